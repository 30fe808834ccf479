//! Rank groups kept up to date while a job runs, after Chameleon (Bahmani and Mueller; chapter 5
//! of Bahmani's 2017 thesis): windows instead of its marker barriers, the states AT, C and L, and
//! behaviour changes where a re-clustering finds ranks with another call path than the last one.
//!
//! The tracker is fed cumulative per-rank counts, as the kernel sums them; only readings that
//! cross a window boundary change its state, so a recording that keeps those readings replays
//! to the same groups and changes.

use std::{collections::BTreeMap, sync::Arc};

use serde::{Deserialize, Serialize};

use super::{cluster, signature::Counts, GroupParams, RankGroup, RankSignature};

/// Chameleon's states, after the window that closed last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupState {
    /// AT: a rank's call path changed in the last window (or no window closed yet); the groups
    /// are those of the last clustering, or provisional ones before the first.
    #[default]
    AllTracing,
    /// C: the call paths were the same in the last two windows: the ranks were re-clustered.
    Clustering,
    /// L: stable since the last clustering; the groups follow the counts, their call paths stay.
    Lead,
}

/// Ranks that kept another call path: found when the new behaviour was stable for two windows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BehaviourChange {
    /// The window in which a rank's call path first differed (Unix start ÷ window length).
    pub window: u64,
    /// That window as the kernel readings that delimit it (Unix ns): the change happened by its
    /// end, after its start or in a call that returned after it.
    pub start_ns: u64,
    pub end_ns: u64,
    /// End of the window that confirmed the new behaviour (the re-clustering).
    pub confirmed_ns: u64,
    /// The ranks whose call path changed, ascending.
    pub ranks: Vec<u32>,
    /// The groups before and after the change; job-wide, those of the leads of the groups of
    /// the nodes that saw it, clustered together.
    pub groups_before: usize,
    pub groups_after: usize,
    /// Job-wide only: the nodes that saw the change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<String>,
    /// The lead ranks' signatures of the groups before and after: what a job-wide merge counts
    /// the job's groups from. Served apart, for the merge only.
    #[serde(skip)]
    pub leads: ChangeLeads,
}

/// The signatures of the lead ranks of the groups before and after a behaviour change.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ChangeLeads {
    pub before: BTreeMap<u32, RankSignature>,
    pub after: BTreeMap<u32, RankSignature>,
}

/// What the API, the reports and the metrics show of a job's rank groups.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankGroupsView {
    pub groups: Vec<RankGroup>,
    pub changes: Vec<BehaviourChange>,
    pub state: GroupState,
    pub windows_closed: u64,
    /// Clusterings (state C) so far: 1 for a job whose behaviour never changed.
    pub clusterings: u64,
    /// Start (Unix ns) of the span the groups' signatures cover: the job's start, or the start of
    /// the first window of its current behaviour.
    pub since_ns: u64,
    /// The reading (Unix ns) the groups were last formed from.
    #[serde(default)]
    pub through_ns: u64,
    pub window_s: f64,
    /// Each rank's signature over that span, as the groups were last formed from: what a
    /// job-wide merge clusters ([`super::merge`]). Served apart, for the merge only.
    #[serde(skip)]
    pub signatures: Arc<BTreeMap<u32, RankSignature>>,
}

/// A window that has not closed yet.
#[derive(Clone, Copy, Debug)]
struct OpenWindow {
    index: u64,
    /// The reading that opened it (Unix ns).
    start_ns: u64,
}

/// One window's identity for a change report.
#[derive(Clone, Copy, Debug)]
struct WindowSpan {
    index: u64,
    start_ns: u64,
    end_ns: u64,
}

/// The rank groups of one job.
pub struct RankGroupTracker {
    params: GroupParams,
    window_ns: u64,
    open: Option<OpenWindow>,
    /// Cumulative counts at the start of the open window, and of the window before it.
    boundary: BTreeMap<u32, Counts>,
    previous_boundary: BTreeMap<u32, Counts>,
    previous_start_ns: u64,
    /// Counts at the start of the span the groups cover (empty: from the ranks' start).
    segment: BTreeMap<u32, Counts>,
    /// Each rank's call path in the last window in which it made a call.
    paths: BTreeMap<u32, Vec<String>>,
    /// The call paths at the last clustering.
    established: Option<BTreeMap<u32, Vec<String>>>,
    /// The first window that differed since the last clustering.
    changed_in: Option<WindowSpan>,
    view: RankGroupsView,
    finished: bool,
}

impl RankGroupTracker {
    pub fn new(params: GroupParams, window_s: f64) -> Self {
        RankGroupTracker {
            params,
            window_ns: ((window_s * 1e9) as u64).max(1),
            open: None,
            boundary: BTreeMap::new(),
            previous_boundary: BTreeMap::new(),
            previous_start_ns: 0,
            segment: BTreeMap::new(),
            paths: BTreeMap::new(),
            established: None,
            changed_in: None,
            view: RankGroupsView {
                window_s,
                ..RankGroupsView::default()
            },
            finished: false,
        }
    }

    pub fn view(&self) -> &RankGroupsView {
        &self.view
    }

    /// The tracker of a job first seen at `first_seen_ns` (Unix), its first window opened there:
    /// the daemon's and a recording's replay start alike, so that both give the same groups.
    pub fn for_job(params: GroupParams, window_s: f64, first_seen_ns: u64) -> Self {
        let mut tracker = RankGroupTracker::new(params, window_s);
        tracker.observe(first_seen_ns, &BTreeMap::new());
        tracker
    }

