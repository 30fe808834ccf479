//! Capture stage: loads the BPF programs, attaches them to MPI library files, and drains what
//! the kernel collected (burst records, exec notifications, per-thread totals, loss counters).
//! Its configuration sections, `[capture]` and `[mpi]`, are defined in [`config`].

pub mod config;
mod counters;
mod file_io;
mod governed;
pub mod governor;
pub mod hold_guard;
mod kernel_btf;
mod libraries;
mod mapping;
mod multi;
pub mod node_usage;
mod on_demand;
mod placement;
mod probe_cost;
mod ring;
mod scheduler;
mod threads;
mod tracefs;
pub mod usage;

use std::{
    collections::{BTreeMap, HashSet},
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::TracePoint,
    Ebpf, EbpfLoader,
};
use counters::Counters;
pub use counters::{online_cpus, CounterEvent, CounterSetup, CountersOff};
use file_io::{FileIoTracepoints, IO_TRACEPOINTS};
use governed::GovernedLinks;
pub use governed::GovernorHandle;
pub use libraries::{HeldProcess, HoldEvent, LibraryOpenEvent, LibraryOpenStats, UnlistedParent};
pub(crate) use placement::probe_offset;
pub use probe_cost::{ProbeCost, ProbeCostError, TimedRuns};
use profiler_common::{
    lost, BurstRecord, BurstTotals, ExecRecord, FuncKey, FuncStats, HoldReport, IoTotals,
    RankRegion, StormEvent, TaskThread, ThreadLife, ThreadState, NO_FUNC,
};
pub use scheduler::SchedulerFloor;

use config::CaptureConfig;
use kernel_btf::SchedOffsets;
use multi::ProbeKind;
use ring::RecordRing;
use scheduler::{SchedulerPrograms, SCHED_RAW_TRACEPOINTS};

use crate::model::ProbePoint;

/// The BPF object profiler/build.rs built; empty when the build skipped it (AYA_BUILD_SKIP).
static BPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));

