//! Phase-for-phase matching of two runs of one application ([`match_runs`]) on their
//! [`RunSignature`]s, after Llort et al. (2013) ("the paper" below): which phases correspond,
//! whether the instructions scale with the ranks, and how each matched phase changed.
//!
//! The same relation pipeline on two [`RunSignature`]s of the same application, plus:
//!
//! * **Instruction scaling (§2).** The paper weights process-correlated metrics (instructions) by
//!   the number of processes, which is right for strong scaling and wrong for weak scaling. In
//!   log space the weighting is a shift of ln(ranks_B / ranks_A) of the first feature
//!   (ln instructions, or ln on-CPU time). When the rank counts differ we evaluate both
//!   hypotheses and keep the one with the smaller mean nearest-neighbour distance between the two
//!   frames' samples; the result says which ([`InstructionScaling`]).
//! * **Trends per matched phase** ([`PhaseTrend`]): for each side, bursts, time, time share,
//!   mean burst duration, mean instructions (raw and × ranks, the scaled value of §2) and IPC
//!   as Σ instructions ÷ Σ cycles over the relation's clusters; changes are relative (B ÷ A − 1)
//!   except the time share, whose change is the difference of shares.
//! * **Coverage** (Table 2): relations that contain a relevant cluster ÷ the larger number of
//!   relevant clusters of the two runs (1 when both have none): a split or a wide relation
//!   lowers it, as in the paper.

use serde::{Deserialize, Serialize};

use super::relations::{centroid_move, displacement, Space};
use super::{relate, Edge, Frame, Relation, TrackedCluster, TrackingError, TrackingParams};
use crate::analysis::Analysis;
use crate::model::Burst;

/// How the first feature of B is weighted before comparing two runs (Llort et al. (2013), §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstructionScaling {
    /// Per-burst values compared as they are (same rank count, or weak scaling).
    None,
    /// Per-burst values multiplied by the rank count (strong scaling: the same total work).
    ByRanks,
}

/// Which application a run is: runs are comparable when the build ids are equal (or, without
/// build ids, the executables).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppIdentity {
    /// GNU build-id of the executable, in hex.
    pub build_id: Option<String>,
    pub executable: String,
}

impl AppIdentity {
    pub fn same_application(&self, other: &AppIdentity) -> bool {
        match (&self.build_id, &other.build_id) {
            (Some(a), Some(b)) => a == b,
            _ => self.executable == other.executable,
        }
    }
}

/// A compact, serialisable description of one run's phases, for matching against later runs:
/// the clusters with their centroids and sampled points in raw log space, their code regions
/// and statistics, the intra-run simultaneities, and a bounded sample of the rank sequences
/// (order of phases). A few tens of KiB for typical applications.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSignature {
    /// Format version, for stored signatures.
    pub version: u32,
    pub app: AppIdentity,
    /// Job id or any label.
    pub label: String,
    /// Time span of the analysed bursts (Unix ns).
    pub start_ns: u64,
    pub end_ns: u64,
    pub frame: Frame,
}

impl RunSignature {
    pub const VERSION: u32 = 1;

    /// The signature of an analysis of `bursts` (all of a run, or a sample of it).
    pub fn from_analysis(
        app: AppIdentity,
        label: impl Into<String>,
        analysis: &Analysis,
        bursts: &[Burst],
        params: &TrackingParams,
    ) -> Result<RunSignature, TrackingError> {
        let mut frame = Frame::from_analysis(analysis, bursts, params)?;
        frame.sequences.truncate(params.signature_ranks);
        for sequence in &mut frame.sequences {
            sequence.truncate(params.signature_sequence_len);
        }
        Ok(RunSignature {
            version: Self::VERSION,
            app,
            label: label.into(),
            start_ns: bursts.iter().map(|b| b.start_ns).min().unwrap_or(0),
            end_ns: bursts
                .iter()
                .map(|b| b.start_ns + b.duration_ns)
                .max()
                .unwrap_or(0),
            frame,
        })
    }
}

