//! Clusters that play the same role in the ranks' sequences: what makes one phase out of the
//! parts that the code regions, ranks that share cores or a perturbed iteration split off. All
//! run inside ACR ([`super::acr()`]).
//!
//! **Region variants** ([`merge_region_variants`], after every DBSCAN step). Without a PMU each
//! code region (start call site, end call site) is clustered on its own, because the region
//! stands in for the instruction count. In a pipeline or wavefront code the same computation
//! sits between different MPI calls depending on the rank's position (the first rank of a sweep
//! receives nothing, the last sends nothing, edge ranks have fewer neighbours), so each
//! computation falls apart into rank-exclusive clusters that never score above their share of
//! ranks. Two clusters of different regions are *variants* of one computation when
//!
//! 1. their feature boxes lie within the step's Eps of each other (DBSCAN would have joined
//!    them without the region partition) and no rank runs both (within one rank, different
//!    regions are different code), and
//! 2. the alignment puts them in the same columns: at least half of the columns of the rarer one
//!    also hold the other. To let the aligner find that, the candidates of step 1 are aligned as
//!    one symbol; its mismatches score 0 and could not tell which rank-exclusive cluster of one
//!    rank goes with which of another.
//!
//! Variants of one computation become one cluster. Step 2 is what keeps apart clusters that
//! merely have similar durations, such as two phases of the same length in different code, run
//! at different places in the iteration. With counters (one group) nothing changes: DBSCAN
//! already sees every region at once.
//!
//! **Rank splits** (in the same step). Ranks that share a core run the same code region slower
//! than the others (they evict each other's caches), and the ranks that use other work or data
//! run it longer: DBSCAN then splits one region along rank lines, a cluster on some ranks and
//! another on the others, each scoring only its share of ranks. Two clusters of one code region
//! that no rank runs both, and that the alignment puts in the same columns (step 2 above), are one
//! phase whatever their distance: its imbalance shows in its load balance, not as a second phase.
//! Clusters of one region that the same ranks run both, such as a phase that alternates between
//! two durations on every rank, stay apart. Only where the groups are code regions (no
//! counters): with counters the clusters carry no region to tell one code from another.
//!
//! **Rare variants** ([`join_rare_variants`], once, at the end). A phase recurs. A cluster that
//! occurs in at most 1/[`RARE_FACTOR`] of the columns of the most frequent cluster, and whose
//! bursts sit where another, frequent cluster usually sits (the same predecessor and successor
//! in the rank sequences), is that cluster in a perturbed iteration: all ranks preempted or
//! slowed by the hypervisor at once, or the slow first iteration. Such a cluster is perfectly
//! SPMD (every rank has it in its one column), so ACR freezes it at a small Eps and never
//! re-clusters it with its phase; it joins that phase here. It must end at a call site where that
//! phase ends: a perturbed iteration runs the same code to the same call, and the first burst of
//! a run ends where the phase it holds ends, while the last burst, from the last call of the loop
//! to MPI_Finalize, follows the phase it would replace but is other code. A neighbour that is
//! itself rare (or the start or end of the sequence) matches any context, so a whole slowed
//! iteration joins burst by burst; at least one neighbour must match for real. A rare
//! computation that does not take another's place, such as a checkpoint every 20 iterations
//! between two phases, has a context no frequent cluster has and stays a phase of its own.
//!
//! **One region at other speeds** ([`join_same_region`], once, at the end, before the rare
//! variants). Ranks that share cores take turns at evicting each other's data: on 4 ranks over 2
//! cores a memory-bound code ran a computation 1.5 times longer on two ranks for the first half
//! of the run and on the two others now and then, or on every rank for its first 9 of 30
//! iterations. Each code region then falls into a slow and a fast cluster that neither ranks nor
//! columns alone separate. Two clusters of one code region (the region most of a cluster's bursts
//! have) are one computation when
//!
//! 1. they share aligned columns: at least [`MIN_SHARED_COLUMNS`], and at least
//!    1/[`SHARED_COLUMNS_PART`] of the columns of the one in fewer. An aligned column is one step
//!    of the program; in it, some ranks ran the code at one speed and the others at another: load
//!    imbalance within one phase; or
//! 2. one is a stretch of time of a larger cluster of the region that every rank running it also
//!    runs: on every such rank its bursts form at most [`MAX_STRETCHES`] unbroken runs among
//!    that cluster's bursts: the code ran at another speed for a while on every rank. Of several
//!    such clusters, the one whose place it takes: among the bursts of the region on each rank,
//!    the guest's bursts sit between the neighbours the host's usually sit between. Then the
//!    nearest. In a phase alternating between 12 and 24 ms, iterations slowed to 18 ms on every
//!    rank for a while are a stretch of the 12 ms cluster only (among the 24 ms bursts they make
//!    a run per iteration); one such iteration alone is a stretch of both, nearer the 24 ms one
//!    beyond the midpoint (17 ms), but it sits between two 24 ms bursts, where the 12 ms bursts
//!    sit, and joins the 12 ms one. Guests slowed at the same time are placed together
//!    (`place_stretches`): a stretch of both parities slowed 1.7 times makes a 20 ms and a
//!    41 ms cluster that sit between each other; read as the 24 ms cluster, the 41 ms bursts put
//!    the 20 ms ones where the 12 ms bursts sit.
//!
//! Its spread and per-rank balance then show the slowdown. Clusters of one region that take turns
//! on every rank at once, such as a phase that alternates between two durations with the
//! iteration parity, share no column and make many runs: they stay apart. Joining them first
//! also gives the rare variants above the contexts of whole phases (the slow first burst of a run
//! takes the place of a phase whose next phase had split). Only where the groups are code regions
//! (no counters), as for rank splits.
//!
//! **Lone bursts out of place** ([`place_lone_bursts`], once, at the very end). A burst slowed on
//! its own can land in another cluster of its region or in the noise: a 12 ms step of an
//! alternating phase slowed 1.9 times on one rank lies within the 24 ms cluster's reach. Among
//! the bursts of a code region on each rank, a *place* is the pair of clusters before and after a
//! burst; it is a cluster's when at least [`MIN_PLACE_BURSTS`] bursts of that cluster over all
//! ranks take it, and they are at least [`PLACE_SHARE`] of the clustered bursts that take it. A
//! burst that takes another cluster's place, noise included, joins that cluster, unless a
//! clustered neighbour of it is out of place too (then the neighbours themselves are in doubt: a
//! stretch, which the joins above handle), or, on its rank, most bursts of its own cluster are
//! out of place as well (a path the rank takes now and then, such as a longer step every sixth
//! iteration, is a behaviour of its own), or it is noise beside noise (a run of noise takes one
//! place by the bursts around it, which at most one of them can be in). At either end of the run
//! one side decides. In a region with one cluster every place is that cluster's, so a noise
//! burst of the region joins it; a region whose behaviour changed for good keeps both clusters,
//! because the change leaves each in its own place.

