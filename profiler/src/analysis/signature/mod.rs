//! The application signature of a run and the workload model that predicts run time from it,
//! after PAS2P (Wong, Rexachs and Luque, "Parallel Application Signature for Performance
//! Analysis and Prediction", IEEE TPDS 2015) and Martínez Canillas, "Including the Workload Effect
//! in the Parallel Program Signature" (master thesis, UAB, 2011).
//!
//! A run's signature is its phases, each with a weight W (how many times a rank runs it) and a
//! phase execution time PET (what one repetition costs), so that the predicted application
//! execution time PAET = Σ PET_i × W_i. The phases are the clusters of the phase analysis,
//! grouped by their dominant code region (the pair of call sites around most of their bursts), so
//! that the same phase has the same name in every run of the same build, whatever its cost.
//!
//! One repetition of a phase is a burst of it together with what follows until the rank's next
//! analysed burst: the MPI call that ends it, and the bursts too short to analyse between there
//! and the next one. The repetitions of a rank then tile its region of interest (MPI_Init's
//! return to MPI_Finalize's entry), and Σ PET_i × W_i is the mean rank's time in the phases. The
//! time that no phase covers (before the first analysed burst, and the noise bursts of code
//! regions no phase has, with their calls) is kept apart as `other_ns`, so that the signature's
//! parts add up to the run time. A noise burst of a phase's own code region is a perturbed
//! repetition of that phase (preempted, or slowed by a page fault storm): PAS2P's phases are
//! code, so it counts in the phase's weight and time, and weights stay the exact iteration
//! counts whatever the clustering leaves out.
//! The run time is the region of interest of the slowest rank, the one the POP efficiencies use.
//!
//! Threads: a rank's repetitions come from its thread with the most analysed bursts (the one that
//! calls MPI); the bursts of other threads overlap that thread's time and are left out.
//!
//! A running job's signature, job-wide over its nodes, is counted as its bursts arrive instead
//! ([`live`]).

pub mod fit;
pub mod live;
pub mod predict;

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::{stats::RegionCount, Analysis, ClusterId, NOISE};
use crate::model::{Burst, CallSite};

/// A phase's name: its dominant code region, the same in every run of the same build.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PhaseKey {
    pub start: CallSite,
    pub end: CallSite,
}

/// One phase of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseSignature {
    pub key: PhaseKey,
    /// The clusters of the analysis that make the phase.
    pub clusters: Vec<ClusterId>,
    /// W: repetitions per rank (the mean over the ranks with a region of interest).
    pub weight: f64,
    /// PET: the mean time of one repetition, its burst and the MPI time after it, in ns.
    pub pet_ns: f64,
}

impl PhaseSignature {
    /// W × PET: the mean rank's time in this phase, in ns.
    pub fn time_ns(&self) -> f64 {
        self.weight * self.pet_ns
    }
}

/// The signature of one run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AppSignature {
    /// Ranks with a region of interest, over which the weights are means.
    pub ranks: usize,
    /// The measured run time: the region of interest of the slowest rank, in ns.
    pub runtime_ns: u64,
    /// By decreasing W × PET.
    pub phases: Vec<PhaseSignature>,
    /// The run time the phases do not cover, in ns: runtime − PAET.
    pub other_ns: f64,
}

impl AppSignature {
    /// PAET = Σ PET_i × W_i, in ns.
    pub fn paet_ns(&self) -> f64 {
        self.phases.iter().map(PhaseSignature::time_ns).sum()
    }

    /// The share of the run time the phases cover: PAET ÷ run time.
    pub fn coverage(&self) -> f64 {
        if self.runtime_ns == 0 {
            0.0
        } else {
            self.paet_ns() / self.runtime_ns as f64
        }
    }
}

/// Why a run has no signature.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SignatureError {
    #[error("no rank has a region of interest (none returned from MPI_Init while recorded)")]
    NoRegion,
    #[error("no burst of the run is in a phase")]
    NoPhase,
}

