//! Types that flow between the stages: capture and recordings produce them, discovery annotates
//! them, analysis and export consume them. Nothing here depends on BPF or on a live system, so every
//! later stage can be driven from a recording.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// A code location that compares equal across processes and nodes running the same binary:
/// the module (GNU build-id in hex when the ELF has one, else its path) and the file offset.
/// Raw virtual addresses are never used because of ASLR.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CallSite {
    pub module: Arc<str>,
    pub offset: u64,
}

impl CallSite {
    /// The call site of a burst that no MPI call opened (cannot happen after MPI_Init) or whose
    /// address could not be resolved because the process was gone before its maps were read.
    pub fn unknown(address: u64) -> Self {
        CallSite {
            module: Arc::from("?"),
            offset: address,
        }
    }

    /// Whether this is an [`CallSite::unknown`] site: a raw address, not comparable between
    /// processes.
    pub fn is_unknown(&self) -> bool {
        self.module.as_ref() == "?"
    }
}

impl std::fmt::Display for CallSite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let module = self.module.rsplit('/').next().unwrap_or(&self.module);
        let short = if module.len() > 12 && module.bytes().all(|b| b.is_ascii_hexdigit()) {
            &module[..12]
        } else {
            module
        };
        write!(f, "{short}+{:#x}", self.offset)
    }
}

/// Hardware counter deltas over one burst. Present only where a PMU delivered them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HwCounters {
    pub instructions: u64,
    pub cycles: u64,
}

/// One CPU burst: the computation of one thread between returning from an MPI call and entering
/// the next one (polling calls such as MPI_Test do not end a burst; their time is excluded).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Burst {
    pub pid: u32,
    pub tid: u32,
    /// MPI rank in the job's world communicator.
    pub rank: u32,
    /// Start time, nanoseconds since the Unix epoch.
    pub start_ns: u64,
    /// Wall-clock duration without the time spent in polling MPI calls inside the burst.
    pub duration_ns: u64,
    /// Time the thread ran during the burst, as the scheduler accounts it (sched_stat_runtime):
    /// what the thread's own CLOCK_THREAD_CPUTIME_ID counts, without time stolen by a hypervisor.
    pub oncpu_ns: u64,
    pub counters: Option<HwCounters>,
    /// MPI function whose return opened the burst.
    pub start_func: Arc<str>,
    /// MPI function whose entry closed the burst.
    pub end_func: Arc<str>,
    /// Return address of the outermost MPI call that opened the burst.
    pub start_site: CallSite,
    /// Return address of the outermost MPI call that closed the burst.
    pub end_site: CallSite,
}

impl Burst {
    /// The code region of a burst: the pair of call sites around it.
    pub fn region(&self) -> (&CallSite, &CallSite) {
        (&self.start_site, &self.end_site)
    }
}

/// The calls that bound a rank's region of interest, as the POP methodology defines it: from
/// the return of MPI_Init/MPI_Init_thread to the entry of MPI_Finalize. Their own time is start-up
/// and shut-down, reported apart and never counted as MPI time of the region.
pub const INIT_FUNCTIONS: [&str; 2] = ["MPI_Init", "MPI_Init_thread"];
pub const FINALIZE_FUNCTION: &str = "MPI_Finalize";

/// MPI_Init, MPI_Init_thread or MPI_Finalize.
pub fn is_lifecycle_function(name: &str) -> bool {
    INIT_FUNCTIONS.contains(&name) || name == FINALIZE_FUNCTION
}

/// Now, in nanoseconds since the Unix epoch: CLOCK_REALTIME, the clock burst start times and
/// job times are kept in.
pub fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Identity of one MPI job on a node, as discovery found it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct JobId(pub String);

impl std::fmt::Display for JobId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