use std::collections::{BTreeMap, BTreeSet};

use super::css::{RankSequences, SequenceScore};
use super::points::{boxes_distance2, distance2, Coords, PointSet, MAX_DIMS};
use super::{ClusterId, NOISE};

/// A cluster is rare when it occurs in at most 1/RARE_FACTOR of the columns of the most frequent
/// cluster. A bi-modal phase alternating with the iteration parity (1:1), or one that takes a
/// different path every fourth iteration, stays two clusters; a hiccup in a handful of
/// iterations out of dozens does not.
pub const RARE_FACTOR: u64 = 8;

/// A cluster of a code region whose bursts form at most this many unbroken runs among the bursts
/// of a larger cluster of the region on every rank is a stretch of time of that cluster: one or
/// two passing slowdowns (or speed-ups), rather than a pattern that comes back.
pub const MAX_STRETCHES: usize = 2;

/// Two clusters of one code region that share at least this many aligned columns, and at least
/// 1/[`SHARED_COLUMNS_PART`] of the columns of the one in fewer, are one computation: in one step
/// of the program some ranks ran it at one speed and the others at another. One shared column
/// could be the aligner's choice around a missing burst.
pub const MIN_SHARED_COLUMNS: usize = 2;
/// See [`MIN_SHARED_COLUMNS`].
pub const SHARED_COLUMNS_PART: usize = 4;

/// Per-cluster facts for the merges.
struct Summary {
    group: u32,
    lo: Coords,
    hi: Coords,
    sum: Coords,
    points: usize,
    ranks: Vec<bool>,
}

impl Summary {
    fn centroid(&self) -> Coords {
        self.sum.map(|x| x / self.points as f64)
    }
}

