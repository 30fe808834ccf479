//! What a job's online analysis shows: the views of its last window and of its cumulative sample,
//! its totals and memory use, gathered in a serialisable [`PhasesSnapshot`] for the exporters,
//! and the run signature of the job for later comparison.

use serde::{Deserialize, Serialize};

use super::{HeldSamples, JobPhases, OnlineError, PhaseKey, ProvisionalCounts};
use crate::analysis::signature::{live::RepetitionSums, AppSignature};
use crate::analysis::tracking::{AppIdentity, EventCounts, RunSignature, StableId, TrackingEvent};
use crate::analysis::{
    analyse, ClusterId, ClusterStats, ClusteringReport, FeatureReport, FilterReport,
};

/// One phase of a window: the analysis's statistics under the stable id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseView {
    pub id: StableId,
    /// The same phase's name on every node of the job (see [`PhaseKey`]).
    pub key: PhaseKey,
    /// The analysis's own number for it: 1 = most time in the window.
    pub time_rank: ClusterId,
    /// `stats.id` is the stable id.
    pub stats: ClusterStats,
}

/// One rank's sequence of stable ids (0 = noise; filtered bursts omitted), in start order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankSequence {
    pub rank: u32,
    pub phases: Vec<StableId>,
}

/// The last clustering of a window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowView {
    pub window: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    /// A re-clustering of the window while it was still open.
    pub partial: bool,
    /// Bursts of the window pushed so far, analysed (the sample) and left out by the bound.
    pub bursts_seen: u64,
    pub time_seen_ns: u64,
    pub bursts_analysed: u64,
    pub bursts_dropped: u64,
    /// Ranks whose bursts the sample keeps: all the job's, or a sample of them when the job has
    /// more than the window's bound has room for; the SPMD score and the rank sequences are
    /// over these.
    #[serde(default)]
    pub ranks_sampled: u32,
    pub features: FeatureReport,
    pub filter: FilterReport,
    /// Share of the analysed time the duration filter removed.
    pub time_filtered_share: f64,
    pub clustering: ClusteringReport,
    /// Global Cluster Sequence Score.
    pub spmd_score: f64,
    /// By stable id.
    pub phases: Vec<PhaseView>,
    pub noise: Option<ClusterStats>,
    pub sequences: Vec<RankSequence>,
}

/// The share of a cumulative cluster's sampled time that its windows gave to one phase.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseShare {
    /// Stable id; 0 for bursts that were noise or filtered in their window.
    pub id: StableId,
    pub share: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CumulativeCluster {
    /// The stable window phase holding most of its time (0 if its bursts were noise in their
    /// windows).
    pub phase: StableId,
    /// 0 for the cluster with most time among those of the same phase, then 1, …
    pub part: u32,
    /// The cluster's name on every node of the job, keyed like the window phases.
    pub key: PhaseKey,
    pub window_phases: Vec<PhaseShare>,
    /// `stats.id` is the cumulative analysis's own number (1 = most time).
    pub stats: ClusterStats,
}

/// The clustering of the cumulative sample.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CumulativeView {
    /// Windows the sample holds a chunk of, first and last of them, and the window stride.
    pub windows_sampled: usize,
    pub first_window: u64,
    pub last_window: u64,
    pub stride: u64,
    pub bursts_analysed: u64,
    pub features: FeatureReport,
    pub filter: FilterReport,
    pub spmd_score: f64,
    /// By (phase, part).
    pub clusters: Vec<CumulativeCluster>,
    pub noise: Option<ClusterStats>,
}

/// Running totals of a job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Totals {
    pub bursts_seen: u64,
    pub time_seen_ns: u64,
    /// Bursts that arrived for an already closed window.
    pub late_bursts: u64,
    /// Bursts left out of a window sample by its bound.
    pub dropped_bursts: u64,
    pub windows_closed: u64,
    /// Closed windows too small to be clustered, whose bursts went to the next window.
    pub windows_carried: u64,
    pub reclusters_window: u64,
    pub reclusters_noise: u64,
    pub reclusters_forced: u64,
    pub analysis_failures: u64,
}

/// What is held in memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    pub open_windows: usize,
    pub window_bursts: usize,
    /// Bursts of the samples of the last closed windows, kept for the job-wide analysis.
    pub sample_bursts: usize,
    pub cumulative_bursts: usize,
    pub model_points: usize,
    pub live_phases: usize,
    pub events: usize,
}

/// The window currently being filled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpenWindow {
    pub window: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub bursts_seen: u64,
    pub bursts_held: u64,
}

