//! Types shared by the BPF programs and the daemon. Every struct is `#[repr(C)]` with explicit
//! padding and a compile-time size check, because both sides read the same bytes.
#![no_std]

/// Function id meaning "no MPI function" (a burst opened before any call was seen).
pub const NO_FUNC: u32 = u32::MAX;

/// How many hardware counters a burst carries (instructions, cycles).
pub const NUM_COUNTERS: usize = 2;

/// The attach cookie of each uprobe describes the probed function, so one pair of BPF programs
/// serves every MPI function without a map lookup:
///
/// | bits  | meaning                                                       |
/// |-------|---------------------------------------------------------------|
/// | 0–15  | function id (index into the daemon's function table)          |
/// | 16–19 | argument index of the element count, `NO_ARG` if none         |
/// | 20–23 | argument index of the datatype, `NO_ARG` if none              |
/// | 24–26 | datatype encoding (`DTYPE_*`)                                 |
/// | 27    | a wrapper (Fortran binding, PMPI interposer) that calls the C function probed too |
/// | 28    | polling call: counted, but it neither ends nor starts a burst |
/// | 29    | MPI_Init / MPI_Init_thread: its return starts the region of interest |
/// | 30    | MPI_Finalize: its entry ends the region of interest           |
/// | 32–35 | argument index of the peer rank (dest or source), `NO_ARG` if none |
/// | 36–39 | argument index of the communicator (6 and up: on the stack)   |
/// | 40–41 | how MPI_COMM_WORLD is recognised (`COMM_*`)                   |
/// | 42–63 | Open MPI: (GOT slot of ompi_mpi_comm_world − the function's address) ÷ 8, signed |
pub mod cookie {
    pub const NO_ARG: u64 = 0xf;
    /// No byte accounting at this attach point (for example Fortran wrappers, whose arguments
    /// are pointers; the C call nested inside them accounts the bytes).
    pub const DTYPE_NONE: u64 = 0;
    /// Open MPI: the datatype handle points at an object holding its size at a fixed offset.
    pub const DTYPE_OPENMPI: u64 = 1;
    /// MPICH: builtin datatype handles encode their size in bits 8–15.
    pub const DTYPE_MPICH: u64 = 2;
    /// No peer accounting at this attach point.
    pub const COMM_NONE: u64 = 0;
    /// MPICH: MPI_COMM_WORLD is the integer handle 0x44000000.
    pub const COMM_MPICH: u64 = 1;
    /// Open MPI: MPI_COMM_WORLD points at `ompi_mpi_comm_world`, whose address the library's
    /// global offset table slot for it holds; the slot's distance from the probed function is
    /// the same in every process (both move with the library). The object itself may sit in the
    /// executable (a copy relocation), so only the slot is at a fixed distance.
    pub const COMM_OPENMPI: u64 = 2;
    /// The largest distance, in bytes, the Open MPI encoding holds.
    pub const MAX_WORLD_DISTANCE: i64 = (1 << 21) * 8 - 8;
    /// The attach point is a wrapper, a Fortran binding or a PMPI interposer, whose call makes
    /// a probed call of the same function: counting at entry only, the nested call counts it.
    pub const WRAPPER: u64 = 1 << 27;
    pub const POLLING: u64 = 1 << 28;
    pub const REGION_START: u64 = 1 << 29;
    pub const REGION_END: u64 = 1 << 30;
    /// The call may free a datatype (MPI_Type_free): the sizes the probes remember per datatype
    /// handle are stale from here on, since a new datatype can get the freed one's address.
    pub const DTYPE_FREE: u64 = 1 << 31;

