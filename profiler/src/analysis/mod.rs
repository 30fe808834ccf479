//! Analysis stage: duration filter, features, clustering (DBSCAN, Aggregative Cluster
//! Refinement), Cluster Sequence Score and per-cluster statistics, after González García (2013):
//! J. González García, *Application of clustering analysis and sequence analysis on the
//! performance analysis of parallel applications*, PhD thesis, UPC/BSC, Barcelona 2013 (DBSCAN in
//! chapters 4–5; Cluster Sequence Score in chapter 5, also PDCAT'09; Aggregative Cluster
//! Refinement in chapter 6, also LSPP'12). [`analyse`] runs all of it on one set of bursts; the
//! pieces are public for tests, benchmarks and later stages.
//!
//! Decisions González García (2013) leaves open, each documented in detail where it is
//! implemented:
//!
//! * **Features** ([`features`]): [ln(instructions), IPC] when every analysed burst has counters,
//!   else ln(on-CPU time) clustered separately within each code region; the result names the set
//!   used and the normalisation ranges. Min–max normalisation over the analysed bursts, Euclidean
//!   distance. The duration-only fallback normalises over all regions together, so Eps means the
//!   same in every region. The region partition is not final: clusters of different regions that
//!   are variants of one computation (pipeline and wavefront codes) become one phase, and so do
//!   the clusters of one region split along rank lines (ranks sharing cores) ([`roles`]).
//! * **Duration filter**: the 99 % criterion of González García (2013), then lowered to the next
//!   empty factor-2 gap in the sorted durations so that it never cuts through a phase
//!   ([`features::duration_filter`]). On on-CPU time, not wall time: on a busy node preemption
//!   spreads one phase's wall times over several factors of 2 and fills the gap below it with
//!   preempted tiny bursts. A burst whose on-CPU clock the kernel stopped is kept when its wall
//!   time passes and most of its code region passes.
//! * **DBSCAN** ([`dbscan()`]): grid index (near-linear even for dense phases); the neighbourhood
//!   includes the point; border points join the cluster of their nearest core point.
//! * **MinPoints** ([`acr::default_min_points`]): ranks/4, at least 2 (ClusteringSuite's
//!   clamp), as González García (2013) defines it, not from occurrences: a window holds iterations
//!   × ranks bursts per phase, but a MinPoints that grows with the window would turn rare phases
//!   into noise. MinPoints 1 would make DBSCAN single linkage without noise on 2–7 ranks.
//! * **Eps list** ([`acr::epsilon_steps`], [`acr::kdist_neighbours`]): ClusteringSuite's knee on
//!   the sorted k-dist curve; N values index-spaced from the knee up to the 0.5 %-trimmed top of
//!   the curve, both included. The curve uses k = max(MinPoints, ⌈ln n⌉) rather than MinPoints:
//!   with many iterations per window and MinPoints 2, the nearest-neighbour distances never reach
//!   the radius at which a jittered phase is connected (González García (2013) clustered 1–2
//!   iterations). No Eps is below the distance a 5 % difference makes along the ln features
//!   (`resolution`, [`FeatureReport::normalised_ratio`]).
//! * **ACR** ([`acr()`]): after each step, clusters of different code regions that lie within Eps
//!   of each other, share no rank and share their aligned columns join (region variants of one
//!   computation, [`roles::merge_region_variants`]; they are aligned as one symbol so that the
//!   aligner can line them up at all), and so do clusters of one code region that share no rank
//!   and share their columns, whatever their distance (a region split along rank lines: one
//!   phase with its imbalance, not two); bursts in a full aligned column dominated by one cluster
//!   join it (column-majority absorption, our addition against residual noise and
//!   over-aggregation); then clusters scoring exactly 1 are frozen; the rest and all noise are
//!   refined with the next Eps. At the end the sequence-based merge (a cluster appearing only in
//!   another one's columns joins it, which contains the "always together" of González García
//!   (2013)) runs unconditionally; then rare clusters (at most 1/8 of the columns of the most
//!   frequent one) that take a frequent cluster's place in the sequences and end at one of its
//!   call sites join it, because a phase recurs and such a cluster is that phase in a perturbed
//!   iteration ([`roles::join_rare_variants`]); then a lone burst that takes another cluster's
//!   place among its code region's bursts on its rank joins that cluster
//!   ([`roles::place_lone_bursts`]); then the absorption once more.
//! * **CSS** ([`css`], [`msa`]): one sequence per rank (all its threads' bursts by start time);
//!   Eq. 5.2 divided by the number of ranks m, which counts ranks without bursts; noise is a symbol
//!   in the sequences but has no weight in the global score, which is weighted by time over all
//!   analysed bursts (noise included) and is 0 when there is no analysed time. Progressive
//!   alignment: identical sequences collapsed, UPGMA over 2-mer distances, banded profile
//!   Needleman–Wunsch with our own weighted-identity scores and linear gaps, free at the ends.
//! * **Numbering**: clusters 1, 2, … by decreasing total time; noise is [`NOISE`] = 0; filtered
//!   bursts have no label (`None`).
//! * **Statistics** ([`stats`]): IPC = Σ instructions ÷ Σ cycles; LB = mean over all m ranks of
//!   per-rank totals ÷ their maximum, absent ranks counting 0.
//! * **Determinism**: bursts are put in a canonical order (rank, start, thread, …) before anything
//!   else, ids are assigned from that order, ties are broken by index everywhere, and only ordered
//!   maps reach the results.