    /// A reading of the ranks' cumulative counts at `at_ns` (Unix). Returns whether it closed a
    /// window: only such readings change anything, so a recording needs only those.
    pub fn observe(&mut self, at_ns: u64, ranks: &BTreeMap<u32, Counts>) -> bool {
        if self.finished {
            return false;
        }
        let index = at_ns / self.window_ns;
        match self.open {
            None => {
                self.open = Some(OpenWindow {
                    index,
                    start_ns: at_ns,
                });
                self.view.since_ns = at_ns;
                self.refresh(at_ns, ranks);
                false
            }
            Some(open) if index > open.index => {
                self.close(open, at_ns, ranks);
                self.open = Some(OpenWindow {
                    index,
                    start_ns: at_ns,
                });
                true
            }
            Some(_) => false,
        }
    }

    /// The job ended at `at_ns` with these final counts: the partial window closes, and the
    /// groups take the exact final counts. A last window that differs from the ones before it
    /// (the job's closing calls) is no behaviour change: nothing can confirm it.
    pub fn finish(&mut self, at_ns: u64, ranks: &BTreeMap<u32, Counts>) {
        if self.finished {
            return;
        }
        match self.open {
            Some(open) => self.close(open, at_ns, ranks),
            None => self.view.since_ns = at_ns,
        }
        self.refresh(at_ns, ranks);
        self.finished = true;
    }

    fn close(&mut self, open: OpenWindow, at_ns: u64, ranks: &BTreeMap<u32, Counts>) {
        let span = WindowSpan {
            index: open.index,
            start_ns: open.start_ns,
            end_ns: at_ns,
        };
        let paths: BTreeMap<u32, Vec<String>> = ranks
            .iter()
            .map(|(&r, c)| {
                (
                    r,
                    RankSignature::between(r, c, self.boundary.get(&r)).call_path(),
                )
            })
            .filter(|(_, p)| !p.is_empty())
            .collect();
        let changed = paths
            .iter()
            .any(|(r, p)| self.paths.get(r).is_some_and(|before| before != p));
        let first = self.view.windows_closed == 0;
        self.view.windows_closed += 1;
        self.view.state = match self.view.state {
            GroupState::AllTracing if first || changed => {
                if self.established.is_none() {
                    self.refresh(at_ns, ranks);
                }
                GroupState::AllTracing
            }
            GroupState::AllTracing => {
                self.recluster(at_ns, ranks, &paths);
                GroupState::Clustering
            }
            GroupState::Clustering | GroupState::Lead if changed => {
                self.changed_in = Some(span);
                GroupState::AllTracing
            }
            GroupState::Clustering | GroupState::Lead => {
                self.refresh(at_ns, ranks);
                GroupState::Lead
            }
        };
        self.paths.extend(paths);
        self.previous_boundary = std::mem::replace(&mut self.boundary, ranks.clone());
        self.previous_start_ns = open.start_ns;
    }

    /// State C: the call paths of the last two windows agree. After a change the groups cover
    /// those two windows on; the change is reported when ranks keep another call path.
    fn recluster(
        &mut self,
        at_ns: u64,
        ranks: &BTreeMap<u32, Counts>,
        paths: &BTreeMap<u32, Vec<String>>,
    ) {
        let changed_in = self.changed_in.take();
        if changed_in.is_some() {
            self.segment = self.previous_boundary.clone();
            self.view.since_ns = self.previous_start_ns;
        }
        let before = self.view.groups.len();
        let leads_before = self.leads();
        self.refresh(at_ns, ranks);
        self.view.clusterings += 1;
        if let (Some(established), Some(span)) = (&self.established, changed_in) {
            let moved: Vec<u32> = paths
                .iter()
                .filter(|(r, p)| established.get(r).is_some_and(|q| q != *p))
                .map(|(&r, _)| r)
                .collect();
            if !moved.is_empty() {
                self.view.changes.push(BehaviourChange {
                    window: span.index,
                    start_ns: span.start_ns,
                    end_ns: span.end_ns,
                    confirmed_ns: at_ns,
                    ranks: moved,
                    groups_before: before,
                    groups_after: self.view.groups.len(),
                    nodes: Vec::new(),
                    leads: ChangeLeads {
                        before: leads_before,
                        after: self.leads(),
                    },
                });
            }
        }
        self.established = Some(paths.clone());
    }

    /// The signatures of the groups' lead ranks.
    fn leads(&self) -> BTreeMap<u32, RankSignature> {
        self.view
            .groups
            .iter()
            .filter_map(|g| Some((g.lead, self.view.signatures.get(&g.lead)?.clone())))
            .collect()
    }

    /// The groups of the ranks' signatures since the segment's start, read at `at_ns`.
    fn refresh(&mut self, at_ns: u64, ranks: &BTreeMap<u32, Counts>) {
        let signatures: BTreeMap<u32, RankSignature> = ranks
            .iter()
            .map(|(&r, c)| (r, RankSignature::between(r, c, self.segment.get(&r))))
            .collect();
        self.view.groups = cluster(&signatures, &self.params);
        self.view.signatures = Arc::new(signatures);
        self.view.through_ns = at_ns;
    }
}