    /// `flags` is any of `WRAPPER`, `POLLING`, `REGION_START`, `REGION_END`, `DTYPE_FREE`.
    pub const fn encode(func: u16, count_arg: u64, dtype_arg: u64, dtype: u64, flags: u64) -> u64 {
        func as u64
            | (count_arg & 0xf) << 16
            | (dtype_arg & 0xf) << 20
            | (dtype & 0x7) << 24
            | (flags & (WRAPPER | POLLING | REGION_START | REGION_END | DTYPE_FREE))
    }
    /// Adds the peer fields to a cookie: `world_distance` is Open MPI's distance to the slot, in
    /// bytes (a multiple of 8 within ±`MAX_WORLD_DISTANCE`).
    pub const fn with_peer(
        c: u64,
        peer_arg: u64,
        comm_arg: u64,
        comm: u64,
        world_distance: i64,
    ) -> u64 {
        c | (peer_arg & 0xf) << 32
            | (comm_arg & 0xf) << 36
            | (comm & 0x3) << 40
            | ((world_distance / 8) as u64 & 0x3f_ffff) << 42
    }
    pub const fn peer_arg(c: u64) -> u64 {
        (c >> 32) & 0xf
    }
    pub const fn comm_arg(c: u64) -> u64 {
        (c >> 36) & 0xf
    }
    pub const fn comm(c: u64) -> u64 {
        (c >> 40) & 0x3
    }
    pub const fn world_distance(c: u64) -> i64 {
        // Sign-extend the 22-bit field.
        ((c as i64) >> 42) * 8
    }
    pub const fn func(c: u64) -> u32 {
        (c & 0xffff) as u32
    }
    pub const fn count_arg(c: u64) -> u64 {
        (c >> 16) & 0xf
    }
    pub const fn dtype_arg(c: u64) -> u64 {
        (c >> 20) & 0xf
    }
    pub const fn dtype(c: u64) -> u64 {
        (c >> 24) & 0x7
    }
    pub const fn polling(c: u64) -> bool {
        c & POLLING != 0
    }
}

/// Per process (keyed by pid): the region of interest of the POP methodology, from the return
/// of MPI_Init/MPI_Init_thread to the entry of MPI_Finalize (CLOCK_MONOTONIC ns, 0 until seen).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankRegion {
    pub init_return_ns: u64,
    pub finalize_entry_ns: u64,
}
const _: () = assert!(core::mem::size_of::<RankRegion>() == 16);

/// Per CPU: its run queue (the kernel's `struct rq` address, found at the first switch to a
/// profiled thread; 0 until then), the task the last context switch on it brought in (its
/// `task_struct` address), and the counter values when the profiled thread now running on it
/// came in.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSwitch {
    pub rq: u64,
    pub task: u64,
    pub counters: [u64; NUM_COUNTERS],
    /// The profiled thread that the last switch took off this CPU mid-burst while it could run,
    /// and when (CLOCK_MONOTONIC ns); tid 0 when the last switch took off no such thread. The
    /// next switch on the CPU ends the run of the task that displaced it.
    pub displaced_tid: u32,
    pub _pad: u32,
    pub displaced_ns: u64,
}
const _: () = assert!(core::mem::size_of::<CpuSwitch>() == 48);

/// One burst at or above the duration filter, sent through the ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BurstRecord {
    pub pid: u32,
    pub tid: u32,
    /// CLOCK_MONOTONIC nanoseconds at the return of the call that opened the burst.
    pub start_ns: u64,
    /// Wall duration minus the time spent inside polling calls during the burst.
    pub duration_ns: u64,
    /// On-CPU time of the thread in the burst, minus on-CPU time inside polling calls.
    pub oncpu_ns: u64,
    /// Counter deltas (instructions, cycles); valid only when `flags & BURST_HAS_COUNTERS`.
    pub counters: [u64; NUM_COUNTERS],
    /// Return address of the outermost call that opened / closed the burst (virtual address).
    pub start_site: u64,
    pub end_site: u64,
    pub start_func: u32,
    pub end_func: u32,
    /// Polling calls made inside the burst.
    pub polling_calls: u32,
    pub flags: u32,
}
pub const BURST_HAS_COUNTERS: u32 = 1;
const _: () = assert!(core::mem::size_of::<BurstRecord>() == 80);