pub mod acr;
pub mod css;
pub mod dbscan;
pub mod features;
mod grid;
pub mod groups;
pub(crate) mod hashing;
mod kdtree;
pub mod msa;
pub mod online;
pub mod points;
pub mod roles;
pub mod signature;
pub mod stats;
pub mod synthetic;
pub mod tracking;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::model::Burst;
pub use acr::{
    acr, default_min_points, epsilon_steps, kdist_neighbours, single_dbscan, ClusteringOutcome,
    ClusteringReport, SequenceMerge, StepReport,
};
pub use css::{sequence_score, RankSequences, SequenceScore};
pub use dbscan::{dbscan, k_distances};
pub use features::{DurationFilter, FeatureReport, FeatureSelection, FeatureSet, FilterReport};
pub use points::PointSet;
pub use stats::{ClusterStats, DurationQuantiles, RegionCount};

/// Cluster number: 1 is the cluster with the most time; [`NOISE`] is 0.
pub type ClusterId = u32;

/// Bursts that DBSCAN left unclustered.
pub const NOISE: ClusterId = 0;

#[derive(Debug, thiserror::Error)]
pub enum AnalysisError {
    #[error(
        "{missing} of {bursts} analysed bursts carry no usable hardware counters (instructions and \
         non-zero cycles), so instructions and IPC cannot be used; select the features \
         automatically to fall back to on-CPU time per code region"
    )]
    MissingCounters { missing: usize, bursts: usize },
    #[error(
        "the bursts come from {seen} distinct ranks but the analysis was told there are {ranks}; \
         pass the number of ranks whose bursts are analysed"
    )]
    TooManyRanks { seen: usize, ranks: u32 },
    #[error("invalid analysis parameter {name} = {value}: expected {expected}")]
    InvalidParameter {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
}

/// How bursts are clustered.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClusteringMethod {
    /// Aggregative Cluster Refinement with up to `steps` Eps values (González García (2013) uses
    /// 10). No Eps is smaller than the distance a relative difference of `resolution` makes in
    /// the logarithmic features (see [`acr::acr`]).
    Acr {
        steps: usize,
        min_points: Option<usize>,
        #[serde(default = "default_resolution")]
        resolution: f64,
    },
    /// One DBSCAN run with a fixed Eps in normalised feature units.
    Dbscan { eps: f64, min_points: Option<usize> },
}

impl Default for ClusteringMethod {
    fn default() -> Self {
        ClusteringMethod::Acr {
            steps: 10,
            min_points: None,
            resolution: default_resolution(),
        }
    }
}

/// Bursts of one code region whose on-CPU times (or instruction counts) differ by less than 5 %
/// are never told apart. The Eps values González García (2013) reports, 0.01–0.09 over
/// normalised ranges of a few ln units, amount to 5–30 %; the k-dist curve of a window of many
/// quiet iterations goes far lower, and ACR then freezes a phase whose speed drifted by 1 % in
/// the middle of the window as two perfectly SPMD clusters.
fn default_resolution() -> f64 {
    0.05
}

/// Everything [`analyse`] can be told. `min_points: None` means [`acr::default_min_points`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AnalysisParams {
    pub features: FeatureSelection,
    pub duration_filter: DurationFilter,
    pub clustering: ClusteringMethod,
}

/// The result of one analysis.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Analysis {
    pub params: AnalysisParams,
    pub ranks: u32,
    pub filter: FilterReport,
    pub features: FeatureReport,
    pub clustering: ClusteringReport,
    /// Ascending id, so by decreasing time.
    pub clusters: Vec<ClusterStats>,
    pub noise: Option<ClusterStats>,
    /// Time-weighted Cluster Sequence Score over the analysed bursts (see [`css`]).
    pub global_score: f64,
    /// Per input burst, in input order: its cluster, [`NOISE`], or `None` when filtered out.
    pub labels: Vec<Option<ClusterId>>,
}

/// The bursts that pass the filter, in canonical order, as points and per-rank sequences: point i
/// is burst `kept[i]`.
#[derive(Clone, Debug)]
pub struct Prepared {
    pub kept: Vec<usize>,
    pub filter: FilterReport,
    pub features: features::Features,
    pub sequences: RankSequences,
}