#[derive(Debug, thiserror::Error)]
pub enum CaptureError {
    #[error(
        "cannot load the BPF programs: {0}; mpiburst needs root (CAP_BPF, CAP_PERFMON) and a \
         kernel with BTF and uprobes"
    )]
    Load(#[from] aya::EbpfError),
    #[error(
        "this mpiburst binary carries no BPF programs: it was built with AYA_BUILD_SKIP set; \
         build it with `cargo xtask build`"
    )]
    NoBpfObject,
    #[error("no process can be held: the hold guard was not started")]
    NotHolding,
    #[error(
        "mpi.launchers is empty, or the launchers could not be noted: only processes a launcher \
         started are held (a program started from an interactive shell must not be stopped)"
    )]
    NoLaunchers,
    #[error("BPF program {program}: {source}")]
    Program {
        program: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("BPF map {map}: {source}")]
    Map {
        map: &'static str,
        source: aya::maps::MapError,
    },
    #[error("BPF map {0} is missing from the object; rebuild with `cargo xtask build`")]
    MissingMap(&'static str),
    #[error("cannot attach {program} to {function} of {path}: {source}")]
    Attach {
        function: String,
        path: PathBuf,
        program: &'static str,
        source: std::io::Error,
    },
    #[error("cannot open the {event} counter on CPU {cpu}: {source}; use `capture.counters = \"auto\"` or \"off\" where the PMU lacks it")]
    PerfEvent {
        event: &'static str,
        cpu: u32,
        source: std::io::Error,
    },
    #[error("cannot put a perf counter into BPF map {map}: {source}")]
    CounterMap {
        map: &'static str,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Tracefs(#[from] tracefs::TracefsError),
    #[error(transparent)]
    HoldGuard(#[from] hold_guard::HoldGuardError),
    #[error(transparent)]
    KernelBtf(#[from] kernel_btf::KernelBtfError),
    #[error("tracepoint {event}: {detail}")]
    TracepointFormat { event: String, detail: String },
}

/// One place to attach: a function's entry in a library file, with the cookie that tells the
/// BPF programs which function it is and how to count its bytes.
#[derive(Clone, Debug)]
pub struct AttachPoint {
    pub function: String,
    pub file_offset: u64,
    pub cookie: u64,
}

impl AttachPoint {
    /// Where the floor's empty programs go for a probe point: the place the daemon's probes
    /// take (`ProbePoint::probe_offset`), with no cookie.
    pub fn floor(point: &ProbePoint) -> AttachPoint {
        AttachPoint {
            function: point.function.clone(),
            file_offset: point.probe_offset,
            cookie: 0,
        }
    }
}

/// Per-thread values read from the kernel maps, summed by the caller per process.
#[derive(Debug, Default)]
pub struct KernelTotals {
    /// (tid, function id, call site) → stats; each value names its pid.
    pub functions: Vec<(FuncKey, FuncStats)>,
    /// Life of a thread → its burst totals; each value names its pid.
    pub bursts: Vec<(ThreadLife, BurstTotals)>,
    /// pid → region of interest boundaries seen so far.
    pub regions: BTreeMap<u32, RankRegion>,
    /// Outermost MPI calls in progress at the read, one per thread inside one.
    pub open_calls: Vec<OpenCall>,
    /// CLOCK_MONOTONIC ns just before the maps were read.
    pub read_ns: u64,
}

/// An outermost MPI call a thread is inside of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenCall {
    pub pid: u32,
    pub func: u32,
    /// CLOCK_MONOTONIC ns at its entry.
    pub entry_ns: u64,
}

/// Losses the kernel side counted (all are exported; none is silent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Lost {
    pub bursts: u64,
    pub execs: u64,
    pub thread_states: u64,
    pub thread_stats: u64,
    /// Per-CPU counters that were off the PMU for part of their enabled time (another user of
    /// the PMU took their slot), so the bursts on their CPUs undercount.
    #[serde(default)]
    pub counters_descheduled: u64,
}

/// Cumulative run time and run count of one BPF program (kernel BPF stats).
#[derive(Clone, Debug)]
pub struct ProgramStats {
    pub name: &'static str,
    /// Run time and run count: `None` while the kernel's BPF statistics are off
    /// (`capture.bpf_stats`), when the kernel does not count them.
    pub run_time: Option<Duration>,
    pub run_count: Option<u64>,
    /// Runs the kernel skipped because another tracing program was active on the CPU.
    pub missed: u64,
}

/// Probe programs attached through uprobe_multi links: the real pair (where the kernel has no
/// uprobe sessions), then the empty pair that only the overhead benchmark uses.
const UPROBE_PROGRAMS: [(&str, ProbeKind); 4] = [
    ("mpi_enter", ProbeKind::Entry),
    ("mpi_exit", ProbeKind::Return),
    ("floor_enter", ProbeKind::Entry),
    ("floor_exit", ProbeKind::Return),
];
/// The probe program of a uprobe session: entry and return of every MPI call in one program,
/// the return only for the outermost call in progress (kernel ≥ 6.13).
const SESSION_PROGRAM: &str = "mpi_session";

/// A uprobe program to attach: one of UPROBE_PROGRAMS by index, or the session program.
#[derive(Clone, Copy)]
enum Probe {
    Listed(usize),
    Session,
}

/// Where each classic tracepoint program attaches: (program, category, events).
const TRACEPOINTS: [(&str, &str, &[&str]); 3] = [
    ("sched_process_exec", "sched", &["sched_process_exec"]),
    ("sched_process_fork", "sched", &["sched_process_fork"]),
    ("sched_process_exit", "sched", &["sched_process_exit"]),
];

pub struct Capture {
    ebpf: Ebpf,
    bursts: RecordRing,
    execs: RingBuf<MapData>,
    /// The processes held for the daemon (at the open of a new MPI library, at a thread's first
    /// call while the scheduler programs are detached, at the exec of a process a launcher
    /// started while the library watch is), once it holds any.
    holding: Option<libraries::Holding>,
    /// Why library opens cannot be watched on this kernel, if they cannot.
    library_watch_unavailable: Option<CaptureError>,
    /// `library_open_exit`, once library opens are watched.
    library_watch: Option<libraries::LibraryWatch>,
    /// The command names of the launchers of MPI ranks (`mpi.launchers`), once noted.
    launchers: HashSet<String>,
    /// Library files already attached, by (device, inode): a file is attached once however many
    /// paths or processes lead to it.
    attached: HashSet<(u64, u64)>,
    probes: usize,
    /// The uprobe programs, loaded for uprobe_multi links, in UPROBE_PROGRAMS order.
    uprobe_programs: Vec<OwnedFd>,
    /// SESSION_PROGRAM, attached instead of the real pair, unless the kernel has no uprobe
    /// sessions or `capture.uprobe_sessions` is off.
    session_program: Option<OwnedFd>,
    /// One link per (library, program); closing it detaches all its probes.
    links: Vec<OwnedFd>,
    /// The links of the polling functions, one per (library, function), once the governor runs.
    governed: Option<Arc<Mutex<GovernedLinks>>>,
    /// Names of the counter events when counters are on, or why they are off.
    pub counters: Result<[CounterEvent; 2], CountersOff>,
    /// The per-CPU counters in the BPF arrays; they count while open.
    open_counters: Option<Counters>,
    /// The kernel's BPF run-time statistics are on while this is open (`capture.bpf_stats`).
    stats_fd: Option<OwnedFd>,
    /// The processes tracked (identified as MPI processes), until forgotten.
    tracked: HashSet<u32>,
    /// The file I/O programs (`capture.file_io`), attached while a process is tracked.
    file_io: Option<FileIoTracepoints>,
    /// The scheduler programs, attached while the node has an MPI thread once processes can be
    /// held.
    scheduler: SchedulerPrograms,
    /// How long the node must have had no MPI process before the programs attached on demand
    /// are detached (`capture.detach_idle_after_s`).
    detach_idle_after: Duration,
    /// Reads the records the BPF programs log with aya-log (rare events, such as the first loss
    /// of a kind on a CPU) and hands them to the `log` facade, which the daemon's tracing
    /// subscriber receives.
    bpf_log: Box<dyn FnMut() + Send>,
}

/// Loads the BPF object with its load-time settings: the duration filter, the ring's size and
/// wake-up threshold, the counters, the tracepoints' and the scheduler's field offsets on this
/// kernel.
fn load_object(
    config: &CaptureConfig,
    setup: &CounterSetup,
    cpus: &[u32],
    ring_bytes: u32,
    openat_ret_offset: &Result<u64, CaptureError>,
) -> Result<Ebpf, CaptureError> {
    let exec_pid_offset = tracefs::field_offset("sched", "sched_process_exec", "pid")?;
    let exit_group_dead_offset =
        tracefs::field_offset("sched", "sched_process_exit", "group_dead")?;
    let fork_child_pid_offset = tracefs::field_offset("sched", "sched_process_fork", "child_pid")?;
    let (io_fd_offset, io_ret_offset) = if config.file_io {
        file_io::field_offsets()?
    } else {
        (0, 0)
    };
    let sched = SchedOffsets::of_running_kernel()?;
    let (task_cfs_rq_offset, cfs_rq_rq_offset) = sched.rq_path.unwrap_or_else(|| {
        tracing::warn!(
            "this kernel has no group scheduling (CONFIG_FAIR_GROUP_SCHED), so the scheduler \
             program cannot reach a CPU's run queue: within a time slice, the on-CPU time of a \
             burst includes what a hypervisor stole from the virtual CPU"
        );
        (0, 0)
    });
    let min_burst_ns = config.min_burst_ns();
    let counters_enabled: u32 = matches!(setup, CounterSetup::Enabled(_)).into();
    let max_cpu = cpus.iter().copied().max().unwrap_or(0) + 1;
    Ok(EbpfLoader::new()
        .override_global("MIN_BURST_NS", &min_burst_ns, true)
        .override_global("RING_WAKE_BYTES", &(u64::from(ring_bytes) / 4), true)
        .override_global("COUNTERS_ENABLED", &counters_enabled, true)
        .override_global("EXEC_PID_OFFSET", &exec_pid_offset, true)
        .override_global("EXIT_GROUP_DEAD_OFFSET", &exit_group_dead_offset, true)
        .override_global("FORK_CHILD_PID_OFFSET", &fork_child_pid_offset, true)
        .override_global("IO_FD_OFFSET", &io_fd_offset, true)
        .override_global("IO_RET_OFFSET", &io_ret_offset, true)
        .override_global("DAEMON_PID", &std::process::id(), true)
        .override_global("TASK_RUNTIME_OFFSET", &sched.task_runtime, true)
        .override_global("TASK_CFS_RQ_OFFSET", &task_cfs_rq_offset, true)
        .override_global("CFS_RQ_RQ_OFFSET", &cfs_rq_rq_offset, true)
        .override_global("RQ_CLOCK_OFFSET", &sched.rq_clock, true)
        .override_global("RQ_CLOCK_TASK_OFFSET", &sched.rq_clock_task, true)
        .override_global(
            "OPENAT_RET_OFFSET",
            openat_ret_offset.as_ref().unwrap_or(&0),
            true,
        )
        .map_max_entries("BURSTS", ring_bytes)
        .map_max_entries("COUNTER_INSTRUCTIONS", max_cpu)
        .map_max_entries("COUNTER_CYCLES", max_cpu)
        .load(BPF_OBJECT)?)
}

/// Turns the kernel's BPF run-time statistics on while the returned fd is open; `None`, with a
/// warning, where they are unavailable.
fn enable_bpf_stats() -> Option<OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .map_err(|e| {
            tracing::warn!(
                "BPF run-time statistics unavailable ({e}): the run-time metrics are not \
                 exported; `sysctl kernel.bpf_stats_enabled=1` turns them on for the node"
            )
        })
        .ok()
}