/// Sent when a process calls exec, so the daemon can look for MPI libraries it has not seen.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecRecord {
    pub pid: u32,
    pub _pad: u32,
    /// When the exec happened (CLOCK_MONOTONIC ns): the start of the program the process runs
    /// from then on, to the nanosecond, where /proc gives its fork to the clock tick.
    pub exec_ns: u64,
}
const _: () = assert!(core::mem::size_of::<ExecRecord>() == 16);

/// Bytes of a library path a [`HoldReport`] carries (and the BPF side hashes); longer paths
/// are cut, which only shortens the name in the daemon's log: the daemon reads the file through
/// the descriptor.
pub const LIBRARY_PATH_BYTES: usize = 256;

/// Why a process was held (`HoldReport::reason`).
pub mod hold {
    /// It opened a file named like an MPI library (`libmpi*`) at a path the daemon has not
    /// handled: held until the daemon has attached to the file.
    pub const LIBRARY_OPEN: u32 = 0;
    /// One of its threads made its first probed MPI call while the scheduler programs were
    /// detached (no MPI thread on the node for a while): held until they are attached again,
    /// so that the thread's on-CPU time is whole from its first burst.
    pub const FIRST_CALL: u32 = 1;
    /// A launcher of MPI ranks (`mpi.launchers`) started it, and it exec'ed while the library
    /// watch was detached (the node had no launcher and no MPI process for a while): held until
    /// the watch is attached again, so that its opens of MPI libraries are seen. The launcher,
    /// its parent, does not wait for it with `WUNTRACED`, where a shell would see the stop.
    pub const LAUNCHED: u32 = 2;
}

/// Bytes of a command name as the kernel keeps it (`TASK_COMM_LEN`: 15 and a zero), the key of
/// the launchers' names.
pub const COMM_BYTES: usize = 16;

/// Sent when the BPF programs hold a process (SIGSTOP) for the daemon, which resumes it once it
/// has done what the reason asks.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HoldReport {
    pub pid: u32,
    /// One of [`hold`].
    pub reason: u32,
    /// FNV-1a of the path as passed to open (the key of the daemon's known paths); 0 at a first
    /// call.
    pub path_hash: u64,
    /// CLOCK_MONOTONIC ns of the hold: how long the process was held is counted from here.
    pub held_ns: u64,
    /// The descriptor the open returned: /proc/PID/fd/FD is the file, in whatever mount
    /// namespace the process runs. 0 at a first call.
    pub fd: u32,
    pub _pad: u32,
    /// The path as passed to open, NUL-terminated unless cut at LIBRARY_PATH_BYTES; empty at a
    /// first call.
    pub path: [u8; LIBRARY_PATH_BYTES],
}
const _: () = assert!(core::mem::size_of::<HoldReport>() == 32 + LIBRARY_PATH_BYTES);

/// Slots of the array of thread states (`THREAD_SLOTS` in the BPF programs): a thread's slot is
/// its tid modulo this (a power of two), and a thread whose slot another live thread holds keeps
/// its state in the LRU hash `THREADS` instead.
pub const THREAD_SLOT_COUNT: u32 = 16384;