fn summaries(
    points: &PointSet,
    labels: &[ClusterId],
    sequences: &RankSequences,
) -> BTreeMap<ClusterId, Summary> {
    let mut out: BTreeMap<ClusterId, Summary> = BTreeMap::new();
    for (p, (&label, c)) in labels.iter().zip(points.coords()).enumerate() {
        if label == NOISE {
            continue;
        }
        let s = out.entry(label).or_insert_with(|| Summary {
            group: points.groups()[p],
            lo: *c,
            hi: *c,
            sum: [0.0; MAX_DIMS],
            points: 0,
            ranks: vec![false; sequences.ranks()],
        });
        for (d, &x) in c.iter().enumerate() {
            s.lo[d] = s.lo[d].min(x);
            s.hi[d] = s.hi[d].max(x);
            s.sum[d] += x;
        }
        s.points += 1;
        s.ranks[sequences.rank_of(p) as usize] = true;
    }
    out
}

/// Union–find over cluster ids whose roots are the smallest id of each set.
struct Sets(BTreeMap<ClusterId, ClusterId>);

impl Sets {
    fn root(&self, mut id: ClusterId) -> ClusterId {
        while let Some(&parent) = self.0.get(&id).filter(|&&p| p != id) {
            id = parent;
        }
        id
    }

    fn union(&mut self, a: ClusterId, b: ClusterId) {
        let (ra, rb) = (self.root(a), self.root(b));
        let (low, high) = (ra.min(rb), ra.max(rb));
        if low != high {
            self.0.insert(high, low);
        }
    }

    /// Every id that is not its own root, mapped to its root.
    fn mapping(&self) -> BTreeMap<ClusterId, ClusterId> {
        self.0
            .keys()
            .map(|&id| (id, self.root(id)))
            .filter(|(id, root)| id != root)
            .collect()
    }
}

/// `labels` with every id that `map` holds replaced by its target.
pub(super) fn relabel(
    labels: &[ClusterId],
    map: &BTreeMap<ClusterId, ClusterId>,
) -> Vec<ClusterId> {
    labels
        .iter()
        .map(|l| map.get(l).copied().unwrap_or(*l))
        .collect()
}

/// The aligned column of every point.
fn columns_of_points(sequences: &RankSequences, score: &SequenceScore) -> Vec<u32> {
    let mut column = vec![0; sequences.points()];
    for rank in 0..sequences.ranks() {
        for (&p, &j) in sequences
            .sequence(rank)
            .iter()
            .zip(score.alignment().positions(rank))
        {
            column[p] = j;
        }
    }
    column
}

/// Merges the region variants and rank splits of one computation among the clusters not in
/// `frozen` (see the module documentation). Returns the new labels and their score; `align`
/// aligns and scores a labelling (ACR's one alignment per step happens here, on the candidates'
/// joint symbols).
pub fn merge_region_variants(
    points: &PointSet,
    labels: &[ClusterId],
    sequences: &RankSequences,
    eps: f64,
    frozen: impl Fn(ClusterId) -> bool,
    align: impl Fn(&[ClusterId]) -> SequenceScore,
) -> (Vec<ClusterId>, SequenceScore) {
    let clusters = summaries(points, labels, sequences);
    let open: Vec<(&ClusterId, &Summary)> =
        clusters.iter().filter(|(&id, _)| !frozen(id)).collect();
    let mut candidates = Sets(BTreeMap::new());
    for (i, &(&a, sa)) in open.iter().enumerate() {
        for &(&b, sb) in &open[i + 1..] {
            let disjoint = sa.ranks.iter().zip(&sb.ranks).all(|(&x, &y)| !(x && y));
            let variants = sa.group != sb.group
                && boxes_distance2(&sa.lo, &sa.hi, &sb.lo, &sb.hi) <= eps * eps;
            let rank_split = sa.group == sb.group && points.by_region();
            if disjoint && (variants || rank_split) {
                candidates.union(a, b);
            }
        }
    }
    let joint = candidates.mapping();
    if joint.is_empty() {
        return (labels.to_vec(), align(labels));
    }
    let score = align(&relabel(labels, &joint));

    // Columns of each candidate, sorted and deduplicated.
    let column = columns_of_points(sequences, &score);
    let candidate: BTreeSet<ClusterId> = joint.iter().flat_map(|(&a, &b)| [a, b]).collect();
    let mut columns: BTreeMap<ClusterId, Vec<u32>> = BTreeMap::new();
    for (p, &label) in labels.iter().enumerate() {
        if candidate.contains(&label) {
            columns.entry(label).or_default().push(column[p]);
        }
    }
    for c in columns.values_mut() {
        c.sort_unstable();
        c.dedup();
    }
    let mut variants = Sets(BTreeMap::new());
    let members: Vec<(&ClusterId, &Vec<u32>)> = columns.iter().collect();
    for (i, &(&a, ca)) in members.iter().enumerate() {
        for &(&b, cb) in &members[i + 1..] {
            if candidates.root(a) == candidates.root(b)
                && 2 * shared(ca, cb) >= ca.len().min(cb.len())
            {
                variants.union(a, b);
            }
        }
    }
    let merged = relabel(labels, &variants.mapping());
    let score = score.relabelled(&merged, sequences);
    (merged, score)
}

