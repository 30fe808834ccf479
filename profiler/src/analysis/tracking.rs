//! Cluster tracking across time windows of one job and across runs of one application, after Llort
//! et al. (2013): G. Llort, H. Servat, J. Giménez and J. Labarta, "On the usefulness of object
//! tracking techniques in performance analysis", SC 2013 ("the paper" below).
//!
//! A **frame** ([`Frame`]) is one clustering: a window of a running job, or a whole run. Its
//! clusters ([`TrackedCluster`]) carry what the evaluators need and nothing else: a bounded
//! sample of raw feature points, the centroid in raw (log) feature space, the code regions with
//! their burst counts, the statistics the trends are made of, plus the frame's per-rank cluster
//! sequences and its intra-frame simultaneity (which clusters share aligned columns). A frame is
//! serialisable; [`RunSignature`] is a frame plus the application's identity, which a recording or
//! the daemon stores per job.
//!
//! # Matching two frames ([`relate`], used by [`Tracker`] and [`match_runs`])
//!
//! The paper's combination order (§3), with every gap it leaves filled as follows.
//!
//! 1. **Displacement (E1, §3.1), both directions.** Each sampled burst of A is classified to the
//!    B cluster holding its nearest sampled burst, and vice versa. *The paper leaves "nearest
//!    cluster" open; we use the nearest member (of a sample of at most
//!    [`TrackingParams::sample_points`] per cluster), not the centroid, because density clusters
//!    are not round (a cluster stretched along the instruction axis is imbalance, §2).* Distances
//!    are Euclidean in the raw feature space (ln instructions and IPC, or ln on-CPU time) min–max
//!    normalised jointly over **both** frames, which is §2's "scale adjusted to the minimum and
//!    maximum values seen along all experiments". With the per-region fallback feature set, a
//!    burst is only compared with bursts of the same code region, as in the clustering. Rows are
//!    normalised to shares and cells below [`TrackingParams::outlier_share`] (5 %, §3) are
//!    dropped. A pair is related when either direction keeps it ("reciprocally").
//! 2. **SPMD simultaneity (E2, §3.2).** Within a frame, cluster j is simultaneous with i when it
//!    occupies at least `outlier_share` of the aligned columns i occupies, using the same
//!    progressive alignment as the Cluster Sequence Score (the paper's "global sequence
//!    alignment"). The paper first tests that the application is SPMD; we apply E2 on a side only
//!    when that frame's global sequence score is at least [`TrackingParams::spmd_min_score`].
//!    E1 relations are expanded once (not transitively): A_i ≡ B_j and B_j ~ B_k add A_i ≡ B_k.
//! 3. **Call sites (E3, §3.3)** prune: a relation whose two clusters run no code region (start
//!    call site, end call site, in module+offset form) in common is dropped. *The paper uses
//!    source lines; our regions are stricter (both delimiting call sites).* Pruning is skipped
//!    for a pair when one cluster has no resolved call site, and for the whole pair of frames when
//!    they share no resolved region at all (a different build: offsets differ), which the result
//!    says.
//! 4. **Grouping (§3):** connected components of the bipartite relation graph. 1:1 components
//!    are the **pivots** of the sequence evaluator.
//! 5. **Sequence (E4, §3.4)** splits wide relations. *The paper aligns the two frames' sequences
//!    on the pivots (ref. [8]) without saying how.* We describe every occurrence of a non-pivot
//!    cluster by its context in its rank's sequence: (the last pivot before it, how many bursts
//!    since, capped at [`TrackingParams::sequence_steps`]). Pivots have the same number on both
//!    sides, so contexts compare across frames; E4(i, j) is the overlap (histogram intersection)
//!    of the two clusters' context distributions, in [0, 1]. This is Fig. 5 exactly: with pivot
//!    1 → 2, A's "1 then 2 then 3" and B's "2 then 3 then 4" give 2 → 3 and 3 → 4. In a wide
//!    relation (more than one cluster on a side), the pairs of its members with E4 at least
//!    `outlier_share` (and not excluded by E3) replace its edges when they cover every member and
//!    split it into several relations; pairs E1 did not propose may thus be chosen, as in the
//!    paper's A11/A12 ≡ B12/B15 example. Otherwise edges are only removed, in increasing E4
//!    order while E4 is below `outlier_share` and both ends keep another edge, so no cluster
//!    loses its last relation to E4. Without pivots, or for a cluster absent from the sequences,
//!    E4 is uninformative and changes nothing.
//! 6. **Rescue of long moves (ours).** The paper's failure case for E1 is a long move (§3.1: "15
//!    is too far away"), which after pruning leaves a cluster without any relation; the paper
//!    only says the other evaluators "must resolve" it. We relate a still unmatched cluster to a
//!    cluster of the other frame that shares code with it and whose E4 is at least
//!    `outlier_share` (or uninformative), preferring pairs where both are unmatched, then larger
//!    shared code, then larger E4, then smaller distance. This is what makes a phase whose work
//!    changed a lot (a compiler change, as in the paper's §4.1; a doubled phase) keep its
//!    identity.
//!
//! # Stable identities within a job ([`Tracker`])
//!
//! Frames are windows; each new frame is related to the clusters of the previous one (the paper's
//! §3: consecutive frames). Ids are u32 from 1, never reused for another cluster; 0 is noise.
//! Within each relation (a group of old clusters ≡ a group of new ones), ids are handed on in this
//! order, which the paper leaves open (the obvious rule would be "keep the oldest/biggest id"):
//!
//! 1. **Continuations.** An old and a new cluster whose centroids are within
//!    [`TrackingParams::move_threshold`] in raw log space (|Δ ln instructions|, |Δ ln IPC| or
//!    |Δ ln on-CPU time|, the largest) *stayed*: they are paired first, by E1 affinity (both
//!    directions summed), then by the smaller move; when several old clusters stayed where one
//!    new cluster is, the oldest id continues it (a phase that shed a part for a window and
//!    takes it back keeps its own id). An unchanged phase is always such a pair,
//!    so it keeps its id whatever else splits off it or merges into it, as long as the
//!    clustering keeps it a cluster of its own (two phases the clustering puts in one cluster
//!    can only have one id: that is a merge, undone by rule 5 when they separate again).
//! 2. **Moves.** Old clusters with no continuation and new clusters near no old one are then
//!    paired by the time they hold (the bulk of a phase continues it, not a fragment that
//!    happens to lie between its old and new place). The id is kept and a **moved** event
//!    records the distance (the paper's objects "move"; a phase whose work doubled keeps its id:
//!    the change is a trend, not a new region).
//! 3. **Split.** Other new clusters of the relation split off the old cluster most of their
//!    bursts are nearest to (E1 from B to A).
//! 4. **Merge.** Other old clusters of the relation merge into the new cluster most of their
//!    bursts are nearest to (E1 from A to B); their ids retire but stay dormant.
//! 5. A new cluster left without an id (an unrelated one, or a split part) **revives** a
//!    dormant id if it relates 1:1 to that dormant cluster and stayed where it was; this is a
//!    rolling reference (our addition), which keeps the id of a phase that skips a
//!    window, and it restores the ids of two phases that the clustering merged for a while.
//!    Otherwise it gets a new id (an unrelated one **appears**).
//! 6. An old cluster without relation becomes dormant when a *closed* window lacks it, and
//!    **vanishes** after [`TrackingParams::vanish_after_windows`] closed windows without it
//!    (merged ids expire silently: their merge was reported). A partial frame (a re-clustering
//!    of the open window) never makes a cluster dormant: the window may not have reached that
//!    phase yet.
//!
//! A split (merge) is reported when at least two parts (parents) are relevant and each holds
//! at least `outlier_share` of its side of the relation's time: the paper's 5 % rule for a split
//! row, so a fragment of a few bursts that density clustering cut off a phase makes no split.
//!
//! The paper tracks only "relevant" objects, those holding most of the time (§4). We track every
//! cluster, but only clusters holding at least [`TrackingParams::relevant_time_share`] of their
//! frame's time make events: an appear or vanish of a minor cluster, a split with fewer than two
//! relevant parts, a merge of fewer than two relevant clusters or a move of a minor cluster is
//! not reported (the ids are assigned all the same). Event counts are exact; the event list
//! keeps the last [`TrackingParams::max_events`].
//!
//! Limitation, inherited from E1 (nearest cluster, no distance bound, as in the paper): without
//! resolved call sites nothing prunes, so a genuinely new phase is related to its nearest
//! cluster and reported as a split of it rather than as an appearance.
//!
//! # Across runs ([`match_runs`])
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

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::points::{distance2, Coords, MAX_DIMS};
use super::{
    prepare, sequence_score, Analysis, AnalysisError, ClusterId, FeatureSet, Prepared, RegionCount,
    NOISE,
};
use crate::model::{Burst, CallSite};

/// A cluster identity that survives re-clustering: assigned by a [`Tracker`], never reused.
/// 0 is never an id (it is the noise label in sequences).
pub type StableId = u32;

#[derive(Debug, thiserror::Error)]
pub enum TrackingError {
    #[error("invalid tracking parameter {name} = {value}: expected {expected}")]
    InvalidParameter {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("cannot build a tracking frame: {0}")]
    Analysis(#[from] AnalysisError),
}

/// Everything the tracker can be told. Defaults in parentheses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrackingParams {
    /// Cells of every evaluator matrix below this share are outliers (0.05, Llort et al. (2013),
    /// §3).
    pub outlier_share: f64,
    /// Sampled bursts per cluster for cross-classification and in signatures (64).
    pub sample_points: usize,
    /// The SPMD evaluator is applied to a frame only when its global sequence score is at least
    /// this (0.5).
    pub spmd_min_score: f64,
    /// Longest distance in bursts from a pivot that a sequence context tells apart (16).
    pub sequence_steps: u32,
    /// A 1:1 relation whose centroid moved more than this in raw log space is a "moved" event
    /// (ln 1.25 ≈ 0.223: a 25 % change of instructions, IPC or on-CPU time).
    pub move_threshold: f64,
    /// Clusters below this share of their frame's time make no events (0.01).
    pub relevant_time_share: f64,
    /// Closed windows without a cluster after which it vanishes (10).
    pub vanish_after_windows: u32,
    /// Most ids kept alive (active and dormant) by a tracker; the dormant one seen longest ago
    /// vanishes first (256).
    pub max_phases: usize,
    /// Events kept in a tracker's list; counts stay exact (1024).
    pub max_events: usize,
    /// Ranks whose sequences a run signature keeps (16).
    pub signature_ranks: usize,
    /// Bursts per rank sequence a run signature keeps (512).
    pub signature_sequence_len: usize,
}