/// One side of a matched phase.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseMetrics {
    pub bursts: u64,
    pub time_ns: u64,
    pub time_share: f64,
    pub duration_mean_ns: f64,
    pub instructions_mean: Option<f64>,
    /// Mean instructions × ranks (the process-weighted value of Llort et al. (2013), §2).
    pub instructions_scaled: Option<f64>,
    /// Σ instructions ÷ Σ cycles.
    pub ipc: Option<f64>,
    /// Time-weighted mean of the clusters' sequence scores.
    pub spmd_score: f64,
}

impl PhaseMetrics {
    fn of(frame: &Frame, ids: &[u32]) -> PhaseMetrics {
        let clusters: Vec<&TrackedCluster> = ids.iter().filter_map(|&i| frame.cluster(i)).collect();
        let bursts: u64 = clusters.iter().map(|c| c.bursts).sum();
        let time_ns: u64 = clusters.iter().map(|c| c.time_ns).sum();
        let instructions: Option<f64> = clusters
            .iter()
            .map(|c| c.instructions_mean.map(|m| m * c.bursts as f64))
            .sum();
        let cycles: Option<f64> = clusters
            .iter()
            .map(|c| match (c.instructions_mean, c.ipc) {
                (Some(m), Some(ipc)) if ipc > 0.0 => Some(m * c.bursts as f64 / ipc),
                _ => None,
            })
            .sum();
        let instructions_mean = instructions
            .filter(|_| bursts > 0)
            .map(|i| i / bursts as f64);
        PhaseMetrics {
            bursts,
            time_ns,
            time_share: clusters.iter().map(|c| c.time_share).sum(),
            duration_mean_ns: if bursts == 0 {
                0.0
            } else {
                time_ns as f64 / bursts as f64
            },
            instructions_mean,
            instructions_scaled: instructions_mean.map(|m| m * f64::from(frame.ranks)),
            ipc: match (instructions, cycles) {
                (Some(i), Some(c)) if c > 0.0 => Some(i / c),
                _ => None,
            },
            spmd_score: if time_ns == 0 {
                0.0
            } else {
                clusters
                    .iter()
                    .map(|c| c.spmd_score * c.time_ns as f64)
                    .sum::<f64>()
                    / time_ns as f64
            },
        }
    }
}

/// How a matched phase changed from run A to run B.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseTrend {
    pub a: PhaseMetrics,
    pub b: PhaseMetrics,
    /// B ÷ A − 1 of the mean burst duration.
    pub duration_mean_change: f64,
    /// B − A of the time share.
    pub time_share_change: f64,
    /// B ÷ A − 1, when both sides have counters.
    pub instructions_change: Option<f64>,
    pub instructions_scaled_change: Option<f64>,
    pub ipc_change: Option<f64>,
}

fn relative_change(a: f64, b: f64) -> f64 {
    if a == 0.0 {
        if b == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        b / a - 1.0
    }
}

impl PhaseTrend {
    fn new(a: PhaseMetrics, b: PhaseMetrics) -> PhaseTrend {
        let change = |x: Option<f64>, y: Option<f64>| Some(relative_change(x?, y?));
        PhaseTrend {
            duration_mean_change: relative_change(a.duration_mean_ns, b.duration_mean_ns),
            time_share_change: b.time_share - a.time_share,
            instructions_change: change(a.instructions_mean, b.instructions_mean),
            instructions_scaled_change: change(a.instructions_scaled, b.instructions_scaled),
            ipc_change: change(a.ipc, b.ipc),
            a,
            b,
        }
    }
}

/// The shape of a matched phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchKind {
    OneToOne,
    /// One cluster of A is several of B.
    Split,
    /// Several clusters of A are one of B.
    Merge,
    /// Several on both sides: the evaluators could not tell them apart.
    Wide,
}

/// A phase of run A and its equivalent in run B.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseMatch {
    pub a: Vec<u32>,
    pub b: Vec<u32>,
    pub kind: MatchKind,
    /// Largest centroid change in raw log space, after instruction scaling (1:1 only).
    pub moved: Option<f64>,
    pub edges: Vec<Edge>,
    pub trend: PhaseTrend,
}

/// Phase-for-phase correspondence between two runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunMatch {
    pub same_application: bool,
    pub scaling: InstructionScaling,
    /// Mean nearest distance between the runs' samples without and with scaling by ranks
    /// (normalised units; `None` when the rank counts are equal or features differ).
    pub scaling_evidence: Option<(f64, f64)>,
    pub call_sites_compared: bool,
    pub phases: Vec<PhaseMatch>,
    pub unmatched_a: Vec<u32>,
    pub unmatched_b: Vec<u32>,
    /// The coverage of Llort et al. (2013): relations holding a relevant cluster ÷ the larger
    /// count of relevant clusters.
    pub coverage: f64,
}

