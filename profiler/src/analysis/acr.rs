//! Aggregative Cluster Refinement (González García (2013), ch. 6, Algorithm 1) and the single-Eps
//! alternative.
//!
//! ACR runs DBSCAN with increasing Eps. After each run the region variants of one computation
//! are merged ([`super::roles::merge_region_variants`], which also aligns and scores the
//! partition), bursts are absorbed by column majorities (below), and clusters that score exactly
//! 1 are frozen; only the bursts of the others, plus all noise, take part in the next run. After
//! the last Eps (or when nothing is left to refine) three post-processes run on the last
//! alignment:
//!
//! 1. Sequence-based merge (`ProcessLastPartition`). González García (2013) merges imperfect
//!    clusters that always appear together, i.e. in exactly the same aligned columns
//!    (ClusteringSuite finds them by counting every subset of each column's clusters, which is
//!    exponential). We merge one-directionally: an imperfect cluster that appears only in columns
//!    also holding another imperfect cluster joins that host. This contains the case González
//!    García (2013) merges (identical column sets) and also joins a sub-group that density split
//!    further, such as a slow rank's instances of a phase falling into two clusters that each
//!    appear in only some of the phase's columns, which the rule of González García (2013) leaves
//!    as three clusters. Two different phases never qualify, because each has columns without the
//!    other. It runs unconditionally; perfect clusters never share a column with another cluster,
//!    so it only ever touches imperfect ones.
//! 2. Rare clusters join the frequent cluster whose place they take in the sequences
//!    ([`super::roles::join_rare_variants`]), and the clusters of one code region that are one
//!    computation at other speeds join ([`super::roles::join_same_region`]).
//! 3. Lone bursts that take another cluster's place among their region's bursts join it
//!    ([`super::roles::place_lone_bursts`]).
//! 4. Column-majority absorption, again after the merges.
//!
//! Column-majority absorption (our addition, along the fix González García (2013) proposes in
//! §10.5.2 for residual noise and over-aggregation: classify bursts on each iteration): in an
//! aligned column where every rank has a burst and one cluster X holds more than half of the
//! clustered bursts and at least half of all of them, the column's other bursts, noise or other
//! clusters, join X: the alignment says they are those ranks' occurrences of X. It runs after
//! every step, before clusters are frozen. Without it, one perturbed instance of a phase (an
//! outlier that is noise, or that lands in another phase's cloud) keeps both phases below 100 % at
//! every step; they are never frozen and are refined with ever larger Eps until they merge with
//! their neighbours, the over-aggregation González García (2013) lists as ACR's main limitation.
//! The same happens to a phase with one slower rank, whose instances form their own cluster until
//! the final merge. Absorbed bursts in a cluster that is not frozen are re-clustered with it at
//! the next step. With two ranks no cluster is ever a strict majority over another one, and the
//! final merge does that work.

//! Final ids are by decreasing total time (1 = most time), noise is 0.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::css::{sequence_score, RankSequences, SequenceScore};
use super::dbscan::{dbscan, k_distances_sample};
use super::points::{cluster_count, PointSet};
use super::roles::{
    join_rare_variants, join_same_region, merge_region_variants, place_lone_bursts, relabel,
};
use super::{ClusterId, NOISE};

/// The top of the k-dist curve that the knee line and the largest Eps skip, as a share of the
/// points: ClusteringSuite's 0.5 %, so that a few outliers set neither.
const KDIST_TRIM_SHARE: f64 = 0.005;
/// The points whose k-distance draws the k-dist curve, at most (see `k_distances_sample`): the
/// trimmed top is then still 20 values, and a window of up to this many points is drawn whole.
const KDIST_QUERIES: usize = 4096;

/// One DBSCAN run and the partition it led to.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepReport {
    pub eps: f64,
    /// Clusters in the whole partition after the step (frozen ones included), noise excluded.
    pub clusters: usize,
    pub perfect_clusters: usize,
    pub noise_bursts: usize,
    pub global_score: f64,
}