impl Default for TrackingParams {
    fn default() -> Self {
        TrackingParams {
            outlier_share: 0.05,
            sample_points: 64,
            spmd_min_score: 0.5,
            sequence_steps: 16,
            move_threshold: 1.25f64.ln(),
            relevant_time_share: 0.01,
            vanish_after_windows: 10,
            max_phases: 256,
            max_events: 1024,
            signature_ranks: 16,
            signature_sequence_len: 512,
        }
    }
}

impl TrackingParams {
    pub fn validate(&self) -> Result<(), TrackingError> {
        let invalid = |name, value: String, expected| {
            Err(TrackingError::InvalidParameter {
                name,
                value,
                expected,
            })
        };
        let share = |x: f64| (0.0..=1.0).contains(&x);
        if !(share(self.outlier_share) && self.outlier_share > 0.0) {
            return invalid(
                "tracking.outlier_share",
                self.outlier_share.to_string(),
                "a share in (0, 1]",
            );
        }
        if self.sample_points == 0 {
            return invalid("tracking.sample_points", "0".into(), "at least 1");
        }
        if !share(self.spmd_min_score) {
            return invalid(
                "tracking.spmd_min_score",
                self.spmd_min_score.to_string(),
                "a score in [0, 1]",
            );
        }
        if !(self.move_threshold.is_finite() && self.move_threshold > 0.0) {
            return invalid(
                "tracking.move_threshold",
                self.move_threshold.to_string(),
                "a positive distance in log space",
            );
        }
        if !share(self.relevant_time_share) {
            return invalid(
                "tracking.relevant_time_share",
                self.relevant_time_share.to_string(),
                "a share in [0, 1]",
            );
        }
        if self.vanish_after_windows == 0 {
            return invalid("tracking.vanish_after_windows", "0".into(), "at least 1");
        }
        if self.max_phases == 0 {
            return invalid("tracking.max_phases", "0".into(), "at least 1");
        }
        Ok(())
    }
}

/// One cluster of a frame, as the evaluators see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrackedCluster {
    /// The cluster's id in its frame: the analysis's cluster number, or a stable id.
    pub id: u32,
    pub bursts: u64,
    pub time_ns: u64,
    /// Share of the frame's burst time (filtered bursts included).
    pub time_share: f64,
    /// Mean raw feature values (logs applied), as the analysis's feature report names them.
    pub centroid: Vec<f64>,
    /// A deterministic sample of the cluster's bursts in raw feature space (coordinates past the
    /// feature set's dimensions are 0).
    pub points: Vec<Coords>,
    /// For each sampled point, its code region as an index into `regions`.
    pub point_regions: Vec<u32>,
    /// Code regions, by decreasing burst count.
    pub regions: Vec<RegionCount>,
    pub instructions_mean: Option<f64>,
    pub ipc: Option<f64>,
    pub spmd_score: f64,
    pub lb_duration: f64,
}

/// Cluster `b` occupies `share` of the aligned columns that cluster `a` occupies.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Simultaneity {
    pub a: u32,
    pub b: u32,
    pub share: f64,
}

/// One clustering, reduced to what tracking needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    pub features: FeatureSet,
    /// m, the number of ranks of the analysis.
    pub ranks: u32,
    /// Global Cluster Sequence Score of the clustering.
    pub spmd_score: f64,
    /// All burst time given to the analysis, filtered bursts included.
    pub time_ns: u64,
    /// By ascending id.
    pub clusters: Vec<TrackedCluster>,
    /// Pairs with a non-zero share, by (a, b).
    pub simultaneous: Vec<Simultaneity>,
    /// Per rank (by rank index), the ids of its clustered bursts in start order (noise omitted).
    pub sequences: Vec<Vec<u32>>,
}

impl Frame {
    /// The frame of an analysis of `bursts` (the same bursts, in the same order, that `analysis`
    /// was computed from). Re-runs the cheap preparation and one sequence alignment.
    pub fn from_analysis(
        analysis: &Analysis,
        bursts: &[Burst],
        params: &TrackingParams,
    ) -> Result<Frame, TrackingError> {
        let prepared = prepare(bursts, analysis.ranks, &analysis.params)?;
        Ok(Frame::from_prepared(analysis, bursts, &prepared, params))
    }

    /// As [`Frame::from_analysis`], from the preparation of the same bursts.
    pub(crate) fn from_prepared(
        analysis: &Analysis,
        bursts: &[Burst],
        prepared: &Prepared,
        params: &TrackingParams,
    ) -> Frame {
        let labels: Vec<ClusterId> = prepared
            .kept
            .iter()
            .map(|&i| analysis.labels[i].expect("a kept burst has a label"))
            .collect();
        let mut members: BTreeMap<ClusterId, Vec<usize>> = BTreeMap::new();
        for (point, &label) in labels.iter().enumerate() {
            if label != NOISE {
                members.entry(label).or_default().push(point);
            }
        }
        let raw = &prepared.features.raw;
        let clusters = analysis
            .clusters
            .iter()
            .map(|stats| {
                let points = members.get(&stats.id).map_or(&[][..], |m| &m[..]);
                let region_index: BTreeMap<(&CallSite, &CallSite), u32> = stats
                    .regions
                    .iter()
                    .enumerate()
                    .map(|(k, r)| ((&r.start, &r.end), k as u32))
                    .collect();
                let sample = sample_indices(points.len(), params.sample_points);
                TrackedCluster {
                    id: stats.id,
                    bursts: stats.bursts,
                    time_ns: stats.time_ns,
                    time_share: stats.time_share,
                    centroid: stats.centroid.clone(),
                    points: sample.iter().map(|&k| raw[points[k]]).collect(),
                    point_regions: sample
                        .iter()
                        .map(|&k| region_index[&bursts[prepared.kept[points[k]]].region()])
                        .collect(),
                    regions: stats.regions.clone(),
                    instructions_mean: stats.instructions_mean,
                    ipc: stats.ipc,
                    spmd_score: stats.spmd_score,
                    lb_duration: stats.lb_duration,
                }
            })
            .collect();
        let sequences = (0..prepared.sequences.ranks())
            .map(|r| {
                prepared
                    .sequences
                    .sequence(r)
                    .iter()
                    .map(|&p| labels[p])
                    .filter(|&l| l != NOISE)
                    .collect()
            })
            .collect();
        Frame {
            features: analysis.features.used,
            ranks: analysis.ranks,
            spmd_score: analysis.global_score,
            time_ns: analysis.filter.time_in_ns,
            clusters,
            simultaneous: simultaneity(&labels, prepared),
            sequences,
        }
    }

    fn cluster(&self, id: u32) -> Option<&TrackedCluster> {
        self.clusters
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .map(|k| &self.clusters[k])
    }

    /// The same frame with every id replaced through `map` (ids missing from it are dropped
    /// from the sequences and simultaneities, clusters keep their sample).
    pub fn relabelled(&self, map: &BTreeMap<u32, u32>) -> Frame {
        let mut clusters: Vec<TrackedCluster> = self
            .clusters
            .iter()
            .filter_map(|c| map.get(&c.id).map(|&id| TrackedCluster { id, ..c.clone() }))
            .collect();
        clusters.sort_by_key(|c| c.id);
        let mut simultaneous: Vec<Simultaneity> = self
            .simultaneous
            .iter()
            .filter_map(|s| {
                Some(Simultaneity {
                    a: *map.get(&s.a)?,
                    b: *map.get(&s.b)?,
                    share: s.share,
                })
            })
            .collect();
        simultaneous.sort_by_key(|s| (s.a, s.b));
        Frame {
            features: self.features,
            ranks: self.ranks,
            spmd_score: self.spmd_score,
            time_ns: self.time_ns,
            clusters,
            simultaneous,
            sequences: self
                .sequences
                .iter()
                .map(|s| s.iter().filter_map(|id| map.get(id).copied()).collect())
                .collect(),
        }
    }

    /// Only the clusters in `keep`, with their sequences and simultaneities.
    fn restricted(&self, keep: &BTreeSet<u32>) -> Frame {
        let map = keep.iter().map(|&id| (id, id)).collect();
        self.relabelled(&map)
    }
}

/// `n` indices spread evenly over `0..len`, or all of them.
fn sample_indices(len: usize, n: usize) -> Vec<usize> {
    if len <= n {
        (0..len).collect()
    } else {
        (0..n).map(|k| k * len / n).collect()
    }
}