/// Puts each CPU's counters into the perf-event arrays the programs read.
fn fill_counter_arrays(
    ebpf: &mut Ebpf,
    counters: &Counters,
    cpus: &[u32],
) -> Result<(), CaptureError> {
    for (slot, map) in ["COUNTER_INSTRUCTIONS", "COUNTER_CYCLES"]
        .into_iter()
        .enumerate()
    {
        let Some(aya::maps::Map::PerfEventArray(data)) = ebpf.map(map) else {
            return Err(CaptureError::MissingMap(map));
        };
        for (counter, &cpu) in counters.counters[slot].iter().zip(cpus) {
            counters::set_perf_array_fd(data.fd().as_fd(), cpu, counter)
                .map_err(|source| CaptureError::CounterMap { map, source })?;
        }
    }
    Ok(())
}

/// The uprobe session program, where the kernel has uprobe sessions; else, with a warning, none.
fn load_session_program(ebpf: &Ebpf) -> Option<OwnedFd> {
    match multi::load_programs(BPF_OBJECT, ebpf, &[(SESSION_PROGRAM, ProbeKind::Session)]) {
        Ok(mut fds) => fds.pop(),
        Err(e) => {
            tracing::warn!(
                "uprobe sessions unavailable ({e}): every probed call, nested ones included, \
                 runs an entry and a return probe"
            );
            None
        }
    }
}

/// Loads and attaches the tracepoint programs that are always on: exec and exit.
fn attach_tracepoints(ebpf: &mut Ebpf) -> Result<(), CaptureError> {
    for (name, category, events) in TRACEPOINTS {
        let program: &mut TracePoint = program_mut(ebpf, name)?;
        let failed = |source| CaptureError::Program {
            program: name,
            source,
        };
        program.load().map_err(failed)?;
        for event in events {
            program.attach(category, event).map_err(failed)?;
        }
    }
    Ok(())
}