/// Per-thread state, keyed by tid: the return probe may run on another CPU than the entry probe,
/// so per-CPU storage would be wrong.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadState {
    pub pid: u32,
    /// The thread whose state this is (0 in a free slot of `THREAD_SLOTS`).
    pub tid: u32,
    /// Nesting depth of MPI calls (Fortran wrapper → C, MPI → PMPI); only depth 0↔1 matters.
    pub depth: u32,
    pub outer_func: u32,
    pub burst_start_func: u32,
    /// The thread's outermost polling calls since `storm_start_ns`, for the governor's storm
    /// watch (`STORM_WINDOW_NS`).
    pub storm_calls: u32,
    pub outer_entry_ns: u64,
    /// The stack pointer at the entry of the outermost call in progress (at its return address):
    /// a uprobe session tells that call's return from the entry of a nested call by it.
    pub outer_entry_sp: u64,
    /// The burst the outermost call in progress closed, when it passed the filter: shipped when
    /// that call returns, because only then is its call site known for free (the return
    /// probe's instruction pointer is the return address; reading it from the stack at entry
    /// costs more than the rest of the probe).
    pub pending: BurstRecord,
    pub outer_bytes: u64,
    /// The peer rank in MPI_COMM_WORLD of the outermost call in progress, when
    /// `OUTER_WORLD_PEER` is set.
    pub outer_peer: i64,
    /// Open MPI: the address of the library's GOT slot for `ompi_mpi_comm_world` and what it
    /// holds, read at the thread's first call with a peer. The slot is written once, when the
    /// loader relocates the library, and a user memory read costs more than the rest of the
    /// entry probe; 0 until read, and again after an exec.
    pub world_slot: u64,
    pub world_comm: u64,
    /// Open MPI: the last datatype handles whose sizes were read from their datatype objects,
    /// their sizes, and the datatype epoch (DTYPE_EPOCH) they were read in; a size is reused
    /// while its handle is called with in the same epoch. Several ways, since codes alternate
    /// datatypes from call to call (a halo exchange's contiguous rows and vector columns). A
    /// handle of 0 is an empty way. The epoch is 0 until read, and again after an exec, whose
    /// new program may have other datatypes at the same addresses.
    pub dtype_handles: [u64; DTYPE_CACHE_WAYS],
    pub dtype_sizes: [u32; DTYPE_CACHE_WAYS],
    pub dtype_epoch: u64,
    pub outer_flags: u32,
    pub polling_calls: u32,
    /// 0 when no burst is open.
    pub burst_start_ns: u64,
    pub burst_start_site: u64,
    pub burst_start_oncpu: u64,
    pub burst_start_counters: [u64; NUM_COUNTERS],
    /// Time spent in polling calls since the burst opened (wall, on-CPU, counters).
    pub polled_ns: u64,
    pub polled_oncpu: u64,
    pub polled_counters: [u64; NUM_COUNTERS],
    /// On-CPU snapshot at the entry of the polling call in progress.
    pub poll_entry_oncpu: u64,
    pub poll_entry_counters: [u64; NUM_COUNTERS],
    /// The thread's on-CPU time (its task's run time as the scheduler accounts it, taken at its
    /// last switch in), when it was taken (CLOCK_MONOTONIC ns), and what its CPU's run queue
    /// clock had lost to steal and interrupts then: running since then adds the wall time less
    /// what the run queue lost since.
    pub oncpu_ns: u64,
    pub oncpu_accounted_ns: u64,
    pub oncpu_rq_lost_ns: u64,
    /// The thread's kernel task (`task_struct` address).
    pub task: u64,
    /// Per-thread counter totals, virtualised from per-CPU counters at sched_switch.
    pub counters: [u64; NUM_COUNTERS],
    /// When the state was made (CLOCK_MONOTONIC ns): with the tid, it names this life of the
    /// thread, since tids are reused.
    pub born_ns: u64,
    /// The thread's burst totals. They live here, beside the rest of its state, so closing a
    /// burst looks nothing up; at the thread's exit (or when its tid's state is restarted) they
    /// move to `BURST_TOTALS` under `ThreadLife`.
    pub totals: BurstTotals,
    /// When the thread's current storm watch window began (CLOCK_MONOTONIC ns), and the modes
    /// (bit `mode::*`) it has reported a storm in.
    pub storm_start_ns: u64,
    pub storm_reported: u32,
    pub _pad: u32,
    /// When a switch last took the thread off a CPU mid-burst while it could run (CLOCK_MONOTONIC
    /// ns), until it comes back on one: 0 while it runs or waits.
    pub displaced_ns: u64,
    /// The statistics of some of the thread's call sites, in place of their `FUNC_STATS`
    /// entries (see `CachedCallStats`).
    pub call_cache: [CachedCallStats; CALL_CACHE_WAYS],
}
impl ThreadState {
    /// This life of the thread: the key its burst totals move to when it ends.
    pub fn life(&self) -> ThreadLife {
        ThreadLife {
            tid: self.tid,
            _pad: 0,
            born_ns: self.born_ns,
        }
    }
}