/// Filters the bursts and computes their features and rank sequences. The canonical order (rank,
/// start, thread, process, duration, input index) makes every later id independent of the input
/// order. `ranks` is m, as for [`analyse`].
pub fn prepare(
    bursts: &[Burst],
    ranks: u32,
    params: &AnalysisParams,
) -> Result<Prepared, AnalysisError> {
    let seen = bursts.iter().map(|b| b.rank).collect::<BTreeSet<_>>().len();
    if seen > ranks as usize {
        return Err(AnalysisError::TooManyRanks { seen, ranks });
    }
    let (mut kept, filter) = features::duration_filter(bursts, params.duration_filter)?;
    kept.sort_by_key(|&i| {
        let b = &bursts[i];
        (b.rank, b.start_ns, b.tid, b.pid, b.duration_ns, i)
    });
    let features = features::extract_features(bursts, &kept, params.features)?;
    let rank_index: BTreeMap<u32, u32> = kept
        .iter()
        .map(|&i| bursts[i].rank)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .enumerate()
        .map(|(index, rank)| (rank, index as u32))
        .collect();
    let starts: Vec<u64> = kept.iter().map(|&i| bursts[i].start_ns).collect();
    let sequences = RankSequences::new(
        ranks as usize,
        kept.iter().map(|&i| rank_index[&bursts[i].rank]).collect(),
        &starts,
        kept.iter().map(|&i| bursts[i].duration_ns).collect(),
    );
    Ok(Prepared {
        kept,
        filter,
        features,
        sequences,
    })
}

/// Analyses the bursts of one job (or of the ranks of one job on this node). `ranks` is m, the
/// number of ranks the bursts come from; a rank id is an identifier, not an index, and ranks with
/// no analysed bursts count as empty sequences.
pub fn analyse(
    bursts: &[Burst],
    ranks: u32,
    params: &AnalysisParams,
) -> Result<Analysis, AnalysisError> {
    analyse_in_full(bursts, ranks, params).map(|full| full.analysis)
}

/// An analysis with what it was computed from, for a caller that goes on from there (the online
/// analysis tracks it and classifies against it) without preparing and aligning the bursts again.
pub(crate) struct AnalysisInFull {
    pub analysis: Analysis,
    pub prepared: Prepared,
    /// The alignment and scores of the final labels of the prepared points.
    pub score: SequenceScore,
}

/// As [`analyse`], keeping the preparation and the final alignment.
pub(crate) fn analyse_in_full(
    bursts: &[Burst],
    ranks: u32,
    params: &AnalysisParams,
) -> Result<AnalysisInFull, AnalysisError> {
    let (eps, steps, min_points, resolution) = match params.clustering {
        ClusteringMethod::Acr {
            steps,
            min_points,
            resolution,
        } => (None, steps, min_points, resolution),
        ClusteringMethod::Dbscan { eps, min_points } => (Some(eps), 1, min_points, 0.0),
    };
    if !(resolution.is_finite() && (0.0..1.0).contains(&resolution)) {
        return Err(AnalysisError::InvalidParameter {
            name: "clustering.resolution",
            value: resolution.to_string(),
            expected: "a relative difference from 0 to below 1, such as 0.05 for 5 %",
        });
    }
    if steps == 0 {
        return Err(AnalysisError::InvalidParameter {
            name: "clustering.steps",
            value: "0".into(),
            expected: "at least 1",
        });
    }
    if let Some(eps) = eps.filter(|e| !(e.is_finite() && *e >= 0.0)) {
        return Err(AnalysisError::InvalidParameter {
            name: "clustering.eps",
            value: eps.to_string(),
            expected: "a finite, non-negative distance",
        });
    }
    let min_points = min_points.unwrap_or_else(|| acr::default_min_points(ranks as usize));
    if min_points == 0 {
        return Err(AnalysisError::InvalidParameter {
            name: "clustering.min_points",
            value: "0".into(),
            expected: "at least 1",
        });
    }

    let prepared = prepare(bursts, ranks, params)?;
    let Prepared {
        kept,
        filter,
        features,
        sequences,
    } = &prepared;
    let outcome = match eps {
        None => acr(
            &features.points,
            sequences,
            steps,
            min_points,
            features.report.normalised_ratio(resolution),
        ),
        Some(eps) => single_dbscan(&features.points, sequences, eps, min_points),
    };
    let (clusters, noise) = stats::cluster_stats(&stats::StatsInput {
        bursts,
        burst_of: kept,
        labels: &outcome.labels,
        raw: &features.raw,
        dims: features.points.dims(),
        sequences,
        score: &outcome.score,
        time_in_ns: filter.time_in_ns,
    });
    let mut labels = vec![None; bursts.len()];
    for (&i, &label) in kept.iter().zip(&outcome.labels) {
        labels[i] = Some(label);
    }
    let analysis = Analysis {
        params: *params,
        ranks,
        filter: filter.clone(),
        features: features.report.clone(),
        clustering: outcome.report,
        clusters,
        noise,
        global_score: outcome.score.global(),
        labels,
    };
    Ok(AnalysisInFull {
        analysis,
        prepared,
        score: outcome.score,
    })
}

#[cfg(test)]
mod tests;
