//! Export stage: Prometheus metrics, the HTTP server, recordings, text reports, phase tables and
//! the HTML views of a phase analysis.

pub mod bottlenecks;
pub mod client;
pub mod groups;
pub mod html;
pub mod http;
pub mod phases;
pub mod prometheus;
pub mod recording;
pub mod report;
pub mod report_json;
pub mod signature;
pub mod sites;

use crate::capture::{Lost, ProgramStats};

/// The daemon's own health, exported next to the jobs.
#[derive(Clone, Debug, Default)]
pub struct SelfStats {
    pub lost: Lost,
    pub programs: Vec<ProgramStats>,
    pub probes: usize,
    pub libraries: usize,
    /// Comma-separated counter event names, or "none".
    pub counter_events: String,
    pub hardware_counters: bool,
    /// The daemon's own CPU time and memory (None if procfs could not be read).
    pub process: Option<crate::capture::usage::ProcessUsage>,
}
