//! Relating the clusters of two frames ([`relate`]): which clusters of frame A are the same phase
//! as which clusters of frame B, by the evaluators of Llort et al. (2013) ("the paper" below):
//! displacement, SPMD simultaneity, call sites and sequence, plus a rescue of long moves. The
//! [`Tracker`] relates each window to the previous one, [`match_runs`] one run to another.
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
//!    on the pivots (ref. \[8\]) without saying how.* We describe every occurrence of a non-pivot
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
//! [`Tracker`]: super::Tracker
//! [`match_runs`]: super::match_runs

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Frame, TrackedCluster, TrackingParams};
use crate::analysis::points::{distance2, Coords, MAX_DIMS};
use crate::analysis::{FeatureSet, RegionCount};
use crate::model::CallSite;

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

fn resolved(region: &RegionCount) -> bool {
    !region.start.is_unknown() && !region.end.is_unknown()
}

/// Joint min–max normalisation of both frames' sampled points (B's first feature shifted).
pub(super) struct Space {
    lo: Coords,
    scale: Coords,
}

impl Space {
    pub(super) fn joint(a: &Frame, b: &Frame, shift_b: f64) -> Space {
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
pub(super) fn displacement(
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

/// The related pairs and the evaluator that created each.
type Edges = BTreeMap<(u32, u32), EdgeSource>;

fn edge_set(edges: &Edges) -> BTreeSet<(u32, u32)> {
    edges.keys().copied().collect()
}

/// Relates the clusters of two frames (the module docs give the pipeline). `shift_b` is added to
/// B's first feature before any distance (0 within a job; ln(ranks ratio) for strong scaling).
pub fn relate(a: &Frame, b: &Frame, params: &TrackingParams, shift_b: f64) -> Pairing {
    let evaluators = Evaluators::new(a, b, params, shift_b);
    let mut edges = evaluators.displacement_edges();
    evaluators.add_simultaneous(&mut edges);
    if evaluators.call_sites_compared {
        edges.retain(|&(i, j), _| evaluators.code(i, j).is_none_or(|c| c > 0.0));
    }
    let sequence = SequenceEvidence::new(&evaluators, &edges);
    for (pa, pb) in components(&edge_set(&edges)) {
        if pa.len() + pb.len() > 2 {
            evaluators.refine_wide_relation(&sequence, &mut edges, &pa, &pb);
        }
    }
    if evaluators.call_sites_compared {
        evaluators.rescue_long_moves(&sequence, &mut edges);
    }
    evaluators.pairing(&sequence, &edges)
}

/// Two frames and what the evaluators measure between them that does not depend on the edges:
/// E1 in both directions and whether call sites compare.
struct Evaluators<'f> {
    a: &'f Frame,
    b: &'f Frame,
    params: &'f TrackingParams,
    shift_b: f64,
    /// Both frames have clusters in the same feature space.
    comparable_features: bool,
    /// E1 from A to B by (A id, B id), and from B to A by (B id, A id).
    d_ab: BTreeMap<(u32, u32), f64>,
    d_ba: BTreeMap<(u32, u32), f64>,
    call_sites_compared: bool,
}

impl<'f> Evaluators<'f> {
    fn new(a: &'f Frame, b: &'f Frame, params: &'f TrackingParams, shift_b: f64) -> Self {
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
        Evaluators {
            a,
            b,
            params,
            shift_b,
            comparable_features,
            d_ab,
            d_ba,
            call_sites_compared: share_resolved_region(a, b),
        }
    }

    /// E3 for A's `i` and B's `j`: the mean of the two shares of shared code; `None` when call
    /// sites are not compared or either cluster has no resolved region.
    fn code(&self, i: u32, j: u32) -> Option<f64> {
        if !self.call_sites_compared {
            return None;
        }
        let (ca, cb) = (self.a.cluster(i)?, self.b.cluster(j)?);
        Some((code_share(ca, cb)? + code_share(cb, ca)?) / 2.0)
    }

    /// Step 1: the pairs displacement relates in either direction.
    fn displacement_edges(&self) -> Edges {
        let threshold = self.params.outlier_share;
        let mut edges = Edges::new();
        for (&(i, j), &share) in &self.d_ab {
            if share >= threshold {
                edges.insert((i, j), EdgeSource::Displacement);
            }
        }
        for (&(j, i), &share) in &self.d_ba {
            if share >= threshold {
                edges.insert((i, j), EdgeSource::Displacement);
            }
        }
        edges
    }

    /// The clusters of an SPMD `frame` simultaneous with `id`.
    fn simultaneous_with(&self, frame: &Frame, id: u32) -> Vec<u32> {
        if frame.spmd_score < self.params.spmd_min_score {
            return Vec::new();
        }
        frame
            .simultaneous
            .iter()
            .filter(|s| s.a == id && s.share >= self.params.outlier_share)
            .map(|s| s.b)
            .collect()
    }

    /// Step 2: SPMD simultaneity, one expansion step per side.
    fn add_simultaneous(&self, edges: &mut Edges) {
        let displaced: Vec<(u32, u32)> = edges.keys().copied().collect();
        for (i, j) in displaced {
            for l in self.simultaneous_with(self.a, i) {
                edges.entry((l, j)).or_insert(EdgeSource::Simultaneity);
            }
            for k in self.simultaneous_with(self.b, j) {
                edges.entry((i, k)).or_insert(EdgeSource::Simultaneity);
            }
        }
    }

    /// Step 5 for one wide relation (A ids `pa` ≡ B ids `pb`).
    fn refine_wide_relation(
        &self,
        sequence: &SequenceEvidence,
        edges: &mut Edges,
        pa: &[u32],
        pb: &[u32],
    ) {
        let threshold = self.params.outlier_share;
        // Within the relation, the pairs E4 (and E3) support, if they cover every member and
        // split it: they replace the relation's edges.
        let supported: BTreeSet<(u32, u32)> = pa
            .iter()
            .flat_map(|&i| pb.iter().map(move |&j| (i, j)))
            .filter(|&(i, j)| sequence.overlap(i, j).is_some_and(|s| s >= threshold))
            .filter(|&(i, j)| self.code(i, j).is_none_or(|c| c > 0.0))
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
            return;
        }
        // Otherwise only drop the edges E4 contradicts, never a member's last one.
        let mut candidates: Vec<(f64, u32, u32)> = edges
            .keys()
            .filter(|(i, j)| pa.contains(i) && pb.contains(j))
            .filter_map(|&(i, j)| sequence.overlap(i, j).map(|s| (s, i, j)))
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

    /// The distance² between the centroids of A's `i` and B's `j` in the joint space (infinite
    /// without one).
    fn centroid_distance(&self, space: Option<&Space>, i: u32, j: u32) -> f64 {
        let (Some(space), Some(ca), Some(cb)) = (space, self.a.cluster(i), self.b.cluster(j))
        else {
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
            &space.map(&to_coords(&cb.centroid), self.shift_b),
        )
    }

    /// Step 6: code and sequence for the clusters left without relation.
    fn rescue_long_moves(&self, sequence: &SequenceEvidence, edges: &mut Edges) {
        let matched_a: BTreeSet<u32> = edges.keys().map(|e| e.0).collect();
        let matched_b: BTreeSet<u32> = edges.keys().map(|e| e.1).collect();
        let space = (self.comparable_features && !self.b.clusters.is_empty())
            .then(|| Space::joint(self.a, self.b, self.shift_b));
        let mut candidates: Vec<(bool, f64, f64, f64, u32, u32)> = Vec::new();
        for ca in &self.a.clusters {
            for cb in &self.b.clusters {
                let (i, j) = (ca.id, cb.id);
                let both = !matched_a.contains(&i) && !matched_b.contains(&j);
                let either = !matched_a.contains(&i) || !matched_b.contains(&j);
                if !either {
                    continue;
                }
                let Some(shared) = self.code(i, j).filter(|&c| c > 0.0) else {
                    continue;
                };
                let position = sequence.overlap(i, j);
                if position.is_some_and(|s| s < self.params.outlier_share) {
                    continue;
                }
                candidates.push((
                    both,
                    shared,
                    position.unwrap_or(0.0),
                    self.centroid_distance(space.as_ref(), i, j),
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

    /// The relations of the final edges, with every evaluator's value on each edge, and the
    /// clusters left unrelated.
    fn pairing(&self, sequence: &SequenceEvidence, edges: &Edges) -> Pairing {
        let relations: Vec<Relation> = components(&edge_set(edges))
            .into_iter()
            .map(|(pa, pb)| {
                let relation_edges = edges
                    .iter()
                    .filter(|((i, j), _)| pa.contains(i) && pb.contains(j))
                    .map(|(&(i, j), &source)| Edge {
                        a: i,
                        b: j,
                        source,
                        displacement_ab: self.d_ab.get(&(i, j)).copied().unwrap_or(0.0),
                        displacement_ba: self.d_ba.get(&(j, i)).copied().unwrap_or(0.0),
                        code: self.code(i, j),
                        sequence: sequence.overlap(i, j),
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
        let unmatched = |frame: &Frame, related: &BTreeSet<u32>| -> Vec<u32> {
            frame
                .clusters
                .iter()
                .map(|c| c.id)
                .filter(|id| !related.contains(id))
                .collect()
        };
        Pairing {
            unmatched_a: unmatched(self.a, &related_a),
            unmatched_b: unmatched(self.b, &related_b),
            relations,
            call_sites_compared: self.call_sites_compared,
        }
    }
}

/// Step 4 and the sequence evaluator (E4): the pivots (1:1 components of the edges after
/// pruning) and the context histograms of both frames' other clusters.
struct SequenceEvidence {
    has_pivots: bool,
    contexts_a: Contexts,
    contexts_b: Contexts,
}

impl SequenceEvidence {
    fn new(evaluators: &Evaluators<'_>, edges: &Edges) -> Self {
        let mut pivot_a: BTreeMap<u32, u32> = BTreeMap::new();
        let mut pivot_b: BTreeMap<u32, u32> = BTreeMap::new();
        for (n, (pa, pb)) in components(&edge_set(edges))
            .into_iter()
            .filter(|(pa, pb)| pa.len() == 1 && pb.len() == 1)
            .enumerate()
        {
            pivot_a.insert(pa[0], n as u32);
            pivot_b.insert(pb[0], n as u32);
        }
        let steps = evaluators.params.sequence_steps;
        SequenceEvidence {
            has_pivots: !pivot_a.is_empty(),
            contexts_a: contexts(evaluators.a, &pivot_a, steps),
            contexts_b: contexts(evaluators.b, &pivot_b, steps),
        }
    }

    /// E4 for A's `i` and B's `j`; `None` when uninformative (no pivots, or a cluster absent
    /// from the sequences).
    fn overlap(&self, i: u32, j: u32) -> Option<f64> {
        if !self.has_pivots {
            return None;
        }
        Some(context_overlap(
            self.contexts_a.get(&i)?,
            self.contexts_b.get(&j)?,
        ))
    }
}

/// The largest change between two centroids in raw log space: |Δ| of log features, |Δ ln| of
/// IPC (absolute difference when an IPC is not positive). `shift_b` as for [`relate`].
pub(super) fn centroid_move(features: FeatureSet, a: &[f64], b: &[f64], shift_b: f64) -> f64 {
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

#[cfg(test)]
mod tests;