impl Capture {
    /// Loads the programs and attaches the scheduler tracepoints. MPI libraries are attached
    /// afterwards with [`Capture::attach_library`].
    pub fn load(config: &CaptureConfig) -> Result<Self, CaptureError> {
        if BPF_OBJECT.is_empty() {
            return Err(CaptureError::NoBpfObject);
        }
        tracefs::ensure_mounted()?;
        // Without this tracepoint no process is held at its open of a library; the daemon says so
        // when it starts watching, and runs on.
        let openat_ret_offset = libraries::openat_ret_offset();
        let cpus = online_cpus()?;
        let setup = counters::open(config.counters, &cpus)?;
        let ring_bytes = (config.ring_buffer_mib.next_power_of_two()) << 20;
        let mut ebpf = load_object(config, &setup, &cpus, ring_bytes, &openat_ret_offset)?;
        // Kernel BPF statistics (run time per program) are on while this fd is open.
        let stats_fd = config.bpf_stats.then(enable_bpf_stats).flatten();
        let (counter_events, open_counters) = match setup {
            CounterSetup::Enabled(c) => {
                fill_counter_arrays(&mut ebpf, &c, &cpus)?;
                (Ok(c.events), Some(c))
            }
            CounterSetup::Disabled(reason) => (Err(reason), None),
        };
        let uprobe_programs = multi::load_programs(BPF_OBJECT, &ebpf, &UPROBE_PROGRAMS)?;
        let session_program = if config.uprobe_sessions {
            load_session_program(&ebpf)
        } else {
            None
        };
        attach_tracepoints(&mut ebpf)?;
        let scheduler = scheduler::load(&mut ebpf)?;
        let file_io = config
            .file_io
            .then(|| FileIoTracepoints::load(&mut ebpf))
            .transpose()?;
        let bursts = take_map::<RingBuf<MapData>>(&mut ebpf, "BURSTS")?
            .as_fd()
            .try_clone_to_owned()
            .and_then(|fd| RecordRing::new(fd, ring_bytes as usize))
            .map_err(|source| CaptureError::Io {
                what: "mapping the burst ring buffer".into(),
                source,
            })?;
        let execs = take_map(&mut ebpf, "EXECS")?;
        // After the uprobe programs were relocated against the maps: this takes AYA_LOGS out.
        let mut logger = aya_log::EbpfLogger::init(&mut ebpf).map_err(|e| CaptureError::Io {
            what: "reading the BPF programs' log (aya-log)".into(),
            source: std::io::Error::other(e),
        })?;
        Ok(Capture {
            ebpf,
            bursts,
            execs,
            holding: None,
            library_watch_unavailable: openat_ret_offset.err(),
            library_watch: None,
            launchers: HashSet::new(),
            attached: HashSet::new(),
            probes: 0,
            uprobe_programs,
            session_program,
            links: Vec::new(),
            governed: None,
            counters: counter_events,
            open_counters,
            stats_fd,
            tracked: HashSet::new(),
            file_io,
            scheduler,
            detach_idle_after: config.detach_idle_after(),
            bpf_log: Box::new(move || logger.flush()),
        })
    }

    pub fn is_attached(&self, dev_inode: (u64, u64)) -> bool {
        self.attached.contains(&dev_inode)
    }

    /// Number of uprobe + uretprobe pairs attached so far.
    pub fn probes(&self) -> usize {
        self.probes
    }

    /// Attaches the probes at every point of one library file, for all processes (present and
    /// future) that map it: the session program, or else the entry and return pair. A file
    /// already attached is skipped.
    pub fn attach_library(
        &mut self,
        path: &Path,
        dev_inode: (u64, u64),
        points: &[AttachPoint],
    ) -> Result<usize, CaptureError> {
        if !self.attached.insert(dev_inode) {
            return Ok(0);
        }
        if let (Some(links), Some(program)) = (&self.governed, &self.session_program) {
            // Each polling function in a link of its own, which the governor can detach.
            let mut by_func: BTreeMap<u32, (Vec<u64>, Vec<u64>)> = BTreeMap::new();
            let mut rest = Vec::new();
            for p in points {
                match governed::governed(p.cookie) {
                    Some(func) => {
                        let (offsets, cookies) = by_func.entry(func).or_default();
                        offsets.push(p.file_offset);
                        cookies.push(p.cookie);
                    }
                    None => rest.push(p.clone()),
                }
            }
            let mut links = links.lock().unwrap_or_else(|e| e.into_inner());
            for (func, (offsets, cookies)) in by_func {
                let n = offsets.len();
                links
                    .add(program.as_fd(), path, func, offsets, cookies)
                    .map_err(|source| CaptureError::Attach {
                        function: format!("{n} entry points of function {func}"),
                        path: path.to_path_buf(),
                        program: SESSION_PROGRAM,
                        source,
                    })?;
                self.probes += n;
            }
            drop(links);
            Ok(points.len() - rest.len() + self.attach_programs(&[Probe::Session], path, &rest)?)
        } else if self.session_program.is_some() {
            self.attach_programs(&[Probe::Session], path, points)
        } else {
            // Return probes first: an entry probe without its return probe would leave the
            // thread's depth counter raised and hide all its later calls.
            self.attach_programs(&[Probe::Listed(1), Probe::Listed(0)], path, points)
        }
    }

    /// Starts the kernel's side of the probe governor: from now on each polling function of a
    /// library attached gets a link of its own. Needs uprobe sessions, where an entry decides
    /// whether the return is probed; call it before attaching any library.
    pub fn start_governor(&mut self) -> Result<GovernorHandle, CaptureError> {
        let program = self
            .session_program
            .as_ref()
            .ok_or_else(|| CaptureError::Io {
                what: "starting the probe governor".into(),
                source: std::io::Error::other(
                    "it needs uprobe sessions (kernel 6.13 or later, capture.uprobe_sessions = true)",
                ),
            })?
            .try_clone()
            .map_err(|source| CaptureError::Io {
                what: "a descriptor of the session program".into(),
                source,
            })?;
        let governance = take_map(&mut self.ebpf, "GOVERNANCE")?;
        let samples = take_map(&mut self.ebpf, "SAMPLES")?;
        let storms = take_map(&mut self.ebpf, "STORMS")?;
        let links = Arc::new(Mutex::new(GovernedLinks::default()));
        self.governed = Some(links.clone());
        Ok(GovernorHandle::new(
            program, links, governance, samples, storms,
        ))
    }

    /// Whether the probes run as uprobe sessions (see SESSION_PROGRAM).
    pub fn uprobe_sessions(&self) -> bool {
        self.session_program.is_some()
    }

