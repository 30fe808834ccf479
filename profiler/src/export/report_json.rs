//! The JSON documents of `mpiburst report --format json` and `mpiburst compare --format json`,
//! for scripts and CI pipelines (schema in docs/report-json.md): what the text shows, built from
//! the same structures the text is rendered from, numbers in base units and never formatted.

use std::path::Path;

use serde::Serialize;

use crate::{
    analysis::{
        online::{CumulativeView, OpenWindow, PhaseView, PhasesSnapshot},
        tracking::{AppIdentity, EventCounts, RunMatch, RunSignature, StableId},
        Analysis, AnalysisParams, ClusterStats, ClusteringReport, FeatureReport, FilterReport,
    },
    export::{
        bottlenecks::Bottlenecks,
        phases::{active_phases, current_window, KernelFilter},
        report::JobReport,
    },
};

/// The `schema` of `mpiburst report --format json`.
pub const REPORT_SCHEMA: &str = "mpiburst-report";
/// The `schema` of `mpiburst compare --format json`.
pub const COMPARE_SCHEMA: &str = "mpiburst-compare";
/// The `version` of both schemas: additive changes keep it, renames and removals bump it.
pub const SCHEMA_VERSION: u32 = 1;

/// `mpiburst report --format json`: one document per invocation.
#[derive(Clone, Debug, Serialize)]
pub struct ReportDocument {
    pub schema: &'static str,
    pub version: u32,
    /// One [`JobDocument`] per job reported, in the order of the text.
    pub jobs: Vec<serde_json::Value>,
}

impl ReportDocument {
    pub fn new(jobs: Vec<serde_json::Value>) -> ReportDocument {
        ReportDocument {
            schema: REPORT_SCHEMA,
            version: SCHEMA_VERSION,
            jobs,
        }
    }
}

/// One job of the report: the job report's fields, then its bottlenecks and phases.
#[derive(Clone, Debug, Serialize)]
pub struct JobDocument<'a> {
    #[serde(flatten)]
    pub report: JobReport<'a>,
    /// Over the job's life on its node; `None` while a daemon has not evaluated them yet.
    pub bottlenecks: Option<Bottlenecks<'a>>,
    /// With `--phases` only.
    pub phases: Option<PhasesDocument<'a>>,
}

/// The phases of one job, from where the report read them.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum PhasesDocument<'a> {
    /// Clustered from a recording's bursts.
    Recording {
        /// The kernel's duration filter the recording was made with.
        min_burst_ns: u64,
        /// `None` when the recording holds no burst of the job.
        analysis: Option<AnalysisView<'a>>,
        kernel_filter: Option<KernelFilter>,
    },
    /// A running daemon's online analysis.
    Daemon {
        /// `None` before the daemon started one (it does with the job's first bursts).
        online: Option<OnlineView<'a>>,
        kernel_filter: Option<KernelFilter>,
    },
}

/// An [`Analysis`] without its per-burst labels.
#[derive(Clone, Debug, Serialize)]
pub struct AnalysisView<'a> {
    pub params: &'a AnalysisParams,
    pub ranks: u32,
    pub global_score: f64,
    pub features: &'a FeatureReport,
    pub filter: &'a FilterReport,
    pub clustering: &'a ClusteringReport,
    pub clusters: &'a [ClusterStats],
    pub noise: Option<&'a ClusterStats>,
}

impl<'a> From<&'a Analysis> for AnalysisView<'a> {
    fn from(a: &'a Analysis) -> Self {
        AnalysisView {
            params: &a.params,
            ranks: a.ranks,
            global_score: a.global_score,
            features: &a.features,
            filter: &a.filter,
            clustering: &a.clustering,
            clusters: &a.clusters,
            noise: a.noise.as_ref(),
        }
    }
}

/// The daemon's online analysis of one job as the text shows it at a time: the last clustered
/// window, the open one, the tracking and the whole job so far.
#[derive(Clone, Debug, Serialize)]
pub struct OnlineView<'a> {
    pub ranks: u32,
    pub window_ns: u64,
    pub last_window: Option<WindowSummary<'a>>,
    pub current_window: OpenWindow,
    /// Windows that held too few bursts to be clustered alone; their bursts went to the next.
    pub windows_carried: u64,
    pub tracking: Tracking<'a>,
    pub last_error: Option<&'a str>,
    pub whole_job: Option<&'a CumulativeView>,
}

impl<'a> OnlineView<'a> {
    /// The view of `s` at `now_ns` (Unix), which gives the open window before the daemon's
    /// first tick.
    pub fn new(s: &'a PhasesSnapshot, now_ns: u64) -> OnlineView<'a> {
        OnlineView {
            ranks: s.ranks,
            window_ns: s.window_ns,
            last_window: s.last_window.as_ref().map(|w| WindowSummary {
                window: w.window,
                start_ns: w.start_ns,
                end_ns: w.end_ns,
                partial: w.partial,
                bursts_seen: w.bursts_seen,
                bursts_analysed: w.bursts_analysed,
                bursts_dropped: w.bursts_dropped,
                features: &w.features,
                filter: &w.filter,
                clustering: &w.clustering,
                spmd_score: w.spmd_score,
                phases: &w.phases,
                noise: w.noise.as_ref(),
            }),
            current_window: current_window(s, now_ns),
            windows_carried: s.totals.windows_carried,
            tracking: Tracking {
                active: active_phases(s),
                dormant: &s.dormant_ids,
                event_counts: &s.event_counts,
            },
            last_error: s.last_error.as_deref(),
            whole_job: s.cumulative.as_ref(),
        }
    }
}

/// A clustered window without its per-rank phase sequences.
#[derive(Clone, Debug, Serialize)]
pub struct WindowSummary<'a> {
    pub window: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub partial: bool,
    pub bursts_seen: u64,
    pub bursts_analysed: u64,
    pub bursts_dropped: u64,
    pub features: &'a FeatureReport,
    pub filter: &'a FilterReport,
    pub clustering: &'a ClusteringReport,
    pub spmd_score: f64,
    pub phases: &'a [PhaseView],
    pub noise: Option<&'a ClusterStats>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Tracking<'a> {
    pub active: Vec<StableId>,
    pub dormant: &'a [StableId],
    /// Tracking events since the job started, by kind.
    pub event_counts: &'a EventCounts,
}

/// `mpiburst compare --format json`.
#[derive(Clone, Debug, Serialize)]
pub struct CompareDocument<'a> {
    pub schema: &'static str,
    pub version: u32,
    pub before: RunSide<'a>,
    pub after: RunSide<'a>,
    #[serde(rename = "match")]
    pub run_match: &'a RunMatch,
}

impl<'a> CompareDocument<'a> {
    pub fn new(before: RunSide<'a>, after: RunSide<'a>, m: &'a RunMatch) -> CompareDocument<'a> {
        CompareDocument {
            schema: COMPARE_SCHEMA,
            version: SCHEMA_VERSION,
            before,
            after,
            run_match: m,
        }
    }
}

/// One of the two runs compared.
#[derive(Clone, Debug, Serialize)]
pub struct RunSide<'a> {
    pub recording: &'a Path,
    pub job: &'a str,
    pub app: &'a AppIdentity,
    pub ranks: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub spmd_score: f64,
}

impl<'a> RunSide<'a> {
    pub fn new(recording: &'a Path, s: &'a RunSignature) -> RunSide<'a> {
        RunSide {
            recording,
            job: &s.label,
            app: &s.app,
            ranks: s.frame.ranks,
            start_ns: s.start_ns,
            end_ns: s.end_ns,
            spmd_score: s.frame.spmd_score,
        }
    }
}
