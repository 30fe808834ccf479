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
//! # Decisions
//!
//! * **Windows** are aligned to Unix time: window k covers [k·W, (k+1)·W), and a burst belongs to
//!   the window of its start. Bursts arrive after they end, so a window is closed by the first
//!   tick at or after its end + [`OnlineParams::lateness_s`]; a burst arriving for a closed window
//!   is counted as late and not analysed. At most [`MAX_OPEN_WINDOWS`] windows are open; a burst
//!   for a further window closes the oldest one at once (its events come with the next tick).
//!   Windows without bursts are skipped: no clustering, no tracking step, so an idle job makes no
//!   events. A window whose sample holds fewer than [`OnlineParams::min_window_bursts`] bursts is
//!   not clustered alone either: its bursts are carried into the next window. A low-rate job is
//!   thereby clustered over several windows, and a few stray bursts (the tail of a job, a window
//!   cut by a pause) are not mistaken for a new structure.
//! * **Provisional classification** (ClusteringSuite's "cluster a sample, classify the rest",
//!   option `-m` in González García (2013), Table B.2): a pushed burst is compared with the core
//!   points of the last clustering in that clustering's frozen normalisation (its feature set,
//!   min–max ranges and duration-filter threshold). It takes the stable id of the nearest core
//!   point within Eps, else it is provisional noise; shorter than the threshold, it is
//!   provisionally filtered. Eps is the last (largest) Eps the clustering used, core points are
//!   the clustered points with MinPoints neighbours within it. To keep a push O(1) the core points
//!   are thinned to a cover: a core point closer than Eps/4 to an already kept one of the same
//!   cluster is dropped, so a burst within ¾ Eps of any core point is always classified, one
//!   beyond Eps never is. Without a model yet, every burst counts as provisional noise. Only one
//!   pushed burst in [`OnlineParams::classify_every`] is classified (deterministically, by arrival
//!   count): the classification only feeds the noise share and the live counts, which a sample
//!   estimates well, and the daemon's budget is about 100 ns per burst for everything.
//! * **Re-clustering** happens when a window closes, and early when the provisional noise share
//!   of the bursts classified since the model was built exceeds
//!   [`OnlineParams::recluster_noise_share`] over at least
//!   [`OnlineParams::recluster_min_bursts`] bursts (at most
//!   [`OnlineParams::max_early_reclusters`] times per window): the open window's sample so far
//!   is clustered and tracked as a *partial* frame. The first window therefore gets a model as
//!   soon as it has enough bursts, and a phase change is picked up within the window.
//! * **Bounded window sample** (stratified): the window is cut into
//!   [`OnlineParams::window_slots`] equal time slots, and each (slot, rank) stratum keeps the first
//!   max_window_bursts ÷ (slots × ranks) bursts that arrive for it. Every rank and every part of
//!   the window is represented, and within a stratum the kept bursts are a contiguous stretch of
//!   that rank's sequence, so the rank sequences (and hence the Cluster Sequence Score) stay
//!   meaningful, which a uniform reservoir sample would destroy. The analysed statistics are
//!   those of the sample; the window's totals (bursts and time seen, dropped by the bound) are
//!   reported beside them.
//! * **Cumulative view** (whole job, bounded): a systematic sample of windows, each contributing
//!   one chunk: the contiguous stretch of at most max_cumulative_bursts ÷ cumulative_chunks
//!   bursts (all ranks) that starts at a slot chosen by a hash of the window index (so a phase
//!   that runs at a fixed offset in every window is not always missed). Windows are taken with a
//!   stride, 1 at first; when there are more chunks than [`OnlineParams::cumulative_chunks`],
//!   the stride doubles and the chunks off the new stride are dropped. The sample thus always
//!   spans the whole job evenly. It is re-clustered whenever a closing window adds a chunk
//!   (every window at first, every stride-th one later; in between it has not changed). Its
//!   clusters are
//!   keyed by the stable window phase that holds most of their time (the sampled bursts keep the
//!   stable id their window gave them) and a part number (0 = most time) when one phase shows
//!   several behaviours over the job, for example before and after a change. Cumulative
//!   statistics describe the sample; counts are not job totals.
//! * **Ranks**: m for [`analyse`] is the larger of the configured rank count and the number of
//!   distinct ranks seen, so a rank count learned late never makes an analysis fail.
//! * **Memory**: bursts held ≤ [`MAX_OPEN_WINDOWS`] × max_window_bursts + min_window_bursts
//!   (windows and carry) + max_cumulative_bursts; model points ≤ max_window_bursts; tracked ids ≤
//!   [`TrackingParams::max_phases`]; events listed ≤ [`TrackingParams::max_events`]
//!   ([`JobPhases::held`] reports them).
//! * **Errors**: an analysis failure (only possible with a fixed feature set whose counters are
//!   missing) is reported as an event and in the snapshot, and the window is skipped.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::hashing::{mix, FastMap};
use super::points::{distance2, Coords, MAX_DIMS};
use super::tracking::{
    AppIdentity, EventCounts, Frame, RunSignature, StableId, Tracker, TrackingError, TrackingEvent,
    TrackingParams,
};
use super::{
    analyse, features, k_distances, prepare, Analysis, AnalysisParams, ClusterId, ClusterStats,
    ClusteringReport, FeatureReport, FeatureSet, FilterReport, Prepared, NOISE,
};
use crate::model::{Burst, CallSite};

/// Windows that may be open at once (the current one, the previous one waiting for late
/// bursts, and one more for bursts that already belong to the next window).
pub const MAX_OPEN_WINDOWS: usize = 3;