    /// Attaches the empty floor programs instead of the real ones: the reference cost of a bare
    /// uprobe + uretprobe pair for the overhead benchmark.
    pub fn attach_floor(
        &mut self,
        path: &Path,
        points: &[AttachPoint],
    ) -> Result<usize, CaptureError> {
        self.attach_programs(&[Probe::Listed(3), Probe::Listed(2)], path, points)
    }

    /// Attaches each of `programs` at every point, in this order.
    fn attach_programs(
        &mut self,
        programs: &[Probe],
        path: &Path,
        points: &[AttachPoint],
    ) -> Result<usize, CaptureError> {
        if points.is_empty() {
            return Ok(0);
        }
        let offsets: Vec<u64> = points.iter().map(|p| p.file_offset).collect();
        let cookies: Vec<u64> = points.iter().map(|p| p.cookie).collect();
        for &probe in programs {
            let (name, kind, fd) = match probe {
                Probe::Listed(index) => {
                    let (name, kind) = UPROBE_PROGRAMS[index];
                    (name, kind, self.uprobe_programs[index].as_fd())
                }
                Probe::Session => match &self.session_program {
                    Some(fd) => (SESSION_PROGRAM, ProbeKind::Session, fd.as_fd()),
                    None => continue,
                },
            };
            let link = multi::attach(fd, kind, path, &offsets, &cookies, 0).map_err(|source| {
                CaptureError::Attach {
                    function: format!("{} entry points", points.len()),
                    path: path.to_path_buf(),
                    program: name,
                    source,
                }
            })?;
            self.links.push(link);
        }
        self.probes += points.len();
        Ok(points.len())
    }

