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
//! * [`sample`]: the bounded, stratified sample of each window (of a sample of the ranks when a
//!   job has more than the bound has room for) and the cumulative sample of the whole job.
//! * [`model`]: the provisional classification of pushed bursts against the last clustering.
//! * [`recluster`]: when a sample is clustered, and how its clustering becomes the job's views,
//!   stable ids and events.
//! * [`keys`]: the name of a phase that is the same on every node ([`PhaseKey`]).
//! * [`snapshot`]: what an exporter reads ([`PhasesSnapshot`]) and the job's run signature.
//! * [`merge`]: the job-wide analysis of the window samples of all of a job's nodes.
//! * [`wire`]: the compact form in which a node sends its window samples.
//! * [`params`]: what all of them can be told ([`OnlineParams`]).
//!
//! # Decisions
//!
//! Each part documents its own; two concern the whole job:
//!
//! * **Ranks**: the job's ranks are the larger of the configured rank count and the number of
//!   distinct ranks seen, so a rank count learned late never makes an analysis fail. m for
//!   [`analyse`] is the number of ranks the window samples keep: all of them, or a sample of
//!   them when the job has more ranks than the window's bound has room for ([`sample`]).
//! * **Memory**: bursts held ≤ [`MAX_OPEN_WINDOWS`] × max_window_bursts + min_window_bursts
//!   (windows and carry) + [`KEPT_WINDOW_SAMPLES`] × max_window_bursts (the samples of the last
//!   closed windows, for the job-wide analysis) + max_cumulative_bursts; model points ≤ max_window_bursts; tracked ids ≤
//!   [`TrackingParams::max_phases`]; events listed ≤ [`TrackingParams::max_events`]; code regions
//!   whose repetitions are counted for the signature ≤ [`MAX_REGIONS`]
//!   ([`JobPhases::held`] reports them).
//!
//! [`analyse`]: super::analyse
//! [`MAX_REGIONS`]: crate::analysis::signature::live::MAX_REGIONS
//! [`RunSignature`]: crate::analysis::tracking::RunSignature
//! [`TrackingParams::max_phases`]: crate::analysis::tracking::TrackingParams::max_phases
//! [`TrackingParams::max_events`]: crate::analysis::tracking::TrackingParams::max_events

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::analysis::{signature::live::Repetitions, tracking::Tracker};
use crate::model::Burst;

pub mod keys;
pub mod merge;
pub mod model;
pub mod params;
pub mod recluster;
pub mod sample;
pub mod snapshot;
pub mod windows;
pub mod wire;

pub use keys::{phase_keys, PhaseKey, PhaseKeyError};
pub use merge::{
    merge_nodes, HeldSamples, MergeError, MergedPhases, NodeSamples, KEPT_WINDOW_SAMPLES,
};
use model::Model;
pub use model::ProvisionalCounts;
pub use params::{OnlineError, OnlineParams};
pub use recluster::{PhaseEvent, ReclusterReason};
use sample::{CumulativeSample, WindowBuffer};
pub use sample::{RankSample, WindowSample, MIN_STRATUM_BURSTS};
pub use snapshot::{
    CumulativeCluster, CumulativeView, Held, LiveSignature, OpenWindow, PhaseShare, PhaseView,
    PhasesSnapshot, RankSequence, Totals, WindowView,
};
pub use windows::MAX_OPEN_WINDOWS;
pub use wire::{WireError, SAMPLES_FORMAT};

/// Online phase analysis of one job (see the module docs).
#[derive(Debug)]
pub struct JobPhases {
    ranks: u32,
    params: OnlineParams,
    window_ns: u64,
    lateness_ns: u64,
    seen_ranks: BTreeSet<u32>,
    /// The ranks whose strata the window samples keep, drawn from the job's ranks…
    rank_sample: RankSample,
    /// …and how many of the ranks seen it keeps.
    sampled_seen: u32,
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
    /// Every burst's repetition of its code region, for the job's signature.
    repetitions: Repetitions,
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
        let window_ns = windows::window_ns(&params);
        Ok(JobPhases {
            ranks,
            rank_sample: RankSample::new(ranks, &params),
            sampled_seen: 0,
            window_ns,
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
            repetitions: Repetitions::new(window_ns),
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
        self.resample_ranks();
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

    /// The ranks of the job: configured or seen, whichever are more.
    fn job_ranks(&self) -> u32 {
        self.ranks.max(self.seen_ranks.len() as u32)
    }

    /// Draws the rank sample anew when the job's rank count changed.
    fn resample_ranks(&mut self) {
        let ranks = self.job_ranks();
        if self.rank_sample.ranks() != ranks {
            self.rank_sample = RankSample::new(ranks, &self.params);
            let sample = &self.rank_sample;
            self.sampled_seen = self.seen_ranks.iter().filter(|&&r| sample.keeps(r)).count() as u32;
        }
    }

    /// Counts a rank seen for the first time.
    fn see_rank(&mut self, rank: u32) {
        if self.seen_ranks.insert(rank) {
            self.sampled_seen += u32::from(self.rank_sample.keeps(rank));
            self.resample_ranks();
        }
    }

    /// m of the analysis: the ranks the window samples keep. Ranks numbered beyond the job's
    /// rank count (a node's ranks of a larger job) may make them more than the sample is sized
    /// for.
    fn analysis_ranks(&self) -> u32 {
        self.rank_sample.kept().max(self.sampled_seen)
    }
}

#[cfg(test)]
mod tests;
