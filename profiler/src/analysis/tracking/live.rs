//! Stable cluster identities within one job ([`Tracker`]), after Llort et al. (2013) ("the
//! paper" below): each window's frame is related to the clusters of the previous one, ids are
//! handed on, and what happened between the windows (appear, vanish, split, merge, moved) is
//! reported as events.
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

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::relations::centroid_move;
use super::{relate, Edge, Frame, Relation, TrackedCluster, TrackingError, TrackingParams};
use crate::analysis::FeatureSet;

/// A cluster identity that survives re-clustering: assigned by a [`Tracker`], never reused.
/// 0 is never an id (it is the noise label in sequences).
pub type StableId = u32;

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

/// Of `ids`, the one with the largest affinity, then the most time, then the smallest id.
fn strongest(
    ids: &[u32],
    affinity: impl Fn(u32) -> f64,
    time_ns: impl Fn(u32) -> u64,
) -> Option<u32> {
    ids.iter().copied().max_by(|&x, &y| {
        affinity(x)
            .total_cmp(&affinity(y))
            .then(time_ns(x).cmp(&time_ns(y)))
            .then(y.cmp(&x))
    })
}

/// The window and kind of frame that one [`Tracker::update`] stamps its events with.
#[derive(Clone, Copy)]
struct Stamp {
    window: u64,
    /// The frame is a re-clustering of an open window.
    partial: bool,
}

impl Stamp {
    fn event(self, kind: EventKind, from: Vec<StableId>, to: Vec<StableId>) -> TrackingEvent {
        TrackingEvent {
            window: self.window,
            partial: self.partial,
            kind,
            from,
            to,
            distance: None,
            last_seen_window: None,
        }
    }
}

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

/// What one [`Tracker::update`] decides as it goes through the relations: the ids handed on so
/// far, the events, and what it can only report or apply once every new cluster has an id.
#[derive(Default)]
struct Assignment {
    /// Frame cluster id → stable id.
    ids: BTreeMap<u32, StableId>,
    events: Vec<TrackingEvent>,
    splits: Vec<Split>,
    merges: Vec<Merge>,
    /// Old ids merged into another cluster.
    retired: BTreeSet<StableId>,
    /// Frame clusters that no old id continues (split parts, then the unrelated ones).
    without_id: Vec<u32>,
    /// Ids reported as moved, whose anchor becomes their new centroid.
    reanchored: BTreeSet<StableId>,
}

impl Assignment {
    /// Reports the splits with at least two significant parts and the merges of at least two
    /// significant clusters, now that every part has an id.
    fn report_splits_and_merges(&mut self, stamp: Stamp) {
        for split in std::mem::take(&mut self.splits) {
            if split.significant.len() >= 2 {
                let to = split
                    .heir
                    .iter()
                    .chain(&split.parts)
                    .filter(|j| split.significant.contains(j))
                    .map(|j| self.ids[j])
                    .collect();
                self.events
                    .push(stamp.event(EventKind::Split, vec![split.parent], to));
            }
        }
        for merge in std::mem::take(&mut self.merges) {
            if merge.parts.len() >= 2 {
                let to = vec![self.ids[&merge.child]];
                self.events
                    .push(stamp.event(EventKind::Merge, merge.parts, to));
            }
        }
    }
}

/// The old ids of one relation paired with the new clusters that continue them.
#[derive(Default)]
struct Heirs {
    /// Old id → frame cluster id.
    heir_of: BTreeMap<StableId, u32>,
    /// Frame clusters already paired.
    taken: BTreeSet<u32>,
}

impl Heirs {
    /// Pairs `i` with `j` unless either is paired already.
    fn claim(&mut self, i: StableId, j: u32) {
        if !self.heir_of.contains_key(&i) && !self.taken.contains(&j) {
            self.heir_of.insert(i, j);
            self.taken.insert(j);
        }
    }
}