    /// A descriptor that becomes readable when the BPF side wakes the daemon: once the burst
    /// ring is a quarter full, before a storm can fill it between two timer drains.
    pub fn bursts_wakeup(&self) -> Result<OwnedFd, CaptureError> {
        self.bursts
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| CaptureError::Io {
                what: "a descriptor of the burst ring buffer".into(),
                source,
            })
    }

    /// Hands every burst record waiting in the ring buffer to `sink`; returns how many.
    pub fn drain_bursts(&mut self, mut sink: impl FnMut(BurstRecord)) -> usize {
        let mut n = 0;
        self.bursts.drain(|item| {
            if let Some(record) = read_record::<BurstRecord>(item) {
                sink(record);
                n += 1;
            }
        });
        n
    }

    /// Passes what the BPF programs logged since the last call to the daemon's log.
    pub fn forward_bpf_log(&mut self) {
        (self.bpf_log)();
    }

    /// The execs since the last drain: which process, and when.
    pub fn drain_execs(&mut self) -> Vec<ExecRecord> {
        let mut execs = Vec::new();
        while let Some(item) = self.execs.next() {
            if let Some(record) = read_record::<ExecRecord>(&item) {
                execs.push(record);
            }
        }
        execs
    }

    /// Reads the per-thread call statistics, burst totals, regions of interest and the MPI
    /// calls in progress.
    pub fn read_totals(&self) -> Result<KernelTotals, CaptureError> {
        let read_ns = usage::clock_ns(libc::CLOCK_MONOTONIC);
        let functions: HashMap<&MapData, FuncKey, FuncStats> = map_ref(&self.ebpf, "FUNC_STATS")?;
        let ended: HashMap<&MapData, ThreadLife, BurstTotals> =
            map_ref(&self.ebpf, "BURST_TOTALS")?;
        let regions: HashMap<&MapData, u32, RankRegion> = map_ref(&self.ebpf, "REGIONS")?;
        let threads: HashMap<&MapData, u32, ThreadState> = map_ref(&self.ebpf, "THREADS")?;
        let owners: HashMap<&MapData, u32, u32> = map_ref(&self.ebpf, "SLOT_OWNERS")?;
        let slots: Array<&MapData, ThreadState> = map_ref(&self.ebpf, "THREAD_SLOTS")?;
        // The live threads' states before the ended threads' totals and the call statistics
        // outside the threads' caches (see burst_totals_by_life, call_stats_by_key).
        let states: Vec<ThreadState> = threads
            .iter()
            .filter_map(Result::ok)
            .map(|(_, st)| st)
            .chain(threads::held_states(&owners, &slots))
            .collect();
        let bursts = threads::burst_totals_by_life(&states, ended.iter().filter_map(Result::ok));
        let open_calls = states
            .iter()
            .filter(|st| st.depth > 0 && st.outer_func != NO_FUNC)
            .map(|st| OpenCall {
                pid: st.pid,
                func: st.outer_func,
                entry_ns: st.outer_entry_ns,
            })
            .collect();
        Ok(KernelTotals {
            functions: threads::call_stats_by_key(&states, functions.iter().filter_map(Result::ok)),
            bursts,
            regions: regions.iter().filter_map(Result::ok).collect(),
            open_calls,
            read_ns,
        })
    }

    /// Starts tracking an MPI process: counting its file I/O and noting its exit time. Attaches
    /// the file I/O and scheduler programs if they are not.
    pub fn track(&mut self, pid: u32) -> Result<(), CaptureError> {
        let mut pids: HashMap<&mut MapData, u32, u64> = map_mut(&mut self.ebpf, "TRACKED")?;
        pids.insert(pid, 0, 0).map_err(|source| CaptureError::Map {
            map: "TRACKED",
            source,
        })?;
        self.set_tracked_bit(pid, true)?;
        self.tracked.insert(pid);
        if let Some(io) = &mut self.file_io {
            if let Err(e) = io.attach(&mut self.ebpf) {
                tracing::warn!(
                    "file I/O is not counted: {e}; attaching is tried again at the next MPI \
                     process"
                );
            }
        }
        self.attach_scheduler();
        Ok(())
    }

    /// Attaches the scheduler programs unless they are (a process was held at a thread's first
    /// call for them, or a process is tracked); says so when they cannot be. Whether they are.
    pub fn attach_scheduler(&mut self) -> bool {
        if let Err(e) = self.scheduler.attach(&mut self.ebpf) {
            tracing::error!(
                "cannot attach the scheduler programs ({e}): the bursts of MPI threads that start \
                 now count wall time as on-CPU time; attaching is tried again at the next \
                 statistics update"
            );
            return false;
        }
        true
    }

    /// Whether the scheduler programs are attached.
    pub fn scheduler_attached(&self) -> bool {
        self.scheduler.attached()
    }

    /// Whether the file I/O programs are attached: `capture.file_io` is on and a process is
    /// tracked, or was a few seconds ago.
    pub fn counts_file_io(&self) -> bool {
        self.file_io
            .as_ref()
            .is_some_and(FileIoTracepoints::attached)
    }

    /// Detaches the programs attached on demand once the node has had no MPI process for
    /// `capture.detach_idle_after_s` (called at every statistics update): the file I/O programs
    /// when no process is tracked, the scheduler programs when no thread has a state either.
    pub fn detach_idle_programs(&mut self) {
        let now = Instant::now();
        let tracking = !self.tracked.is_empty();
        if let Some(io) = &mut self.file_io {
            io.detach_if_idle(tracking, self.detach_idle_after, now);
        }
        if !tracking {
            match self.free_states_of_exited_threads() {
                Ok(0) => {}
                Ok(freed) => tracing::info!(
                    "freed the states of {freed} threads whose exit the probes missed: they would \
                     have kept the scheduler programs attached"
                ),
                Err(e) => tracing::warn!("cannot free the states of exited threads: {e}"),
            }
        }
        let busy = tracking || self.has_thread_states();
        let step = self
            .scheduler
            .detach_if_idle(&mut self.ebpf, busy, self.detach_idle_after, now);
        if let Err(e) = step {
            tracing::warn!(
                "attaching or detaching the scheduler programs: {e}; tried again at the next \
                 statistics update"
            );
        }
        // The launchers are looked at (and the stale ones forgotten) whenever processes are
        // held for them, the watch on demand or not.
        let launching = busy || (!self.launchers.is_empty() && self.launchers_running());
        if let Some(watch) = &mut self.library_watch {
            let step = watch.detach_if_idle(&mut self.ebpf, launching, self.detach_idle_after, now);
            if let Err(e) = step {
                tracing::warn!(
                    "attaching or detaching the library watch: {e}; tried again at the next \
                     statistics update"
                );
            }
        }
    }

    /// Frees the states of threads that have exited, and returns how many. Only the exit
    /// tracepoint's program frees a state, and a run of a classic tracepoint's program can be
    /// missed: one stale state would keep the scheduler programs attached for good.
    fn free_states_of_exited_threads(&mut self) -> Result<usize, CaptureError> {
        let exited = |st: &ThreadState| !crate::proc::thread_exists(st.pid, st.tid);
        let stale: Vec<ThreadState> = {
            let owners: HashMap<&MapData, u32, u32> = map_ref(&self.ebpf, "SLOT_OWNERS")?;
            let slots: Array<&MapData, ThreadState> = map_ref(&self.ebpf, "THREAD_SLOTS")?;
            threads::held_states(&owners, &slots)
                .into_iter()
                .filter(exited)
                .collect()
        };
        // As at a thread's exit: the slot empties before its claim goes.
        let mut slots: Array<&mut MapData, ThreadState> = map_mut(&mut self.ebpf, "THREAD_SLOTS")?;
        for st in &stale {
            let freed = ThreadState { tid: 0, ..*st };
            slots
                .set(threads::slot(st.tid), freed, 0)
                .map_err(|source| CaptureError::Map {
                    map: "THREAD_SLOTS",
                    source,
                })?;
        }
        let mut owners: HashMap<&mut MapData, u32, u32> = map_mut(&mut self.ebpf, "SLOT_OWNERS")?;
        for st in &stale {
            let _ = owners.remove(&threads::slot(st.tid));
        }
        let unslotted = remove_entries::<u32, ThreadState>(&mut self.ebpf, "THREADS", exited)?;
        Ok(stale.len() + unslotted)
    }

    /// Whether any thread on the node has a state (made a probed call and has not exited).
    fn has_thread_states(&self) -> bool {
        let owners = map_ref::<HashMap<&MapData, u32, u32>>(&self.ebpf, "SLOT_OWNERS");
        let threads = map_ref::<HashMap<&MapData, u32, ThreadState>>(&self.ebpf, "THREADS");
        // A map that cannot be read counts as holding states: the programs stay attached.
        !matches!(owners, Ok(o) if o.keys().next().is_none())
            || !matches!(threads, Ok(t) if t.keys().next().is_none())
    }

    /// Sets where Open MPI datatype objects keep their size, for the attach points whose cookie
    /// says `DTYPE_OPENMPI`.
    pub fn set_ompi_dtype_size_offset(&mut self, offset: u64) -> Result<(), CaptureError> {
        let mut slot: Array<&mut MapData, u64> = map_mut(&mut self.ebpf, "OMPI_DTYPE_SIZE_OFFSET")?;
        slot.set(0, offset, 0).map_err(|source| CaptureError::Map {
            map: "OMPI_DTYPE_SIZE_OFFSET",
            source,
        })
    }

    /// Lets the probes reuse an Open MPI datatype's size per thread until the next
    /// MPI_Type_free, once a probe on MPI_Type_free is attached (the datatype epoch leaves 0).
    pub fn reuse_datatype_sizes(&mut self) -> Result<(), CaptureError> {
        let map = |source| CaptureError::Map {
            map: "DTYPE_EPOCH",
            source,
        };
        let mut epoch: Array<&mut MapData, u64> = map_mut(&mut self.ebpf, "DTYPE_EPOCH")?;
        if epoch.get(&0, 0).map_err(map)? == 0 {
            epoch.set(0, 1, 0).map_err(map)?;
        }
        Ok(())
    }

    /// Sets or clears a pid's bit in TRACKED_PIDS. The daemon is the bitmap's only writer, so a
    /// read-modify-write of the word loses no other bit.
    fn set_tracked_bit(&mut self, pid: u32, tracked: bool) -> Result<(), CaptureError> {
        let map = |source| CaptureError::Map {
            map: "TRACKED_PIDS",
            source,
        };
        let mut words: Array<&mut MapData, u64> = map_mut(&mut self.ebpf, "TRACKED_PIDS")?;
        let (index, bit) = (pid / 64, 1u64 << (pid % 64));
        let word = words.get(&index, 0).map_err(map)?;
        let word = if tracked { word | bit } else { word & !bit };
        words.set(index, word, 0).map_err(map)
    }

    /// When a tracked process exited (CLOCK_MONOTONIC ns), once it has.
    pub fn exit_time(&self, pid: u32) -> Option<u64> {
        let pids: HashMap<&MapData, u32, u64> = map_ref(&self.ebpf, "TRACKED").ok()?;
        pids.get(&pid, 0).ok().filter(|&t| t != 0)
    }

    /// File I/O per process of the tracked processes (threads summed).
    pub fn read_io(&self) -> Result<BTreeMap<u32, IoTotals>, CaptureError> {
        let totals: HashMap<&MapData, u32, IoTotals> = map_ref(&self.ebpf, "IO_TOTALS")?;
        let mut out: BTreeMap<u32, IoTotals> = BTreeMap::new();
        for (_, t) in totals.iter().filter_map(Result::ok) {
            let e = out.entry(t.pid).or_default();
            e.pid = t.pid;
            e.read_bytes += t.read_bytes;
            e.read_calls += t.read_calls;
            e.write_bytes += t.write_bytes;
            e.write_calls += t.write_calls;
            e.opens += t.opens;
            e.closes += t.closes;
        }
        Ok(out)
    }

    /// Removes every kernel entry of the given (ended) processes, after their final read.
    pub fn forget_processes(&mut self, pids: &HashSet<u32>) -> Result<(), CaptureError> {
        remove_entries::<FuncKey, FuncStats>(&mut self.ebpf, "FUNC_STATS", |v| {
            pids.contains(&v.pid)
        })?;
        remove_entries::<ThreadLife, BurstTotals>(&mut self.ebpf, "BURST_TOTALS", |v| {
            pids.contains(&v.pid)
        })?;
        remove_entries::<u32, IoTotals>(&mut self.ebpf, "IO_TOTALS", |v| pids.contains(&v.pid))?;
        let mut regions: HashMap<&mut MapData, u32, RankRegion> =
            map_mut(&mut self.ebpf, "REGIONS")?;
        for pid in pids {
            let _ = regions.remove(pid);
        }
        let mut tracked: HashMap<&mut MapData, u32, u64> = map_mut(&mut self.ebpf, "TRACKED")?;
        for pid in pids {
            let _ = tracked.remove(pid);
        }
        for &pid in pids {
            self.set_tracked_bit(pid, false)?;
        }
        self.tracked.retain(|pid| !pids.contains(pid));
        let mut files: HashMap<&mut MapData, u64, u32> = map_mut(&mut self.ebpf, "IO_FILES")?;
        let open: Vec<u64> = files
            .keys()
            .filter_map(Result::ok)
            .filter(|k| pids.contains(&((k >> 32) as u32)))
            .collect();
        for k in open {
            let _ = files.remove(&k);
        }
        remove_entries::<u64, TaskThread>(&mut self.ebpf, "TASK_THREADS", |v| {
            pids.contains(&v.pid)
        })?;
        remove_entries::<u32, ThreadState>(&mut self.ebpf, "THREADS", |v| pids.contains(&v.pid))?;
        Ok(())
    }

    pub fn lost(&mut self) -> Result<Lost, CaptureError> {
        let array: PerCpuArray<&MapData, u64> = map_ref(&self.ebpf, "LOST")?;
        let sum = |index: u32| -> u64 { array.get(&index, 0).map(|v| v.iter().sum()).unwrap_or(0) };
        Ok(Lost {
            bursts: sum(lost::BURSTS),
            execs: sum(lost::EXECS),
            thread_states: sum(lost::THREAD_STATES),
            thread_stats: sum(lost::THREAD_STATS),
            counters_descheduled: self.open_counters.as_mut().map_or(0, Counters::descheduled),
        })
    }

    /// Run time and count of each program, from the kernel's BPF statistics.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        // On while the daemon holds its statistics fd, or for the whole node by sysctl.
        let stats_on = self.stats_fd.is_some()
            || crate::proc::kernel_setting("bpf_stats_enabled").is_ok_and(|v| v == "1");
        // The probe programs attached to MPI libraries: the session program or the pair.
        let probes: Vec<(&'static str, BorrowedFd<'_>)> = match &self.session_program {
            Some(fd) => vec![(SESSION_PROGRAM, fd.as_fd())],
            None => UPROBE_PROGRAMS[..2]
                .iter()
                .zip(&self.uprobe_programs)
                .map(|(&(name, _), fd)| (name, fd.as_fd()))
                .collect(),
        };
        let tracepoints = TRACEPOINTS
            .iter()
            .map(|&(name, _, _)| name)
            .chain(SCHED_RAW_TRACEPOINTS.iter().map(|&(name, _)| name))
            .chain(IO_TRACEPOINTS.iter().map(|&(name, _)| name))
            .chain([libraries::PROGRAM])
            .filter_map(|name| {
                let fd = self.ebpf.program(name)?.fd().ok()?;
                Some((name, fd.as_fd()))
            });
        probes
            .into_iter()
            .chain(tracepoints)
            .filter_map(|(name, fd)| {
                let (run_time, run_count, missed) = multi::run_stats(fd)?;
                Some(ProgramStats {
                    name,
                    run_time: stats_on.then_some(run_time),
                    run_count: stats_on.then_some(run_count),
                    missed,
                })
            })
            .collect()
    }
}