/// Intra-frame simultaneity from the alignment of the rank sequences (noise ignored).
fn simultaneity(labels: &[ClusterId], prepared: &Prepared) -> Vec<Simultaneity> {
    if labels.is_empty() {
        return Vec::new();
    }
    let score = sequence_score(labels, &prepared.sequences);
    let alignment = score.alignment();
    let mut columns: BTreeMap<u32, u64> = BTreeMap::new();
    let mut together: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for j in 0..alignment.columns() {
        let ids: Vec<u32> = alignment
            .column(j)
            .iter()
            .map(|&(id, _)| id)
            .filter(|&id| id != NOISE)
            .collect();
        for &a in &ids {
            *columns.entry(a).or_default() += 1;
            for &b in &ids {
                if a != b {
                    *together.entry((a, b)).or_default() += 1;
                }
            }
        }
    }
    together
        .into_iter()
        .map(|((a, b), n)| Simultaneity {
            a,
            b,
            share: n as f64 / columns[&a] as f64,
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// The relation pipeline.
// ---------------------------------------------------------------------------------------------

/// How the first feature of B is weighted before comparing two runs (Llort et al. (2013), §2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstructionScaling {
    /// Per-burst values compared as they are (same rank count, or weak scaling).
    None,
    /// Per-burst values multiplied by the rank count (strong scaling: the same total work).
    ByRanks,
}

/// Which evaluator created an edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeSource {
    Displacement,
    Simultaneity,
    /// The sequence evaluator's pairing inside a wide relation.
    Sequence,
    /// The rescue of a long move: shared code and sequence position.
    CodeAndSequence,
}

/// One related pair and the evaluators' values for it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Edge {
    pub a: u32,
    pub b: u32,
    pub source: EdgeSource,
    /// E1: share of A's sampled bursts nearest to B, and of B's nearest to A (0 when dropped as
    /// an outlier).
    pub displacement_ab: f64,
    pub displacement_ba: f64,
    /// E3: mean of the two shares of bursts in regions the other cluster also runs; `None` when
    /// call sites were not compared.
    pub code: Option<f64>,
    /// E4: overlap of sequence contexts; `None` when uninformative.
    pub sequence: Option<f64>,
}

/// A group of A clusters equivalent to a group of B clusters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Relation {
    pub a: Vec<u32>,
    pub b: Vec<u32>,
    pub edges: Vec<Edge>,
}

/// The outcome of relating two frames.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Pairing {
    /// Ordered by their smallest A id.
    pub relations: Vec<Relation>,
    pub unmatched_a: Vec<u32>,
    pub unmatched_b: Vec<u32>,
    /// Whether call sites could be compared (the frames share at least one resolved region).
    pub call_sites_compared: bool,
}

type Region<'a> = (&'a CallSite, &'a CallSite);

fn unresolved(site: &CallSite) -> bool {
    &*site.module == "?"
}

fn resolved(region: &RegionCount) -> bool {
    !unresolved(&region.start) && !unresolved(&region.end)
}

/// Joint min–max normalisation of both frames' sampled points (B's first feature shifted).
struct Space {
    lo: Coords,
    scale: Coords,
}

impl Space {
    fn joint(a: &Frame, b: &Frame, shift_b: f64) -> Space {
        let dims = a.features.names().len();
        let mut lo = [f64::INFINITY; MAX_DIMS];
        let mut hi = [f64::NEG_INFINITY; MAX_DIMS];
        for (frame, shift) in [(a, 0.0), (b, shift_b)] {
            for c in &frame.clusters {
                for p in &c.points {
                    let p = shifted(p, shift);
                    for d in 0..dims {
                        lo[d] = lo[d].min(p[d]);
                        hi[d] = hi[d].max(p[d]);
                    }
                }
            }
        }
        let mut scale = [0.0; MAX_DIMS];
        for d in 0..dims {
            let span = hi[d] - lo[d];
            scale[d] = if span.is_finite() && span > 0.0 {
                1.0 / span
            } else {
                0.0
            };
            if !lo[d].is_finite() {
                lo[d] = 0.0;
            }
        }
        for l in lo.iter_mut().skip(dims) {
            *l = 0.0;
        }
        Space { lo, scale }
    }

    fn map(&self, p: &Coords, shift: f64) -> Coords {
        let p = shifted(p, shift);
        let mut out = [0.0; MAX_DIMS];
        for d in 0..MAX_DIMS {
            out[d] = (p[d] - self.lo[d]) * self.scale[d];
        }
        out
    }
}

fn shifted(p: &Coords, shift: f64) -> Coords {
    let mut p = *p;
    p[0] += shift;
    p
}

/// The sampled points of a frame, normalised, grouped by region when the feature set clusters
/// per region (else all in one group).
struct Targets<'f> {
    groups: BTreeMap<Option<Region<'f>>, Vec<(Coords, u32)>>,
}

impl<'f> Targets<'f> {
    fn new(frame: &'f Frame, space: &Space, shift: f64) -> Self {
        let per_region = frame.features == FeatureSet::OnCpuTimePerRegion;
        let mut groups: BTreeMap<Option<Region<'f>>, Vec<(Coords, u32)>> = BTreeMap::new();
        for c in &frame.clusters {
            for (p, &r) in c.points.iter().zip(&c.point_regions) {
                let key = per_region.then(|| {
                    let region = &c.regions[r as usize];
                    (&region.start, &region.end)
                });
                groups
                    .entry(key)
                    .or_default()
                    .push((space.map(p, shift), c.id));
            }
        }
        Targets { groups }
    }

    /// The id of the cluster holding the nearest point in `key`'s group, and the distance².
    fn nearest(&self, key: &Option<Region<'f>>, q: &Coords) -> Option<(u32, f64)> {
        let mut best: Option<(u32, f64)> = None;
        for (p, id) in self.groups.get(key)? {
            let d = distance2(p, q);
            if best.is_none_or(|(_, b)| d < b) {
                best = Some((*id, d));
            }
        }
        best
    }
}

/// E1 from `from` to `to`: per (from id, to id), the share of `from`'s sampled bursts whose
/// nearest sampled burst of `to` belongs to that cluster. Also the mean nearest distance.
fn displacement(
    from: &Frame,
    to: &Frame,
    space: &Space,
    shift_from: f64,
    shift_to: f64,
) -> (BTreeMap<(u32, u32), f64>, f64) {
    let per_region = from.features == FeatureSet::OnCpuTimePerRegion;
    let targets = Targets::new(to, space, shift_to);
    let mut shares = BTreeMap::new();
    let (mut distance_sum, mut distance_count) = (0.0, 0usize);
    for c in &from.clusters {
        let mut votes: BTreeMap<u32, u64> = BTreeMap::new();
        let mut total = 0u64;
        for (p, &r) in c.points.iter().zip(&c.point_regions) {
            let key = per_region.then(|| {
                let region = &c.regions[r as usize];
                (&region.start, &region.end)
            });
            if let Some((id, d2)) = targets.nearest(&key, &space.map(p, shift_from)) {
                *votes.entry(id).or_default() += 1;
                total += 1;
                distance_sum += d2.sqrt();
                distance_count += 1;
            }
        }
        for (id, v) in votes {
            shares.insert((c.id, id), v as f64 / total as f64);
        }
    }
    let mean = if distance_count == 0 {
        f64::INFINITY
    } else {
        distance_sum / distance_count as f64
    };
    (shares, mean)
}

/// E3 for one pair: the share of `a`'s bursts in regions `b` also runs; `None` when either has
/// no resolved region.
fn code_share(a: &TrackedCluster, b: &TrackedCluster) -> Option<f64> {
    if !a.regions.iter().any(resolved) || !b.regions.iter().any(resolved) {
        return None;
    }
    let b_regions: BTreeSet<Region<'_>> = b.regions.iter().map(|r| (&r.start, &r.end)).collect();
    let shared: u64 = a
        .regions
        .iter()
        .filter(|r| b_regions.contains(&(&r.start, &r.end)))
        .map(|r| r.bursts)
        .sum();
    Some(if a.bursts == 0 {
        0.0
    } else {
        shared as f64 / a.bursts as f64
    })
}

/// Whether any resolved region occurs in both frames.
fn share_resolved_region(a: &Frame, b: &Frame) -> bool {
    let a_regions: BTreeSet<Region<'_>> = a
        .clusters
        .iter()
        .flat_map(|c| c.regions.iter().filter(|r| resolved(r)))
        .map(|r| (&r.start, &r.end))
        .collect();
    b.clusters
        .iter()
        .flat_map(|c| c.regions.iter().filter(|r| resolved(r)))
        .any(|r| a_regions.contains(&(&r.start, &r.end)))
}

/// Context histograms (E4): per non-pivot cluster, counts of (last pivot before the burst, or
/// `u32::MAX` before any; bursts since it, capped).
type Contexts = BTreeMap<u32, BTreeMap<(u32, u32), u64>>;

fn contexts(frame: &Frame, pivot_of: &BTreeMap<u32, u32>, max_steps: u32) -> Contexts {
    let mut out: Contexts = BTreeMap::new();
    for sequence in &frame.sequences {
        let mut last = u32::MAX;
        let mut steps = 0u32;
        for &id in sequence {
            if let Some(&pivot) = pivot_of.get(&id) {
                last = pivot;
                steps = 0;
                continue;
            }
            steps = (steps + 1).min(max_steps);
            *out.entry(id).or_default().entry((last, steps)).or_default() += 1;
        }
    }
    out
}

/// Histogram intersection of two context distributions.
fn context_overlap(a: &BTreeMap<(u32, u32), u64>, b: &BTreeMap<(u32, u32), u64>) -> f64 {
    let ta: u64 = a.values().sum();
    let tb: u64 = b.values().sum();
    if ta == 0 || tb == 0 {
        return 0.0;
    }
    a.iter()
        .filter_map(|(k, &x)| {
            b.get(k)
                .map(|&y| (x as f64 / ta as f64).min(y as f64 / tb as f64))
        })
        .sum()
}

