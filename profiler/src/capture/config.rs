//! The capture stage's configuration: the `[capture]` section (duration filter, drain and stats
//! intervals, ring buffer, counters, file I/O) and the `[mpi]` section (which library files and
//! which MPI functions are probed). Each section validates itself and writes its part of the
//! documented default file; [`crate::config::Config`] holds them.

use std::{fmt::Write as _, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

/// A setting of `[capture]`, `[governor]` or `[mpi]` that the file format accepts but mpiburst
/// cannot use; each message names the setting and what to write instead.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum InvalidSetting {
    #[error(
        "capture.drain_interval_ms = {drain_ms} and capture.stats_interval_ms = {stats_ms}: \
         capture intervals must be at least 1 ms"
    )]
    Interval { drain_ms: u64, stats_ms: u64 },
    #[error("capture.ring_buffer_mib = {0}: give a size within 1..=1024")]
    RingBuffer(u32),
    #[error("capture.min_burst_us = {0} is above {MAX_MIN_BURST_US} (one hour)")]
    MinBurst(u64),
    #[error(
        "capture.detach_idle_after_s = {0} must be a number of seconds from 0 to \
         {MAX_DETACH_IDLE_AFTER_S}"
    )]
    DetachIdleAfter(f64),
    #[error("governor.budget_percent = {0} must be above 0 and at most 100")]
    Budget(f64),
    #[error(
        "governor.sample_window_us = {window_us} must be within 100..=1000000 and shorter than \
         governor.min_sample_period_ms = {period_ms}"
    )]
    SampleWindow { window_us: u64, period_ms: u64 },
    #[error("governor.restore_after_s = {0} must be a number of seconds, 0 or more")]
    RestoreAfter(f64),
    #[error(
        "mpi.library_read_timeout_ms is {0}: give 1 to {MAX_LIBRARY_READ_TIMEOUT_MS} ms \
         (a held process waits that long at most)"
    )]
    LibraryReadTimeout(u64),
    #[error(
        "mpi.hold_limit_s is {0}: give {MIN_HOLD_LIMIT_S} to {MAX_HOLD_LIMIT_S} s (a process held \
         by a daemon that does not answer is resumed after that long)"
    )]
    HoldLimit(f64),
    #[error(
        "mpi.launchers lists {0:?}: a command name is 1 to 15 bytes without '/' (the kernel keeps \
         15: write it as `ps -o comm` shows it)"
    )]
    LauncherName(String),
    #[error("mpi.launchers lists {0} names: give at most {MAX_LAUNCHERS}")]
    TooManyLaunchers(usize),
    #[error("mpi.functions has more than 65535 entries")]
    TooManyFunctions,
    #[error("mpi.functions: {0:?} is not a C MPI name; write it as MPI_Xxx")]
    NotCName(String),
    #[error("mpi.functions lists {0} twice")]
    Twice(String),
    #[error(
        "mpi.functions {0}: count_arg and datatype_arg go together and must be below 6 \
         (register arguments)"
    )]
    ByteArguments(String),
    #[error(
        "mpi.functions {0}: peer_arg and comm_arg go together; peer_arg must be below 6 (a \
         register argument) and comm_arg below 15"
    )]
    PeerArguments(String),
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Bursts shorter than this many microseconds are summed in kernel instead of shipped.
    pub min_burst_us: u64,
    /// Milliseconds between ring-buffer drains (there is no wakeup per record; the BPF side wakes
    /// the daemon early when the burst ring is a quarter full).
    pub drain_interval_ms: u64,
    /// Milliseconds between reads of the in-kernel per-thread totals.
    pub stats_interval_ms: u64,
    /// Ring buffer size in MiB (rounded up to a power of two).
    pub ring_buffer_mib: u32,
    /// Counters read in BPF per burst: "auto" (hardware instructions and cycles if the PMU has
    /// them, else none), "hardware" (fail without a PMU), "software" (the software cpu-clock event
    /// in both slots: exercises the counter path where no PMU exists), or "off".
    pub counters: CounterMode,
    /// Count the file I/O of the MPI processes from the tracepoints of the file system calls.
    /// While they are attached every system call on the node takes the kernel's traced path, and
    /// the file calls of every process run a program; `cargo xtask bench overhead` measures what
    /// that adds per call. They are attached only while the daemon tracks an MPI process.
    pub file_io: bool,
    /// Seconds the node must have had no MPI process before the programs attached on demand are
    /// detached: the file I/O programs; the scheduler programs (on every context switch of the
    /// node), which the first MPI call of a process a launcher started then holds that process
    /// for until they are attached again (a few ms; `mpiburst_first_calls_held_total`); and the
    /// watch on library opens, once no launcher (`mpi.launchers`) runs either. Attaching takes
    /// about 1 ms, detaching about 1 s (off the daemon's loop); the wait keeps them across jobs
    /// that follow each other.
    pub detach_idle_after_s: f64,
    /// Detach the scheduler programs (which run at every context switch of the node) while the
    /// node has no MPI process, for `detach_idle_after_s`. The first MPI call of a thread of a
    /// process a launcher started (`mpi.launchers`) then holds that process until they are
    /// attached again, which needs CAP_KILL for other users' processes; another process's
    /// bursts count wall time as on-CPU time until the next statistics update. Off, or with
    /// `mpi.launchers` empty, they stay attached.
    pub scheduler_on_demand: bool,
    /// Turn the kernel's BPF run-time statistics on while the daemon runs, for the
    /// `mpiburst_bpf_run_seconds_total` and `mpiburst_bpf_runs_total` metrics. They make every
    /// BPF program run on the node read the clock twice (about 78 ns per run on this project's
    /// test VM, measured with `cargo xtask bench overhead`), so they are off by default; the two
    /// metrics are then exported only when the statistics are on anyway (`sysctl
    /// kernel.bpf_stats_enabled=1`).
    pub bpf_stats: bool,
    /// Attach the MPI probes as uprobe sessions where the kernel has them (6.13 and later): one
    /// program runs at the entry and, for the outermost call in progress only, at the return, so
    /// a call nested in another probed call (a Fortran wrapper calling C, an interposer calling
    /// PMPI) costs one trap instead of two. Off, or on an older kernel, every call runs an entry
    /// and a return probe.
    pub uprobe_sessions: bool,
}