#[derive(Debug, thiserror::Error)]
pub enum OnlineError {
    #[error("invalid online analysis parameter {name} = {value}: expected {expected}")]
    InvalidParameter {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(transparent)]
    Tracking(#[from] TrackingError),
    #[error("analysis of the cumulative sample failed: {0}")]
    Analysis(#[from] super::AnalysisError),
}

/// Online analysis parameters. Defaults in parentheses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OnlineParams {
    /// Window length in seconds; windows are aligned to Unix time (30).
    pub window_s: f64,
    /// Seconds after a window's end before it is closed, for bursts still in flight (3).
    pub lateness_s: f64,
    /// Re-cluster the open window early when more than this share of the bursts classified
    /// since the last clustering is provisional noise (0.2)…
    pub recluster_noise_share: f64,
    /// …over at least this many classified bursts (200, i.e. 1600 pushed ones with the default
    /// `classify_every`).
    pub recluster_min_bursts: u64,
    /// Early re-clusterings per window at most (2).
    pub max_early_reclusters: u32,
    /// Provisional classification of one pushed burst in this many (8): enough for the noise
    /// share and the live counts, at an eighth of the cost.
    pub classify_every: u32,
    /// Bursts kept per window for clustering (20 000).
    pub max_window_bursts: usize,
    /// A window whose sample holds fewer bursts is not clustered on its own: its bursts are
    /// carried into the next window (100).
    pub min_window_bursts: usize,
    /// Time slots of the stratified window sample (8).
    pub window_slots: u32,
    /// Bursts kept for the cumulative view of the whole job (20 000).
    pub max_cumulative_bursts: usize,
    /// Windows (chunks) the cumulative sample is spread over at most (32).
    pub cumulative_chunks: usize,
    /// How each window and the cumulative sample are clustered.
    pub analysis: AnalysisParams,
    /// How clusters are tracked across windows.
    pub tracking: TrackingParams,
}

impl Default for OnlineParams {
    fn default() -> Self {
        OnlineParams {
            window_s: 30.0,
            lateness_s: 3.0,
            recluster_noise_share: 0.2,
            recluster_min_bursts: 200,
            max_early_reclusters: 2,
            classify_every: 8,
            max_window_bursts: 20_000,
            min_window_bursts: 100,
            window_slots: 8,
            max_cumulative_bursts: 20_000,
            cumulative_chunks: 32,
            analysis: AnalysisParams::default(),
            tracking: TrackingParams::default(),
        }
    }
}

impl OnlineParams {
    pub fn validate(&self) -> Result<(), OnlineError> {
        let invalid = |name, value: String, expected| {
            Err(OnlineError::InvalidParameter {
                name,
                value,
                expected,
            })
        };
        // At least a microsecond, and small enough that window indices fit comfortably.
        if !(self.window_s.is_finite() && self.window_s >= 1e-6 && self.window_s <= 1e7) {
            return invalid(
                "online.window_s",
                self.window_s.to_string(),
                "seconds in [1e-6, 1e7]",
            );
        }
        if !(self.lateness_s.is_finite() && self.lateness_s >= 0.0 && self.lateness_s <= 1e7) {
            return invalid(
                "online.lateness_s",
                self.lateness_s.to_string(),
                "seconds in [0, 1e7]",
            );
        }
        if !(self.recluster_noise_share >= 0.0 && self.recluster_noise_share <= 1.0) {
            return invalid(
                "online.recluster_noise_share",
                self.recluster_noise_share.to_string(),
                "a share in [0, 1]",
            );
        }
        if self.recluster_min_bursts == 0 {
            return invalid("online.recluster_min_bursts", "0".into(), "at least 1");
        }
        if self.classify_every == 0 {
            return invalid("online.classify_every", "0".into(), "at least 1");
        }
        if self.window_slots == 0 {
            return invalid("online.window_slots", "0".into(), "at least 1");
        }
        if self.max_window_bursts < self.window_slots as usize {
            return invalid(
                "online.max_window_bursts",
                self.max_window_bursts.to_string(),
                "at least window_slots",
            );
        }
        if self.min_window_bursts > self.max_window_bursts {
            return invalid(
                "online.min_window_bursts",
                self.min_window_bursts.to_string(),
                "at most max_window_bursts",
            );
        }
        if self.cumulative_chunks == 0 {
            return invalid("online.cumulative_chunks", "0".into(), "at least 1");
        }
        if self.max_cumulative_bursts < self.cumulative_chunks {
            return invalid(
                "online.max_cumulative_bursts",
                self.max_cumulative_bursts.to_string(),
                "at least cumulative_chunks",
            );
        }
        // The clustering parameters are checked by the analysis itself; check them now so a bad
        // configuration fails at start rather than at the first window.
        let probe = analyse(&[], 0, &self.analysis);
        if let Err(e) = probe {
            return invalid(
                "online.analysis",
                e.to_string(),
                "valid analysis parameters",
            );
        }
        self.tracking.validate()?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// Provisional classification.
// ---------------------------------------------------------------------------------------------

/// How a pushed burst was classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Provisional {
    Filtered,
    Noise,
    Phase(StableId),
}

type CellKey = (u32, [i64; MAX_DIMS]);

/// The frozen model of the last clustering: normalisation, Eps and thinned core points.
#[derive(Clone, Debug)]
struct Model {
    features: FeatureSet,
    dims: usize,
    lo: Coords,
    scale: Coords,
    eps: f64,
    side: f64,
    threshold_ns: u64,
    /// Region → point group, for the per-region feature set.
    groups: BTreeMap<(CallSite, CallSite), u32>,
    cells: FastMap<CellKey, Vec<(Coords, StableId)>>,
    points: usize,
}

impl Model {
    /// The model of `analysis` (of `bursts`, prepared as `prepared`), with its clusters
    /// renamed through `ids`. `None` when nothing was clustered.
    fn build(
        analysis: &Analysis,
        bursts: &[Burst],
        prepared: &Prepared,
        ids: &BTreeMap<u32, StableId>,
    ) -> Option<Model> {
        let eps = analysis.clustering.steps.last()?.eps;
        let points = &prepared.features.points;
        let dims = points.dims();
        let mut lo = [0.0; MAX_DIMS];
        let mut scale = [0.0; MAX_DIMS];
        for (d, range) in analysis.features.ranges.iter().enumerate().take(MAX_DIMS) {
            lo[d] = range.min;
            let span = range.max - range.min;
            scale[d] = if span > 0.0 { 1.0 / span } else { 0.0 };
        }
        let mut groups = BTreeMap::new();
        if analysis.features.used == FeatureSet::OnCpuTimePerRegion {
            for (p, &i) in prepared.kept.iter().enumerate() {
                let (start, end) = bursts[i].region();
                groups
                    .entry((start.clone(), end.clone()))
                    .or_insert(points.groups()[p]);
            }
        }
        let mut model = Model {
            features: analysis.features.used,
            dims,
            lo,
            scale,
            eps,
            side: if eps > 0.0 { eps } else { 1.0 },
            threshold_ns: analysis.filter.threshold_ns,
            groups,
            cells: FastMap::default(),
            points: 0,
        };
        let k_dist = k_distances(points, analysis.clustering.min_points);
        let cover2 = (eps / 4.0) * (eps / 4.0);
        for (p, &i) in prepared.kept.iter().enumerate() {
            let label = analysis.labels[i].expect("kept bursts are labelled");
            if label == NOISE || k_dist[p] > eps {
                continue;
            }
            let Some(&id) = ids.get(&label) else { continue };
            let group = points.groups()[p];
            let c = points.coords()[p];
            let covered = model
                .neighbourhood(group, &c)
                .any(|(q, qid)| qid == id && distance2(&q, &c) <= cover2);
            if !covered {
                let key = model.key(group, &c);
                model.cells.entry(key).or_default().push((c, id));
                model.points += 1;
            }
        }
        Some(model)
    }

    fn key(&self, group: u32, c: &Coords) -> CellKey {
        let mut cell = [0i64; MAX_DIMS];
        for d in 0..self.dims {
            cell[d] = (c[d] / self.side).floor() as i64;
        }
        (group, cell)
    }

    /// Points in the 3^dims cells around `c`.
    fn neighbourhood<'m>(
        &'m self,
        group: u32,
        c: &Coords,
    ) -> impl Iterator<Item = (Coords, StableId)> + 'm {
        let (_, centre) = self.key(group, c);
        let dims = self.dims;
        (0..3usize.pow(dims as u32)).flat_map(move |n| {
            let mut cell = centre;
            let mut rest = n;
            for item in cell.iter_mut().take(dims) {
                *item = item.saturating_add((rest % 3) as i64 - 1);
                rest /= 3;
            }
            self.cells
                .get(&(group, cell))
                .into_iter()
                .flat_map(|v| v.iter().copied())
        })
    }