/// `outer_flags` bits.
pub const OUTER_POLLING: u32 = 1;
pub const OUTER_BYTES_DONE: u32 = 2;
/// `pending` holds a burst to ship at the return of the outermost call.
pub const OUTER_BURST_PENDING: u32 = 4;
/// The outermost call in progress is MPI_Init/MPI_Init_thread.
pub const OUTER_REGION_START: u32 = 8;
/// The peer argument of the outermost call in progress was looked at (once, at the first
/// C-level call inside it).
pub const OUTER_PEER_DONE: u32 = 16;
/// `outer_peer` holds a rank of MPI_COMM_WORLD.
pub const OUTER_WORLD_PEER: u32 = 32;
const _: () = assert!(
    core::mem::size_of::<ThreadState>() == 440 + DTYPE_CACHE_WAYS * 12 + CALL_CACHE_WAYS * 80
);

/// Ways of a thread's cache of Open MPI datatype sizes (`ThreadState::dtype_handles`); a power
/// of two, as a way to fill is drawn from the clock's low bits.
pub const DTYPE_CACHE_WAYS: usize = 4;

/// Ways of a thread's cache of call statistics (`ThreadState::call_cache`): a code's main loop
/// calls MPI from a few call sites, and a call whose site is in the cache updates its statistics
/// in the thread's state instead of looking them up in `FUNC_STATS` (a hash lookup, about 40 ns).
/// Any way holds any site: return addresses a few bytes apart (a loop unrolled twice) would
/// share a way chosen by address.
pub const CALL_CACHE_WAYS: usize = 4;

/// One way of a thread's call cache: the statistics of its calls of `func` at `site`, counted
/// from the thread's first call there (not since the way was filled), so that they supersede the
/// `FUNC_STATS` entry of the same key, which they are written back to when another site takes
/// the way or the thread ends. The daemon reads the thread states before `FUNC_STATS` and takes
/// the larger of each statistic: an entry is in the cache, in the hash, or both. Empty while
/// `stats.calls` is 0.
///
/// The daemon copies a state while its thread may be changing it. A way that another site takes
/// changes its key and statistics at once, so that change is framed: `fill_end` first, then the
/// rest, then `fill`, each the previous `fill` plus one. A copy (made in address order) in which
/// they differ caught the change midway, and the daemon leaves that way out of it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachedCallStats {
    pub fill: u32,
    pub func: u32,
    pub site: u64,
    pub stats: FuncStats,
    pub fill_end: u32,
    pub _pad: u32,
}
impl CachedCallStats {
    /// The key and statistics of this way, if it holds any and was copied whole.
    pub fn entry(&self, tid: u32) -> Option<(FuncKey, FuncStats)> {
        (self.fill == self.fill_end && self.stats.calls != 0).then_some((
            FuncKey {
                tid,
                func: self.func,
                site: self.site,
            },
            self.stats,
        ))
    }
}
const _: () = assert!(core::mem::size_of::<CachedCallStats>() == 80);