/// Connected components of a bipartite edge set, as (A ids, B ids), ordered by smallest A id.
fn components(edges: &BTreeSet<(u32, u32)>) -> Vec<(Vec<u32>, Vec<u32>)> {
    let mut adjacency: BTreeMap<(bool, u32), Vec<(bool, u32)>> = BTreeMap::new();
    for &(a, b) in edges {
        adjacency.entry((false, a)).or_default().push((true, b));
        adjacency.entry((true, b)).or_default().push((false, a));
    }
    let mut seen: BTreeSet<(bool, u32)> = BTreeSet::new();
    let mut out = Vec::new();
    for &start in adjacency.keys() {
        if !seen.insert(start) {
            continue;
        }
        let (mut a_side, mut b_side) = (Vec::new(), Vec::new());
        let mut stack = vec![start];
        while let Some(node) = stack.pop() {
            if node.0 {
                b_side.push(node.1);
            } else {
                a_side.push(node.1);
            }
            for &next in &adjacency[&node] {
                if seen.insert(next) {
                    stack.push(next);
                }
            }
        }
        a_side.sort_unstable();
        b_side.sort_unstable();
        out.push((a_side, b_side));
    }
    out.sort();
    out
}

/// Relates the clusters of two frames (the module docs give the pipeline). `shift_b` is added to
/// B's first feature before any distance (0 within a job; ln(ranks ratio) for strong scaling).
pub fn relate(a: &Frame, b: &Frame, params: &TrackingParams, shift_b: f64) -> Pairing {
    let threshold = params.outlier_share;
    let comparable_features = a.features == b.features && !a.clusters.is_empty();
    let (d_ab, d_ba) = if comparable_features && !b.clusters.is_empty() {
        let space = Space::joint(a, b, shift_b);
        (
            displacement(a, b, &space, 0.0, shift_b).0,
            displacement(b, a, &space, shift_b, 0.0).0,
        )
    } else {
        (BTreeMap::new(), BTreeMap::new())
    };
    let d_ba_of = |i: u32, j: u32| d_ba.get(&(j, i)).copied().unwrap_or(0.0);
    let d_ab_of = |i: u32, j: u32| d_ab.get(&(i, j)).copied().unwrap_or(0.0);

    // 1. Displacement, both directions.
    let mut edges: BTreeMap<(u32, u32), EdgeSource> = BTreeMap::new();
    for (&(i, j), &share) in &d_ab {
        if share >= threshold {
            edges.insert((i, j), EdgeSource::Displacement);
        }
    }
    for (&(j, i), &share) in &d_ba {
        if share >= threshold {
            edges.insert((i, j), EdgeSource::Displacement);
        }
    }

    // 2. SPMD simultaneity, one expansion step per side.
    let simultaneous_with = |frame: &Frame, id: u32| -> Vec<u32> {
        if frame.spmd_score < params.spmd_min_score {
            return Vec::new();
        }
        frame
            .simultaneous
            .iter()
            .filter(|s| s.a == id && s.share >= threshold)
            .map(|s| s.b)
            .collect()
    };
    let displaced: Vec<(u32, u32)> = edges.keys().copied().collect();
    for (i, j) in displaced {
        for l in simultaneous_with(a, i) {
            edges.entry((l, j)).or_insert(EdgeSource::Simultaneity);
        }
        for k in simultaneous_with(b, j) {
            edges.entry((i, k)).or_insert(EdgeSource::Simultaneity);
        }
    }

    // 3. Call-site pruning.
    let call_sites_compared = share_resolved_region(a, b);
    let code = |i: u32, j: u32| -> Option<f64> {
        if !call_sites_compared {
            return None;
        }
        let (ca, cb) = (a.cluster(i)?, b.cluster(j)?);
        Some((code_share(ca, cb)? + code_share(cb, ca)?) / 2.0)
    };
    if call_sites_compared {
        edges.retain(|&(i, j), _| code(i, j).is_none_or(|c| c > 0.0));
    }

    // 4. Components; 1:1 ones are pivots.
    let edge_set = |edges: &BTreeMap<(u32, u32), EdgeSource>| -> BTreeSet<(u32, u32)> {
        edges.keys().copied().collect()
    };
    let mut pivot_a: BTreeMap<u32, u32> = BTreeMap::new();
    let mut pivot_b: BTreeMap<u32, u32> = BTreeMap::new();
    for (n, (pa, pb)) in components(&edge_set(&edges))
        .into_iter()
        .filter(|(pa, pb)| pa.len() == 1 && pb.len() == 1)
        .enumerate()
    {
        pivot_a.insert(pa[0], n as u32);
        pivot_b.insert(pb[0], n as u32);
    }
    let contexts_a = contexts(a, &pivot_a, params.sequence_steps);
    let contexts_b = contexts(b, &pivot_b, params.sequence_steps);
    let sequence = |i: u32, j: u32| -> Option<f64> {
        if pivot_a.is_empty() {
            return None;
        }
        Some(context_overlap(contexts_a.get(&i)?, contexts_b.get(&j)?))
    };

    // 5. Sequence refinement of wide relations.
    for (pa, pb) in components(&edge_set(&edges)) {
        if pa.len() + pb.len() <= 2 {
            continue;
        }
        // Within the relation, the pairs E4 (and E3) support, if they cover every member and
        // split it: they replace the relation's edges.
        let supported: BTreeSet<(u32, u32)> = pa
            .iter()
            .flat_map(|&i| pb.iter().map(move |&j| (i, j)))
            .filter(|&(i, j)| sequence(i, j).is_some_and(|s| s >= threshold))
            .filter(|&(i, j)| code(i, j).is_none_or(|c| c > 0.0))
            .collect();
        let covers = pa.iter().all(|i| supported.iter().any(|e| e.0 == *i))
            && pb.iter().all(|j| supported.iter().any(|e| e.1 == *j));
        if covers && components(&supported).len() > 1 {
            edges.retain(|(i, j), _| {
                !(pa.contains(i) && pb.contains(j)) || supported.contains(&(*i, *j))
            });
            for e in supported {
                edges.entry(e).or_insert(EdgeSource::Sequence);
            }
            continue;
        }
        // Otherwise only drop the edges E4 contradicts, never a member's last one.
        let mut candidates: Vec<(f64, u32, u32)> = edges
            .keys()
            .filter(|(i, j)| pa.contains(i) && pb.contains(j))
            .filter_map(|&(i, j)| sequence(i, j).map(|s| (s, i, j)))
            .filter(|&(s, _, _)| s < threshold)
            .collect();
        candidates.sort_by(|x, y| x.0.total_cmp(&y.0).then((x.1, x.2).cmp(&(y.1, y.2))));
        for (_, i, j) in candidates {
            let degree_a = edges.keys().filter(|e| e.0 == i).count();
            let degree_b = edges.keys().filter(|e| e.1 == j).count();
            if degree_a > 1 && degree_b > 1 {
                edges.remove(&(i, j));
            }
        }
    }

    // 6. Rescue of long moves: code and sequence for clusters left without relation.
    if call_sites_compared {
        let matched_a: BTreeSet<u32> = edges.keys().map(|e| e.0).collect();
        let matched_b: BTreeSet<u32> = edges.keys().map(|e| e.1).collect();
        let space =
            (comparable_features && !b.clusters.is_empty()).then(|| Space::joint(a, b, shift_b));
        let centroid_distance = |i: u32, j: u32| -> f64 {
            let (Some(space), Some(ca), Some(cb)) = (&space, a.cluster(i), b.cluster(j)) else {
                return f64::INFINITY;
            };
            let to_coords = |v: &[f64]| {
                let mut c = [0.0; MAX_DIMS];
                for (d, &x) in v.iter().take(MAX_DIMS).enumerate() {
                    c[d] = x;
                }
                c
            };
            distance2(
                &space.map(&to_coords(&ca.centroid), 0.0),
                &space.map(&to_coords(&cb.centroid), shift_b),
            )
        };
        let mut candidates: Vec<(bool, f64, f64, f64, u32, u32)> = Vec::new();
        for ca in &a.clusters {
            for cb in &b.clusters {
                let (i, j) = (ca.id, cb.id);
                let both = !matched_a.contains(&i) && !matched_b.contains(&j);
                let either = !matched_a.contains(&i) || !matched_b.contains(&j);
                if !either {
                    continue;
                }
                let Some(shared) = code(i, j).filter(|&c| c > 0.0) else {
                    continue;
                };
                let position = sequence(i, j);
                if position.is_some_and(|s| s < threshold) {
                    continue;
                }
                candidates.push((
                    both,
                    shared,
                    position.unwrap_or(0.0),
                    centroid_distance(i, j),
                    i,
                    j,
                ));
            }
        }
        candidates.sort_by(|x, y| {
            y.0.cmp(&x.0)
                .then(y.1.total_cmp(&x.1))
                .then(y.2.total_cmp(&x.2))
                .then(x.3.total_cmp(&y.3))
                .then((x.4, x.5).cmp(&(y.4, y.5)))
        });
        let (mut now_a, mut now_b) = (matched_a, matched_b);
        for (_, _, _, _, i, j) in candidates {
            if !now_a.contains(&i) || !now_b.contains(&j) {
                edges.insert((i, j), EdgeSource::CodeAndSequence);
                now_a.insert(i);
                now_b.insert(j);
            }
        }
    }

    let relations: Vec<Relation> = components(&edge_set(&edges))
        .into_iter()
        .map(|(pa, pb)| {
            let relation_edges = edges
                .iter()
                .filter(|((i, j), _)| pa.contains(i) && pb.contains(j))
                .map(|(&(i, j), &source)| Edge {
                    a: i,
                    b: j,
                    source,
                    displacement_ab: d_ab_of(i, j),
                    displacement_ba: d_ba_of(i, j),
                    code: code(i, j),
                    sequence: sequence(i, j),
                })
                .collect();
            Relation {
                a: pa,
                b: pb,
                edges: relation_edges,
            }
        })
        .collect();
    let related_a: BTreeSet<u32> = relations.iter().flat_map(|r| r.a.clone()).collect();
    let related_b: BTreeSet<u32> = relations.iter().flat_map(|r| r.b.clone()).collect();
    Pairing {
        relations,
        unmatched_a: a
            .clusters
            .iter()
            .map(|c| c.id)
            .filter(|id| !related_a.contains(id))
            .collect(),
        unmatched_b: b
            .clusters
            .iter()
            .map(|c| c.id)
            .filter(|id| !related_b.contains(id))
            .collect(),
        call_sites_compared,
    }
}

