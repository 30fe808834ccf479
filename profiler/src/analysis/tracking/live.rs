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

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::relations::centroid_move;
use super::{relate, Frame, TrackedCluster, TrackingError, TrackingParams};
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
                let parent = strongest(&relation.a, |x| affinity_ba(x, j), |x| old(x).time_ns)
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
                let child = strongest(&relation.b, |x| affinity_ab(i, x), |x| new(x).time_ns)
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

#[cfg(test)]
mod tests;