/// Matches the phases of two runs (see the module docs).
pub fn match_runs(a: &RunSignature, b: &RunSignature, params: &TrackingParams) -> RunMatch {
    let (fa, fb) = (&a.frame, &b.frame);
    let ratio_shift = if fa.ranks > 0 && fb.ranks > 0 {
        (f64::from(fb.ranks) / f64::from(fa.ranks)).ln()
    } else {
        0.0
    };
    let (scaling, scaling_evidence) = if ratio_shift != 0.0
        && fa.features == fb.features
        && !fa.clusters.is_empty()
        && !fb.clusters.is_empty()
    {
        let evidence = |shift: f64| {
            let space = Space::joint(fa, fb, shift);
            let (_, ab) = displacement(fa, fb, &space, 0.0, shift);
            let (_, ba) = displacement(fb, fa, &space, shift, 0.0);
            (ab + ba) / 2.0
        };
        let (plain, scaled) = (evidence(0.0), evidence(ratio_shift));
        let scaling = if scaled < plain {
            InstructionScaling::ByRanks
        } else {
            InstructionScaling::None
        };
        (scaling, Some((plain, scaled)))
    } else {
        (InstructionScaling::None, None)
    };
    let shift_b = match scaling {
        InstructionScaling::None => 0.0,
        InstructionScaling::ByRanks => ratio_shift,
    };
    let pairing = relate(fa, fb, params, shift_b);
    let relevant = |frame: &Frame, id: u32| {
        frame
            .cluster(id)
            .is_some_and(|c| c.time_share >= params.relevant_time_share)
    };
    // Clusters below the relevant share make no split or merge, as in the tracker: a few bursts a
    // hiccup of the machine slowed are not a phase of the run.
    let members = |frame: &Frame, ids: &[u32]| -> Vec<u32> {
        let kept: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|&id| relevant(frame, id))
            .collect();
        if kept.is_empty() {
            ids.to_vec()
        } else {
            kept
        }
    };
    let phases: Vec<PhaseMatch> = pairing
        .relations
        .iter()
        .map(|r| {
            let r = Relation {
                a: members(fa, &r.a),
                b: members(fb, &r.b),
                ..r.clone()
            };
            let kind = match (r.a.len(), r.b.len()) {
                (1, 1) => MatchKind::OneToOne,
                (1, _) => MatchKind::Split,
                (_, 1) => MatchKind::Merge,
                _ => MatchKind::Wide,
            };
            let moved = (kind == MatchKind::OneToOne && fa.features == fb.features).then(|| {
                centroid_move(
                    fa.features,
                    &fa.cluster(r.a[0]).expect("related").centroid,
                    &fb.cluster(r.b[0]).expect("related").centroid,
                    shift_b,
                )
            });
            PhaseMatch {
                a: r.a.clone(),
                b: r.b.clone(),
                kind,
                moved,
                edges: r.edges.clone(),
                trend: PhaseTrend::new(PhaseMetrics::of(fa, &r.a), PhaseMetrics::of(fb, &r.b)),
            }
        })
        .collect();
    let relevant_a = fa.clusters.iter().filter(|c| relevant(fa, c.id)).count();
    let relevant_b = fb.clusters.iter().filter(|c| relevant(fb, c.id)).count();
    let tracked = phases
        .iter()
        .filter(|p| p.a.iter().any(|&i| relevant(fa, i)) || p.b.iter().any(|&j| relevant(fb, j)))
        .count();
    let denominator = relevant_a.max(relevant_b);
    RunMatch {
        same_application: a.app.same_application(&b.app),
        scaling,
        scaling_evidence,
        call_sites_compared: pairing.call_sites_compared,
        phases,
        unmatched_a: pairing.unmatched_a,
        unmatched_b: pairing.unmatched_b,
        coverage: if denominator == 0 {
            1.0
        } else {
            (tracked as f64 / denominator as f64).min(1.0)
        },
    }
}

#[cfg(test)]
mod tests;