/// Everything an exporter needs, serialisable.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhasesSnapshot {
    pub ranks: u32,
    pub window_ns: u64,
    /// The window of the last tick's time (`None` before any tick).
    pub open_window: Option<OpenWindow>,
    pub last_window: Option<WindowView>,
    pub cumulative: Option<CumulativeView>,
    pub provisional: ProvisionalCounts,
    pub live_ids: Vec<StableId>,
    pub dormant_ids: Vec<StableId>,
    /// The last events (oldest first) and how many older ones were dropped from the list.
    pub events: Vec<TrackingEvent>,
    pub events_dropped: u64,
    pub event_counts: EventCounts,
    pub totals: Totals,
    pub held: Held,
    pub last_error: Option<String>,
    /// The signature of the job up to the end of the window of the last clustering, its phases
    /// those of that clustering ([`crate::analysis::signature::live`]); `None` before a window is
    /// clustered or when no phase ran in it.
    #[serde(default)]
    pub signature: Option<LiveSignature>,
    /// The samples of the last closed windows, for the job-wide analysis; served on their own
    /// (`/api/jobs/{id}/samples`), not with the phases.
    #[serde(skip)]
    pub samples: HeldSamples,
}

/// A running job's signature and the instant it is of.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LiveSignature {
    /// Unix ns: the end of the window whose repetitions it counts.
    pub up_to_ns: u64,
    #[serde(flatten)]
    pub signature: AppSignature,
}

/// The signature of the job from the repetitions cut at a window's end, the phases being those
/// of `view`, by time.
pub fn live_signature(view: &WindowView, repetitions: &RepetitionSums) -> Option<LiveSignature> {
    let mut phases: Vec<&PhaseView> = view.phases.iter().collect();
    phases.sort_by_key(|p| p.time_rank);
    let signature = repetitions
        .signature(phases.iter().map(|p| (p.id, &p.stats.regions[..])))
        .ok()?;
    Some(LiveSignature {
        up_to_ns: repetitions.cut_ns,
        signature,
    })
}

impl JobPhases {
    /// What is held in memory now.
    pub fn held(&self) -> Held {
        Held {
            open_windows: self.buffers.len(),
            window_bursts: self.carry.len()
                + self.buffers.values().map(|b| b.bursts.len()).sum::<usize>(),
            sample_bursts: self.samples.iter().map(|s| s.bursts.len()).sum(),
            cumulative_bursts: self.cumulative.held(),
            model_points: self.model.as_ref().map_or(0, |m| m.points),
            live_phases: self.tracker.live_ids().count(),
            events: self.tracker.events().count(),
        }
    }

    pub fn snapshot(&self) -> PhasesSnapshot {
        PhasesSnapshot {
            ranks: self.job_ranks(),
            window_ns: self.window_ns,
            open_window: self.now_ns.map(|now| {
                let window = now / self.window_ns;
                let buffer = self.buffers.get(&window);
                OpenWindow {
                    window,
                    start_ns: window * self.window_ns,
                    end_ns: (window + 1).saturating_mul(self.window_ns),
                    bursts_seen: buffer.map_or(0, |b| b.seen),
                    bursts_held: buffer.map_or(0, |b| b.bursts.len() as u64),
                }
            }),
            last_window: self.last.clone(),
            cumulative: self.cumulative_view.clone(),
            provisional: self.provisional.clone(),
            live_ids: self.tracker.live_ids().collect(),
            dormant_ids: self.tracker.dormant_ids().collect(),
            events: self.tracker.events().cloned().collect(),
            events_dropped: self.tracker.events_dropped(),
            event_counts: self.tracker.counts(),
            totals: self.totals,
            held: self.held(),
            last_error: self.last_error.clone(),
            // The repetitions up to the end of the last closed window, with the phases of the
            // last clustering: a job's last window is often too small to be clustered on its
            // own, and its repetitions are what makes the signature cover the job's end.
            signature: self
                .last
                .as_ref()
                .and_then(|view| live_signature(view, &self.samples.back()?.repetitions)),
            samples: HeldSamples {
                params: self.params.clone(),
                samples_from: self.samples_from,
                closed_before: self.closed_before,
                windows: self.samples.iter().cloned().collect(),
            },
        }
    }

    /// The run signature of the job so far, from its cumulative sample (`None` before the first
    /// window closed). Clusters the sample anew: call it at job end, not on every tick.
    pub fn signature(
        &self,
        app: AppIdentity,
        label: impl Into<String>,
    ) -> Result<Option<RunSignature>, OnlineError> {
        let (bursts, _) = self.cumulative.bursts();
        if bursts.is_empty() {
            return Ok(None);
        }
        let analysis = analyse(&bursts, self.analysis_ranks(), &self.params.analysis)?;
        Ok(Some(RunSignature::from_analysis(
            app,
            label,
            &analysis,
            &bursts,
            &self.params.tracking,
        )?))
    }
}