/// Clusters the sequence-based merge joined.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceMerge {
    /// Final id of the merged cluster.
    pub cluster: ClusterId,
    /// How many clusters of the last step it joins.
    pub parts: usize,
}

/// What the clustering did, for the result.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusteringReport {
    pub min_points: usize,
    pub steps: Vec<StepReport>,
    pub sequence_merges: Vec<SequenceMerge>,
    /// Bursts whose final cluster comes from column-majority absorption rather than DBSCAN.
    pub absorbed_by_column: usize,
    /// Clusters that joined another one as a variant of its computation in another code region,
    /// or as the other ranks' part of a region split along rank lines
    /// ([`super::roles::merge_region_variants`]), over all steps.
    #[serde(default)]
    pub region_variants_merged: usize,
    /// Rare clusters that joined the phase whose place they take
    /// ([`super::roles::join_rare_variants`]).
    #[serde(default)]
    pub rare_clusters_joined: usize,
    /// Clusters that joined another cluster of their code region as the same computation run at
    /// another speed, on other ranks in the same steps or for a stretch of time
    /// ([`super::roles::join_same_region`]).
    #[serde(default)]
    pub same_region_joined: usize,
    /// Lone bursts that joined the cluster whose place they take among their code region's bursts
    /// on their rank ([`super::roles::place_lone_bursts`]).
    #[serde(default)]
    pub placed_by_context: usize,
}

/// A final labelling (1 = most time, [`NOISE`] = 0), its score and how it was reached.
#[derive(Clone, Debug)]
pub struct ClusteringOutcome {
    pub labels: Vec<ClusterId>,
    pub score: SequenceScore,
    pub report: ClusteringReport,
}

/// The Eps values for ACR, ascending, from the sorted k-dist curve (`k_distances`, any order;
/// infinite values, from points that can never be core, are ignored).
///
/// With d sorted in decreasing order, n finite values, top = max(1, ⌊0.005·n⌋) and
/// bottom = ⌊0.995·n⌋: the knee is the x in [top, bottom/2] where d lies furthest below the line
/// from (0, d\[top\]) to (bottom/2, 0) (ClusteringSuite; González García (2013) draws the line from
/// the untrimmed maximum). The `steps` values are then d at indices spaced evenly from the knee up
/// to top, both included (González García (2013) spaces N − 1 intervals between x = 1 and the
/// knee). Even index spacing makes each step turn roughly the same number of points into core
/// points. The largest Eps is the trimmed top rather than x = 1 so that an outlier's k-dist never
/// becomes an Eps (over-aggregation); fewer values come out when the curve has fewer distinct
/// points.
pub fn epsilon_steps(k_distances: &[f64], steps: usize) -> Vec<f64> {
    let mut d: Vec<f64> = k_distances
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .collect();
    if d.is_empty() || steps == 0 {
        return Vec::new();
    }
    d.sort_by(|a, b| b.total_cmp(a));
    let n = d.len();
    let top = ((KDIST_TRIM_SHARE * n as f64) as usize).max(1).min(n - 1);
    let half = ((1.0 - KDIST_TRIM_SHARE) * n as f64) as usize / 2;
    let mut knee = top;
    if half > top {
        let mut deepest = f64::NEG_INFINITY;
        for (x, &value) in d.iter().enumerate().take(half + 1).skip(top) {
            let below_line = d[top] * (1.0 - x as f64 / half as f64) - value;
            if below_line > deepest {
                deepest = below_line;
                knee = x;
            }
        }
    }
    let mut eps: Vec<f64> = if steps == 1 {
        vec![d[knee]]
    } else {
        (0..steps)
            .map(|i| d[top + i * (knee - top) / (steps - 1)])
            .collect()
    };
    eps.sort_by(f64::total_cmp);
    eps.dedup();
    eps
}