/// Elements two sorted lists share.
fn shared(a: &[u32], b: &[u32]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

/// Joins rare clusters into the frequent cluster whose place they take (see the module
/// documentation). `score` is the alignment of `labels`. Returns each joined cluster's host.
pub fn join_rare_variants(
    points: &PointSet,
    labels: &[ClusterId],
    sequences: &RankSequences,
    score: &SequenceScore,
) -> BTreeMap<ClusterId, ClusterId> {
    let columns: BTreeMap<ClusterId, u64> = score
        .symbols()
        .filter(|&id| id != NOISE)
        .filter_map(|id| Some((id, score.tally(id)?.columns)))
        .collect();
    let most = columns.values().copied().max().unwrap_or(0);
    let rare = |id: ClusterId| columns.get(&id).is_some_and(|&c| c * RARE_FACTOR <= most);
    if !columns.keys().any(|&id| rare(id)) {
        return BTreeMap::new();
    }
    let clusters = summaries(points, labels, sequences);
    let centroid = |id: ClusterId| clusters[&id].centroid();
    let mut ends: BTreeMap<ClusterId, BTreeSet<u32>> = BTreeMap::new();
    for (&label, &end) in labels.iter().zip(points.ends()) {
        if label != NOISE {
            ends.entry(label).or_default().insert(end);
        }
    }
    let same_end = |guest: ClusterId, host: ClusterId| !ends[&guest].is_disjoint(&ends[&host]);
    let mut labels = labels.to_vec();
    let mut hosts: BTreeMap<ClusterId, ClusterId> = BTreeMap::new();
    loop {
        let contexts = contexts(&labels, sequences);
        let usual: BTreeMap<ClusterId, Context> = contexts
            .iter()
            .filter(|(&id, _)| !rare(id))
            .map(|(&id, seen)| (id, most_common(seen)))
            .collect();
        let mut joined = None;
        for (&guest, seen) in contexts.iter().filter(|(&id, _)| rare(id)) {
            let (before, after) = most_common(seen);
            // A neighbour matches when it is the host's usual one, or unknown: rare (it may be
            // the perturbed occurrence of the host's neighbour) or the end of the sequence.
            let side = |mine: Option<ClusterId>, theirs: Option<ClusterId>| match mine {
                Some(id) if !rare(id) => (mine == theirs).then_some(1),
                _ => Some(0),
            };
            let host = usual
                .iter()
                .filter(|(&host, _)| same_end(guest, host))
                .filter_map(|(&host, &(host_before, host_after))| {
                    let real = side(before, host_before)? + side(after, host_after)?;
                    (real > 0).then(|| {
                        let (a, b) = (centroid(guest), centroid(host));
                        let d2 = distance2(&a, &b);
                        (std::cmp::Reverse(real), d2, host)
                    })
                })
                .min_by(|x, y| x.0.cmp(&y.0).then(x.1.total_cmp(&y.1)).then(x.2.cmp(&y.2)));
            if let Some((_, _, host)) = host {
                joined = Some((guest, host));
                break;
            }
        }
        let Some((guest, host)) = joined else { break };
        // Hosts are frequent, so never guests: the map needs no chains.
        for label in &mut labels {
            if *label == guest {
                *label = host;
            }
        }
        hosts.insert(guest, host);
    }
    hosts
}

/// The clustered bursts before and after a burst in its rank's sequence (noise skipped; `None`
/// at either end).
type Context = (Option<ClusterId>, Option<ClusterId>);

/// Every context each cluster was seen in, with counts.
fn contexts(
    labels: &[ClusterId],
    sequences: &RankSequences,
) -> BTreeMap<ClusterId, BTreeMap<Context, u64>> {
    contexts_within(labels, sequences, |_| 0)
}

/// Every context each cluster was seen in, with counts, where a burst's neighbours are the
/// clustered bursts of its own group (`group_of` a point) before and after it in its rank's
/// sequence.
fn contexts_within(
    labels: &[ClusterId],
    sequences: &RankSequences,
    group_of: impl Fn(usize) -> u32,
) -> BTreeMap<ClusterId, BTreeMap<Context, u64>> {
    let mut out: BTreeMap<ClusterId, BTreeMap<Context, u64>> = BTreeMap::new();
    for rank in 0..sequences.ranks() {
        let mut clustered: BTreeMap<u32, Vec<ClusterId>> = BTreeMap::new();
        for &p in sequences.sequence(rank) {
            if labels[p] != NOISE {
                clustered.entry(group_of(p)).or_default().push(labels[p]);
            }
        }
        for group in clustered.values() {
            for (k, &id) in group.iter().enumerate() {
                let before = k.checked_sub(1).map(|k| group[k]);
                let after = group.get(k + 1).copied();
                *out.entry(id)
                    .or_default()
                    .entry((before, after))
                    .or_default() += 1;
            }
        }
    }
    out
}

/// The most frequent context, ties to the smallest.
fn most_common(seen: &BTreeMap<Context, u64>) -> Context {
    seen.iter()
        .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
        .map(|(&context, _)| context)
        .expect("a cluster has at least one burst")
}

/// Joins the clusters of one code region that are one computation run at other speeds: those
/// that share aligned columns, and stretches of time of a larger cluster of the region (see the
/// module documentation). A cluster's region is the one most of its bursts have (a stretch at the
/// start of a run also holds the first bursts, from another call site). `score` is the alignment
/// of `labels`. Returns each joined cluster's host, the smallest id of its set.
pub fn join_same_region(
    points: &PointSet,
    labels: &[ClusterId],
    sequences: &RankSequences,
    score: &SequenceScore,
) -> BTreeMap<ClusterId, ClusterId> {
    if !points.by_region() {
        return BTreeMap::new();
    }
    let clusters = summaries(points, labels, sequences);
    let mut per_region: BTreeMap<(ClusterId, u32), usize> = BTreeMap::new();
    for (&label, &group) in labels.iter().zip(points.groups()) {
        if label != NOISE {
            *per_region.entry((label, group)).or_default() += 1;
        }
    }
    let mut region: BTreeMap<ClusterId, (u32, usize)> = BTreeMap::new();
    for (&(id, group), &n) in &per_region {
        let best = region.entry(id).or_insert((group, n));
        if n > best.1 {
            *best = (group, n);
        }
    }
    let mut sets = Sets(BTreeMap::new());

    // Clusters of one region in the same aligned columns.
    let column = columns_of_points(sequences, score);
    let mut columns: BTreeMap<ClusterId, Vec<u32>> = BTreeMap::new();
    for (p, &label) in labels.iter().enumerate() {
        if label != NOISE {
            columns.entry(label).or_default().push(column[p]);
        }
    }
    for c in columns.values_mut() {
        c.sort_unstable();
        c.dedup();
    }
    let ids: Vec<ClusterId> = region.keys().copied().collect();
    for (i, &a) in ids.iter().enumerate() {
        for &b in &ids[i + 1..] {
            let (ca, cb) = (&columns[&a], &columns[&b]);
            let fewer = ca.len().min(cb.len());
            if region[&a].0 == region[&b].0
                && shared(ca, cb) >= MIN_SHARED_COLUMNS.max(fewer.div_ceil(SHARED_COLUMNS_PART))
            {
                sets.union(a, b);
            }
        }
    }

    // Stretches of time of a larger cluster of the region that runs on every rank the guest runs
    // on: the one whose place it takes most often, then the nearest, then the lower id.
    let centroid = |id: ClusterId| clusters[&id].centroid();
    let larger = |a: ClusterId, b: ClusterId| {
        (clusters[&a].points, std::cmp::Reverse(a)) > (clusters[&b].points, std::cmp::Reverse(b))
    };
    // The guest's unbroken runs among the host's bursts, at most MAX_STRETCHES on every rank.
    let stretch_of = |guest: ClusterId, host: ClusterId| {
        (0..sequences.ranks()).all(|rank| {
            let mut runs = 0;
            let mut previous = NOISE;
            for &p in sequences.sequence(rank) {
                let label = labels[p];
                if label == guest || label == host {
                    runs += usize::from(label == guest && previous != guest);
                    previous = label;
                }
            }
            runs <= MAX_STRETCHES
        })
    };
    let within_region = contexts_within(labels, sequences, |p| points.groups()[p]);
    let mut hosts: BTreeMap<ClusterId, Vec<ClusterId>> = BTreeMap::new();
    for (&guest, &(group, _)) in &region {
        let ranks = |id: ClusterId| clusters[&id].ranks.iter();
        let mut candidates: Vec<ClusterId> = region
            .iter()
            .filter(|&(&host, &(host_group, _))| {
                host_group == group
                    && larger(host, guest)
                    && ranks(guest).zip(ranks(host)).all(|(&g, &h)| h || !g)
                    && stretch_of(guest, host)
            })
            .map(|(&host, _)| host)
            .collect();
        candidates.sort_by(|&a, &b| {
            distance2(&centroid(guest), &centroid(a))
                .total_cmp(&distance2(&centroid(guest), &centroid(b)))
                .then(a.cmp(&b))
        });
        if !candidates.is_empty() {
            hosts.insert(guest, candidates);
        }
    }
    for (guest, host) in place_stretches(&hosts, &within_region) {
        sets.union(guest, host);
    }
    sets.mapping()
}

/// Rounds of `place_stretches`' search at most: each round moves one guest to a host whose place
/// more of the guests' bursts take, so it ends long before on any real job.
const MAX_PLACING_ROUNDS: usize = 64;
/// (guest, host) pairs above which `place_stretches` keeps each guest's own choice: each round
/// scores every pair, and a few stretches slowed together make a handful of pairs.
const MAX_PLACING_PAIRS: usize = 64;

/// A host for each stretch guest among its `candidates` (nearest first). Each guest first takes
/// the host whose usual place most of its bursts take, then the nearest. Then the search looks
/// for the assignment under which the most guest bursts sit where their host's bursts usually
/// sit among the bursts of their region, every guest read as its host (see the module
/// documentation): it moves one guest at a time while that places more bursts, taking the first
/// of a round's best moves.
fn place_stretches(
    candidates: &BTreeMap<ClusterId, Vec<ClusterId>>,
    within_region: &BTreeMap<ClusterId, BTreeMap<Context, u64>>,
) -> BTreeMap<ClusterId, ClusterId> {
    let own_choice = |guest: ClusterId, hosts: &[ClusterId]| {
        let in_place = |host: ClusterId| {
            let usual = most_common(&within_region[&host]);
            within_region[&guest].get(&usual).copied().unwrap_or(0)
        };
        // The first of the most placed: the nearest of them.
        let mut best = hosts[0];
        for &host in &hosts[1..] {
            if in_place(host) > in_place(best) {
                best = host;
            }
        }
        best
    };
    let mut assignment: BTreeMap<ClusterId, ClusterId> = candidates
        .iter()
        .map(|(&guest, hosts)| (guest, own_choice(guest, hosts)))
        .collect();
    let pairs: usize = candidates.values().map(Vec::len).sum();
    if pairs > MAX_PLACING_PAIRS || pairs == candidates.len() {
        return assignment;
    }
    let placed = |assignment: &BTreeMap<ClusterId, ClusterId>| -> u64 {
        // Every guest read as its last host (hosts are larger, so the chains end).
        let resolved: BTreeMap<ClusterId, ClusterId> = assignment
            .keys()
            .map(|&guest| {
                let mut id = guest;
                while let Some(&host) = assignment.get(&id) {
                    id = host;
                }
                (guest, id)
            })
            .collect();
        let read = |id: ClusterId| resolved.get(&id).copied().unwrap_or(id);
        let map = |(before, after): Context| (before.map(read), after.map(read));
        // Either end of a rank's run of the region matches any neighbour.
        let side =
            |mine: Option<ClusterId>, usual: Option<ClusterId>| mine.is_none() || mine == usual;
        let mut usual: BTreeMap<ClusterId, Context> = BTreeMap::new();
        let mut total = 0;
        for (guest, &host) in &resolved {
            let usual = *usual.entry(host).or_insert_with(|| {
                let mut seen: BTreeMap<Context, u64> = BTreeMap::new();
                for (&context, &n) in &within_region[&host] {
                    *seen.entry(map(context)).or_default() += n;
                }
                most_common(&seen)
            });
            total += within_region[guest]
                .iter()
                .filter(|&(&context, _)| {
                    let (before, after) = map(context);
                    side(before, usual.0) && side(after, usual.1)
                })
                .map(|(_, &n)| n)
                .sum::<u64>();
        }
        total
    };
    let mut best = placed(&assignment);
    for _ in 0..MAX_PLACING_ROUNDS {
        let mut better: Option<(u64, BTreeMap<ClusterId, ClusterId>)> = None;
        for (&guest, hosts) in candidates {
            for &host in hosts {
                if assignment[&guest] == host {
                    continue;
                }
                let mut tried = assignment.clone();
                tried.insert(guest, host);
                let n = placed(&tried);
                if n > better.as_ref().map_or(best, |(m, _)| *m) {
                    better = Some((n, tried));
                }
            }
        }
        let Some((n, tried)) = better else { break };
        best = n;
        assignment = tried;
    }
    assignment
}

/// Bursts of a cluster that take a place at least this many times over all ranks make that place
/// a pattern.
pub const MIN_PLACE_BURSTS: u64 = 4;
/// A place is a cluster's when at least this share of the clustered bursts that take it are of
/// that cluster.
pub const PLACE_SHARE: f64 = 0.75;

/// Moves each lone burst, clustered or noise, that sits where another cluster of its code region
/// almost always sits into that cluster (see the module documentation). Returns the new labels
/// and how many bursts moved.
pub fn place_lone_bursts(
    points: &PointSet,
    labels: &[ClusterId],
    sequences: &RankSequences,
) -> (Vec<ClusterId>, usize) {
    if !points.by_region() {
        return (labels.to_vec(), 0);
    }
    let region = |p: usize| points.groups()[p];
    // Per rank and region, the bursts in time order.
    let mut runs: Vec<Vec<usize>> = Vec::new();
    for rank in 0..sequences.ranks() {
        let mut by_region: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &p in sequences.sequence(rank) {
            by_region.entry(region(p)).or_default().push(p);
        }
        runs.extend(by_region.into_values());
    }
    // Each burst's context: the nearest clustered bursts of its run before and after it, with
    // their positions.
    let neighbours = |run: &[usize]| -> Vec<(Option<usize>, Option<usize>)> {
        let mut out = vec![(None, None); run.len()];
        let mut last = None;
        for (k, &p) in run.iter().enumerate() {
            out[k].0 = last;
            if labels[p] != NOISE {
                last = Some(k);
            }
        }
        last = None;
        for (k, &p) in run.iter().enumerate().rev() {
            out[k].1 = last;
            if labels[p] != NOISE {
                last = Some(k);
            }
        }
        out
    };
    let around: Vec<Vec<(Option<usize>, Option<usize>)>> =
        runs.iter().map(|run| neighbours(run)).collect();
    let context = |run: &[usize], (before, after): (Option<usize>, Option<usize>)| -> Context {
        (
            before.map(|k| labels[run[k]]),
            after.map(|k| labels[run[k]]),
        )
    };
    // Per region and context, the clusters of the clustered bursts found there. A burst at either
    // end of its run is seen in every context whose other side it shares: the first burst of a
    // run is not known to be out of place by its start, but by what follows it.
    let mut seen: BTreeMap<(u32, Context), BTreeMap<ClusterId, u64>> = BTreeMap::new();
    for (run, around) in runs.iter().zip(&around) {
        for (&p, &near) in run.iter().zip(around) {
            if labels[p] == NOISE {
                continue;
            }
            let (before, after) = context(run, near);
            let keys: BTreeSet<Context> = [(before, after), (None, after), (before, None)]
                .into_iter()
                .filter(|&key| key != (None, None))
                .collect();
            for key in keys {
                *seen
                    .entry((region(p), key))
                    .or_default()
                    .entry(labels[p])
                    .or_default() += 1;
            }
        }
    }
    // The cluster whose place a context of a region is, if any.
    let owner = |region: u32, context: Context| -> Option<ClusterId> {
        let found = seen.get(&(region, context))?;
        let total: u64 = found.values().sum();
        let (&id, &n) = found
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))?;
        (n >= MIN_PLACE_BURSTS && n as f64 >= PLACE_SHARE * total as f64).then_some(id)
    };
    let elsewhere: Vec<Vec<Option<ClusterId>>> = runs
        .iter()
        .zip(&around)
        .map(|(run, around)| {
            run.iter()
                .zip(around)
                .map(|(&p, &a)| owner(region(p), context(run, a)).filter(|&id| id != labels[p]))
                .collect()
        })
        .collect();
    // A cluster whose bursts on a rank mostly sit in other clusters' places there is a path of
    // its own that the rank takes now and then (every sixth iteration, say), not a burst that
    // strayed.
    let mut out_of_place: BTreeMap<(ClusterId, u32), (usize, usize)> = BTreeMap::new();
    for (run, elsewhere) in runs.iter().zip(&elsewhere) {
        for (&p, e) in run.iter().zip(elsewhere) {
            let (out, all) = out_of_place
                .entry((labels[p], sequences.rank_of(p)))
                .or_default();
            *out += usize::from(e.is_some());
            *all += 1;
        }
    }
    let strays = |p: usize| {
        let key = (labels[p], sequences.rank_of(p));
        out_of_place
            .get(&key)
            .is_some_and(|&(out, all)| 2 * out < all)
    };
    let mut placed = labels.to_vec();
    let mut moved = 0;
    for ((run, around), elsewhere) in runs.iter().zip(&around).zip(&elsewhere) {
        // A clustered neighbour out of place too makes the context itself unsure; one at the end
        // of the run is out of place by one side only, which the burst itself may have put there.
        let unsure = |k: Option<usize>| {
            k.is_some_and(|k| {
                let (before, after) = around[k];
                before.is_some() && after.is_some() && elsewhere[k].is_some()
            })
        };
        // Noise beside noise: a run of bursts that all take one place by the clustered bursts
        // around them, which at most one of them can be in.
        let noise_at = |k: Option<usize>| k.is_some_and(|k| labels[run[k]] == NOISE);
        for (k, &p) in run.iter().enumerate() {
            let Some(host) = elsewhere[k] else { continue };
            let (before, after) = around[k];
            let lone = if labels[p] == NOISE {
                !noise_at(k.checked_sub(1)) && !noise_at(Some(k + 1).filter(|&k| k < run.len()))
            } else {
                strays(p)
            };
            if lone && !unsure(before) && !unsure(after) {
                placed[p] = host;
                moved += 1;
            }
        }
    }
    (placed, moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `place_lone_bursts` on one code region, each rank's bursts labelled in time order.
    fn placed(ranks: &[&[ClusterId]]) -> (Vec<Vec<ClusterId>>, usize) {
        let labels: Vec<ClusterId> = ranks.iter().flat_map(|r| r.iter().copied()).collect();
        let rank_of: Vec<u32> = ranks
            .iter()
            .enumerate()
            .flat_map(|(rank, r)| std::iter::repeat_n(rank as u32, r.len()))
            .collect();
        let start: Vec<u64> = (0..labels.len() as u64).collect();
        let sequences = RankSequences::new(ranks.len(), rank_of, &start, vec![1; labels.len()]);
        let points = PointSet::with_regions(
            1,
            vec![[0.0; MAX_DIMS]; labels.len()],
            vec![0; labels.len()],
        );
        let (out, moved) = place_lone_bursts(&points, &labels, &sequences);
        let mut rest = &out[..];
        let per_rank = ranks
            .iter()
            .map(|r| {
                let (mine, others) = rest.split_at(r.len());
                rest = others;
                mine.to_vec()
            })
            .collect();
        (per_rank, moved)
    }

    const A: ClusterId = 1;
    const B: ClusterId = 2;
    const C: ClusterId = 3;
    const N: ClusterId = NOISE;
    /// A phase alternating between two clusters, with nothing out of place.
    const ALTERNATING: &[ClusterId] = &[A, B, A, B, A, B, A, B, A, B, A, B];

    #[test]
    fn a_lone_burst_in_the_other_cluster_s_place_joins_it() {
        let strayed: &[ClusterId] = &[A, B, A, B, B, B, A, B, A, B, A, B];
        let (out, moved) = placed(&[strayed, ALTERNATING]);
        assert_eq!((out[0].as_slice(), moved), (ALTERNATING, 1));
    }

    #[test]
    fn noise_beside_noise_stays_noise() {
        // The three noise bursts all sit between two A bursts, B's place, where only the middle
        // one belongs.
        let noisy: &[ClusterId] = &[A, B, A, B, A, N, N, N, A, B, A, B];
        let (out, moved) = placed(&[noisy, ALTERNATING]);
        assert_eq!((out[0].as_slice(), moved), (noisy, 0));
        // Alone, a noise burst joins the cluster whose place it takes.
        let lone: &[ClusterId] = &[A, B, A, B, A, N, A, B, A, B, A, B];
        let (out, moved) = placed(&[lone, ALTERNATING]);
        assert_eq!((out[0].as_slice(), moved), (ALTERNATING, 1));
    }

    #[test]
    fn a_path_a_rank_takes_now_and_then_keeps_its_cluster() {
        // Rank 0 takes path C every sixth step, in A's place; rank 1 takes it always. On rank 0
        // every C is out of place, so C is a path of its own there, whatever rank 1 does.
        let sometimes: &[ClusterId] = &[A, A, A, A, A, C, A, A, A, A, A, C, A, A, A, A, A, C, A];
        let always: &[ClusterId] = &[C; 19];
        let (out, moved) = placed(&[sometimes, always]);
        assert_eq!((out[0].as_slice(), moved), (sometimes, 0));
    }
}
