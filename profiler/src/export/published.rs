//! What the daemon publishes for the HTTP server and the Prometheus metrics: an immutable view of
//! the node's jobs, replaced after every update and read through a watch channel. Both readers
//! take it from here, so neither imports the other for it.

use std::{collections::BTreeMap, sync::Arc};

use tokio::sync::watch;

use crate::{
    analysis::{groups::RankGroupsView, online::PhasesSnapshot},
    capture::{
        governor::GovernorStats, usage::UsageTotals, LibraryOpenStats, Lost, ProbeCost,
        ProgramStats,
    },
    model::JobId,
    properties::LiveProperties,
    store::JobStore,
};

/// What the daemon publishes after every update: an immutable view that the server reads.
#[derive(Default)]
pub struct Published {
    /// The jobs without their burst buffers ([`crate::store::Job::without_bursts`]).
    pub store: JobStore,
    /// Bursts each job holds in its buffer.
    pub bursts_held: BTreeMap<JobId, usize>,
    pub health: SelfStats,
    /// The online phase analysis of each job, as of the last tick.
    pub phases: BTreeMap<JobId, Arc<PhasesSnapshot>>,
    /// Each job's properties (life and last window), as of the last stats update.
    pub properties: BTreeMap<JobId, Arc<LiveProperties>>,
    /// Each job's kernel usage (CPU time, memory, file I/O) on this node.
    pub usage: BTreeMap<JobId, UsageTotals>,
    /// The start-up has attached the probes: from here on MPI calls are counted.
    pub probes_attached: bool,
    /// Each job's rank groups and behaviour changes.
    pub rank_groups: BTreeMap<JobId, Arc<RankGroupsView>>,
}

/// The server's end of the daemon's watch channel: the latest [`Published`] view.
pub type PublishedState = watch::Receiver<Arc<Published>>;

/// The daemon's own health, exported next to the jobs.
#[derive(Clone, Debug, Default)]
pub struct SelfStats {
    pub lost: Lost,
    pub programs: Vec<ProgramStats>,
    pub probes: usize,
    pub libraries: usize,
    pub library_opens: LibraryOpenStats,
    /// Whether the programs attached on demand (while the node has MPI processes) are.
    pub file_io_attached: bool,
    pub scheduler_attached: bool,
    pub library_watch_attached: bool,
    /// Comma-separated counter event names, or "none".
    pub counter_events: String,
    pub hardware_counters: bool,
    /// The daemon's own CPU time and memory (None if procfs could not be read).
    pub process: Option<crate::proc::ProcessUsage>,
    pub governor: GovernorStats,
    /// What a probe hit costs here, measured at start.
    pub probe_cost: Option<ProbeCost>,
}