/// The signature of a run from its bursts, their [`Analysis`] (same order: `analysis.labels[i]`
/// is the label of `bursts[i]`) and each rank's region of interest (start, end) in Unix ns.
pub fn signature(
    bursts: &[Burst],
    analysis: &Analysis,
    regions: &BTreeMap<u32, (u64, u64)>,
) -> Result<AppSignature, SignatureError> {
    let regions: BTreeMap<u32, (u64, u64)> = regions
        .iter()
        .filter(|(_, (start, end))| end > start)
        .map(|(&rank, &span)| (rank, span))
        .collect();
    let runtime_ns = regions
        .values()
        .map(|(start, end)| end - start)
        .max()
        .ok_or(SignatureError::NoRegion)?;
    let phase_of = phase_keys(analysis);
    let phase_of_region: HashMap<(&CallSite, &CallSite), &PhaseKey> = phase_of
        .values()
        .map(|key| ((&key.start, &key.end), key))
        .collect();

    // The analysed bursts of each rank's main thread, by start, each with its phase if any.
    type Repetition<'a> = (u64, ClusterId, Option<&'a PhaseKey>);
    let mut threads: HashMap<(u32, u32, u32), Vec<Repetition>> = HashMap::new();
    for (burst, label) in bursts.iter().zip(&analysis.labels) {
        if let (Some(label), true) = (label, regions.contains_key(&burst.rank)) {
            let key = phase_of
                .get(label)
                .or_else(|| phase_of_region.get(&burst.region()).copied());
            threads
                .entry((burst.rank, burst.pid, burst.tid))
                .or_default()
                .push((burst.start_ns, *label, key));
        }
    }
    let mut main: BTreeMap<u32, Vec<Repetition>> = BTreeMap::new();
    for ((rank, _, _), seq) in threads {
        let slot = main.entry(rank).or_default();
        if seq.len() > slot.len() {
            *slot = seq;
        }
    }

    // Each repetition lasts until the next analysed burst of the thread, the last one until the
    // end of the rank's region; only what lies inside the region counts.
    let mut repetitions: PhaseRepetitions = BTreeMap::new();
    for (rank, mut seq) in main {
        seq.sort_unstable_by_key(|&(at, label, _)| (at, label));
        let (start, end) = regions[&rank];
        for (i, &(at, label, key)) in seq.iter().enumerate() {
            let Some(key) = key else {
                continue; // noise of code no phase has: other time
            };
            let next = seq.get(i + 1).map_or(end, |&(t, _, _)| t).min(end);
            let from = at.max(start);
            let entry = repetitions.entry(key).or_default();
            if label != NOISE && !entry.0.contains(&label) {
                entry.0.push(label);
            }
            entry.1 += 1;
            entry.2 += next.saturating_sub(from);
        }
    }
    assemble(regions.len(), runtime_ns, repetitions)
}

/// Each phase's clusters, repetitions and their time, by phase.
type PhaseRepetitions<'a> = BTreeMap<&'a PhaseKey, (Vec<ClusterId>, u64, u64)>;

/// The signature of `ranks` ranks whose slowest ran `runtime_ns`, from each phase's repetitions
/// summed over the ranks: W and PET per phase, by decreasing W × PET, and the time no phase
/// covers.
fn assemble(
    ranks: usize,
    runtime_ns: u64,
    repetitions: PhaseRepetitions,
) -> Result<AppSignature, SignatureError> {
    if repetitions.is_empty() {
        return Err(SignatureError::NoPhase);
    }
    let mut phases: Vec<PhaseSignature> = repetitions
        .into_iter()
        .map(|(key, (mut clusters, count, time_ns))| {
            clusters.sort_unstable();
            PhaseSignature {
                key: key.clone(),
                clusters,
                weight: count as f64 / ranks as f64,
                pet_ns: time_ns as f64 / count as f64,
            }
        })
        .collect();
    phases.sort_by(|a, b| b.time_ns().total_cmp(&a.time_ns()).then(a.key.cmp(&b.key)));
    let paet: f64 = phases.iter().map(PhaseSignature::time_ns).sum();
    Ok(AppSignature {
        ranks,
        runtime_ns,
        phases,
        other_ns: runtime_ns as f64 - paet,
    })
}

/// Each cluster's phase: its most frequent code region.
fn phase_keys(analysis: &Analysis) -> HashMap<ClusterId, PhaseKey> {
    analysis
        .clusters
        .iter()
        .filter(|c| c.id != NOISE)
        .filter_map(|c| Some((c.id, PhaseKey::dominant(&c.regions)?)))
        .collect()
}

impl PhaseKey {
    /// The phase of a cluster whose code regions are `regions`, by decreasing burst count: the
    /// first.
    fn dominant(regions: &[RegionCount]) -> Option<PhaseKey> {
        let region = regions.first()?;
        Some(PhaseKey {
            start: region.start.clone(),
            end: region.end.clone(),
        })
    }
}

#[cfg(test)]
mod tests;