fn remove_entries<K: aya::Pod, V: aya::Pod>(
    ebpf: &mut Ebpf,
    name: &'static str,
    owned: impl Fn(&V) -> bool,
) -> Result<usize, CaptureError> {
    let mut map: HashMap<&mut MapData, K, V> = map_mut(ebpf, name)?;
    let keys: Vec<K> = map
        .iter()
        .filter_map(Result::ok)
        .filter(|(_, v)| owned(v))
        .map(|(k, _)| k)
        .collect();
    for k in &keys {
        // An entry already gone (LRU eviction) is what we wanted anyway.
        let _ = map.remove(k);
    }
    Ok(keys.len())
}

fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut T, CaptureError>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    let program = ebpf.program_mut(name).ok_or(CaptureError::Program {
        program: name,
        source: aya::programs::ProgramError::UnexpectedProgramType,
    })?;
    program.try_into().map_err(|source| CaptureError::Program {
        program: name,
        source,
    })
}

/// A record the BPF side writes to a ring buffer, one per entry.
///
/// # Safety
/// `#[repr(C)]` of integers only, shared with the BPF side: every bit pattern is a valid value.
unsafe trait RingRecord: Copy {}
// SAFETY: `#[repr(C)]` structs of integers and byte arrays (profiler-common).
unsafe impl RingRecord for BurstRecord {}
unsafe impl RingRecord for ExecRecord {}
unsafe impl RingRecord for HoldReport {}
unsafe impl RingRecord for StormEvent {}