/// The longest wait before idle programs are detached: one day.
const MAX_DETACH_IDLE_AFTER_S: f64 = 86_400.0;

/// The longest duration filter: one hour (a burst is one MPI call), far below the
/// `u64` nanoseconds the BPF programs compare against.
const MAX_MIN_BURST_US: u64 = 3_600_000_000;

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CounterMode {
    Auto,
    Hardware,
    Software,
    Off,
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            min_burst_us: 100,
            drain_interval_ms: 100,
            stats_interval_ms: 1000,
            ring_buffer_mib: 4,
            counters: CounterMode::Auto,
            file_io: true,
            detach_idle_after_s: 10.0,
            scheduler_on_demand: true,
            bpf_stats: false,
            uprobe_sessions: true,
        }
    }
}

impl CaptureConfig {
    /// Checks what the file format cannot express; the error says what to change.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if self.drain_interval_ms == 0 || self.stats_interval_ms == 0 {
            return Err(InvalidSetting::Interval {
                drain_ms: self.drain_interval_ms,
                stats_ms: self.stats_interval_ms,
            });
        }
        if !(1..=1024).contains(&self.ring_buffer_mib) {
            return Err(InvalidSetting::RingBuffer(self.ring_buffer_mib));
        }
        if self.min_burst_us > MAX_MIN_BURST_US {
            return Err(InvalidSetting::MinBurst(self.min_burst_us));
        }
        if !(0.0..=MAX_DETACH_IDLE_AFTER_S).contains(&self.detach_idle_after_s) {
            return Err(InvalidSetting::DetachIdleAfter(self.detach_idle_after_s));
        }
        Ok(())
    }

    /// The duration filter in ns, as the BPF programs apply it.
    pub fn min_burst_ns(&self) -> u64 {
        self.min_burst_us.min(MAX_MIN_BURST_US) * 1000
    }

    /// `detach_idle_after_s` as a duration (validated).
    pub fn detach_idle_after(&self) -> Duration {
        Duration::from_secs_f64(self.detach_idle_after_s.clamp(0.0, MAX_DETACH_IDLE_AFTER_S))
    }

    pub fn drain_interval(&self) -> Duration {
        Duration::from_millis(self.drain_interval_ms)
    }

    pub fn stats_interval(&self) -> Duration {
        Duration::from_millis(self.stats_interval_ms)
    }

    /// The `[capture]` section of the default file, each field with its documentation.
    pub fn default_toml() -> String {
        let d = CaptureConfig::default();
        format!(
            "[capture]\n\
             # Bursts shorter than this (microseconds) are summed in kernel, not shipped.\n\
             min_burst_us = {}\n\
             # Milliseconds between ring-buffer drains (no wakeup per record; a quarter-full burst\n\
             # ring wakes the daemon early).\n\
             drain_interval_ms = {}\n\
             # Milliseconds between reads of the in-kernel per-thread totals.\n\
             stats_interval_ms = {}\n\
             # Ring buffer size in MiB.\n\
             ring_buffer_mib = {}\n\
             # \"auto\" (hardware instructions+cycles if the PMU has them, else none), \"hardware\",\n\
             # \"software\" (cpu-clock in both slots, to exercise the counter path), or \"off\".\n\
             counters = \"auto\"\n\
             # Count the MPI processes' file I/O from the tracepoints of read, write, open and close.\n\
             # They are attached only while MPI processes run on the node; then every system call\n\
             # on the node takes the kernel's traced path (on a VM about 0.04 us more per call,\n\
             # 0.19 us per read or write; `cargo xtask bench overhead` measures it here); false\n\
             # turns the I/O properties into \"not measured\".\n\
             file_io = true\n\
             # Seconds without MPI processes on the node before the file I/O programs and the\n\
             # scheduler programs (on every context switch) are detached (and the watch on\n\
             # library opens, once no launcher runs either); the first MPI call of a process a\n\
             # launcher started then holds it a few ms until the scheduler programs are back.\n\
             detach_idle_after_s = {:?}\n\
             # Detach the scheduler programs too (on every context switch of the node), holding the\n\
             # first MPI call of a process a launcher started until they are back (another\n\
             # process's first bursts count wall time as on-CPU time until the next statistics\n\
             # update); false, or mpi.launchers = [], keeps them attached.\n\
             scheduler_on_demand = true\n\
             # Turn the kernel's BPF run-time statistics on, for the per-program run time and run\n\
             # count metrics. Every BPF program run on the node then reads the clock twice (about\n\
             # 0.08 us per run on a VM), so they are off by default; without them those two metrics\n\
             # appear only if `sysctl kernel.bpf_stats_enabled=1` turned them on for the node.\n\
             bpf_stats = false\n\
             # Attach the MPI probes as uprobe sessions where the kernel has them (6.13 and later):\n\
             # a call nested in another probed call (a Fortran wrapper calling C, an interposer\n\
             # calling PMPI) then costs one trap instead of two. false: an entry and a return probe\n\
             # for every call.\n\
             uprobe_sessions = true\n\n",
            d.min_burst_us,
            d.drain_interval_ms,
            d.stats_interval_ms,
            d.ring_buffer_mib,
            d.detach_idle_after_s
        )
    }
}