/// The largest change between two centroids in raw log space: |Δ| of log features, |Δ ln| of
/// IPC (absolute difference when an IPC is not positive). `shift_b` as for [`relate`].
fn centroid_move(features: FeatureSet, a: &[f64], b: &[f64], shift_b: f64) -> f64 {
    let mut largest: f64 = 0.0;
    for (d, name) in features.names().iter().enumerate() {
        let (Some(&x), Some(&y)) = (a.get(d), b.get(d)) else {
            continue;
        };
        let change = if d == 0 {
            (y + shift_b - x).abs()
        } else if *name == "ipc" && x > 0.0 && y > 0.0 {
            (y / x).ln().abs()
        } else {
            (y - x).abs()
        };
        largest = largest.max(change);
    }
    largest
}

// ---------------------------------------------------------------------------------------------
// Stable identities within a job.
// ---------------------------------------------------------------------------------------------

/// What happened to tracked clusters between two frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// A cluster without any relation to an earlier one: `to` is its new id.
    Appear,
    /// A cluster absent for `vanish_after_windows` closed windows: `from` is its id.
    Vanish,
    /// One cluster became several: `from` is the old id, `to` the parts (the old id first, on
    /// the part that continues it, then the new ids).
    Split,
    /// Several clusters became one: `from` are the old ids, `to` the id kept.
    Merge,
    /// A cluster kept its id but its centroid moved beyond the move threshold.
    Moved,
}

/// A tracking event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrackingEvent {
    /// The window (Unix time ÷ window length) of the frame where it was seen.
    pub window: u64,
    /// Whether that frame was a re-clustering of an open window.
    pub partial: bool,
    pub kind: EventKind,
    pub from: Vec<StableId>,
    pub to: Vec<StableId>,
    /// For `Moved`: the centroid change in raw log space.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distance: Option<f64>,
    /// For `Vanish`: the last window the cluster was seen in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_seen_window: Option<u64>,
}

/// Exact counts of events by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventCounts {
    pub appear: u64,
    pub vanish: u64,
    pub split: u64,
    pub merge: u64,
    pub moved: u64,
}

impl EventCounts {
    pub(crate) fn count(&mut self, kind: EventKind) {
        match kind {
            EventKind::Appear => self.appear += 1,
            EventKind::Vanish => self.vanish += 1,
            EventKind::Split => self.split += 1,
            EventKind::Merge => self.merge += 1,
            EventKind::Moved => self.moved += 1,
        }
    }

    pub fn total(&self) -> u64 {
        self.appear + self.vanish + self.split + self.merge + self.moved
    }
}

/// A live id: its latest cluster model and when it was seen.
#[derive(Clone, Debug)]
struct Live {
    cluster: TrackedCluster,
    /// Its centroid when the id was given or last reported as moved: a phase that drifts a
    /// little every window (a change that falls inside a window shows up half-way first) is
    /// reported once its total move passes the threshold.
    anchor: Vec<f64>,
    last_seen: u64,
    /// Closed windows since it was last seen.
    missed: u32,
    /// Merged into another cluster (reported), kept only for a later split to revive.
    merged: bool,
}

impl Live {
    fn is_active(&self) -> bool {
        self.missed == 0 && !self.merged
    }
}

/// The result of one [`Tracker::update`].
#[derive(Clone, Debug, PartialEq)]
pub struct TrackUpdate {
    /// Frame cluster id → stable id, for every cluster of the frame.
    pub ids: BTreeMap<u32, StableId>,
    pub events: Vec<TrackingEvent>,
}

/// Assigns stable ids to the clusters of successive frames of one job.
#[derive(Clone, Debug)]
pub struct Tracker {
    params: TrackingParams,
    next_id: StableId,
    live: BTreeMap<StableId, Live>,
    /// The last frame, in stable ids (for its sequences and simultaneities).
    last: Option<Frame>,
    events: VecDeque<TrackingEvent>,
    events_dropped: u64,
    counts: EventCounts,
}

impl Tracker {
    pub fn new(params: TrackingParams) -> Result<Self, TrackingError> {
        params.validate()?;
        Ok(Tracker {
            params,
            next_id: 1,
            live: BTreeMap::new(),
            last: None,
            events: VecDeque::new(),
            events_dropped: 0,
            counts: EventCounts::default(),
        })
    }

    pub fn params(&self) -> &TrackingParams {
        &self.params
    }

    /// The last [`TrackingParams::max_events`] events, oldest first.
    pub fn events(&self) -> impl Iterator<Item = &TrackingEvent> {
        self.events.iter()
    }

    /// Events no longer in the list.
    pub fn events_dropped(&self) -> u64 {
        self.events_dropped
    }

    pub fn counts(&self) -> EventCounts {
        self.counts
    }