/// The record in ring-buffer entry `item`, or `None` for an entry too short to hold one.
fn read_record<T: RingRecord>(item: &[u8]) -> Option<T> {
    // SAFETY: `item` holds at least a T, and any bytes are a valid T (RingRecord);
    // read_unaligned because ring-buffer entries are only 8-byte aligned by contract.
    (item.len() >= std::mem::size_of::<T>())
        .then(|| unsafe { std::ptr::read_unaligned(item.as_ptr().cast::<T>()) })
}

/// Takes map `name` out of the object, for a handle that owns it.
fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, CaptureError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(CaptureError::MissingMap(name))?;
    T::try_from(map).map_err(|source| CaptureError::Map { map: name, source })
}

fn map_ref<'a, T>(ebpf: &'a Ebpf, name: &'static str) -> Result<T, CaptureError>
where
    T: TryFrom<&'a aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.map(name).ok_or(CaptureError::MissingMap(name))?;
    T::try_from(map).map_err(|source| CaptureError::Map { map: name, source })
}

fn map_mut<'a, T>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<T, CaptureError>
where
    T: TryFrom<&'a mut aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.map_mut(name).ok_or(CaptureError::MissingMap(name))?;
    T::try_from(map).map_err(|source| CaptureError::Map { map: name, source })
}

/// One process's kernel totals, its threads summed.
#[derive(Debug, Default)]
pub struct ProcessTotals {
    pub bursts: BurstTotals,
    /// By function id.
    pub functions: BTreeMap<u32, FuncStats>,
    /// By (function id, call site address).
    pub sites: BTreeMap<(u32, u64), FuncStats>,
}

/// Sums per-thread kernel totals per process.
pub fn per_process(totals: &KernelTotals) -> BTreeMap<u32, ProcessTotals> {
    let mut out: BTreeMap<u32, ProcessTotals> = BTreeMap::new();
    for (_, t) in &totals.bursts {
        let e = &mut out.entry(t.pid).or_default().bursts;
        e.pid = t.pid;
        e.bursts += t.bursts;
        e.burst_ns += t.burst_ns;
        e.burst_oncpu_ns += t.burst_oncpu_ns;
        e.filtered_bursts += t.filtered_bursts;
        e.filtered_ns += t.filtered_ns;
        e.dropped_bursts += t.dropped_bursts;
        e.timed_runs += t.timed_runs;
        e.timed_run_ns += t.timed_run_ns;
        e.daemon_delay_ns += t.daemon_delay_ns;
        for (sum, c) in e.counters.iter_mut().zip(t.counters) {
            *sum += c;
        }
    }
    for (k, s) in &totals.functions {
        let process = out.entry(s.pid).or_default();
        add_stats(process.functions.entry(k.func).or_default(), s);
        add_stats(process.sites.entry((k.func, k.site)).or_default(), s);
    }
    out
}

fn add_stats(sum: &mut FuncStats, s: &FuncStats) {
    sum.pid = s.pid;
    sum.calls += s.calls;
    sum.time_ns += s.time_ns;
    sum.bytes += s.bytes;
    sum.sized_calls += s.sized_calls;
    sum.world_peer_calls += s.world_peer_calls;
    sum.world_peer_sum = sum.world_peer_sum.wrapping_add(s.world_peer_sum);
}