/// The `[governor]` section: what the probes of polling functions may cost, and how they are
/// demoted when a thread polls faster than that allows.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GovernorConfig {
    /// Govern the probes of the polling functions (class "polling"). Needs uprobe sessions.
    pub enabled: bool,
    /// The share of a thread's time the probes of a polling function may cost, in percent.
    /// Above it the function is counted at its entry only (its time then stays in the burst),
    /// and above that budget again it is sampled: its probes are detached, and attached again
    /// for short windows, and only the calls in the windows are counted. The decision is
    /// node-wide, per function; the counts and times it touched are marked.
    pub budget_percent: f64,
    /// How long the probes of a sampled function stay attached in each window, in µs.
    pub sample_window_us: u64,
    /// The time from one sampling window to the next, in ms, on average at least: windows come
    /// further apart where needed to keep their cost within half the budget, each at a random
    /// point (from half to one and a half times the spacing after the last), so that no periodic
    /// code is sampled at the same phase.
    pub min_sample_period_ms: u64,
    /// Seconds in which no thread called a function counted at entry only fast enough to storm
    /// if it were probed in full, after which it is; a sampled one is probed in full again once
    /// its windows show its calls within half the budget for that long.
    pub restore_after_s: f64,
}

impl Default for GovernorConfig {
    fn default() -> Self {
        GovernorConfig {
            enabled: true,
            budget_percent: 1.0,
            sample_window_us: 2000,
            min_sample_period_ms: 1000,
            restore_after_s: 10.0,
        }
    }
}

impl GovernorConfig {
    /// Checks what the file format cannot express; the error says what to change.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if !(self.budget_percent.is_finite()
            && self.budget_percent > 0.0
            && self.budget_percent <= 100.0)
        {
            return Err(InvalidSetting::Budget(self.budget_percent));
        }
        if !(100..=1_000_000).contains(&self.sample_window_us)
            || self.sample_window_us >= self.min_sample_period_ms.saturating_mul(1000)
        {
            return Err(InvalidSetting::SampleWindow {
                window_us: self.sample_window_us,
                period_ms: self.min_sample_period_ms,
            });
        }
        if !(self.restore_after_s.is_finite() && self.restore_after_s >= 0.0) {
            return Err(InvalidSetting::RestoreAfter(self.restore_after_s));
        }
        Ok(())
    }

    /// The `[governor]` section of the default file, each field with its documentation.
    pub fn default_toml() -> String {
        let d = GovernorConfig::default();
        format!(
            "[governor]\n\
             # Govern the probes of the polling functions (MPI_Test*, MPI_Iprobe, MPI_Improbe), whose\n\
             # calls can come every few tens of nanoseconds while a probe hit costs a microsecond or\n\
             # more. Needs uprobe sessions (kernel 6.13 or later).\n\
             enabled = {}\n\
             # The share of a thread's time these probes may cost, in percent. Above it a function is\n\
             # counted at its entry only (its time stays in the burst); above it again, the function\n\
             # is sampled: only its calls in short windows are counted. Node-wide, per function; the\n\
             # counts and times it touched are marked in the metrics, recordings and reports.\n\
             budget_percent = {:?}\n\
             # A sampled function is probed for sample_window_us in each window; windows come at\n\
             # least min_sample_period_ms apart, further where needed to cost at most half the budget.\n\
             sample_window_us = {}\n\
             min_sample_period_ms = {}\n\
             # Seconds of calls within the budget after which a function is probed in full again.\n\
             restore_after_s = {:?}\n\n",
            d.enabled,
            d.budget_percent,
            d.sample_window_us,
            d.min_sample_period_ms,
            d.restore_after_s
        )
    }

    pub fn sample_window(&self) -> Duration {
        Duration::from_micros(self.sample_window_us)
    }

    pub fn min_sample_period(&self) -> Duration {
        Duration::from_millis(self.min_sample_period_ms)
    }
}