    /// Ids alive (active or dormant).
    pub fn live_ids(&self) -> impl Iterator<Item = StableId> + '_ {
        self.live.keys().copied()
    }

    /// Ids not seen in the last closed window, or merged into another, but not yet expired:
    /// a cluster in the same place may still revive them.
    pub fn dormant_ids(&self) -> impl Iterator<Item = StableId> + '_ {
        self.live
            .iter()
            .filter(|(_, l)| !l.is_active())
            .map(|(&id, _)| id)
    }

    /// Ids of the clusters seen in the last frame or carried over a partial one.
    pub fn active_ids(&self) -> impl Iterator<Item = StableId> + '_ {
        self.live
            .iter()
            .filter(|(_, l)| l.is_active())
            .map(|(&id, _)| id)
    }

    /// Tracks `frame`, the clustering of `window` (`closed`: the whole window; else a
    /// re-clustering of the open window). Returns the stable id of each of its clusters and the
    /// events.
    pub fn update(&mut self, window: u64, frame: &Frame, closed: bool) -> TrackUpdate {
        let mut ids: BTreeMap<u32, StableId> = BTreeMap::new();
        let mut events: Vec<TrackingEvent> = Vec::new();
        let event = |kind, from: Vec<StableId>, to: Vec<StableId>| TrackingEvent {
            window,
            partial: !closed,
            kind,
            from,
            to,
            distance: None,
            last_seen_window: None,
        };
        let relevant_share = self.params.relevant_time_share;
        let is_relevant = move |c: &TrackedCluster| c.time_share >= relevant_share;
        let new_relevant = |id: u32| frame.cluster(id).is_some_and(is_relevant);
        let (move_threshold, outlier_share) =
            (self.params.move_threshold, self.params.outlier_share);

        // Against the active clusters (with the last frame's sequences and simultaneities).
        let active: BTreeSet<StableId> = self
            .live
            .iter()
            .filter(|(_, l)| l.is_active())
            .map(|(&id, _)| id)
            .collect();
        let reference = self.reference(&active, true);
        let pairing = relate(&reference, frame, &self.params, 0.0);
        let same_features = reference.features == frame.features;

        /// A split decided before the new ids are known.
        struct Split {
            parent: StableId,
            heir: Option<u32>,
            parts: Vec<u32>,
            significant: BTreeSet<u32>,
        }
        /// A merge: `parts` (old ids, significant ones only) into the new cluster `child`.
        struct Merge {
            child: u32,
            parts: Vec<StableId>,
        }
        let mut splits: Vec<Split> = Vec::new();
        let mut merges: Vec<Merge> = Vec::new();
        let mut retired: BTreeSet<StableId> = BTreeSet::new();
        let mut without_id: Vec<u32> = Vec::new();
        let mut reanchored: BTreeSet<StableId> = BTreeSet::new();

        for relation in &pairing.relations {
            let edge = |i: u32, j: u32| relation.edges.iter().find(|e| e.a == i && e.b == j);
            let affinity_ab = |i: u32, j: u32| edge(i, j).map_or(0.0, |e| e.displacement_ab);
            let affinity_ba = |i: u32, j: u32| edge(i, j).map_or(0.0, |e| e.displacement_ba);
            let old = |i: u32| {
                reference
                    .cluster(i)
                    .expect("related ids are in the reference")
            };
            let new = |j: u32| frame.cluster(j).expect("related ids are in the frame");
            let moved = |i: u32, j: u32| {
                same_features
                    .then(|| centroid_move(frame.features, &old(i).centroid, &new(j).centroid, 0.0))
            };
            // A part of a split or merge counts when it is relevant and holds at least the
            // outlier share of its side of the relation (the 5 % rule of Llort et al. (2013) for a
            // split row).
            let time_a: u64 = relation.a.iter().map(|&i| old(i).time_ns).sum();
            let time_b: u64 = relation.b.iter().map(|&j| new(j).time_ns).sum();
            let significant_old = |i: u32| {
                is_relevant(old(i)) && old(i).time_ns as f64 >= outlier_share * time_a as f64
            };
            let significant_new =
                |j: u32| new_relevant(j) && new(j).time_ns as f64 >= outlier_share * time_b as f64;
            let any_significant_new = relation.b.iter().any(|&j| significant_new(j));
            // A cluster that stayed where the old one was continues it, unless it is a remnant:
            // when a phase changes at the start of a window, a few bursts of the old behaviour
            // stay behind while the bulk moves, and the bulk is what continues the phase.
            let stayed = |i: u32, j: u32| {
                moved(i, j).is_some_and(|d| d <= move_threshold)
                    && (significant_new(j) || !any_significant_new)
            };

            // 1. Continuations: an old cluster and a new one that stayed where it was, by E1
            //    affinity (both directions), then the smaller move.
            let mut heir_of: BTreeMap<u32, u32> = BTreeMap::new(); // old id → new local id
            let mut taken: BTreeSet<u32> = BTreeSet::new();
            let mut pairs: Vec<(f64, f64, u32, u32)> = Vec::new();
            for &i in &relation.a {
                for &j in &relation.b {
                    if stayed(i, j) {
                        let d = moved(i, j).unwrap_or(0.0);
                        pairs.push((affinity_ab(i, j) + affinity_ba(i, j), d, i, j));
                    }
                }
            }
            pairs.sort_by(|x, y| {
                y.0.total_cmp(&x.0)
                    .then(x.1.total_cmp(&y.1))
                    .then((x.2, x.3).cmp(&(y.2, y.3)))
            });
            for &(_, _, i, j) in &pairs {
                if !heir_of.contains_key(&i) && !taken.contains(&j) {
                    heir_of.insert(i, j);
                    taken.insert(j);
                }
            }
            // Of the old clusters that stayed where a new one is, the oldest id continues it (ids
            // grow with time): a phase that shed a part for a window and takes it back keeps its
            // own id, and the part's id merges into it.
            for &(_, _, i, j) in &pairs {
                let heir = heir_of.iter().find(|&(_, &h)| h == j).map(|(&old, _)| old);
                if let Some(heir) = heir.filter(|&heir| i < heir && !heir_of.contains_key(&i)) {
                    heir_of.remove(&heir);
                    heir_of.insert(i, j);
                }
            }
            // 2. Moves: old clusters without a continuation and new clusters near no old one
            //    are paired by the time they hold (the bulk of a phase continues it).
            let lonely_old: Vec<u32> = relation
                .a
                .iter()
                .copied()
                .filter(|&i| relation.b.iter().all(|&j| !stayed(i, j)))
                .collect();
            let lonely_new: Vec<u32> = relation
                .b
                .iter()
                .copied()
                .filter(|&j| relation.a.iter().all(|&i| !stayed(i, j)))
                .collect();
            let mut pairs: Vec<(u64, f64, u32, u32)> = Vec::new();
            for &i in &lonely_old {
                for &j in &lonely_new {
                    let bulk = old(i).time_ns.min(new(j).time_ns);
                    pairs.push((bulk, affinity_ab(i, j) + affinity_ba(i, j), i, j));
                }
            }
            pairs.sort_by(|x, y| {
                y.0.cmp(&x.0)
                    .then(y.1.total_cmp(&x.1))
                    .then((x.2, x.3).cmp(&(y.2, y.3)))
            });
            for (_, _, i, j) in pairs {
                if !heir_of.contains_key(&i) && !taken.contains(&j) {
                    heir_of.insert(i, j);
                    taken.insert(j);
                }
            }
            for (&i, &j) in &heir_of {
                ids.insert(j, i);
                let drift = same_features
                    .then(|| self.live.get(&i))
                    .flatten()
                    .map(|l| centroid_move(frame.features, &l.anchor, &new(j).centroid, 0.0));
                let distance = moved(i, j).unwrap_or(0.0).max(drift.unwrap_or(0.0));
                if distance > move_threshold && (is_relevant(old(i)) || new_relevant(j)) {
                    let mut event = event(EventKind::Moved, vec![i], vec![i]);
                    event.distance = Some(distance);
                    events.push(event);
                    reanchored.insert(i);
                }
            }

            // 3. Leftover new clusters split off the old cluster most of their bursts are
            //    nearest to; their ids are decided below.
            let mut split_parts: BTreeMap<StableId, Vec<u32>> = BTreeMap::new();
            for &j in &relation.b {
                if ids.contains_key(&j) {
                    continue;
                }
                without_id.push(j);
                let parent = relation
                    .a
                    .iter()
                    .copied()
                    .max_by(|&x, &y| {
                        affinity_ba(x, j)
                            .total_cmp(&affinity_ba(y, j))
                            .then(old(x).time_ns.cmp(&old(y).time_ns))
                            .then(y.cmp(&x))
                    })
                    .expect("a relation has an A side");
                split_parts.entry(parent).or_default().push(j);
            }
            for (parent, parts) in split_parts {
                let heir = heir_of.get(&parent).copied();
                let significant = heir
                    .iter()
                    .chain(&parts)
                    .copied()
                    .filter(|&j| significant_new(j))
                    .collect();
                splits.push(Split {
                    parent,
                    heir,
                    parts,
                    significant,
                });
            }
            // 4. Leftover old clusters retire, merged into the new cluster most of their bursts
            //    are nearest to.
            let mut merged_into: BTreeMap<u32, Vec<StableId>> = BTreeMap::new();
            for &i in &relation.a {
                if heir_of.contains_key(&i) {
                    continue;
                }
                retired.insert(i);
                let child = relation
                    .b
                    .iter()
                    .copied()
                    .max_by(|&x, &y| {
                        affinity_ab(i, x)
                            .total_cmp(&affinity_ab(i, y))
                            .then(new(x).time_ns.cmp(&new(y).time_ns))
                            .then(y.cmp(&x))
                    })
                    .expect("a relation has a B side");
                merged_into.entry(child).or_default().push(i);
            }
            for (child, mut parts) in merged_into {
                if let Some((&heir, _)) = heir_of.iter().find(|(_, &j)| j == child) {
                    parts.push(heir);
                }
                parts.retain(|&i| significant_old(i));
                parts.sort_unstable();
                merges.push(Merge { child, parts });
            }
        }

        // New clusters without an id (unrelated ones and split parts) revive a dormant id when
        // they relate 1:1 to it and stayed where it was; else they get a new id.
        without_id.extend(pairing.unmatched_b.iter().copied());
        without_id.sort_unstable();
        let dormant: BTreeSet<StableId> = self
            .live
            .iter()
            .filter(|(id, l)| !l.is_active() && !retired.contains(id))
            .map(|(&id, _)| id)
            .collect();
        if !dormant.is_empty() && !without_id.is_empty() {
            let reference = self.reference(&dormant, false);
            let candidates = frame.restricted(&without_id.iter().copied().collect());
            let revival = relate(&reference, &candidates, &self.params, 0.0);
            for relation in revival.relations {
                if let ([i], [j]) = (&relation.a[..], &relation.b[..]) {
                    let (old, new) = (reference.cluster(*i), frame.cluster(*j));
                    let stayed = old.zip(new).is_some_and(|(old, new)| {
                        reference.features == frame.features
                            && centroid_move(frame.features, &old.centroid, &new.centroid, 0.0)
                                <= move_threshold
                    });
                    if stayed {
                        ids.insert(*j, *i);
                    }
                }
            }
        }
        for &j in &without_id {
            if let std::collections::btree_map::Entry::Vacant(slot) = ids.entry(j) {
                let id = self.next_id;
                self.next_id = id.checked_add(1).expect("fewer than 2³² clusters per job");
                slot.insert(id);
                if pairing.unmatched_b.contains(&j) && new_relevant(j) {
                    events.push(event(EventKind::Appear, vec![], vec![id]));
                }
            }
        }
        for split in splits {
            if split.significant.len() >= 2 {
                let to = split
                    .heir
                    .iter()
                    .chain(&split.parts)
                    .filter(|j| split.significant.contains(j))
                    .map(|j| ids[j])
                    .collect();
                events.push(event(EventKind::Split, vec![split.parent], to));
            }
        }
        for merge in merges {
            if merge.parts.len() >= 2 {
                events.push(event(
                    EventKind::Merge,
                    merge.parts,
                    vec![ids[&merge.child]],
                ));
            }
        }

        // Update the live set: merged ids stay dormant (a later split may revive them) but
        // expire without a vanish event, since their merge was reported.
        for id in &retired {
            if let Some(live) = self.live.get_mut(id) {
                live.merged = true;
            }
        }
        let seen: BTreeSet<StableId> = ids.values().copied().collect();
        let mut vanished: Vec<StableId> = Vec::new();
        for (&id, live) in self.live.iter_mut() {
            if seen.contains(&id) || !closed {
                continue;
            }
            live.missed += 1;
            if live.missed >= self.params.vanish_after_windows {
                vanished.push(id);
            }
        }
        for (&j, &id) in &ids {
            let cluster = TrackedCluster {
                id,
                ..frame.cluster(j).expect("ids map frame clusters").clone()
            };
            let anchor = match self.live.get(&id) {
                Some(live)
                    if !reanchored.contains(&id) && live.anchor.len() == cluster.centroid.len() =>
                {
                    live.anchor.clone()
                }
                _ => cluster.centroid.clone(),
            };
            self.live.insert(
                id,
                Live {
                    cluster,
                    anchor,
                    last_seen: window,
                    missed: 0,
                    merged: false,
                },
            );
        }
        while self.live.len() - vanished.len() > self.params.max_phases {
            let oldest = self
                .live
                .iter()
                .filter(|(id, l)| !l.is_active() && !vanished.contains(id))
                .min_by_key(|(&id, l)| (l.last_seen, id))
                .map(|(&id, _)| id);
            match oldest {
                Some(id) => vanished.push(id),
                None => break,
            }
        }
        vanished.sort_unstable();
        for id in vanished {
            let live = self.live.remove(&id).expect("vanished ids are live");
            if is_relevant(&live.cluster) && !live.merged {
                let mut gone = event(EventKind::Vanish, vec![id], vec![]);
                gone.last_seen_window = Some(live.last_seen);
                events.push(gone);
            }
        }
        self.last = Some(frame.relabelled(&ids));

        for e in &events {
            self.counts.count(e.kind);
            self.events.push_back(e.clone());
        }
        while self.events.len() > self.params.max_events {
            self.events.pop_front();
            self.events_dropped += 1;
        }
        TrackUpdate { ids, events }
    }

    /// A frame of the live clusters in `ids`, with the last frame's sequences and
    /// simultaneities when `with_sequences`.
    fn reference(&self, ids: &BTreeSet<StableId>, with_sequences: bool) -> Frame {
        let clusters = ids.iter().map(|id| self.live[id].cluster.clone()).collect();
        match &self.last {
            Some(last) => Frame {
                clusters,
                simultaneous: if with_sequences {
                    last.simultaneous
                        .iter()
                        .filter(|s| ids.contains(&s.a) && ids.contains(&s.b))
                        .copied()
                        .collect()
                } else {
                    Vec::new()
                },
                sequences: if with_sequences {
                    last.sequences
                        .iter()
                        .map(|s| s.iter().copied().filter(|id| ids.contains(id)).collect())
                        .collect()
                } else {
                    Vec::new()
                },
                ..last.clone_header()
            },
            None => Frame {
                features: FeatureSet::InstructionsIpc,
                ranks: 0,
                spmd_score: 0.0,
                time_ns: 0,
                clusters,
                simultaneous: Vec::new(),
                sequences: Vec::new(),
            },
        }
    }
}