/// MinPoints when none is configured: a quarter of the ranks (González García (2013): an SPMD
/// phase must cover at least 25 % of the tasks), at least 2 (ClusteringSuite) because MinPoints 1
/// makes every point core, so DBSCAN degenerates to single linkage and noise disappears.
pub fn default_min_points(ranks: usize) -> usize {
    (ranks / 4).max(2)
}

/// The k of the k-dist curve the Eps list is taken from: MinPoints, but at least ⌈ln n⌉.
///
/// González García (2013) uses k = MinPoints on cuts of 1–2 iterations, where a quarter of the
/// ranks is a sizeable part of each phase's cloud. A window of many iterations holds far more
/// points per phase, and with MinPoints 2 the k-dist is the nearest-neighbour distance: even its
/// top lies below the radius at which a uniformly jittered cloud becomes connected, so every Eps
/// of the list splits such a phase at random. A cloud of n points is connected (with high
/// probability) once the radius holds about ln n neighbours per point (random geometric graphs),
/// so the k-dist with k = ⌈ln n⌉ reaches that radius near its top, whatever the window length.
pub fn kdist_neighbours(min_points: usize, points: usize) -> usize {
    min_points.max((points.max(1) as f64).ln().ceil() as usize)
}

/// ACR with up to `steps` Eps values, none below `min_eps`: the k-dist curve of quiet, tight
/// phases yields Eps values below the differences that tell phases apart, and a value below
/// `min_eps` is raised to it (equal values run once).
pub fn acr(
    points: &PointSet,
    sequences: &RankSequences,
    steps: usize,
    min_points: usize,
    min_eps: f64,
) -> ClusteringOutcome {
    assert_eq!(
        points.len(),
        sequences.points(),
        "one rank position per point"
    );
    let mut refinement = Refinement::new(points.len());
    for eps in eps_list(points, steps, min_points, min_eps) {
        if !refinement.step(points, sequences, eps, min_points) {
            break;
        }
    }
    let Refinement {
        mut labels,
        frozen,
        reports,
        mut absorbed,
        score,
        region_variants_merged,
        ..
    } = refinement;
    let score = score.unwrap_or_else(|| sequence_score(&labels, sequences));

    let merged_into = sequence_merge(&score, &frozen);
    let mut parts: BTreeMap<ClusterId, usize> = BTreeMap::new();
    for &target in merged_into.values() {
        *parts.entry(target).or_insert(1) += 1;
    }
    labels = relabel(&labels, &merged_into);
    let same_region = join_same_region(
        points,
        &labels,
        sequences,
        &score.relabelled(&labels, sequences),
    );
    labels = relabel(&labels, &same_region);
    let hosts = join_rare_variants(
        points,
        &labels,
        sequences,
        &score.relabelled(&labels, sequences),
    );
    labels = relabel(&labels, &hosts);
    let joined: BTreeMap<ClusterId, ClusterId> = same_region
        .iter()
        .map(|(&guest, host)| (guest, *hosts.get(host).unwrap_or(host)))
        .chain(hosts.iter().map(|(&guest, &host)| (guest, host)))
        .collect();
    let (placed, placed_by_context) = place_lone_bursts(points, &labels, sequences);
    labels = placed;
    absorb_into_column_majority(&mut labels, &mut absorbed, sequences, &score);
    let absorbed_by_column = absorbed.iter().filter(|&&a| a).count();
    let (labels, final_id) = number_by_time(&labels, sequences.durations());
    let score = sequence_score(&labels, sequences);
    ClusteringOutcome {
        labels,
        score,
        report: ClusteringReport {
            min_points,
            steps: reports,
            sequence_merges: sequence_merges(parts, &joined, &final_id),
            absorbed_by_column,
            region_variants_merged,
            rare_clusters_joined: hosts.len(),
            same_region_joined: same_region.len(),
            placed_by_context,
        },
    }
}

