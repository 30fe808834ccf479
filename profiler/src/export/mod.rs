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

use std::collections::BTreeMap;

use crate::capture::{Lost, ProgramStats};

/// Processes held at the open of an MPI library at a new path (see `mpi.hold_new_libraries`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LibraryOpenStats {
    /// Processes stopped until the daemon had handled the library they opened.
    pub held: u64,
    /// Their stopped time, summed: from the open to the resume, in ns.
    pub held_ns: u64,
    /// Library files (MPI libraries and PMPI interposers) attached while a process was held.
    pub attached: u64,
    /// Opens that could not be reported (the ring buffer was full): not held.
    pub not_held: u64,
    /// Reads of library files found at run time that did not return within
    /// `mpi.library_read_timeout_ms` (a file system that does not answer).
    pub reads_timed_out: u64,
    /// Those reads still running.
    pub reads_stuck: u64,
}

/// What the probe governor did (see `governor` in the config).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GovernorStats {
    /// What a probe hit costs on this node, measured at start: (return probed too, entry only),
    /// in ns.
    pub probe_cost_ns: Option<(f64, f64)>,
    /// The governed (polling) functions, by name.
    pub functions: BTreeMap<String, GovernedFunction>,
}

/// How the governor has one function probed, and how often it changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GovernedFunction {
    /// "full", "count_only" or "sampled".
    pub mode: &'static str,
    /// Changes into each mode.
    pub changes: BTreeMap<&'static str, u64>,
    /// Sampling windows closed.
    pub windows: u64,
}

/// The daemon's own health, exported next to the jobs.
#[derive(Clone, Debug, Default)]
pub struct SelfStats {
    pub lost: Lost,
    pub programs: Vec<ProgramStats>,
    pub probes: usize,
    pub libraries: usize,
    pub library_opens: LibraryOpenStats,
    /// Comma-separated counter event names, or "none".
    pub counter_events: String,
    pub hardware_counters: bool,
    /// The daemon's own CPU time and memory (None if procfs could not be read).
    pub process: Option<crate::proc::ProcessUsage>,
    pub governor: GovernorStats,
}