/// How the probes treat a polling function, as the daemon's governor sets it (`Governance`): a polling loop calls such a function every few tens of nanoseconds, and a
/// probe hit costs a microsecond or more.
pub mod mode {
    /// Entry and return: the call is counted with its time, which is taken out of the burst.
    pub const FULL: u32 = 0;
    /// Entry only (the return is not probed): the call is counted; its time stays in the burst.
    pub const COUNT_ONLY: u32 = 1;
    /// As COUNT_ONLY, and each thread's calls are also summed in `SAMPLES`: the probes are
    /// attached for short windows only, and the daemon reads from what the windows saw whether
    /// the calls came back within its budget.
    pub const SAMPLED: u32 = 2;
}
/// How the probes treat one polling function (`GOVERNANCE`, by function id); set by the
/// daemon's governor, which the probes answer in `full_storm_ns`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Governance {
    /// `mode::*`.
    pub mode: u32,
    /// Outermost calls of the function per thread and storm watch window at which the thread is
    /// reported (`StormEvent`); 0: not watched.
    pub storm_calls: u32,
    /// In `COUNT_ONLY`: the limit the function had when probed in full. A thread whose window
    /// reaches it would storm again if the function were restored, so the call that reaches it
    /// stamps `full_storm_ns`, and the governor keeps the function counted at entry only.
    pub full_storm_calls: u32,
    pub _pad: u32,
    /// CLOCK_MONOTONIC ns of the last such call, written by the probes (0: none since the mode
    /// was set).
    pub full_storm_ns: u64,
}
const _: () = assert!(core::mem::size_of::<Governance>() == 24);
/// Function ids `GOVERNANCE` has room for; a function with a larger id is always probed in full.
pub const GOVERNED_FUNCS: u32 = 1024;
/// The storm watch window: a thread that makes more outermost calls of a polling function than
/// its limit (`Governance::storm_calls`) within it is reported to the governor (`StormEvent`).
/// The count is per thread, over whichever polling functions it calls.
pub const STORM_WINDOW_NS: u64 = 10_000_000;

/// A thread called polling functions faster than the governor's budget allows: sent once per
/// storm watch window and thread, by the call that reached the limit.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StormEvent {
    pub pid: u32,
    pub tid: u32,
    pub func: u32,
    /// The function's mode (`mode::*`) when the limit was reached.
    pub mode: u32,
    /// Outermost polling calls of the thread in the window so far.
    pub calls: u32,
    pub _pad: u32,
    /// When the window began, and the entry of the call that reached the limit
    /// (CLOCK_MONOTONIC ns).
    pub window_start_ns: u64,
    pub at_ns: u64,
}
const _: () = assert!(core::mem::size_of::<StormEvent>() == 40);

/// Key of `SAMPLES`: one thread's calls of one function.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadFunc {
    pub tid: u32,
    pub func: u32,
}
const _: () = assert!(core::mem::size_of::<ThreadFunc>() == 8);

/// What a sampling window of a governed function saw of one thread: its calls and the entry
/// times of the first and the last.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sample {
    pub calls: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}
const _: () = assert!(core::mem::size_of::<Sample>() == 24);

/// Value of the task → thread map: which thread (and process) a kernel task is.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskThread {
    pub tid: u32,
    pub pid: u32,
}
const _: () = assert!(core::mem::size_of::<TaskThread>() == 8);

/// Key of the per-thread, per-call-site call statistics. Keyed by thread, not process, so that
/// only one CPU at a time updates an entry and plain adds are exact without atomics.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FuncKey {
    pub tid: u32,
    pub func: u32,
    /// The return address of the outermost call: its call site.
    pub site: u64,
}
const _: () = assert!(core::mem::size_of::<FuncKey>() == 16);

/// Calls, time inside the call, bytes and peers, summed in kernel per (thread, function, call
/// site).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FuncStats {
    /// The thread's process, so the daemon can sum threads per process.
    pub pid: u32,
    pub _pad: u32,
    pub calls: u64,
    pub time_ns: u64,
    pub bytes: u64,
    /// Calls whose datatype size was known, so `bytes` covers exactly these.
    pub sized_calls: u64,
    /// Calls whose peer was a rank of MPI_COMM_WORLD (not MPI_ANY_SOURCE, MPI_PROC_NULL or a
    /// rank of another communicator), and the sum of those peers.
    pub world_peer_calls: u64,
    pub world_peer_sum: u64,
}
const _: () = assert!(core::mem::size_of::<FuncStats>() == 56);