/// The Eps values ACR runs, increasing: up to `steps` from the k-dist curve, none below
/// `min_eps`, each once.
fn eps_list(points: &PointSet, steps: usize, min_points: usize, min_eps: f64) -> Vec<f64> {
    let mut eps_list: Vec<f64> = epsilon_steps(
        &k_distances_sample(
            points,
            kdist_neighbours(min_points, points.len()),
            KDIST_QUERIES,
        ),
        steps,
    )
    .into_iter()
    .map(|eps| eps.max(min_eps))
    .collect();
    eps_list.dedup();
    eps_list
}

/// The state of ACR's refinement across its Eps steps: each step clusters the points not yet in
/// a frozen (perfectly SPMD) cluster.
struct Refinement {
    labels: Vec<ClusterId>,
    frozen: BTreeSet<ClusterId>,
    next_id: ClusterId,
    reports: Vec<StepReport>,
    /// Points moved to their column's majority cluster.
    absorbed: Vec<bool>,
    /// Every step scores its own labels; the all-noise start is only scored when no step runs.
    score: Option<SequenceScore>,
    region_variants_merged: usize,
}

impl Refinement {
    fn new(n: usize) -> Self {
        Refinement {
            labels: vec![NOISE; n],
            frozen: BTreeSet::new(),
            next_id: 1,
            reports: Vec::new(),
            absorbed: vec![false; n],
            score: None,
            region_variants_merged: 0,
        }
    }

    /// Runs DBSCAN with `eps` on the points outside frozen clusters, merges region variants,
    /// absorbs into column majorities and freezes the clusters that became perfect. `false`
    /// when every point is frozen already (nothing left to refine).
    fn step(
        &mut self,
        points: &PointSet,
        sequences: &RankSequences,
        eps: f64,
        min_points: usize,
    ) -> bool {
        let (labels, frozen) = (&mut self.labels, &mut self.frozen);
        let subset: Vec<usize> = (0..labels.len())
            .filter(|&i| !frozen.contains(&labels[i]))
            .collect();
        if subset.is_empty() {
            return false;
        }
        let sub_labels = dbscan(&points.subset(&subset), eps, min_points);
        let fresh = sub_labels.iter().copied().max().unwrap_or(NOISE);
        for (&i, &label) in subset.iter().zip(&sub_labels) {
            labels[i] = if label == NOISE {
                NOISE
            } else {
                self.next_id + label - 1
            };
            self.absorbed[i] = false;
        }
        self.next_id += fresh;
        let merged = merge_region_variants(
            points,
            labels,
            sequences,
            eps,
            |id| frozen.contains(&id),
            |labels| sequence_score(labels, sequences),
        );
        self.region_variants_merged += cluster_count(labels) - cluster_count(&merged.0);
        let mut step_score;
        (*labels, step_score) = merged;
        if absorb_into_column_majority(labels, &mut self.absorbed, sequences, &step_score) > 0 {
            step_score = step_score.relabelled(labels, sequences);
        }
        frozen.extend(
            step_score
                .symbols()
                .filter(|&id| id != NOISE && step_score.is_perfect(id)),
        );
        self.reports.push(step_report(eps, labels, &step_score));
        self.score = Some(step_score);
        true
    }
}

/// The sequence merges by final cluster. A merged cluster may since have joined a frequent host
/// as its rare variant, or lost all its bursts to column majorities: its `parts` count for the
/// cluster they are in now (through `hosts`, then `final_id`), if any.
fn sequence_merges(
    parts: BTreeMap<ClusterId, usize>,
    hosts: &BTreeMap<ClusterId, ClusterId>,
    final_id: &BTreeMap<ClusterId, ClusterId>,
) -> Vec<SequenceMerge> {
    let mut merged_parts: BTreeMap<ClusterId, usize> = BTreeMap::new();
    for (id, parts) in parts {
        let now = hosts.get(&id).copied().unwrap_or(id);
        if let Some(&cluster) = final_id.get(&now) {
            *merged_parts.entry(cluster).or_default() += parts;
        }
    }
    merged_parts
        .into_iter()
        .map(|(cluster, parts)| SequenceMerge { cluster, parts })
        .collect()
}