impl Frame {
    /// The frame's scalar fields, without clusters, sequences or simultaneities.
    fn clone_header(&self) -> Frame {
        Frame {
            features: self.features,
            ranks: self.ranks,
            spmd_score: self.spmd_score,
            time_ns: self.time_ns,
            clusters: Vec::new(),
            simultaneous: Vec::new(),
            sequences: Vec::new(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Across runs.
// ---------------------------------------------------------------------------------------------

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
mod tests {
    use super::*;
    use crate::analysis::synthetic::{Phase, SyntheticJob};
    use crate::analysis::{analyse, AnalysisParams};

    /// E1's loop (`e1_job` of the analysis tests): 10⁶, 5·10⁶ and 2·10⁷ instructions at IPC 2.0,
    /// 0.6, 1.2.
    fn job(ranks: u32, phases: &[(f64, f64)], seed: u64) -> SyntheticJob {
        SyntheticJob {
            ranks,
            iterations: 50,
            phases: phases
                .iter()
                .map(|&(instructions, ipc)| Phase::new(instructions, ipc, 0.03))
                .collect(),
            tiny_bursts_per_phase: 2,
            outlier_share: 0.0,
            counters: true,
            seed,
        }
    }

    const E1: [(f64, f64); 3] = [(1e6, 2.0), (5e6, 0.6), (2e7, 1.2)];

    fn app() -> AppIdentity {
        AppIdentity {
            build_id: Some("0123456789abcdef".into()),
            executable: "/opt/app/bin/solver".into(),
        }
    }

    fn signature(job: &SyntheticJob) -> RunSignature {
        let bursts = job.bursts();
        let analysis = analyse(&bursts, job.ranks, &AnalysisParams::default()).unwrap();
        RunSignature::from_analysis(app(), "run", &analysis, &bursts, &TrackingParams::default())
            .unwrap()
    }

    /// The synthetic phase of a cluster: phase k starts at the collective at offset 0x1000·k.
    fn phase(frame: &Frame, id: u32) -> u64 {
        frame.cluster(id).unwrap().regions[0].start.offset / 0x1000
    }

    /// Asserts every phase of both runs is matched 1:1 with the same phase, and nothing else.
    fn assert_phase_for_phase(a: &RunSignature, b: &RunSignature, m: &RunMatch, phases: usize) {
        assert_eq!(m.phases.len(), phases, "{m:#?}");
        assert!(
            m.unmatched_a.is_empty() && m.unmatched_b.is_empty(),
            "{m:#?}"
        );
        for p in &m.phases {
            assert_eq!(p.kind, MatchKind::OneToOne, "{p:#?}");
            assert_eq!(phase(&a.frame, p.a[0]), phase(&b.frame, p.b[0]), "{p:#?}");
        }
        assert_eq!(m.coverage, 1.0);
        assert!(m.call_sites_compared && m.same_application);
    }

    #[test]
    fn two_and_four_ranks_of_one_program_match_phase_for_phase() {
        let a = signature(&job(2, &E1, 1));
        let b = signature(&job(4, &E1, 2));
        assert_eq!((a.frame.ranks, b.frame.ranks), (2, 4));
        let m = match_runs(&a, &b, &TrackingParams::default());
        assert_phase_for_phase(&a, &b, &m, 3);
        // Same work per rank (weak scaling): no instruction scaling, and flat trends.
        assert_eq!(m.scaling, InstructionScaling::None);
        let (plain, scaled) = m.scaling_evidence.unwrap();
        assert!(plain < scaled);
        for p in &m.phases {
            let t = &p.trend;
            assert!(t.duration_mean_change.abs() < 0.03, "{t:#?}");
            assert!(t.instructions_change.unwrap().abs() < 0.03, "{t:#?}");
            assert!(t.ipc_change.unwrap().abs() < 0.03, "{t:#?}");
            assert!(
                (t.instructions_scaled_change.unwrap() - 1.0).abs() < 0.06,
                "{t:#?}"
            );
            assert!(t.time_share_change.abs() < 0.02, "{t:#?}");
            assert_eq!((t.a.bursts, t.b.bursts), (100, 200));
            assert!(p.moved.unwrap() < 0.05);
            // Evidence: displacement in both directions and shared code.
            assert!(p
                .edges
                .iter()
                .all(|e| e.displacement_ab > 0.9 && e.code == Some(1.0)));
        }
        // And the other way round.
        let back = match_runs(&b, &a, &TrackingParams::default());
        assert_phase_for_phase(&b, &a, &back, 3);
    }

    #[test]
    fn strong_scaling_is_recognised_and_trends_show_it() {
        // Four ranks doing half the work each: instructions ÷ 2 per burst.
        let halved: Vec<(f64, f64)> = E1.iter().map(|&(i, ipc)| (i / 2.0, ipc)).collect();
        let a = signature(&job(2, &E1, 3));
        let b = signature(&job(4, &halved, 4));
        let m = match_runs(&a, &b, &TrackingParams::default());
        assert_phase_for_phase(&a, &b, &m, 3);
        assert_eq!(m.scaling, InstructionScaling::ByRanks);
        for p in &m.phases {
            let t = &p.trend;
            assert!(
                (t.instructions_change.unwrap() + 0.5).abs() < 0.03,
                "{t:#?}"
            );
            assert!(t.instructions_scaled_change.unwrap().abs() < 0.03, "{t:#?}");
            assert!((t.duration_mean_change + 0.5).abs() < 0.03, "{t:#?}");
            assert!(t.ipc_change.unwrap().abs() < 0.03, "{t:#?}");
        }
    }

    #[test]
    fn a_long_move_is_resolved_by_call_sites_and_sequence() {
        // A compiler change (Llort et al. (2013), §4.1): phase 0 now retires 16× the instructions
        // at half the IPC, which puts it next to phase 2 and far from where it was. Displacement
        // alone relates it to phase 2; pruning by call site removes that, and the rescue by shared
        // code and sequence position finds it.
        let moved = [(1.6e7, 1.0), (5e6, 0.6), (2e7, 1.2)];
        let a = signature(&job(4, &E1, 5));
        let b = signature(&job(4, &moved, 6));
        assert_eq!(
            b.frame.clusters.len(),
            3,
            "the moved phase stays a cluster of its own"
        );
        let m = match_runs(&a, &b, &TrackingParams::default());
        assert_phase_for_phase(&a, &b, &m, 3);
        let p0 = m
            .phases
            .iter()
            .find(|p| phase(&a.frame, p.a[0]) == 0)
            .unwrap();
        assert_eq!(p0.edges.len(), 1);
        assert_eq!(p0.edges[0].source, EdgeSource::CodeAndSequence);
        assert_eq!(p0.edges[0].sequence, Some(1.0));
        assert!(p0.moved.unwrap() > 2.0);
        let t = &p0.trend;
        assert!(
            (t.instructions_change.unwrap() - 15.0).abs() < 0.5,
            "{t:#?}"
        );
        assert!((t.ipc_change.unwrap() + 0.5).abs() < 0.03, "{t:#?}");
    }

    #[test]
    fn a_different_build_matches_on_behaviour_alone() {
        // Another build: every call site differs, so nothing prunes; the phases, distinct in
        // behaviour, still match by displacement.
        let a = signature(&job(2, &E1, 7));
        let mut b = signature(&job(2, &E1, 8));
        b.app.build_id = Some("fedcba".into());
        for c in &mut b.frame.clusters {
            for r in &mut c.regions {
                r.start.offset += 0x10;
                r.end.offset += 0x10;
            }
        }
        let m = match_runs(&a, &b, &TrackingParams::default());
        assert!(!m.call_sites_compared && !m.same_application);
        assert_eq!(m.phases.len(), 3);
        assert!(m.phases.iter().all(|p| p.kind == MatchKind::OneToOne));
        assert!(m.phases.iter().all(|p| p.edges[0].code.is_none()));
    }

    #[test]
    fn signatures_round_trip_and_stay_small() {
        let s = signature(&job(4, &E1, 9));
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.len() < 64 * 1024, "{} bytes", json.len());
        let parsed: RunSignature = serde_json::from_str(&json).unwrap();
        assert_eq!(parsed.frame.clusters.len(), 3);
        assert_eq!(parsed.frame.sequences, s.frame.sequences);
        let m = match_runs(&s, &parsed, &TrackingParams::default());
        assert_phase_for_phase(&s, &parsed, &m, 3);
    }

    /// A frame from per-rank sequences of cluster ids, one region per cluster (region = id), all
    /// clusters at the same point in feature space (so displacement cannot tell them apart).
    fn sequence_frame(sequences: Vec<Vec<u32>>) -> Frame {
        let ids: BTreeSet<u32> = sequences.iter().flatten().copied().collect();
        let site = |offset| CallSite {
            module: "app".into(),
            offset,
        };
        Frame {
            features: FeatureSet::InstructionsIpc,
            ranks: sequences.len() as u32,
            spmd_score: 1.0,
            time_ns: 0,
            clusters: ids
                .iter()
                .map(|&id| TrackedCluster {
                    id,
                    bursts: 10,
                    time_ns: 10,
                    time_share: 0.1,
                    centroid: vec![10.0, 1.0],
                    points: vec![[10.0, 1.0, 0.0]],
                    point_regions: vec![0],
                    regions: vec![RegionCount {
                        start: site(u64::from(id)),
                        end: site(0),
                        bursts: 10,
                    }],
                    instructions_mean: None,
                    ipc: None,
                    spmd_score: 1.0,
                    lb_duration: 1.0,
                })
                .collect(),
            simultaneous: Vec::new(),
            sequences,
        }
    }

    #[test]
    fn fig5_sequence_pivots() {
        // Llort et al. (2013), Fig. 5: A = 1 2 3 1 2 3, B = 2 3 4 2 3 4, pivot 1 → 2: then 2 → 3
        // and 3 → 4.
        let a = sequence_frame(vec![vec![1, 2, 3, 1, 2, 3]]);
        let b = sequence_frame(vec![vec![2, 3, 4, 2, 3, 4]]);
        let ca = contexts(&a, &BTreeMap::from([(1, 0)]), 16);
        let cb = contexts(&b, &BTreeMap::from([(2, 0)]), 16);
        assert_eq!(context_overlap(&ca[&2], &cb[&3]), 1.0);
        assert_eq!(context_overlap(&ca[&3], &cb[&4]), 1.0);
        assert_eq!(context_overlap(&ca[&2], &cb[&4]), 0.0);
        assert_eq!(context_overlap(&ca[&3], &cb[&3]), 0.0);
    }

    #[test]
    fn sequence_splits_a_wide_relation() {
        // The A11/A12 → B12/B15 case of Llort et al. (2013), §3.1: displacement relates everything
        // to everything (all clusters sit on one point), and code does not separate 2 and 3 from
        // 20 and 30 (shared regions), but the sequence with pivot 1 ≡ 10 does.
        let mut a = sequence_frame(vec![vec![1, 2, 3, 1, 2, 3]; 2]);
        let mut b = sequence_frame(vec![vec![10, 20, 30, 10, 20, 30]; 2]);
        let region = |frame: &Frame, id: u32| frame.cluster(id).unwrap().regions.clone();
        let (r1, r2) = (region(&a, 1), region(&a, 2));
        let shared = vec![r2[0].clone(), region(&a, 3)[0].clone()];
        for c in &mut a.clusters {
            c.regions = if c.id == 1 {
                r1.clone()
            } else {
                shared.clone()
            };
        }
        for c in &mut b.clusters {
            c.regions = if c.id == 10 {
                r1.clone()
            } else {
                shared.clone()
            };
        }
        // Make 1 and 10 a clean pivot: move them apart from the rest in feature space.
        for frame in [&mut a, &mut b] {
            for c in &mut frame.clusters {
                if c.id == 1 || c.id == 10 {
                    c.points = vec![[20.0, 3.0, 0.0]];
                    c.centroid = vec![20.0, 3.0];
                }
            }
        }
        let pairing = relate(&a, &b, &TrackingParams::default(), 0.0);
        let relations: Vec<(Vec<u32>, Vec<u32>)> = pairing
            .relations
            .iter()
            .map(|r| (r.a.clone(), r.b.clone()))
            .collect();
        assert_eq!(
            relations,
            vec![
                (vec![1], vec![10]),
                (vec![2], vec![20]),
                (vec![3], vec![30])
            ]
        );
    }

    #[test]
    fn coverage_counts_relations_over_relevant_objects() {
        // A split lowers coverage: 2 relations for max(2, 3) objects.
        let a = signature(&job(4, &E1[..2], 10));
        let mut bimodal = job(4, &E1[..2], 11);
        bimodal.phases[1].odd_iteration_factor = 1.3;
        let b = signature(&bimodal);
        assert_eq!((a.frame.clusters.len(), b.frame.clusters.len()), (2, 3));
        let m = match_runs(&a, &b, &TrackingParams::default());
        assert_eq!(m.phases.len(), 2);
        let split = m
            .phases
            .iter()
            .find(|p| p.kind == MatchKind::Split)
            .unwrap();
        assert_eq!(split.b.len(), 2);
        assert!((m.coverage - 2.0 / 3.0).abs() < 1e-12);
    }

    /// A frame of clusters given as (id, ln instructions, region offset, time), each a small
    /// cloud of 9 points at IPC 1, in one rank sequence cycling through them.
    fn cloud_frame(clusters: &[(u32, f64, u64, u64)]) -> Frame {
        let total: u64 = clusters.iter().map(|c| c.3).sum();
        let site = |offset| CallSite {
            module: "app".into(),
            offset,
        };
        Frame {
            features: FeatureSet::InstructionsIpc,
            ranks: 1,
            spmd_score: 1.0,
            time_ns: total,
            clusters: clusters
                .iter()
                .map(|&(id, x, region, time_ns)| TrackedCluster {
                    id,
                    bursts: 9,
                    time_ns,
                    time_share: time_ns as f64 / total as f64,
                    centroid: vec![x, 1.0],
                    points: (0..9)
                        .map(|k| [x + 0.01 * (k % 3) as f64, 1.0 + 0.01 * (k / 3) as f64, 0.0])
                        .collect(),
                    point_regions: vec![0; 9],
                    regions: vec![RegionCount {
                        start: site(region),
                        end: site(0),
                        bursts: 9,
                    }],
                    instructions_mean: None,
                    ipc: None,
                    spmd_score: 1.0,
                    lb_duration: 1.0,
                })
                .collect(),
            simultaneous: Vec::new(),
            sequences: vec![clusters.iter().map(|c| c.0).collect::<Vec<_>>().repeat(4)],
        }
    }

    #[test]
    fn a_phase_changing_at_a_window_start_moves_and_leaves_its_remnant_aside() {
        let mut tracker = Tracker::new(TrackingParams::default()).unwrap();
        tracker.update(
            0,
            &cloud_frame(&[(1, 10.0, 1, 100), (2, 12.0, 2, 100)]),
            true,
        );
        // Two bursts still ran the old way before the change; the bulk moved by ln 1.6.
        let changed = cloud_frame(&[
            (5, 10.0, 1, 2),
            (6, 10.0 + 1.6f64.ln(), 1, 98),
            (7, 12.0, 2, 100),
        ]);
        let update = tracker.update(1, &changed, true);
        assert_eq!(
            update.ids[&6], 1,
            "the bulk continues the phase: {:?}",
            update.ids
        );
        assert_eq!(update.ids[&7], 2);
        let kinds: Vec<(EventKind, Vec<StableId>)> = update
            .events
            .iter()
            .map(|e| (e.kind, e.from.clone()))
            .collect();
        assert_eq!(kinds, vec![(EventKind::Moved, vec![1])]);
    }

    #[test]
    fn two_phases_merged_for_a_window_get_their_ids_back() {
        let mut tracker = Tracker::new(TrackingParams::default()).unwrap();
        let apart = |a: u32, b: u32| cloud_frame(&[(a, 10.0, 1, 60), (b, 10.5, 2, 40)]);
        let first = tracker.update(0, &apart(7, 8), true);
        assert_eq!(first.ids, BTreeMap::from([(7, 1), (8, 2)]));
        // The clustering merges both into one cluster running both regions.
        let mut merged = cloud_frame(&[(5, 10.25, 1, 100)]);
        let mut regions = merged.clusters[0].regions.clone();
        regions.push(apart(1, 2).clusters[1].regions[0].clone());
        merged.clusters[0].regions = regions;
        let second = tracker.update(1, &merged, true);
        assert_eq!(second.ids, BTreeMap::from([(5, 1)]));
        let kinds: Vec<(EventKind, Vec<StableId>, Vec<StableId>)> = second
            .events
            .iter()
            .map(|e| (e.kind, e.from.clone(), e.to.clone()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (EventKind::Moved, vec![1], vec![1]),
                (EventKind::Merge, vec![1, 2], vec![1])
            ]
        );
        assert_eq!(tracker.dormant_ids().collect::<Vec<_>>(), vec![2]);
        // Apart again: the bigger part continues 1, the other revives 2.
        let third = tracker.update(2, &apart(3, 4), true);
        assert_eq!(third.ids, BTreeMap::from([(3, 1), (4, 2)]));
        let kinds: Vec<(EventKind, Vec<StableId>, Vec<StableId>)> = third
            .events
            .iter()
            .map(|e| (e.kind, e.from.clone(), e.to.clone()))
            .collect();
        assert_eq!(
            kinds,
            vec![
                (EventKind::Moved, vec![1], vec![1]),
                (EventKind::Split, vec![1], vec![1, 2])
            ]
        );
        // Stable from then on.
        for window in 3..20 {
            let update = tracker.update(window, &apart(3, 4), true);
            assert!(update.events.is_empty());
        }
        assert_eq!(tracker.counts().total(), 6);
    }

    #[test]
    fn a_partial_frame_never_makes_a_cluster_dormant() {
        let params = TrackingParams {
            vanish_after_windows: 1,
            ..TrackingParams::default()
        };
        let mut tracker = Tracker::new(params).unwrap();
        let both = cloud_frame(&[(1, 10.0, 1, 50), (2, 12.0, 2, 50)]);
        tracker.update(0, &both, true);
        // The open window has only reached the first phase.
        let partial = tracker.update(1, &cloud_frame(&[(1, 10.0, 1, 50)]), false);
        assert!(partial.events.is_empty());
        assert_eq!(tracker.active_ids().collect::<Vec<_>>(), vec![1, 2]);
        let closed = tracker.update(1, &both, true);
        assert!(closed.events.is_empty());
        assert_eq!(closed.ids, BTreeMap::from([(1, 1), (2, 2)]));
        // A closed window without phase 2 makes it vanish (after one window here).
        let gone = tracker.update(2, &cloud_frame(&[(1, 10.0, 1, 50)]), true);
        assert_eq!(gone.events.len(), 1);
        assert_eq!(gone.events[0].kind, EventKind::Vanish);
        assert_eq!(gone.events[0].last_seen_window, Some(1));
    }
}
