//! Online phase analysis of one running job (the analysis of González García (2013) over time
//! windows, tracked after Llort et al. (2013)): the daemon pushes bursts as they arrive and ticks
//! on a timer; this module windows them, classifies them against the current model, re-clusters
//! with [`analyse`], keeps cluster ids stable with a [`Tracker`], and maintains a cumulative view
//! of the whole job. Everything is bounded by [`OnlineParams`], independently of the job's length
//! and burst rate.
//!
//! # Call pattern
//!
//! One [`JobPhases`] per job, used from one thread: [`JobPhases::push`] for every burst (cheap: a
//! classification and a copy into the window sample), [`JobPhases::tick`] on the daemon's timer
//! with the current Unix time (all the clustering happens there), [`JobPhases::snapshot`]
//! whenever an exporter needs the state, [`JobPhases::signature`] at job end to store a
//! [`RunSignature`].
//!
//! # Parts
//!
//! * [`windows`]: which window a pushed burst belongs to, when windows close.
//! * [`sample`]: the bounded, stratified sample of each window and the cumulative sample of the
//!   whole job.
//! * [`model`]: the provisional classification of pushed bursts against the last clustering.
//! * [`recluster`]: when a sample is clustered, and how its clustering becomes the job's views,
//!   stable ids and events.
//! * [`keys`]: the name of a phase that is the same on every node ([`PhaseKey`]).
//! * [`snapshot`]: what an exporter reads ([`PhasesSnapshot`]) and the job's run signature.
//! * [`merge`]: the job-wide analysis of the window samples of all of a job's nodes.
//! * [`params`]: what all of them can be told ([`OnlineParams`]).
//!
//! # Decisions
//!
//! Each part documents its own; two concern the whole job:
//!
//! * **Ranks**: m for [`analyse`] is the larger of the configured rank count and the number of
//!   distinct ranks seen, so a rank count learned late never makes an analysis fail.
//! * **Memory**: bursts held ≤ [`MAX_OPEN_WINDOWS`] × max_window_bursts + min_window_bursts
//!   (windows and carry) + [`KEPT_WINDOW_SAMPLES`] × max_window_bursts (the samples of the last
//!   closed windows, for the job-wide analysis) + max_cumulative_bursts; model points ≤ max_window_bursts; tracked ids ≤
//!   [`TrackingParams::max_phases`]; events listed ≤ [`TrackingParams::max_events`]
//!   ([`JobPhases::held`] reports them).
//!
//! [`analyse`]: super::analyse
//! [`RunSignature`]: crate::analysis::tracking::RunSignature
//! [`TrackingParams::max_phases`]: crate::analysis::tracking::TrackingParams::max_phases
//! [`TrackingParams::max_events`]: crate::analysis::tracking::TrackingParams::max_events

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::analysis::tracking::Tracker;
use crate::model::Burst;

pub mod keys;
pub mod merge;
pub mod model;
pub mod params;
pub mod recluster;
pub mod sample;
pub mod snapshot;
pub mod windows;

pub use keys::{phase_keys, PhaseKey, PhaseKeyError};
pub use merge::{
    merge_nodes, HeldSamples, MergeError, MergedPhases, NodeSamples, KEPT_WINDOW_SAMPLES,
};
use model::Model;
pub use model::ProvisionalCounts;
pub use params::{OnlineError, OnlineParams};
pub use recluster::{PhaseEvent, ReclusterReason};
pub use sample::WindowSample;
use sample::{CumulativeSample, WindowBuffer};
pub use snapshot::{
    CumulativeCluster, CumulativeView, Held, OpenWindow, PhaseShare, PhaseView, PhasesSnapshot,
    RankSequence, Totals, WindowView,
};
pub use windows::MAX_OPEN_WINDOWS;

/// Online phase analysis of one job (see the module docs).
#[derive(Debug)]
pub struct JobPhases {
    ranks: u32,
    params: OnlineParams,
    window_ns: u64,
    lateness_ns: u64,
    seen_ranks: BTreeSet<u32>,
    buffers: BTreeMap<u64, WindowBuffer>,
    /// Bursts of closed windows too small to be clustered alone, for the next window.
    carry: Vec<Burst>,
    /// Windows below this index are closed.
    closed_before: u64,
    /// The samples of the last closed windows, oldest first, at most [`KEPT_WINDOW_SAMPLES`]…
    samples: VecDeque<Arc<WindowSample>>,
    /// …of every closed window from this one on.
    samples_from: u64,
    model: Option<Model>,
    provisional: ProvisionalCounts,
    tracker: Tracker,
    last: Option<WindowView>,
    cumulative: CumulativeSample,
    cumulative_view: Option<CumulativeView>,
    pending: Vec<PhaseEvent>,
    totals: Totals,
    /// Bursts accepted into a window, for the classification subsample.
    accepted: u64,
    now_ns: Option<u64>,
    last_error: Option<String>,
}

impl JobPhases {
    /// `ranks`: how many ranks' bursts this instance receives (m of the analysis).
    pub fn new(ranks: u32, params: OnlineParams) -> Result<Self, OnlineError> {
        params.validate()?;
        let tracker = Tracker::new(params.tracking.clone())?;
        Ok(JobPhases {
            ranks,
            window_ns: ((params.window_s * 1e9).round() as u64).max(1),
            lateness_ns: (params.lateness_s * 1e9).round() as u64,
            params,
            seen_ranks: BTreeSet::new(),
            buffers: BTreeMap::new(),
            carry: Vec::new(),
            closed_before: 0,
            samples: VecDeque::new(),
            samples_from: 0,
            model: None,
            provisional: ProvisionalCounts::default(),
            tracker,
            last: None,
            cumulative: CumulativeSample::default(),
            cumulative_view: None,
            pending: Vec::new(),
            totals: Totals::default(),
            accepted: 0,
            now_ns: None,
            last_error: None,
        })
    }

    /// A new rank count (discovery learned it late); takes effect at the next clustering.
    pub fn set_ranks(&mut self, ranks: u32) {
        self.ranks = ranks;
    }

    pub fn params(&self) -> &OnlineParams {
        &self.params
    }

    fn keep_sample(&mut self, sample: WindowSample) {
        if self.samples.len() == KEPT_WINDOW_SAMPLES {
            if let Some(dropped) = self.samples.pop_front() {
                self.samples_from = dropped.window + 1;
            }
        }
        self.samples.push_back(Arc::new(sample));
    }

    fn analysis_ranks(&self) -> u32 {
        self.ranks.max(self.seen_ranks.len() as u32)
    }
}

#[cfg(test)]
mod tests;