/// Plain DBSCAN with one Eps (González García (2013), chapters 4–5), scored and numbered like ACR.
pub fn single_dbscan(
    points: &PointSet,
    sequences: &RankSequences,
    eps: f64,
    min_points: usize,
) -> ClusteringOutcome {
    let (labels, _) = number_by_time(&dbscan(points, eps, min_points), sequences.durations());
    let score = sequence_score(&labels, sequences);
    let steps = vec![step_report(eps, &labels, &score)];
    ClusteringOutcome {
        labels,
        score,
        report: ClusteringReport {
            min_points,
            steps,
            sequence_merges: Vec::new(),
            absorbed_by_column: 0,
            region_variants_merged: 0,
            rare_clusters_joined: 0,
            same_region_joined: 0,
            placed_by_context: 0,
        },
    }
}

fn step_report(eps: f64, labels: &[ClusterId], score: &SequenceScore) -> StepReport {
    StepReport {
        eps,
        clusters: cluster_count(labels),
        perfect_clusters: score
            .symbols()
            .filter(|&id| id != NOISE && score.is_perfect(id))
            .count(),
        noise_bursts: labels.iter().filter(|&&l| l == NOISE).count(),
        global_score: score.global(),
    }
}

/// Maps each imperfect cluster that only ever appears in columns holding another imperfect
/// cluster to the root of its chain of hosts. A cluster's host is, among the clusters present in
/// all of its columns, the one ranked highest by (columns, hits, lower id); requiring the host to
/// rank above the guest makes the host relation acyclic, and identical column sets (the "always
/// appear together" of González García (2013)) resolve to one cluster.
fn sequence_merge(
    score: &SequenceScore,
    frozen: &BTreeSet<ClusterId>,
) -> BTreeMap<ClusterId, ClusterId> {
    let alignment = score.alignment();
    let candidate = |id: ClusterId| id != NOISE && !frozen.contains(&id) && !score.is_perfect(id);
    let mut columns_of: BTreeMap<ClusterId, Vec<usize>> = BTreeMap::new();
    for j in 0..alignment.columns() {
        for &(id, _) in alignment.column(j) {
            if candidate(id) {
                columns_of.entry(id).or_default().push(j);
            }
        }
    }
    let rank = |id: ClusterId| {
        (
            columns_of[&id].len(),
            score.tally(id).map_or(0, |t| t.hits),
            std::cmp::Reverse(id),
        )
    };
    let mut host: BTreeMap<ClusterId, ClusterId> = BTreeMap::new();
    for (&guest, columns) in &columns_of {
        let mut shared: BTreeMap<ClusterId, usize> = BTreeMap::new();
        for &j in columns {
            for &(id, _) in alignment.column(j) {
                if id != guest && candidate(id) {
                    *shared.entry(id).or_default() += 1;
                }
            }
        }
        let best = shared
            .into_iter()
            .filter(|&(_, count)| count == columns.len())
            .map(|(id, _)| id)
            .filter(|&id| rank(id) > rank(guest))
            .max_by_key(|&id| rank(id));
        if let Some(best) = best {
            host.insert(guest, best);
        }
    }
    host.keys()
        .map(|&guest| {
            let mut root = guest;
            while let Some(&next) = host.get(&root) {
                root = next;
            }
            (guest, root)
        })
        .collect()
}