/// `mpi.library_read_timeout_ms` by default: a healthy read of a library takes milliseconds.
const DEFAULT_LIBRARY_READ_TIMEOUT_MS: u64 = 3000;
/// Its largest value: a held process waits that long at most.
const MAX_LIBRARY_READ_TIMEOUT_MS: u64 = 600_000;
/// `mpi.launchers` by default: Open MPI's (mpirun and its remote daemons, orted for 4, prte and
/// prted for 5), MPICH's Hydra (and Intel MPI's: mpiexec.hydra, hydra_pmi_proxy), MVAPICH's
/// mpirun_rsh and mpispawn, Slurm's step daemon, which starts the ranks of srun, and the names
/// Debian gives the launchers of its two MPIs.
const DEFAULT_LAUNCHERS: [&str; 17] = [
    "mpirun",
    "mpiexec",
    "mpirun.openmpi",
    "mpiexec.openmpi",
    "mpirun.mpich",
    "mpiexec.mpich",
    "mpiexec.hydra",
    "orterun",
    "orted",
    "prte",
    "prterun",
    "prted",
    "hydra_pmi_proxy",
    "mpirun_rsh",
    "mpispawn",
    "slurmstepd",
    "srun",
];
/// The most names `mpi.launchers` may list (the size of the BPF map of them).
const MAX_LAUNCHERS: usize = 256;
/// `mpi.hold_limit_s` by default: a hold the daemon handles lasts tens of ms.
const DEFAULT_HOLD_LIMIT_S: f64 = 2.0;
/// Its bounds: the hold guard looks every 100 ms, and a job must not wait for long.
const MIN_HOLD_LIMIT_S: f64 = 0.2;
const MAX_HOLD_LIMIT_S: f64 = 600.0;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MpiConfig {
    /// Extra MPI library files to probe besides those found in the ld.so cache and in the
    /// memory maps of running processes.
    pub libraries: Vec<PathBuf>,
    /// Stop (SIGSTOP) a process that opens an MPI library at a path not handled yet, until its
    /// probes are attached, then resume it (SIGCONT): no call of a library found at run time is
    /// missed. Off, such a library is found only by the scan after the process's exec, which
    /// can come after MPI_Init and the first calls.
    pub hold_new_libraries: bool,
    /// How long the daemon waits for the file system when it reads a library found at run time
    /// (one a held process opened, or one a new process maps), in ms. The read runs off the
    /// daemon's loop; past this, a held process is resumed and runs unprofiled, and the file is
    /// not read again until the stuck read returns (a hung NFS or FUSE mount).
    pub library_read_timeout_ms: u64,
    /// The longest a process stays held, in s: past it the hold guard (a process the daemon
    /// starts, which outlives it) resumes the process, probes attached or not, when the daemon
    /// is stopped, hung or slow; when the daemon dies, the guard resumes every held process at
    /// once. It also bounds the wait for a library read (`library_read_timeout_ms`).
    pub hold_limit_s: f64,
    /// The command names of the processes that start MPI ranks on a node: launchers, their
    /// remote daemons and the resource manager's step daemon. With holds at library opens, the
    /// watch on opens (a system call tracepoint: every system call on the node pays the
    /// kernel's traced path while it is attached) is attached only while one of them or an MPI
    /// process runs, and for `capture.detach_idle_after_s` after; the exec of a process a
    /// launcher started holds that process until the watch is attached. Only processes a
    /// launcher started are held at their exec or first MPI call. Empty: the watch and the
    /// scheduler programs stay attached.
    pub launchers: Vec<String>,
    /// The probed MPI functions. `count_arg` and `datatype_arg` are the zero-based positions of
    /// the (count, datatype) pair in the C binding whose product gives the call's bytes;
    /// `peer_arg` and `comm_arg` those of the peer rank (destination or source) and of its
    /// communicator.
    pub functions: Vec<FunctionSpec>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FunctionSpec {
    pub name: String,
    pub class: FunctionClass,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_arg: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datatype_arg: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_arg: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_arg: Option<u8>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum FunctionClass {
    P2p,
    Collective,
    Completion,
    /// Test/probe calls that applications spin on: counted in kernel, never a burst boundary.
    Polling,
    OneSided,
    Io,
    Lifecycle,
    /// Calls that free a datatype (MPI_Type_free). Open MPI's probes read a call's datatype size
    /// from the datatype object, and reuse the size read for the same handle until one of these
    /// is called: a new datatype can get a freed one's address.
    Datatype,
}

/// (name, class, (count argument, datatype argument)) of one default probe.
type DefaultFunction = (&'static str, FunctionClass, Option<(u8, u8)>);

const DEFAULT_FUNCTIONS: &[DefaultFunction] = {
    use FunctionClass::*;
    &[
        ("MPI_Init", Lifecycle, None),
        ("MPI_Init_thread", Lifecycle, None),
        ("MPI_Finalize", Lifecycle, None),
        ("MPI_Send", P2p, Some((1, 2))),
        ("MPI_Recv", P2p, Some((1, 2))),
        ("MPI_Isend", P2p, Some((1, 2))),
        ("MPI_Irecv", P2p, Some((1, 2))),
        ("MPI_Ssend", P2p, Some((1, 2))),
        ("MPI_Bsend", P2p, Some((1, 2))),
        ("MPI_Rsend", P2p, Some((1, 2))),
        ("MPI_Issend", P2p, Some((1, 2))),
        ("MPI_Sendrecv", P2p, Some((1, 2))),
        ("MPI_Sendrecv_replace", P2p, Some((1, 2))),
        ("MPI_Barrier", Collective, None),
        ("MPI_Bcast", Collective, Some((1, 2))),
        ("MPI_Reduce", Collective, Some((2, 3))),
        ("MPI_Allreduce", Collective, Some((2, 3))),
        ("MPI_Gather", Collective, Some((1, 2))),
        ("MPI_Gatherv", Collective, Some((1, 2))),
        ("MPI_Scatter", Collective, Some((1, 2))),
        ("MPI_Scatterv", Collective, None),
        ("MPI_Allgather", Collective, Some((1, 2))),
        ("MPI_Allgatherv", Collective, Some((1, 2))),
        ("MPI_Alltoall", Collective, Some((1, 2))),
        ("MPI_Alltoallv", Collective, None),
        ("MPI_Reduce_scatter", Collective, None),
        ("MPI_Reduce_scatter_block", Collective, Some((2, 3))),
        ("MPI_Scan", Collective, Some((2, 3))),
        ("MPI_Exscan", Collective, Some((2, 3))),
        ("MPI_Ibarrier", Collective, None),
        ("MPI_Ibcast", Collective, Some((1, 2))),
        ("MPI_Ireduce", Collective, Some((2, 3))),
        ("MPI_Iallreduce", Collective, Some((2, 3))),
        ("MPI_Igather", Collective, Some((1, 2))),
        ("MPI_Iscatter", Collective, Some((1, 2))),
        ("MPI_Iallgather", Collective, Some((1, 2))),
        ("MPI_Ialltoall", Collective, Some((1, 2))),
        ("MPI_Wait", Completion, None),
        ("MPI_Waitall", Completion, None),
        ("MPI_Waitany", Completion, None),
        ("MPI_Waitsome", Completion, None),
        ("MPI_Probe", Completion, None),
        ("MPI_Mprobe", Completion, None),
        ("MPI_Mrecv", Completion, None),
        ("MPI_Test", Polling, None),
        ("MPI_Testall", Polling, None),
        ("MPI_Testany", Polling, None),
        ("MPI_Testsome", Polling, None),
        ("MPI_Iprobe", Polling, None),
        ("MPI_Improbe", Polling, None),
        ("MPI_Win_fence", OneSided, None),
        ("MPI_Win_lock", OneSided, None),
        ("MPI_Win_unlock", OneSided, None),
        ("MPI_Win_lock_all", OneSided, None),
        ("MPI_Win_unlock_all", OneSided, None),
        ("MPI_Win_flush", OneSided, None),
        ("MPI_Win_flush_all", OneSided, None),
        ("MPI_Win_post", OneSided, None),
        ("MPI_Win_start", OneSided, None),
        ("MPI_Win_complete", OneSided, None),
        ("MPI_Win_wait", OneSided, None),
        ("MPI_Put", OneSided, Some((1, 2))),
        ("MPI_Get", OneSided, Some((1, 2))),
        ("MPI_Accumulate", OneSided, Some((1, 2))),
        ("MPI_File_open", Io, None),
        ("MPI_File_close", Io, None),
        ("MPI_File_sync", Io, None),
        ("MPI_File_read", Io, Some((2, 3))),
        ("MPI_File_write", Io, Some((2, 3))),
        ("MPI_File_read_all", Io, Some((2, 3))),
        ("MPI_File_write_all", Io, Some((2, 3))),
        ("MPI_File_read_at", Io, Some((3, 4))),
        ("MPI_File_write_at", Io, Some((3, 4))),
        ("MPI_File_read_at_all", Io, Some((3, 4))),
        ("MPI_File_write_at_all", Io, Some((3, 4))),
        ("MPI_Type_free", Datatype, None),
        // Point-to-point beyond the common ones: buffered and ready non-blocking sends, MPI-4's
        // non-blocking send-receive, and the cancellation of a pending request.
        ("MPI_Ibsend", P2p, Some((1, 2))),
        ("MPI_Irsend", P2p, Some((1, 2))),
        ("MPI_Isendrecv", P2p, Some((1, 2))),
        ("MPI_Isendrecv_replace", P2p, Some((1, 2))),
        ("MPI_Cancel", P2p, None),
        // Waits until the messages sent from the buffer are delivered.
        ("MPI_Buffer_detach", Completion, None),
        // Persistent requests: set up once, started every iteration. A start is where the
        // communication begins; the set-up calls count as the calls of their family.
        ("MPI_Send_init", P2p, None),
        ("MPI_Recv_init", P2p, None),
        ("MPI_Ssend_init", P2p, None),
        ("MPI_Bsend_init", P2p, None),
        ("MPI_Rsend_init", P2p, None),
        ("MPI_Start", P2p, None),
        ("MPI_Startall", P2p, None),
        // MPI-4 partitioned communication; MPI_Parrived is tested in a loop like MPI_Test.
        ("MPI_Psend_init", P2p, None),
        ("MPI_Precv_init", P2p, None),
        ("MPI_Pready", P2p, None),
        ("MPI_Pready_range", P2p, None),
        ("MPI_Pready_list", P2p, None),
        ("MPI_Parrived", Polling, None),
        ("MPI_Request_get_status", Polling, None),
        // Communicator and topology constructors: collective, so a rank waits in them for the
        // slowest of its communicator.
        ("MPI_Comm_split", Collective, None),
        ("MPI_Comm_split_type", Collective, None),
        ("MPI_Comm_dup", Collective, None),
        ("MPI_Comm_dup_with_info", Collective, None),
        ("MPI_Comm_idup", Collective, None),
        ("MPI_Comm_idup_with_info", Collective, None),
        ("MPI_Comm_create", Collective, None),
        ("MPI_Comm_create_group", Collective, None),
        ("MPI_Comm_create_from_group", Collective, None),
        ("MPI_Comm_free", Collective, None),
        ("MPI_Cart_create", Collective, None),
        ("MPI_Cart_sub", Collective, None),
        ("MPI_Graph_create", Collective, None),
        ("MPI_Dist_graph_create", Collective, None),
        ("MPI_Dist_graph_create_adjacent", Collective, None),
        ("MPI_Intercomm_create", Collective, None),
        ("MPI_Intercomm_create_from_groups", Collective, None),
        ("MPI_Intercomm_merge", Collective, None),
        // Collectives beyond the common ones, blocking and non-blocking.
        ("MPI_Alltoallw", Collective, None),
        ("MPI_Neighbor_allgather", Collective, Some((1, 2))),
        ("MPI_Neighbor_allgatherv", Collective, Some((1, 2))),
        ("MPI_Neighbor_alltoall", Collective, Some((1, 2))),
        ("MPI_Neighbor_alltoallv", Collective, None),
        ("MPI_Neighbor_alltoallw", Collective, None),
        ("MPI_Igatherv", Collective, Some((1, 2))),
        ("MPI_Iscatterv", Collective, None),
        ("MPI_Iallgatherv", Collective, Some((1, 2))),
        ("MPI_Ialltoallv", Collective, None),
        ("MPI_Ialltoallw", Collective, None),
        ("MPI_Ireduce_scatter", Collective, None),
        ("MPI_Ireduce_scatter_block", Collective, Some((2, 3))),
        ("MPI_Iscan", Collective, Some((2, 3))),
        ("MPI_Iexscan", Collective, Some((2, 3))),
        ("MPI_Ineighbor_allgather", Collective, Some((1, 2))),
        ("MPI_Ineighbor_allgatherv", Collective, Some((1, 2))),
        ("MPI_Ineighbor_alltoall", Collective, Some((1, 2))),
        ("MPI_Ineighbor_alltoallv", Collective, None),
        ("MPI_Ineighbor_alltoallw", Collective, None),
        // MPI-4 persistent collectives.
        ("MPI_Barrier_init", Collective, None),
        ("MPI_Bcast_init", Collective, None),
        ("MPI_Reduce_init", Collective, None),
        ("MPI_Allreduce_init", Collective, None),
        ("MPI_Gather_init", Collective, None),
        ("MPI_Gatherv_init", Collective, None),
        ("MPI_Scatter_init", Collective, None),
        ("MPI_Scatterv_init", Collective, None),
        ("MPI_Allgather_init", Collective, None),
        ("MPI_Allgatherv_init", Collective, None),
        ("MPI_Alltoall_init", Collective, None),
        ("MPI_Alltoallv_init", Collective, None),
        ("MPI_Alltoallw_init", Collective, None),
        ("MPI_Reduce_scatter_init", Collective, None),
        ("MPI_Reduce_scatter_block_init", Collective, None),
        ("MPI_Scan_init", Collective, None),
        ("MPI_Exscan_init", Collective, None),
        ("MPI_Neighbor_allgather_init", Collective, None),
        ("MPI_Neighbor_allgatherv_init", Collective, None),
        ("MPI_Neighbor_alltoall_init", Collective, None),
        ("MPI_Neighbor_alltoallv_init", Collective, None),
        ("MPI_Neighbor_alltoallw_init", Collective, None),
        // One-sided: windows are created and freed collectively; request-based and atomic
        // operations; MPI_Win_test is polled like MPI_Test.
        ("MPI_Win_create", OneSided, None),
        ("MPI_Win_allocate", OneSided, None),
        ("MPI_Win_allocate_shared", OneSided, None),
        ("MPI_Win_create_dynamic", OneSided, None),
        ("MPI_Win_free", OneSided, None),
        ("MPI_Win_test", Polling, None),
        ("MPI_Win_flush_local", OneSided, None),
        ("MPI_Win_flush_local_all", OneSided, None),
        ("MPI_Win_sync", OneSided, None),
        ("MPI_Rput", OneSided, Some((1, 2))),
        ("MPI_Rget", OneSided, Some((1, 2))),
        ("MPI_Raccumulate", OneSided, Some((1, 2))),
        ("MPI_Get_accumulate", OneSided, Some((1, 2))),
        ("MPI_Rget_accumulate", OneSided, Some((1, 2))),
        ("MPI_Fetch_and_op", OneSided, None),
        ("MPI_Compare_and_swap", OneSided, None),
        // MPI-IO: non-blocking, shared and ordered file pointers, split collectives, and the
        // collective calls that change a file's view, size or atomicity.
        ("MPI_File_iread", Io, Some((2, 3))),
        ("MPI_File_iwrite", Io, Some((2, 3))),
        ("MPI_File_iread_at", Io, Some((3, 4))),
        ("MPI_File_iwrite_at", Io, Some((3, 4))),
        ("MPI_File_iread_all", Io, Some((2, 3))),
        ("MPI_File_iwrite_all", Io, Some((2, 3))),
        ("MPI_File_iread_at_all", Io, Some((3, 4))),
        ("MPI_File_iwrite_at_all", Io, Some((3, 4))),
        ("MPI_File_read_shared", Io, Some((2, 3))),
        ("MPI_File_write_shared", Io, Some((2, 3))),
        ("MPI_File_iread_shared", Io, Some((2, 3))),
        ("MPI_File_iwrite_shared", Io, Some((2, 3))),
        ("MPI_File_read_ordered", Io, Some((2, 3))),
        ("MPI_File_write_ordered", Io, Some((2, 3))),
        ("MPI_File_read_all_begin", Io, Some((2, 3))),
        ("MPI_File_read_all_end", Io, None),
        ("MPI_File_write_all_begin", Io, Some((2, 3))),
        ("MPI_File_write_all_end", Io, None),
        ("MPI_File_read_at_all_begin", Io, Some((3, 4))),
        ("MPI_File_read_at_all_end", Io, None),
        ("MPI_File_write_at_all_begin", Io, Some((3, 4))),
        ("MPI_File_write_at_all_end", Io, None),
        ("MPI_File_read_ordered_begin", Io, Some((2, 3))),
        ("MPI_File_read_ordered_end", Io, None),
        ("MPI_File_write_ordered_begin", Io, Some((2, 3))),
        ("MPI_File_write_ordered_end", Io, None),
        ("MPI_File_set_view", Io, None),
        ("MPI_File_set_size", Io, None),
        ("MPI_File_preallocate", Io, None),
        ("MPI_File_set_atomicity", Io, None),
        ("MPI_File_seek_shared", Io, None),
        ("MPI_File_delete", Io, None),
        // Dynamic processes: a rank waits in them for its peers and for the processes started.
        ("MPI_Comm_spawn", Lifecycle, None),
        ("MPI_Comm_spawn_multiple", Lifecycle, None),
        ("MPI_Comm_connect", Lifecycle, None),
        ("MPI_Comm_accept", Lifecycle, None),
        ("MPI_Comm_disconnect", Lifecycle, None),
        ("MPI_Comm_join", Lifecycle, None),
        ("MPI_Abort", Lifecycle, None),
        // MPI-4 sessions.
        ("MPI_Session_init", Lifecycle, None),
        ("MPI_Session_finalize", Lifecycle, None),
    ]
};

/// (name, peer argument, communicator argument) of the default functions with a peer rank.
const PEER_ARGUMENTS: &[(&str, u8, u8)] = &[
    ("MPI_Send", 3, 5),
    ("MPI_Recv", 3, 5),
    ("MPI_Isend", 3, 5),
    ("MPI_Irecv", 3, 5),
    ("MPI_Ssend", 3, 5),
    ("MPI_Bsend", 3, 5),
    ("MPI_Rsend", 3, 5),
    ("MPI_Issend", 3, 5),
    // The destination; the source is argument 8.
    ("MPI_Sendrecv", 3, 10),
    ("MPI_Sendrecv_replace", 3, 7),
    ("MPI_Probe", 0, 2),
    ("MPI_Mprobe", 0, 2),
    ("MPI_Iprobe", 0, 2),
    ("MPI_Improbe", 0, 2),
    ("MPI_Ibsend", 3, 5),
    ("MPI_Irsend", 3, 5),
    ("MPI_Isendrecv", 3, 10),
    ("MPI_Isendrecv_replace", 3, 7),
];

impl Default for MpiConfig {
    fn default() -> Self {
        let functions = DEFAULT_FUNCTIONS
            .iter()
            .map(|&(name, class, bytes)| {
                let peer = PEER_ARGUMENTS.iter().find(|p| p.0 == name);
                FunctionSpec {
                    name: name.to_string(),
                    class,
                    count_arg: bytes.map(|b| b.0),
                    datatype_arg: bytes.map(|b| b.1),
                    peer_arg: peer.map(|p| p.1),
                    comm_arg: peer.map(|p| p.2),
                }
            })
            .collect();
        MpiConfig {
            libraries: Vec::new(),
            hold_new_libraries: true,
            library_read_timeout_ms: DEFAULT_LIBRARY_READ_TIMEOUT_MS,
            hold_limit_s: DEFAULT_HOLD_LIMIT_S,
            launchers: DEFAULT_LAUNCHERS.map(String::from).to_vec(),
            functions,
        }
    }
}

impl MpiConfig {
    /// The names of the probed functions, in the order of `functions` (a function's id is its
    /// position).
    pub fn function_names(&self) -> Vec<String> {
        self.functions.iter().map(|f| f.name.clone()).collect()
    }

    /// `library_read_timeout_ms` as a duration.
    pub fn library_read_timeout(&self) -> Duration {
        Duration::from_millis(self.library_read_timeout_ms)
    }

    /// `hold_limit_s` as a duration.
    pub fn hold_limit(&self) -> Duration {
        Duration::from_secs_f64(self.hold_limit_s)
    }

    /// Checks what the file format cannot express; the error says what to change.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if !(1..=MAX_LIBRARY_READ_TIMEOUT_MS).contains(&self.library_read_timeout_ms) {
            return Err(InvalidSetting::LibraryReadTimeout(
                self.library_read_timeout_ms,
            ));
        }
        if self.launchers.len() > MAX_LAUNCHERS {
            return Err(InvalidSetting::TooManyLaunchers(self.launchers.len()));
        }
        if let Some(bad) = self
            .launchers
            .iter()
            .find(|name| name.is_empty() || name.len() > 15 || name.contains('/'))
        {
            return Err(InvalidSetting::LauncherName(bad.clone()));
        }
        if !(MIN_HOLD_LIMIT_S..=MAX_HOLD_LIMIT_S).contains(&self.hold_limit_s) {
            return Err(InvalidSetting::HoldLimit(self.hold_limit_s));
        }
        let mut seen = std::collections::BTreeSet::new();
        if self.functions.len() > u16::MAX as usize {
            return Err(InvalidSetting::TooManyFunctions);
        }
        for f in &self.functions {
            if !f.name.starts_with("MPI_") {
                return Err(InvalidSetting::NotCName(f.name.clone()));
            }
            if !seen.insert(f.name.as_str()) {
                return Err(InvalidSetting::Twice(f.name.clone()));
            }
            match (f.count_arg, f.datatype_arg) {
                (None, None) => {}
                (Some(c), Some(d)) if c < 6 && d < 6 => {}
                _ => return Err(InvalidSetting::ByteArguments(f.name.clone())),
            }
            match (f.peer_arg, f.comm_arg) {
                (None, None) => {}
                (Some(p), Some(c)) if p < 6 && c < 15 => {}
                _ => return Err(InvalidSetting::PeerArguments(f.name.clone())),
            }
        }
        Ok(())
    }

    /// The `[mpi]` section of the default file, every default function written out.
    pub fn default_toml() -> String {
        let mut out = format!(
            "[mpi]\n\
             # Extra MPI library files to probe (the ld.so cache and running processes are searched).\n\
             libraries = []\n\
             # Stop a process that opens an MPI library at a path not seen before until the library's\n\
             # probes are attached (a few tens of ms, once per path), so that no call is missed;\n\
             # false: such a library is found by the scan after exec, which can miss MPI_Init.\n\
             hold_new_libraries = true\n\
             # How long to wait for the file system when reading a library found at run time, in\n\
             # ms. Past this (a hung NFS or FUSE mount) the held process is resumed and runs\n\
             # unprofiled, the daemon logs a warning naming the pid and the file, and the file is\n\
             # not read again until the stuck read returns.\n\
             library_read_timeout_ms = {}\n\
             # The longest a process stays held, in s. A separate process, the hold guard, resumes\n\
             # a process held longer (the daemon is stopped, hung or slow: it runs on, perhaps\n\
             # unprofiled), and every held process at once when the daemon dies.\n\
             hold_limit_s = {:?}\n\
             # The command names of the processes that start MPI ranks (launchers, their remote\n\
             # daemons, the resource manager's step daemon). With hold_new_libraries, the watch on\n\
             # library opens, which makes every system call on the node take the kernel's traced\n\
             # path, is attached only while one of them or an MPI process runs (and for\n\
             # capture.detach_idle_after_s after); the exec of a process a launcher started holds\n\
             # that process until the watch is attached. An MPI program started without any of them\n\
             # (a singleton) has a library at a new path found by the scan after its exec. Only\n\
             # processes a launcher started are held at their exec or first MPI call. Empty: the\n\
             # watch and the scheduler programs stay attached.\n\
             launchers = {:?}\n\
             # Probed functions. count_arg/datatype_arg: zero-based positions of the (count, datatype)\n\
             # pair in the C binding; their product is the call's bytes. peer_arg/comm_arg: those of\n\
             # the peer rank and its communicator (peers in MPI_COMM_WORLD are summed per call site).\n\
             # Class \"polling\" functions are counted in kernel and never end a burst. Class\n\
             # \"datatype\" (MPI_Type_free) lets Open MPI's probes reuse a datatype's size until\n\
             # the next free instead of reading it at every call.\n\
             functions = [\n",
            DEFAULT_LIBRARY_READ_TIMEOUT_MS, DEFAULT_HOLD_LIMIT_S, DEFAULT_LAUNCHERS
        );
        for f in &MpiConfig::default().functions {
            let class = toml::Value::try_from(f.class).expect("a function class is a TOML string");
            let bytes = match (f.count_arg, f.datatype_arg) {
                (Some(c), Some(t)) => format!(", count_arg = {c}, datatype_arg = {t}"),
                _ => String::new(),
            };
            let peer = match (f.peer_arg, f.comm_arg) {
                (Some(p), Some(c)) => format!(", peer_arg = {p}, comm_arg = {c}"),
                _ => String::new(),
            };
            let _ = writeln!(
                out,
                "  {{ name = \"{}\", class = {class}{bytes}{peer} }},",
                f.name
            );
        }
        out.push_str("]\n\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hold_limit_must_leave_the_guard_time_to_look_and_the_job_little_to_wait() {
        let with_limit = |hold_limit_s| MpiConfig {
            hold_limit_s,
            ..MpiConfig::default()
        };
        assert_eq!(MpiConfig::default().hold_limit(), Duration::from_secs(2));
        assert_eq!(with_limit(0.5).validate(), Ok(()));
        for invalid in [0.0, 0.1, 601.0, f64::NAN] {
            let error = with_limit(invalid).validate().unwrap_err();
            assert!(error.to_string().contains("mpi.hold_limit_s"), "{error}");
        }
        let default: toml::Value = toml::from_str(&MpiConfig::default_toml()).unwrap();
        assert_eq!(default["mpi"]["hold_limit_s"].as_float(), Some(2.0));
    }
}