/// One life of a thread: its tid and when its state was made. The key of the burst totals of
/// threads that ended (`BURST_TOTALS`); a live thread keeps them in its state.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ThreadLife {
    pub tid: u32,
    pub _pad: u32,
    pub born_ns: u64,
}
const _: () = assert!(core::mem::size_of::<ThreadLife>() == 16);

/// Burst totals of one thread, summed in kernel for every burst whatever the duration filter, so
/// useful time is exact. `filtered_*` are the bursts below the filter that were not shipped.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BurstTotals {
    pub pid: u32,
    pub _pad: u32,
    pub bursts: u64,
    pub burst_ns: u64,
    pub burst_oncpu_ns: u64,
    pub filtered_bursts: u64,
    pub filtered_ns: u64,
    /// Bursts at or above the filter that the ring buffer had no room for.
    pub dropped_bursts: u64,
    /// The two counter slots summed over all bursts, whatever their duration (0 when counters
    /// are off).
    pub counters: [u64; NUM_COUNTERS],
    /// A sample of the probe program's runs at outermost calls (one in `TIMED_RUN_ONE_IN`),
    /// timed from the program's first clock read to its end, and their summed time: how long
    /// the programs take among the thread's own work, which evicts them and the trap path from
    /// the core's caches.
    pub timed_runs: u64,
    pub timed_run_ns: u64,
    /// The time the daemon's threads ran on the thread's CPU after taking it from the thread
    /// mid-burst, while the thread could have run on (it was preempted, not waiting), until the
    /// thread came back: what the daemon's own CPU delayed its computation.
    pub daemon_delay_ns: u64,
}
const _: () = assert!(core::mem::size_of::<BurstTotals>() == 96);

/// One probe run in this many at an outermost call is timed to its end (`BurstTotals`): each
/// costs one more clock read.
pub const TIMED_RUN_ONE_IN: u64 = 16;

/// File I/O of one thread of a tracked process, summed in kernel from the syscall tracepoints
/// (keyed by tid; the daemon sums threads per process). Reads and writes count
/// only descriptors the process opened with open/openat/openat2/creat while tracked, so pipes,
/// sockets, eventfds and inherited terminals are left out; bytes are what the calls returned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoTotals {
    pub pid: u32,
    pub _pad: u32,
    pub read_bytes: u64,
    pub read_calls: u64,
    pub write_bytes: u64,
    pub write_calls: u64,
    /// Successful opens of any file (a metadata operation even when nothing is read).
    pub opens: u64,
    /// Closes of the counted descriptors.
    pub closes: u64,
}
const _: () = assert!(core::mem::size_of::<IoTotals>() == 56);

/// Indices of the per-CPU self-monitoring counters.
pub mod lost {
    /// Bursts lost because the ring buffer was full.
    pub const BURSTS: u32 = 0;
    /// Exec notifications lost because their ring buffer was full.
    pub const EXECS: u32 = 1;
    /// Thread states that could not be created (LRU map update failed).
    pub const THREAD_STATES: u32 = 2;
    /// Per-thread statistics that could not be created (map full).
    pub const THREAD_STATS: u32 = 3;
    pub const COUNT: u32 = 4;
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    unsafe impl aya::Pod for BurstRecord {}
    unsafe impl aya::Pod for ExecRecord {}
    unsafe impl aya::Pod for HoldReport {}
    unsafe impl aya::Pod for ThreadState {}
    unsafe impl aya::Pod for RankRegion {}
    unsafe impl aya::Pod for TaskThread {}
    unsafe impl aya::Pod for FuncKey {}
    unsafe impl aya::Pod for FuncStats {}
    unsafe impl aya::Pod for IoTotals {}
    unsafe impl aya::Pod for BurstTotals {}
    unsafe impl aya::Pod for ThreadLife {}
    unsafe impl aya::Pod for StormEvent {}
    unsafe impl aya::Pod for ThreadFunc {}
    unsafe impl aya::Pod for Sample {}
    unsafe impl aya::Pod for Governance {}
}