/// Column-majority absorption: in every full column (every rank has a burst there) where one
/// cluster X holds more than half of the clustered bursts and at least half of all bursts, the
/// other bursts (noise or other clusters) join X and are marked in `absorbed`. Columns are those
/// of `score`'s alignment; labels are the current ones. Returns how many bursts joined.
fn absorb_into_column_majority(
    labels: &mut [ClusterId],
    absorbed: &mut [bool],
    sequences: &RankSequences,
    score: &SequenceScore,
) -> usize {
    let alignment = score.alignment();
    let ranks = sequences.ranks();
    let mut placed: Vec<(u32, ClusterId)> = Vec::with_capacity(labels.len());
    for rank in 0..ranks {
        placed.extend(
            sequences
                .sequence(rank)
                .iter()
                .zip(alignment.positions(rank))
                .map(|(&p, &j)| (j, labels[p])),
        );
    }
    placed.sort_unstable();
    let mut majority: Vec<Option<ClusterId>> = vec![None; alignment.columns()];
    for column in placed.chunk_by(|a, b| a.0 == b.0) {
        let clustered = column.iter().filter(|&&(_, l)| l != NOISE).count();
        let best = column
            .chunk_by(|a, b| a.1 == b.1)
            .filter(|run| run[0].1 != NOISE)
            .max_by_key(|run| (run.len(), std::cmp::Reverse(run[0].1)));
        if let Some(run) = best {
            if column.len() == ranks && 2 * run.len() > clustered && 2 * run.len() >= ranks {
                majority[column[0].0 as usize] = Some(run[0].1);
            }
        }
    }
    let mut joined = 0;
    for rank in 0..ranks {
        for (&point, &j) in sequences
            .sequence(rank)
            .iter()
            .zip(alignment.positions(rank))
        {
            if let Some(cluster) = majority[j as usize].filter(|&c| c != labels[point]) {
                labels[point] = cluster;
                absorbed[point] = true;
                joined += 1;
            }
        }
    }
    joined
}