/// One relation between the active clusters (A, the old ids) and the new frame's clusters (B),
/// with what the rules that hand the ids on measure of it.
struct RelationView<'a> {
    relation: &'a Relation,
    reference: &'a Frame,
    frame: &'a Frame,
    params: &'a TrackingParams,
    /// Whether centroids compare across the frames.
    same_features: bool,
    /// The time each side of the relation holds.
    time_a: u64,
    time_b: u64,
    any_significant_new: bool,
}

impl<'a> RelationView<'a> {
    fn new(
        relation: &'a Relation,
        reference: &'a Frame,
        frame: &'a Frame,
        params: &'a TrackingParams,
    ) -> Self {
        let mut view = RelationView {
            relation,
            reference,
            frame,
            params,
            same_features: reference.features == frame.features,
            time_a: 0,
            time_b: 0,
            any_significant_new: false,
        };
        view.time_a = relation
            .a
            .iter()
            .map(|&i| view.old_cluster(i).time_ns)
            .sum();
        view.time_b = relation
            .b
            .iter()
            .map(|&j| view.new_cluster(j).time_ns)
            .sum();
        view.any_significant_new = relation.b.iter().any(|&j| view.significant_new(j));
        view
    }

    fn old_cluster(&self, i: StableId) -> &'a TrackedCluster {
        self.reference
            .cluster(i)
            .expect("related ids are in the reference")
    }

    fn new_cluster(&self, j: u32) -> &'a TrackedCluster {
        self.frame.cluster(j).expect("related ids are in the frame")
    }

    fn edge(&self, i: StableId, j: u32) -> Option<&'a Edge> {
        self.relation.edges.iter().find(|e| e.a == i && e.b == j)
    }

    fn affinity_ab(&self, i: StableId, j: u32) -> f64 {
        self.edge(i, j).map_or(0.0, |e| e.displacement_ab)
    }

    fn affinity_ba(&self, i: StableId, j: u32) -> f64 {
        self.edge(i, j).map_or(0.0, |e| e.displacement_ba)
    }

    /// E1 affinity in both directions, summed.
    fn affinity(&self, i: StableId, j: u32) -> f64 {
        self.affinity_ab(i, j) + self.affinity_ba(i, j)
    }

    /// The centroid move from `i` to `j`, when the frames' features compare.
    fn moved(&self, i: StableId, j: u32) -> Option<f64> {
        self.same_features.then(|| {
            let (old, new) = (self.old_cluster(i), self.new_cluster(j));
            centroid_move(self.frame.features, &old.centroid, &new.centroid, 0.0)
        })
    }

    // A part of a split or merge counts when it is relevant and holds at least the outlier
    // share of its side of the relation (the 5 % rule of Llort et al. (2013) for a split row).
    fn significant_old(&self, i: StableId) -> bool {
        let old = self.old_cluster(i);
        self.params.is_relevant(old)
            && old.time_ns as f64 >= self.params.outlier_share * self.time_a as f64
    }

    fn significant_new(&self, j: u32) -> bool {
        let new = self.new_cluster(j);
        self.params.is_relevant(new)
            && new.time_ns as f64 >= self.params.outlier_share * self.time_b as f64
    }

    /// A cluster that stayed where the old one was continues it, unless it is a remnant: when a
    /// phase changes at the start of a window, a few bursts of the old behaviour stay behind
    /// while the bulk moves, and the bulk is what continues the phase.
    fn stayed(&self, i: StableId, j: u32) -> bool {
        self.moved(i, j)
            .is_some_and(|d| d <= self.params.move_threshold)
            && (self.significant_new(j) || !self.any_significant_new)
    }

    /// Rule 1, continuations: an old cluster and a new one that stayed where it was, by E1
    /// affinity (both directions), then the smaller move.
    fn continuations(&self) -> Heirs {
        let mut pairs: Vec<(f64, f64, StableId, u32)> = Vec::new();
        for &i in &self.relation.a {
            for &j in &self.relation.b {
                if self.stayed(i, j) {
                    let d = self.moved(i, j).unwrap_or(0.0);
                    pairs.push((self.affinity(i, j), d, i, j));
                }
            }
        }
        pairs.sort_by(|x, y| {
            y.0.total_cmp(&x.0)
                .then(x.1.total_cmp(&y.1))
                .then((x.2, x.3).cmp(&(y.2, y.3)))
        });
        let mut heirs = Heirs::default();
        for &(_, _, i, j) in &pairs {
            heirs.claim(i, j);
        }
        // Of the old clusters that stayed where a new one is, the oldest id continues it (ids
        // grow with time): a phase that shed a part for a window and takes it back keeps its
        // own id, and the part's id merges into it.
        for &(_, _, i, j) in &pairs {
            let heir_of = &mut heirs.heir_of;
            let heir = heir_of.iter().find(|&(_, &h)| h == j).map(|(&old, _)| old);
            if let Some(heir) = heir.filter(|&heir| i < heir && !heir_of.contains_key(&i)) {
                heir_of.remove(&heir);
                heir_of.insert(i, j);
            }
        }
        heirs
    }

    /// Rule 2, moves: old clusters without a continuation and new clusters near no old one are
    /// paired by the time they hold (the bulk of a phase continues it).
    fn pair_moves(&self, heirs: &mut Heirs) {
        let lonely_old: Vec<StableId> = self
            .relation
            .a
            .iter()
            .copied()
            .filter(|&i| self.relation.b.iter().all(|&j| !self.stayed(i, j)))
            .collect();
        let lonely_new: Vec<u32> = self
            .relation
            .b
            .iter()
            .copied()
            .filter(|&j| self.relation.a.iter().all(|&i| !self.stayed(i, j)))
            .collect();
        let mut pairs: Vec<(u64, f64, StableId, u32)> = Vec::new();
        for &i in &lonely_old {
            for &j in &lonely_new {
                let bulk = self.old_cluster(i).time_ns.min(self.new_cluster(j).time_ns);
                pairs.push((bulk, self.affinity(i, j), i, j));
            }
        }
        pairs.sort_by(|x, y| {
            y.0.cmp(&x.0)
                .then(y.1.total_cmp(&x.1))
                .then((x.2, x.3).cmp(&(y.2, y.3)))
        });
        for (_, _, i, j) in pairs {
            heirs.claim(i, j);
        }
    }

    /// Rule 3: the new clusters no old id continues split off the old cluster most of their
    /// bursts are nearest to; their ids are decided later.
    fn split(&self, heirs: &Heirs, assignment: &mut Assignment) {
        let mut split_parts: BTreeMap<StableId, Vec<u32>> = BTreeMap::new();
        for &j in &self.relation.b {
            if assignment.ids.contains_key(&j) {
                continue;
            }
            assignment.without_id.push(j);
            let nearest_old = |x| self.affinity_ba(x, j);
            let parent = strongest(&self.relation.a, nearest_old, |x| {
                self.old_cluster(x).time_ns
            })
            .expect("a relation has an A side");
            split_parts.entry(parent).or_default().push(j);
        }
        for (parent, parts) in split_parts {
            let heir = heirs.heir_of.get(&parent).copied();
            let significant = heir
                .iter()
                .chain(&parts)
                .copied()
                .filter(|&j| self.significant_new(j))
                .collect();
            assignment.splits.push(Split {
                parent,
                heir,
                parts,
                significant,
            });
        }
    }

    /// Rule 4: the old clusters without an heir retire, merged into the new cluster most of
    /// their bursts are nearest to.
    fn merge(&self, heirs: &Heirs, assignment: &mut Assignment) {
        let mut merged_into: BTreeMap<u32, Vec<StableId>> = BTreeMap::new();
        for &i in &self.relation.a {
            if heirs.heir_of.contains_key(&i) {
                continue;
            }
            assignment.retired.insert(i);
            let nearest_new = |x| self.affinity_ab(i, x);
            let child = strongest(&self.relation.b, nearest_new, |x| {
                self.new_cluster(x).time_ns
            })
            .expect("a relation has a B side");
            merged_into.entry(child).or_default().push(i);
        }
        for (child, mut parts) in merged_into {
            if let Some((&heir, _)) = heirs.heir_of.iter().find(|(_, &j)| j == child) {
                parts.push(heir);
            }
            parts.retain(|&i| self.significant_old(i));
            parts.sort_unstable();
            assignment.merges.push(Merge { child, parts });
        }
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
        let stamp = Stamp {
            window,
            partial: !closed,
        };
        // Against the active clusters (with the last frame's sequences and simultaneities).
        let active: BTreeSet<StableId> = self.active_ids().collect();
        let reference = self.reference(&active, true);
        let pairing = relate(&reference, frame, &self.params, 0.0);
        let mut assignment = Assignment::default();
        for relation in &pairing.relations {
            let view = RelationView::new(relation, &reference, frame, &self.params);
            self.hand_on(&view, stamp, &mut assignment);
        }

        // New clusters without an id (unrelated ones and split parts) revive a dormant id when
        // they relate 1:1 to it and stayed where it was; else they get a new id.
        assignment
            .without_id
            .extend(pairing.unmatched_b.iter().copied());
        assignment.without_id.sort_unstable();
        self.revive_dormant(frame, &mut assignment);
        self.number_new_clusters(frame, &pairing.unmatched_b, stamp, &mut assignment);
        assignment.report_splits_and_merges(stamp);

        let vanished = self.refresh_live(window, frame, closed, &assignment);
        let Assignment {
            ids, mut events, ..
        } = assignment;
        self.remove_vanished(vanished, stamp, &mut events);
        self.last = Some(frame.relabelled(&ids));
        self.record(&events);
        TrackUpdate { ids, events }
    }

    /// Hands the ids of one relation's old clusters on (rules 1 to 4 of the module docs):
    /// continuations and moves keep their ids, the new clusters left over become split parts
    /// and the old ones left over retire into merges.
    fn hand_on(&self, view: &RelationView<'_>, stamp: Stamp, assignment: &mut Assignment) {
        let mut heirs = view.continuations();
        view.pair_moves(&mut heirs);
        for (&i, &j) in &heirs.heir_of {
            assignment.ids.insert(j, i);
            if let Some(distance) = self.reported_move(view, i, j) {
                let mut event = stamp.event(EventKind::Moved, vec![i], vec![i]);
                event.distance = Some(distance);
                assignment.events.push(event);
                assignment.reanchored.insert(i);
            }
        }
        view.split(&heirs, assignment);
        view.merge(&heirs, assignment);
    }

    /// How far the new cluster `j` that keeps the id `i` moved, from the old cluster or from
    /// the id's anchor (the larger), when that is a move to report.
    fn reported_move(&self, view: &RelationView<'_>, i: StableId, j: u32) -> Option<f64> {
        let new = view.new_cluster(j);
        let drift = view
            .same_features
            .then(|| self.live.get(&i))
            .flatten()
            .map(|l| centroid_move(view.frame.features, &l.anchor, &new.centroid, 0.0));
        let distance = view.moved(i, j).unwrap_or(0.0).max(drift.unwrap_or(0.0));
        let relevant = self.params.is_relevant(view.old_cluster(i)) || self.params.is_relevant(new);
        (distance > self.params.move_threshold && relevant).then_some(distance)
    }

    /// Rule 5, first half: a new cluster without an id that relates 1:1 to a dormant id (not
    /// one retired by this update) and stayed where it was takes that id.
    fn revive_dormant(&self, frame: &Frame, assignment: &mut Assignment) {
        let dormant: BTreeSet<StableId> = self
            .live
            .iter()
            .filter(|(id, l)| !l.is_active() && !assignment.retired.contains(id))
            .map(|(&id, _)| id)
            .collect();
        if dormant.is_empty() || assignment.without_id.is_empty() {
            return;
        }
        let reference = self.reference(&dormant, false);
        let candidates = frame.restricted(&assignment.without_id.iter().copied().collect());
        let revival = relate(&reference, &candidates, &self.params, 0.0);
        for relation in revival.relations {
            if let ([i], [j]) = (&relation.a[..], &relation.b[..]) {
                let (old, new) = (reference.cluster(*i), frame.cluster(*j));
                let stayed = old.zip(new).is_some_and(|(old, new)| {
                    reference.features == frame.features
                        && centroid_move(frame.features, &old.centroid, &new.centroid, 0.0)
                            <= self.params.move_threshold
                });
                if stayed {
                    assignment.ids.insert(*j, *i);
                }
            }
        }
    }

    /// Rule 5, second half: the new clusters still without an id get new ids; an unrelated
    /// one (in `unmatched`) appears.
    fn number_new_clusters(
        &mut self,
        frame: &Frame,
        unmatched: &[u32],
        stamp: Stamp,
        assignment: &mut Assignment,
    ) {
        for &j in &assignment.without_id {
            if let Entry::Vacant(slot) = assignment.ids.entry(j) {
                let id = self.next_id;
                self.next_id = id.checked_add(1).expect("fewer than 2³² clusters per job");
                slot.insert(id);
                let relevant = frame.cluster(j).is_some_and(|c| self.params.is_relevant(c));
                if unmatched.contains(&j) && relevant {
                    assignment
                        .events
                        .push(stamp.event(EventKind::Appear, vec![], vec![id]));
                }
            }
        }
    }

    /// Updates the live set with the frame's clusters under their ids and returns the ids that
    /// vanish: those missing for too many closed windows, then the dormant ones seen longest
    /// ago while more than [`TrackingParams::max_phases`] ids are alive.
    fn refresh_live(
        &mut self,
        window: u64,
        frame: &Frame,
        closed: bool,
        assignment: &Assignment,
    ) -> Vec<StableId> {
        // Merged ids stay dormant (a later split may revive them) but expire without a vanish
        // event, since their merge was reported.
        for id in &assignment.retired {
            if let Some(live) = self.live.get_mut(id) {
                live.merged = true;
            }
        }
        let seen: BTreeSet<StableId> = assignment.ids.values().copied().collect();
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
        for (&j, &id) in &assignment.ids {
            let cluster = TrackedCluster {
                id,
                ..frame.cluster(j).expect("ids map frame clusters").clone()
            };
            let anchor = match self.live.get(&id) {
                Some(live)
                    if !assignment.reanchored.contains(&id)
                        && live.anchor.len() == cluster.centroid.len() =>
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
        vanished
    }

    /// Removes the `vanished` ids from the live set; a relevant one that did not merge vanishes
    /// (an event in `events`).
    fn remove_vanished(
        &mut self,
        mut vanished: Vec<StableId>,
        stamp: Stamp,
        events: &mut Vec<TrackingEvent>,
    ) {
        vanished.sort_unstable();
        for id in vanished {
            let live = self.live.remove(&id).expect("vanished ids are live");
            if self.params.is_relevant(&live.cluster) && !live.merged {
                let mut gone = stamp.event(EventKind::Vanish, vec![id], vec![]);
                gone.last_seen_window = Some(live.last_seen);
                events.push(gone);
            }
        }
    }

    /// Counts `events` and keeps the last [`TrackingParams::max_events`] of all.
    fn record(&mut self, events: &[TrackingEvent]) {
        for e in events {
            self.counts.count(e.kind);
            self.events.push_back(e.clone());
        }
        while self.events.len() > self.params.max_events {
            self.events.pop_front();
            self.events_dropped += 1;
        }
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

#[cfg(test)]
mod tests;