    fn classify(&self, burst: &Burst) -> Provisional {
        if features::filtered_duration_ns(burst) < self.threshold_ns {
            return Provisional::Filtered;
        }
        let mut raw = [0.0; MAX_DIMS];
        let group = match self.features {
            FeatureSet::InstructionsIpc => {
                let Some(c) = burst.counters.filter(|c| c.cycles > 0) else {
                    return Provisional::Noise;
                };
                raw[0] = (c.instructions.max(1) as f64).ln();
                raw[1] = c.instructions as f64 / c.cycles as f64;
                0
            }
            FeatureSet::OnCpuTimePerRegion => {
                raw[0] = (burst.oncpu_ns.max(1) as f64).ln();
                let key = (burst.start_site.clone(), burst.end_site.clone());
                match self.groups.get(&key) {
                    Some(&g) => g,
                    None => return Provisional::Noise,
                }
            }
        };
        let mut c = [0.0; MAX_DIMS];
        for d in 0..self.dims {
            c[d] = (raw[d] - self.lo[d]) * self.scale[d];
        }
        let eps2 = self.eps * self.eps;
        let mut best: Option<(f64, StableId)> = None;
        for (q, id) in self.neighbourhood(group, &c) {
            let d2 = distance2(&q, &c);
            if d2 <= eps2 && best.is_none_or(|(b, _)| d2 < b) {
                best = Some((d2, id));
            }
        }
        best.map_or(Provisional::Noise, |(_, id)| Provisional::Phase(id))
    }
}

// ---------------------------------------------------------------------------------------------
// Samples.
// ---------------------------------------------------------------------------------------------

/// The bounded, stratified sample of one window.
#[derive(Clone, Debug, Default)]
struct WindowBuffer {
    bursts: Vec<Burst>,
    strata: FastMap<(u32, u32), u32>,
    seen: u64,
    seen_time_ns: u64,
    dropped: u64,
    early_reclusters: u32,
}

/// One window's contribution to the cumulative sample: bursts with the stable id their window
/// gave them (0 for noise or filtered).
#[derive(Clone, Debug)]
struct Chunk {
    window: u64,
    bursts: Vec<Burst>,
    labels: Vec<StableId>,
}

#[derive(Clone, Debug, Default)]
struct CumulativeSample {
    chunks: Vec<Chunk>,
    first: Option<u64>,
    stride: u64,
}

impl CumulativeSample {
    fn held(&self) -> usize {
        self.chunks.iter().map(|c| c.bursts.len()).sum()
    }

    /// Offers a closed window's sample; returns whether a chunk was taken.
    fn offer(
        &mut self,
        window: u64,
        bursts: &[Burst],
        labels: &[StableId],
        params: &OnlineParams,
        window_ns: u64,
    ) -> bool {
        let first = *self.first.get_or_insert(window);
        if self.stride == 0 {
            self.stride = 1;
        }
        if window < first || !(window - first).is_multiple_of(self.stride) || bursts.is_empty() {
            return false;
        }
        let quota = params.max_cumulative_bursts / params.cumulative_chunks;
        let mut order: Vec<usize> = (0..bursts.len()).collect();
        order.sort_by_key(|&i| {
            let b = &bursts[i];
            (b.start_ns, b.rank, b.tid, b.pid, i)
        });
        let slot = mix(window) % u64::from(params.window_slots);
        let slot_start = window * window_ns + slot * (window_ns / u64::from(params.window_slots));
        let begin = order
            .partition_point(|&i| bursts[i].start_ns < slot_start)
            .min(order.len().saturating_sub(quota));
        let taken = &order[begin..(begin + quota).min(order.len())];
        self.chunks.push(Chunk {
            window,
            bursts: taken.iter().map(|&i| bursts[i].clone()).collect(),
            labels: taken.iter().map(|&i| labels[i]).collect(),
        });
        while self.chunks.len() > params.cumulative_chunks {
            self.stride *= 2;
            let stride = self.stride;
            self.chunks
                .retain(|c| (c.window - first).is_multiple_of(stride));
        }
        true
    }

    fn bursts(&self) -> (Vec<Burst>, Vec<StableId>) {
        let mut bursts = Vec::with_capacity(self.held());
        let mut labels = Vec::with_capacity(self.held());
        for chunk in &self.chunks {
            bursts.extend(chunk.bursts.iter().cloned());
            labels.extend(chunk.labels.iter().copied());
        }
        (bursts, labels)
    }
}

// ---------------------------------------------------------------------------------------------
// Views and events.
// ---------------------------------------------------------------------------------------------

/// One phase of a window: the analysis's statistics under the stable id.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseView {
    pub id: StableId,
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

/// Why a clustering ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReclusterReason {
    WindowClosed,
    /// Provisional noise share above the threshold (or no model yet).
    NoiseShare,
    /// A burst for a window beyond the open ones closed the oldest one early.
    OpenWindowLimit,
}

/// What a tick reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PhaseEvent {
    Reclustered {
        window: u64,
        partial: bool,
        reason: ReclusterReason,
        bursts: u64,
        phases: usize,
        spmd_score: f64,
    },
    Tracking(TrackingEvent),
    AnalysisFailed {
        window: u64,
        error: String,
    },
}

/// Provisional classification of the bursts pushed since the current model was built (one in
/// [`OnlineParams::classify_every`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProvisionalCounts {
    /// Window whose clustering the model comes from (`None`: no model yet).
    pub model_window: Option<u64>,
    pub phases: BTreeMap<StableId, u64>,
    pub noise: u64,
    pub filtered: u64,
}

impl ProvisionalCounts {
    fn classified(&self) -> u64 {
        self.noise + self.phases.values().sum::<u64>()
    }

    /// Noise share of the bursts above the filter threshold (0 without any).
    pub fn noise_share(&self) -> f64 {
        let n = self.classified();
        if n == 0 {
            0.0
        } else {
            self.noise as f64 / n as f64
        }
    }
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
}