/// Renumbers clusters 1, 2, … by decreasing total duration (ties: lower old id first); noise
/// stays 0. Also returns the old → new map.
pub(crate) fn number_by_time(
    labels: &[ClusterId],
    durations: &[u64],
) -> (Vec<ClusterId>, BTreeMap<ClusterId, ClusterId>) {
    let mut time: BTreeMap<ClusterId, u64> = BTreeMap::new();
    for (&label, &duration) in labels.iter().zip(durations) {
        if label != NOISE {
            *time.entry(label).or_default() += duration;
        }
    }
    let mut by_time: Vec<(ClusterId, u64)> = time.into_iter().collect();
    by_time.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let new_id: BTreeMap<ClusterId, ClusterId> = by_time
        .iter()
        .enumerate()
        .map(|(rank, &(old, _))| (old, rank as ClusterId + 1))
        .collect();
    let labels = labels
        .iter()
        .map(|l| if *l == NOISE { NOISE } else { new_id[l] })
        .collect();
    (labels, new_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eps_steps_span_knee_to_trimmed_top() {
        // 1 000 values, shuffled: a steep top (x < 100) and a flat floor. The knee is at x = 100.
        let curve = |x: usize| {
            if x < 100 {
                0.5 - 0.0045 * x as f64
            } else {
                0.05 - 0.05 * (x - 100) as f64 / 900.0
            }
        };
        let d: Vec<f64> = (0..1000).map(|i| curve(i * 7 % 1000)).collect();
        let eps = epsilon_steps(&d, 10);
        // top = ⌊0.005 · 1000⌋ = 5; indices 5 + i · 95 / 9 for i = 0..10.
        let expected: Vec<f64> = [100, 89, 78, 68, 57, 47, 36, 26, 15, 5].map(curve).to_vec();
        assert_eq!(eps, expected);
    }

    #[test]
    fn eps_steps_of_tiny_and_empty_curves() {
        assert!(epsilon_steps(&[], 10).is_empty());
        assert!(epsilon_steps(&[f64::INFINITY], 10).is_empty());
        assert_eq!(epsilon_steps(&[0.5], 10), vec![0.5]);
        assert_eq!(epsilon_steps(&[0.5, 0.2, 0.1], 10), vec![0.2]);
    }

    /// Scores labels given per rank (one time unit per burst), returning labels and sequences.
    fn scored(per_rank: &[Vec<ClusterId>]) -> (Vec<ClusterId>, RankSequences, SequenceScore) {
        let (mut labels, mut rank_of, mut start) = (Vec::new(), Vec::new(), Vec::new());
        for (rank, sequence) in per_rank.iter().enumerate() {
            for (position, &label) in sequence.iter().enumerate() {
                labels.push(label);
                rank_of.push(rank as u32);
                start.push(position as u64);
            }
        }
        let sequences = RankSequences::new(per_rank.len(), rank_of, &start, vec![1; labels.len()]);
        let score = sequence_score(&labels, &sequences);
        (labels, sequences, score)
    }

    #[test]
    fn column_majority_absorbs_noise_and_strays() {
        // Rank 3 has a noise burst and a stray from cluster 3 where the others run 2 and 1.
        let (mut labels, sequences, score) = scored(&[
            vec![1, 2, 1, 2],
            vec![1, 2, 1, 2],
            vec![1, 2, 1, 2],
            vec![1, NOISE, 3, 2],
        ]);
        let mut absorbed = vec![false; labels.len()];
        assert_eq!(
            absorb_into_column_majority(&mut labels, &mut absorbed, &sequences, &score),
            2
        );
        assert_eq!(&labels[12..], &[1, 2, 1, 2]);
        assert_eq!(absorbed.iter().filter(|&&a| a).count(), 2);

        // No majority: one rank against one, or a column that not every rank fills.
        let (mut labels, sequences, score) = scored(&[vec![1, 2], vec![1, 3]]);
        assert_eq!(
            absorb_into_column_majority(&mut labels, &mut [false; 4], &sequences, &score),
            0
        );
        let (mut labels, sequences, score) =
            scored(&[vec![1, 2, 1], vec![1, NOISE, 1], vec![1, 1]]);
        assert_eq!(
            absorb_into_column_majority(&mut labels, &mut [false; 8], &sequences, &score),
            0
        );
    }

    #[test]
    fn sequence_merge_joins_clusters_that_only_appear_in_anothers_columns() {
        // Rank 1 runs 3 or 4 where rank 0 runs 2: both only ever appear in 2's columns.
        let (_, _, score) = scored(&[vec![1, 2, 1, 2, 1, 2], vec![1, 3, 1, 4, 1, 3]]);
        assert_eq!(
            sequence_merge(&score, &BTreeSet::from([1])),
            BTreeMap::from([(3, 2), (4, 2)])
        );
        // Identical column sets (the case of González García (2013)): the lower id is kept.
        let (_, _, score) = scored(&[vec![1, 5, 1, 5], vec![1, 6, 1, 6]]);
        assert_eq!(
            sequence_merge(&score, &BTreeSet::from([1])),
            BTreeMap::from([(6, 5)])
        );
        // Two phases that each have columns without the other stay apart.
        let (_, _, score) = scored(&[vec![1, 2, 1, 3, 1, 3], vec![1, 2, 1, 2, 1, 3]]);
        assert!(sequence_merge(&score, &BTreeSet::from([1])).is_empty());
    }

    #[test]
    fn numbering_follows_total_time() {
        let (labels, map) = number_by_time(&[7, 3, NOISE, 3, 9], &[5, 2, 100, 2, 4]);
        assert_eq!(labels, vec![1, 2, NOISE, 2, 3]);
        assert_eq!(map, BTreeMap::from([(7, 1), (3, 2), (9, 3)]));
    }

    #[test]
    fn default_min_points_is_a_quarter_of_ranks_at_least_two() {
        assert_eq!(
            [2, 4, 8, 9, 16, 256].map(default_min_points),
            [2, 2, 2, 2, 4, 64]
        );
    }

    #[test]
    fn kdist_neighbours_grow_with_the_logarithm_of_the_points() {
        assert_eq!(kdist_neighbours(2, 0), 2);
        assert_eq!(kdist_neighbours(2, 300), 6);
        assert_eq!(kdist_neighbours(2, 100_000), 12);
        assert_eq!(kdist_neighbours(64, 100_000), 64);
    }
}