// ---------------------------------------------------------------------------------------------
// The per-job state.
// ---------------------------------------------------------------------------------------------

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

    fn analysis_ranks(&self) -> u32 {
        self.ranks.max(self.seen_ranks.len() as u32)
    }

    /// Classifies a burst against the current model and adds it to its window's sample.
    pub fn push(&mut self, burst: &Burst) {
        self.totals.bursts_seen += 1;
        self.totals.time_seen_ns += burst.duration_ns;
        self.seen_ranks.insert(burst.rank);
        let window = burst.start_ns / self.window_ns;
        let oldest_open = self.buffers.keys().next().copied();
        if window < self.closed_before
            || (!self.buffers.contains_key(&window)
                && self.buffers.len() >= MAX_OPEN_WINDOWS
                && oldest_open.is_some_and(|w| window < w))
        {
            self.totals.late_bursts += 1;
            return;
        }
        if !self.buffers.contains_key(&window) && self.buffers.len() >= MAX_OPEN_WINDOWS {
            let oldest = oldest_open.expect("buffers are full");
            let mut events = Vec::new();
            self.close_window(oldest, ReclusterReason::OpenWindowLimit, &mut events);
            self.pending.extend(events);
        }

        self.accepted += 1;
        if self
            .accepted
            .is_multiple_of(u64::from(self.params.classify_every))
        {
            match self.model.as_ref().map(|m| m.classify(burst)) {
                Some(Provisional::Filtered) => self.provisional.filtered += 1,
                Some(Provisional::Phase(id)) => {
                    *self.provisional.phases.entry(id).or_default() += 1
                }
                Some(Provisional::Noise) | None => self.provisional.noise += 1,
            }
        }

        let slots = u64::from(self.params.window_slots);
        let slot = ((burst.start_ns % self.window_ns) * slots / self.window_ns) as u32;
        let quota = (self.params.max_window_bursts
            / (self.params.window_slots as usize * self.analysis_ranks().max(1) as usize))
            .max(1) as u32;
        let max = self.params.max_window_bursts;
        let buffer = self.buffers.entry(window).or_default();
        buffer.seen += 1;
        buffer.seen_time_ns += burst.duration_ns;
        let stratum = buffer.strata.entry((slot, burst.rank)).or_default();
        if *stratum < quota && buffer.bursts.len() < max {
            *stratum += 1;
            buffer.bursts.push(burst.clone());
        } else {
            buffer.dropped += 1;
            self.totals.dropped_bursts += 1;
        }
    }

    /// Closes the windows that are over, re-clusters when the provisional noise asks for it,
    /// and returns what happened (including events of windows a push had to close early).
    pub fn tick(&mut self, now_ns: u64) -> Vec<PhaseEvent> {
        self.now_ns = Some(now_ns);
        let mut events = std::mem::take(&mut self.pending);
        while let Some(&window) = self.buffers.keys().next() {
            let end = (window + 1).saturating_mul(self.window_ns);
            if end.saturating_add(self.lateness_ns) > now_ns {
                break;
            }
            self.close_window(window, ReclusterReason::WindowClosed, &mut events);
        }
        let over = now_ns.saturating_sub(self.lateness_ns) / self.window_ns;
        self.closed_before = self
            .closed_before
            .max(over.min(self.buffers.keys().next().copied().unwrap_or(over)));

        let classified = self.provisional.classified();
        if classified >= self.params.recluster_min_bursts
            && self.provisional.noise_share() > self.params.recluster_noise_share
        {
            // The window being filled: the newest one.
            if let Some(window) = self.buffers.keys().next_back().copied() {
                let buffer = &self.buffers[&window];
                if buffer.early_reclusters < self.params.max_early_reclusters
                    && !buffer.bursts.is_empty()
                {
                    let buffer = self.buffers.get_mut(&window).expect("present");
                    buffer.early_reclusters += 1;
                    let (seen, seen_time, dropped) =
                        (buffer.seen, buffer.seen_time_ns, buffer.dropped);
                    let mut bursts = self.carry.clone();
                    bursts.extend(buffer.bursts.iter().cloned());
                    self.recluster(
                        window,
                        &bursts,
                        (seen, seen_time, dropped),
                        false,
                        ReclusterReason::NoiseShare,
                        &mut events,
                    );
                } else {
                    // No more early re-clusterings in this window: start counting afresh so the
                    // check does not repeat on every tick.
                    let model_window = self.provisional.model_window;
                    self.provisional = ProvisionalCounts {
                        model_window,
                        ..Default::default()
                    };
                }
            }
        }
        events
    }

    fn close_window(&mut self, window: u64, reason: ReclusterReason, events: &mut Vec<PhaseEvent>) {
        let buffer = self
            .buffers
            .remove(&window)
            .expect("closing an open window");
        self.closed_before = self.closed_before.max(window + 1);
        self.totals.windows_closed += 1;
        let mut bursts = std::mem::take(&mut self.carry);
        bursts.extend(buffer.bursts);
        if bursts.len() < self.params.min_window_bursts {
            self.totals.windows_carried += 1;
            self.carry = bursts;
            return;
        }
        let Some(labels) = self.recluster(
            window,
            &bursts,
            (buffer.seen, buffer.seen_time_ns, buffer.dropped),
            true,
            reason,
            events,
        ) else {
            return;
        };
        if self
            .cumulative
            .offer(window, &bursts, &labels, &self.params, self.window_ns)
        {
            self.recluster_cumulative(events);
        }
    }

    /// Clusters one window's sample, tracks it, installs the new model; returns the stable id
    /// of each burst (0 for noise and filtered), or `None` when the analysis failed.
    fn recluster(
        &mut self,
        window: u64,
        bursts: &[Burst],
        (seen, seen_time_ns, dropped): (u64, u64, u64),
        closed: bool,
        reason: ReclusterReason,
        events: &mut Vec<PhaseEvent>,
    ) -> Option<Vec<StableId>> {
        match reason {
            ReclusterReason::WindowClosed => self.totals.reclusters_window += 1,
            ReclusterReason::NoiseShare => self.totals.reclusters_noise += 1,
            ReclusterReason::OpenWindowLimit => self.totals.reclusters_forced += 1,
        }
        let ranks = self.analysis_ranks();
        let analysed = analyse(bursts, ranks, &self.params.analysis)
            .and_then(|a| Ok((prepare(bursts, ranks, &self.params.analysis)?, a)));
        let (prepared, analysis) = match analysed {
            Ok(x) => x,
            Err(e) => {
                self.totals.analysis_failures += 1;
                let error = e.to_string();
                self.last_error = Some(format!("window {window}: {error}"));
                events.push(PhaseEvent::AnalysisFailed { window, error });
                return None;
            }
        };
        let frame = Frame::from_prepared(&analysis, bursts, &prepared, &self.params.tracking);
        let update = self.tracker.update(window, &frame, closed);
        self.model = Model::build(&analysis, bursts, &prepared, &update.ids);
        self.provisional = ProvisionalCounts {
            model_window: Some(window),
            ..Default::default()
        };

        let labels: Vec<StableId> = analysis
            .labels
            .iter()
            .map(|l| match l {
                Some(l) if *l != NOISE => update.ids[l],
                _ => 0,
            })
            .collect();
        let mut phases: Vec<PhaseView> = analysis
            .clusters
            .iter()
            .map(|stats| {
                let id = update.ids[&stats.id];
                PhaseView {
                    id,
                    time_rank: stats.id,
                    stats: ClusterStats {
                        id,
                        ..stats.clone()
                    },
                }
            })
            .collect();
        phases.sort_by_key(|p| p.id);
        let mut sequences: BTreeMap<u32, Vec<StableId>> = BTreeMap::new();
        for &i in &prepared.kept {
            sequences.entry(bursts[i].rank).or_default().push(labels[i]);
        }
        events.push(PhaseEvent::Reclustered {
            window,
            partial: !closed,
            reason,
            bursts: bursts.len() as u64,
            phases: phases.len(),
            spmd_score: analysis.global_score,
        });
        events.extend(update.events.into_iter().map(PhaseEvent::Tracking));
        self.last = Some(WindowView {
            window,
            start_ns: window * self.window_ns,
            end_ns: (window + 1).saturating_mul(self.window_ns),
            partial: !closed,
            bursts_seen: seen,
            time_seen_ns: seen_time_ns,
            bursts_analysed: bursts.len() as u64,
            bursts_dropped: dropped,
            time_filtered_share: analysis.filter.time_filtered_share,
            features: analysis.features,
            filter: analysis.filter,
            clustering: analysis.clustering,
            spmd_score: analysis.global_score,
            phases,
            noise: analysis.noise,
            sequences: sequences
                .into_iter()
                .map(|(rank, phases)| RankSequence { rank, phases })
                .collect(),
        });
        Some(labels)
    }

    fn recluster_cumulative(&mut self, events: &mut Vec<PhaseEvent>) {
        let (bursts, window_labels) = self.cumulative.bursts();
        let analysis = match analyse(&bursts, self.analysis_ranks(), &self.params.analysis) {
            Ok(a) => a,
            Err(e) => {
                self.totals.analysis_failures += 1;
                let error = format!("cumulative sample: {e}");
                self.last_error = Some(error.clone());
                let window = self.cumulative.chunks.last().map_or(0, |c| c.window);
                events.push(PhaseEvent::AnalysisFailed { window, error });
                return;
            }
        };
        let mut votes: BTreeMap<ClusterId, BTreeMap<StableId, u64>> = BTreeMap::new();
        for ((label, burst), &phase) in analysis.labels.iter().zip(&bursts).zip(&window_labels) {
            if let Some(label) = label.filter(|&l| l != NOISE) {
                *votes.entry(label).or_default().entry(phase).or_default() += burst.duration_ns;
            }
        }
        let mut clusters: Vec<CumulativeCluster> = analysis
            .clusters
            .iter()
            .map(|stats| {
                let votes = votes.remove(&stats.id).unwrap_or_default();
                let total: u64 = votes.values().sum();
                let phase = votes
                    .iter()
                    .filter(|(&id, _)| id != 0)
                    .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                    .map_or(0, |(&id, _)| id);
                CumulativeCluster {
                    phase,
                    part: 0,
                    window_phases: votes
                        .iter()
                        .map(|(&id, &t)| PhaseShare {
                            id,
                            share: if total == 0 {
                                0.0
                            } else {
                                t as f64 / total as f64
                            },
                        })
                        .collect(),
                    stats: stats.clone(),
                }
            })
            .collect();
        // Within a phase, parts by decreasing time (the analysis ids are by decreasing time).
        clusters.sort_by_key(|c| (c.phase, c.stats.id));
        for k in 1..clusters.len() {
            if clusters[k].phase == clusters[k - 1].phase {
                clusters[k].part = clusters[k - 1].part + 1;
            }
        }
        self.cumulative_view = Some(CumulativeView {
            windows_sampled: self.cumulative.chunks.len(),
            first_window: self.cumulative.chunks.first().map_or(0, |c| c.window),
            last_window: self.cumulative.chunks.last().map_or(0, |c| c.window),
            stride: self.cumulative.stride,
            bursts_analysed: bursts.len() as u64,
            features: analysis.features,
            filter: analysis.filter,
            spmd_score: analysis.global_score,
            clusters,
            noise: analysis.noise,
        });
    }

    /// What is held in memory now.
    pub fn held(&self) -> Held {
        Held {
            open_windows: self.buffers.len(),
            window_bursts: self.carry.len()
                + self.buffers.values().map(|b| b.bursts.len()).sum::<usize>(),
            cumulative_bursts: self.cumulative.held(),
            model_points: self.model.as_ref().map_or(0, |m| m.points),
            live_phases: self.tracker.live_ids().count(),
            events: self.tracker.events().count(),
        }
    }

    pub fn snapshot(&self) -> PhasesSnapshot {
        PhasesSnapshot {
            ranks: self.analysis_ranks(),
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::analysis::hashing::GOLDEN_GAMMA;
    use crate::analysis::synthetic::SplitMix64;
    use crate::analysis::tracking::EventKind;
    use crate::model::HwCounters;

    /// A start time aligned to whole seconds.
    const T0: u64 = 1_700_000_000_000_000_000;
    const CLOCK_GHZ: f64 = 2.5;
    const E1_PHASES: [(f64, f64); 3] = [(1e6, 2.0), (5e6, 0.6), (2e7, 1.2)];

    /// A call site offset and the MPI function there.
    type Site<'a> = (u64, &'a Arc<str>);

    /// An SPMD loop of `phases` (instructions, IPC) with ±3 % jitter and one 2 µs burst after
    /// each phase, from T0 for `seconds`. `factor(window, iteration, phase)` multiplies a phase's
    /// instructions (the window of the phase's start, in windows of `window_ns` since T0); 0 or
    /// less skips the phase. Every burst goes to `sink`, phase by phase.
    #[allow(clippy::too_many_arguments)]
    fn spmd(
        ranks: u32,
        counters: bool,
        phases: &[(f64, f64)],
        window_ns: u64,
        seconds: f64,
        seed: u64,
        factor: impl Fn(u64, u64, usize) -> f64,
        sink: impl FnMut(Burst),
    ) {
        let noise = Noise {
            jitter: 0.03,
            ..Noise::default()
        };
        spmd_noisy(
            ranks, counters, phases, window_ns, seconds, seed, noise, factor, sink,
        )
    }

    /// Perturbations of the loop: relative jitter of instructions and IPC, a share of outlier
    /// bursts (instructions ×0.2–5, IPC ×0.5–1.5) and one rank doing more work in one phase.
    #[derive(Clone, Copy, Debug, Default)]
    struct Noise {
        jitter: f64,
        outliers: f64,
        imbalance: Option<(u32, usize, f64)>,
    }

    #[allow(clippy::too_many_arguments)]
    fn spmd_noisy(
        ranks: u32,
        counters: bool,
        phases: &[(f64, f64)],
        window_ns: u64,
        seconds: f64,
        seed: u64,
        noise: Noise,
        factor: impl Fn(u64, u64, usize) -> f64,
        mut sink: impl FnMut(Burst),
    ) {
        // splitmix64 one step past the seed: the streams these tests' expectations were set on.
        let mut random = SplitMix64(seed.wrapping_add(GOLDEN_GAMMA));
        let module: Arc<str> = Arc::from("/opt/app/bin/solver");
        let site = |offset: u64| CallSite {
            module: module.clone(),
            offset,
        };
        let allreduce: Arc<str> = Arc::from("MPI_Allreduce");
        let isend: Arc<str> = Arc::from("MPI_Isend");
        let end = T0 + (seconds * 1e9) as u64;
        let mut now = T0;
        let mut iteration = 0u64;
        while now < end {
            for (k, &(instructions, ipc)) in phases.iter().enumerate() {
                let f = factor((now - T0) / window_ns, iteration, k);
                if f <= 0.0 {
                    continue;
                }
                let mut phase_end = now;
                for rank in 0..ranks {
                    let (low, high) = (1.0 - noise.jitter, 1.0 + noise.jitter);
                    let mut instructions = instructions * f * random.uniform(low, high);
                    let mut ipc = ipc * random.uniform(low, high);
                    if let Some((r, phase, factor)) = noise.imbalance {
                        if (r, phase) == (rank, k) {
                            instructions *= factor;
                        }
                    }
                    if random.uniform(0.0, 1.0) < noise.outliers {
                        instructions *= random.uniform(0.2f64.ln(), 5f64.ln()).exp();
                        ipc *= random.uniform(0.5, 1.5);
                    }
                    let cycles = instructions / ipc;
                    let duration_ns = (cycles / CLOCK_GHZ) as u64;
                    let start_ns = now + u64::from(rank) * 100;
                    let burst = |start_ns, duration_ns, instructions: f64, cycles: f64, sites| {
                        let (opened, closed): (Site<'_>, Site<'_>) = sites;
                        Burst {
                            pid: 1000 + rank,
                            tid: 1000 + rank,
                            rank,
                            start_ns,
                            duration_ns,
                            oncpu_ns: duration_ns,
                            counters: counters.then_some(HwCounters {
                                instructions: instructions as u64,
                                cycles: cycles as u64,
                            }),
                            start_func: opened.1.clone(),
                            end_func: closed.1.clone(),
                            start_site: site(opened.0),
                            end_site: site(closed.0),
                        }
                    };
                    let opening = 0x1000 * k as u64;
                    if start_ns >= end {
                        continue;
                    }
                    sink(burst(
                        start_ns,
                        duration_ns,
                        instructions,
                        cycles,
                        ((opening, &allreduce), (opening + 1, &isend)),
                    ));
                    let tiny_start = start_ns + duration_ns + 5_000;
                    let next = 0x1000 * ((k + 1) % phases.len()) as u64;
                    if tiny_start >= end {
                        continue;
                    }
                    sink(burst(
                        tiny_start,
                        2_000,
                        4_000.0,
                        5_000.0,
                        ((opening + 1, &isend), (next, &allreduce)),
                    ));
                    phase_end = phase_end.max(tiny_start + 2_000);
                }
                now = phase_end + 5_000;
            }
            iteration += 1;
        }
    }

    fn test_params() -> OnlineParams {
        OnlineParams {
            window_s: 1.0,
            lateness_s: 0.05,
            ..OnlineParams::default()
        }
    }

    /// What a run produced: all events, and the view of every closed window.
    struct Run {
        events: Vec<PhaseEvent>,
        windows: Vec<WindowView>,
        phases: JobPhases,
    }

    impl Run {
        fn tracking(&self) -> Vec<&TrackingEvent> {
            self.events
                .iter()
                .filter_map(|e| match e {
                    PhaseEvent::Tracking(t) => Some(t),
                    _ => None,
                })
                .collect()
        }
    }

    fn closed_window_in(events: &[PhaseEvent]) -> bool {
        events
            .iter()
            .any(|e| matches!(e, PhaseEvent::Reclustered { partial: false, .. }))
    }

    fn run(
        ranks: u32,
        params: OnlineParams,
        seconds: f64,
        factor: impl Fn(u64, u64, usize) -> f64,
    ) -> Run {
        run_with(ranks, true, params, seconds, factor)
    }

    fn run_with(
        ranks: u32,
        counters: bool,
        params: OnlineParams,
        seconds: f64,
        factor: impl Fn(u64, u64, usize) -> f64,
    ) -> Run {
        let noise = Noise {
            jitter: 0.03,
            ..Noise::default()
        };
        run_noisy(ranks, counters, params, seconds, 42, noise, factor)
    }

    fn run_noisy(
        ranks: u32,
        counters: bool,
        params: OnlineParams,
        seconds: f64,
        seed: u64,
        noise: Noise,
        factor: impl Fn(u64, u64, usize) -> f64,
    ) -> Run {
        let window_ns = (params.window_s * 1e9) as u64;
        let mut phases = JobPhases::new(ranks, params).unwrap();
        let mut events = Vec::new();
        let mut windows = Vec::new();
        spmd_noisy(
            ranks,
            counters,
            &E1_PHASES,
            window_ns,
            seconds,
            seed,
            noise,
            factor,
            |b| {
                phases.push(&b);
                let new = phases.tick(b.start_ns + b.duration_ns);
                if closed_window_in(&new) {
                    windows.push(phases.snapshot().last_window.unwrap());
                }
                events.extend(new);
            },
        );
        // Close the remaining windows one by one.
        let lateness_ns = (phases.params().lateness_s * 1e9) as u64;
        while phases.held().open_windows > 0 {
            let next = phases.buffers.keys().next().copied().unwrap();
            let new = phases.tick((next + 1) * window_ns + lateness_ns);
            if closed_window_in(&new) {
                windows.push(phases.snapshot().last_window.unwrap());
            }
            events.extend(new);
        }
        Run {
            events,
            windows,
            phases,
        }
    }

    /// The phase (index into E1_PHASES) of a window phase, from its code region.
    fn phase_of(view: &PhaseView) -> u64 {
        view.stats.regions[0].start.offset / 0x1000
    }

    /// Per window: (phase index, stable id) of its phases, sorted.
    fn ids_by_window(run: &Run) -> Vec<Vec<(u64, StableId)>> {
        run.windows
            .iter()
            .map(|w| {
                let mut v: Vec<(u64, StableId)> =
                    w.phases.iter().map(|p| (phase_of(p), p.id)).collect();
                v.sort_unstable();
                v
            })
            .collect()
    }

    const W0: u64 = T0 / 1_000_000_000;

    #[test]
    fn stable_phases_keep_their_ids_and_make_no_events_after_the_first_window() {
        for (ranks, counters) in [(4, true), (2, true), (8, true), (4, false)] {
            stable_phases(ranks, counters);
        }
    }

    fn stable_phases(ranks: u32, counters: bool) {
        let run = run_with(ranks, counters, test_params(), 6.0, |_, _, _| 1.0);
        let ids = ids_by_window(&run);
        assert!(ids.len() >= 6, "{} windows", ids.len());
        for (w, window) in ids.iter().enumerate() {
            assert_eq!(window.len(), 3, "window {w}: {window:?}");
            assert_eq!(window, &ids[0], "window {w}");
        }
        for view in &run.windows {
            assert!(!view.partial);
            assert!((view.spmd_score - 1.0).abs() < 1e-9, "{}", view.spmd_score);
            assert!(view.time_filtered_share > 0.0 && view.time_filtered_share < 0.01);
            let expected = if counters {
                FeatureSet::InstructionsIpc
            } else {
                FeatureSet::OnCpuTimePerRegion
            };
            assert_eq!(view.features.used, expected);
            for p in &view.phases {
                assert_eq!(p.stats.spmd_score, 1.0);
                assert_eq!(p.stats.id, p.id);
            }
            // The per-rank sequences in stable ids: each rank runs the three phases in order.
            assert_eq!(view.sequences.len(), ranks as usize);
            let order: Vec<StableId> = [0, 1, 2]
                .iter()
                .map(|&k| ids[0].iter().find(|(p, _)| *p == k).unwrap().1)
                .collect();
            for s in &view.sequences {
                let start = s.phases.iter().position(|&id| id == order[0]).unwrap();
                for (n, &id) in s.phases[start..].iter().enumerate() {
                    assert_eq!(id, order[n % 3], "rank {}", s.rank);
                }
            }
        }
        for event in run.tracking() {
            assert_eq!(event.window, W0, "{event:?}");
        }
        let counts = run.phases.snapshot().event_counts;
        assert_eq!(
            counts,
            EventCounts {
                appear: 3,
                ..Default::default()
            }
        );
        // The first window got a model before it closed (no model yet counts as noise) when it
        // had enough bursts (≈ 580 per rank and window: 1 600 pushes take 3 ranks), and the
        // provisional classification agrees with the clustering: no early re-clustering later.
        let early = u64::from(ranks >= 3);
        assert_eq!(run.phases.snapshot().totals.reclusters_noise, early);
        assert_eq!(
            run.events.iter().any(|e| matches!(
                e,
                PhaseEvent::Reclustered {
                    window: W0,
                    partial: true,
                    reason: ReclusterReason::NoiseShare,
                    ..
                }
            )),
            early == 1
        );
        let snapshot = run.phases.snapshot();
        assert_eq!(snapshot.totals.late_bursts, 0);
        let cumulative = snapshot.cumulative.unwrap();
        let mut phases: Vec<(StableId, u32)> = cumulative
            .clusters
            .iter()
            .map(|c| (c.phase, c.part))
            .collect();
        phases.sort_unstable();
        let mut expected: Vec<(StableId, u32)> = ids[0].iter().map(|&(_, id)| (id, 0)).collect();
        expected.sort_unstable();
        assert_eq!(phases, expected);
    }

    #[test]
    fn a_changed_phase_keeps_its_id_with_one_moved_event() {
        // Phase 1's work ×1.6 from window 3 on.
        let run = run(4, test_params(), 6.0, |w, _, k| {
            if k == 1 && w >= 3 {
                1.6
            } else {
                1.0
            }
        });
        let ids = ids_by_window(&run);
        assert!(ids.len() >= 6);
        for (w, window) in ids.iter().enumerate() {
            assert_eq!(window, &ids[0], "window {w}: every phase keeps its id");
        }
        let tracking = run.tracking();
        let after_first: Vec<&&TrackingEvent> =
            tracking.iter().filter(|e| e.window != W0).collect();
        assert_eq!(after_first.len(), 1, "{after_first:?}");
        let moved = after_first[0];
        assert_eq!(moved.kind, EventKind::Moved);
        assert_eq!(moved.window, W0 + 3);
        let phase_one = ids[0].iter().find(|(p, _)| *p == 1).unwrap().1;
        assert_eq!(
            (moved.from.clone(), moved.to.clone()),
            (vec![phase_one], vec![phase_one])
        );
        let distance = moved.distance.unwrap();
        assert!((distance - 1.6f64.ln()).abs() < 0.05, "moved by {distance}");
        assert_eq!(
            run.phases.snapshot().event_counts,
            EventCounts {
                appear: 3,
                moved: 1,
                ..Default::default()
            }
        );
        // The statistics follow: phase 1's instructions step up by 1.6 under the same id.
        let instructions = |view: &WindowView| {
            view.phases
                .iter()
                .find(|p| p.id == phase_one)
                .unwrap()
                .stats
                .instructions_mean
                .unwrap()
        };
        let ratio = instructions(&run.windows[4]) / instructions(&run.windows[1]);
        assert!((ratio - 1.6).abs() < 0.02, "{ratio}");
        // The cumulative view shows both behaviours of the phase, as two parts.
        let cumulative = run.phases.snapshot().cumulative.unwrap();
        let parts: Vec<u32> = cumulative
            .clusters
            .iter()
            .filter(|c| c.phase == phase_one)
            .map(|c| c.part)
            .collect();
        assert_eq!(parts, vec![0, 1]);
    }

    #[test]
    fn a_phase_that_turns_bimodal_splits() {
        // From window 3 on, phase 1 does 1.3× the work on odd iterations.
        let run = run(4, test_params(), 6.0, |w, i, k| {
            if k == 1 && w >= 3 && i % 2 == 1 {
                1.3
            } else {
                1.0
            }
        });
        let ids = ids_by_window(&run);
        let phase_one = ids[0].iter().find(|(p, _)| *p == 1).unwrap().1;
        let tracking = run.tracking();
        let splits: Vec<&&TrackingEvent> = tracking
            .iter()
            .filter(|e| e.kind == EventKind::Split)
            .collect();
        assert_eq!(splits.len(), 1, "{tracking:?}");
        let split = splits[0];
        assert_eq!(split.window, W0 + 3);
        assert_eq!(split.from, vec![phase_one]);
        assert_eq!(split.to.len(), 2);
        assert_eq!(split.to[0], phase_one, "the unchanged half keeps the id");
        assert!(split.to[1] > *ids[0].iter().map(|(_, id)| id).max().unwrap());
        assert_eq!(
            run.phases.snapshot().event_counts,
            EventCounts {
                appear: 3,
                split: 1,
                ..Default::default()
            }
        );
        for window in &ids[3..] {
            let mut expected = ids[0].clone();
            expected.push((1, split.to[1]));
            expected.sort_unstable();
            assert_eq!(window, &expected);
        }
    }

    #[test]
    fn a_bimodal_phase_that_turns_uniform_merges() {
        // Until window 3, phase 1 does 1.3× the work on odd iterations.
        let run = run(4, test_params(), 6.0, |w, i, k| {
            if k == 1 && w < 3 && i % 2 == 1 {
                1.3
            } else {
                1.0
            }
        });
        let ids = ids_by_window(&run);
        let halves: Vec<StableId> = ids[0]
            .iter()
            .filter(|(p, _)| *p == 1)
            .map(|&(_, id)| id)
            .collect();
        assert_eq!(halves.len(), 2, "{:?}", ids[0]);
        let tracking = run.tracking();
        let merges: Vec<&&TrackingEvent> = tracking
            .iter()
            .filter(|e| e.kind == EventKind::Merge)
            .collect();
        assert_eq!(merges.len(), 1, "{tracking:?}");
        let merge = merges[0];
        assert_eq!(merge.window, W0 + 3);
        assert_eq!(merge.from, halves);
        // The merged phase lies where the even iterations were: that half's id continues.
        let even = ids[0]
            .iter()
            .filter(|(p, _)| *p == 1)
            .map(|&(_, id)| id)
            .find(|&id| {
                let v = run.windows[0].phases.iter().find(|p| p.id == id).unwrap();
                v.stats.instructions_mean.unwrap() < 5.5e6
            })
            .unwrap();
        assert_eq!(merge.to, vec![even]);
        assert_eq!(
            run.phases.snapshot().event_counts,
            EventCounts {
                appear: 4,
                merge: 1,
                ..Default::default()
            }
        );
        for window in &ids[3..] {
            assert_eq!(window.len(), 3);
            assert!(window.contains(&(1, even)));
        }
    }

    #[test]
    fn a_skipped_window_keeps_the_id_and_a_phase_gone_vanishes() {
        // Phase 2 skips window 3 only; phase 0 stops at window 3.
        let params = OnlineParams {
            tracking: TrackingParams {
                vanish_after_windows: 2,
                ..TrackingParams::default()
            },
            ..test_params()
        };
        let run = run(4, params, 6.0, |w, _, k| match (k, w) {
            (2, 3) => 0.0,
            (0, w) if w >= 3 => 0.0,
            _ => 1.0,
        });
        let ids = ids_by_window(&run);
        let id_of = |phase: u64| ids[0].iter().find(|(p, _)| *p == phase).unwrap().1;
        assert_eq!(ids[3], vec![(1, id_of(1))]);
        for window in &ids[4..] {
            assert_eq!(window, &vec![(1, id_of(1)), (2, id_of(2))]);
        }
        let tracking = run.tracking();
        let after_first: Vec<&&TrackingEvent> =
            tracking.iter().filter(|e| e.window != W0).collect();
        assert_eq!(after_first.len(), 1, "{after_first:?}");
        let vanish = after_first[0];
        assert_eq!(vanish.kind, EventKind::Vanish);
        assert_eq!(vanish.from, vec![id_of(0)]);
        assert_eq!(
            (vanish.window, vanish.last_seen_window),
            (W0 + 4, Some(W0 + 2))
        );
        let snapshot = run.phases.snapshot();
        assert!(!snapshot.live_ids.contains(&id_of(0)));
        assert!(snapshot.dormant_ids.is_empty());
    }

    #[test]
    fn the_same_stream_gives_the_same_snapshot() {
        let factor = |w: u64, i: u64, k: usize| {
            if k == 1 && w >= 2 && i.is_multiple_of(3) {
                1.4
            } else {
                1.0
            }
        };
        let first = run(4, test_params(), 4.0, factor);
        let second = run(4, test_params(), 4.0, factor);
        let json = |r: &Run| serde_json::to_string(&r.phases.snapshot()).unwrap();
        assert_eq!(json(&first), json(&second));
        assert_eq!(first.events, second.events);
        let parsed: PhasesSnapshot = serde_json::from_str(&json(&first)).unwrap();
        assert_eq!(parsed.event_counts, first.phases.snapshot().event_counts);
        assert_eq!(parsed.live_ids, first.phases.snapshot().live_ids);
        // The signature of the job is deterministic too.
        let app = AppIdentity {
            build_id: Some("ab12".into()),
            executable: "/opt/app/bin/solver".into(),
        };
        let signature = |r: &Run| {
            serde_json::to_string(&r.phases.signature(app.clone(), "job").unwrap().unwrap())
                .unwrap()
        };
        assert_eq!(signature(&first), signature(&second));
    }

    #[test]
    fn memory_stays_bounded_over_a_million_bursts() {
        // Short phases (≈ 0.25 ms per iteration) on 8 ranks: about 190 000 bursts per second.
        let phases = [(2e4, 2.0), (1e5, 0.6), (4e5, 1.2)];
        let params = OnlineParams {
            window_s: 0.25,
            lateness_s: 0.01,
            max_window_bursts: 4_000,
            max_cumulative_bursts: 2_000,
            cumulative_chunks: 4,
            ..OnlineParams::default()
        };
        let window_ns = (params.window_s * 1e9) as u64;
        let (max_window, max_cumulative) = (params.max_window_bursts, params.max_cumulative_bursts);
        let mut job = JobPhases::new(8, params).unwrap();
        let mut pushed = 0u64;
        let mut largest = Held::default();
        let mut check = |job: &JobPhases| {
            let held = job.held();
            assert!(held.open_windows <= MAX_OPEN_WINDOWS);
            assert!(
                held.window_bursts <= MAX_OPEN_WINDOWS * max_window + 100,
                "{held:?}"
            );
            assert!(held.cumulative_bursts <= max_cumulative, "{held:?}");
            largest.window_bursts = largest.window_bursts.max(held.window_bursts);
            largest.cumulative_bursts = largest.cumulative_bursts.max(held.cumulative_bursts);
        };
        spmd(
            8,
            true,
            &phases,
            window_ns,
            60.0,
            7,
            |_, _, _| 1.0,
            |b| {
                if pushed == 1_000_000 {
                    return;
                }
                job.push(&b);
                pushed += 1;
                if pushed.is_multiple_of(1000) {
                    job.tick(b.start_ns);
                    check(&job);
                }
            },
        );
        assert_eq!(pushed, 1_000_000);
        job.tick(u64::MAX);
        check(&job);
        let snapshot = job.snapshot();
        assert_eq!(snapshot.totals.bursts_seen, 1_000_000);
        assert!(
            snapshot.totals.dropped_bursts > 900_000,
            "{:?}",
            snapshot.totals
        );
        assert!(
            snapshot.totals.windows_closed >= 20,
            "{:?}",
            snapshot.totals
        );
        assert!(largest.window_bursts >= max_window);
        // The cumulative sample spans the job: 4 chunks at most, spread by a doubled stride.
        let cumulative = snapshot.cumulative.unwrap();
        assert!(cumulative.windows_sampled <= 4);
        assert!(cumulative.stride >= 4, "stride {}", cumulative.stride);
        assert_eq!(cumulative.first_window, T0 / window_ns);
        assert!(cumulative.clusters.len() >= 3);
        let window = snapshot.last_window.unwrap();
        assert!(window.bursts_seen > window.bursts_analysed);
        assert!(window.bursts_analysed as usize <= max_window);

        // All in one window without a tick: the sample still stops at its bound.
        let mut job = JobPhases::new(8, OnlineParams::default()).unwrap();
        let mut pushed = 0u64;
        spmd(
            8,
            true,
            &phases,
            30_000_000_000,
            20.0,
            9,
            |_, _, _| 1.0,
            |b| {
                if pushed < 1_000_000 {
                    job.push(&b);
                    pushed += 1;
                }
            },
        );
        let held = job.held();
        assert_eq!(held.open_windows, 1);
        assert!(held.window_bursts <= OnlineParams::default().max_window_bursts);
        assert_eq!(held.cumulative_bursts, 0);
    }

    #[test]
    fn late_bursts_are_counted_and_bursts_beyond_the_open_windows_close_the_oldest() {
        let mut job = JobPhases::new(2, test_params()).unwrap();
        let mut bursts = Vec::new();
        spmd(
            2,
            true,
            &E1_PHASES,
            1_000_000_000,
            1.0,
            3,
            |_, _, _| 1.0,
            |b| bursts.push(b),
        );
        for b in &bursts {
            job.push(b);
        }
        assert!(job.tick(T0 + 2_000_000_000).iter().any(|e| matches!(
            e,
            PhaseEvent::Reclustered {
                window: W0,
                partial: false,
                ..
            }
        )));
        job.push(&bursts[0]);
        assert_eq!(job.snapshot().totals.late_bursts, 1);
        // Bursts for windows W0+5..W0+8: the fourth window closes W0+5 at once.
        for k in 5..9 {
            for b in &bursts[..300] {
                let mut b = b.clone();
                b.start_ns += k * 1_000_000_000;
                job.push(&b);
            }
        }
        assert_eq!(job.held().open_windows, MAX_OPEN_WINDOWS);
        let events = job.tick(T0 + 8_000_000_000);
        assert!(events.iter().any(|e| matches!(
            e,
            PhaseEvent::Reclustered { window, reason: ReclusterReason::OpenWindowLimit, .. }
                if *window == W0 + 5
        )));

        // A window with a handful of bursts is carried into the next one, not clustered alone.
        let mut job = JobPhases::new(2, test_params()).unwrap();
        for b in bursts.iter().take(20) {
            job.push(b);
        }
        for b in &bursts[..300] {
            let mut b = b.clone();
            b.start_ns += 1_000_000_000;
            job.push(&b);
        }
        let events = job.tick(T0 + 3_000_000_000);
        let reclustered: Vec<(u64, u64)> = events
            .iter()
            .filter_map(|e| match e {
                PhaseEvent::Reclustered { window, bursts, .. } => Some((*window, *bursts)),
                _ => None,
            })
            .collect();
        assert_eq!(reclustered, vec![(W0 + 1, 320)]);
        assert_eq!(job.snapshot().totals.windows_carried, 1);
    }

    #[test]
    fn parameters_are_checked_and_read_from_toml() {
        let params: OnlineParams =
            toml::from_str("window_s = 10.0\n[tracking]\noutlier_share = 0.1\n").unwrap();
        assert_eq!(params.window_s, 10.0);
        assert_eq!(params.tracking.outlier_share, 0.1);
        assert_eq!(
            params.max_window_bursts,
            OnlineParams::default().max_window_bursts
        );
        assert!(toml::from_str::<OnlineParams>("windows = 10.0\n").is_err());
        for bad in [
            OnlineParams {
                window_s: 0.0,
                ..OnlineParams::default()
            },
            OnlineParams {
                max_window_bursts: 1,
                ..OnlineParams::default()
            },
            OnlineParams {
                analysis: AnalysisParams {
                    clustering: crate::analysis::ClusteringMethod::Acr {
                        steps: 0,
                        min_points: None,
                        resolution: 0.05,
                    },
                    ..AnalysisParams::default()
                },
                ..OnlineParams::default()
            },
            OnlineParams {
                tracking: TrackingParams {
                    outlier_share: 0.0,
                    ..TrackingParams::default()
                },
                ..OnlineParams::default()
            },
        ] {
            assert!(JobPhases::new(4, bad).is_err());
        }
    }
}
