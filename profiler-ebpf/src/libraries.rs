//! Holds a process that opens an MPI library the daemon has not handled, until the daemon has
//! attached its probes to the file.
//!
//! The dynamic loader opens a library, then maps it and runs the program: a daemon that learns of
//! a new library from the process's maps attaches after MPI_Init and the first calls. This
//! program runs at the exit of every openat on the node (the system call the loader opens
//! libraries with). When the file's name starts with `libmpi` (libmpi.so, libmpich.so,
//! libmpi_mpifh.so, ...), it was opened for reading, and its path is not among the paths the
//! daemon has handled, it tells the daemon (pid, descriptor, path) and stops the process with
//! SIGSTOP, which takes effect on the return from openat, before the loader maps the file. The
//! daemon attaches through /proc/PID/fd/FD and sends SIGCONT. Every process held is also in
//! HELD_PROCESSES, which the hold guard (a process of its own, profiler's capture/hold_guard.rs)
//! watches: it resumes a process held too long, or every one when the daemon dies.
//!
//! The same hold, reported on the same ring, serves the first probed call of a thread while the
//! scheduler programs are detached (from threads.rs), and the exec of a process an MPI launcher
//! started while this program is detached (`launched_exec`, from lifecycle.rs): the daemon
//! attaches it only while the node has a launcher or an MPI process, for while it is attached
//! every system call on the node takes the kernel's traced path.

use aya_ebpf::{
    bindings::{pt_regs, BPF_NOEXIST, BPF_RB_FORCE_WAKEUP},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_ktime_get_ns,
        bpf_probe_read_kernel, bpf_probe_read_user_str_bytes, bpf_send_signal, bpf_task_pt_regs,
    },
    macros::{map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use profiler_common::{hold, HoldReport, COMM_BYTES, LIBRARY_PATH_BYTES};

use crate::shared::config;

/// The daemon's own pid: it opens MPI libraries to read their symbols and must never hold
/// itself, and its calls of its own probed functions (measuring what a probe hit costs) ship no
/// burst. Set at load. (Its threads are also named `mpiburst*`, see NEVER_HELD.)
#[no_mangle]
pub(crate) static DAEMON_PID: u32 = 0;
/// Offset of the return value in the records of syscalls/sys_exit_openat, from its format file.
#[no_mangle]
static OPENAT_RET_OFFSET: u64 = 0;

/// FNV-1a hashes of the paths the daemon has handled (MPI library or not): opening one again
/// holds nothing.
#[map]
static KNOWN_LIBRARY_PATHS: LruHashMap<u64, u8> = LruHashMap::with_max_entries(4096, 0);
/// The holds, reported to the daemon.
#[map]
static HOLDS: RingBuf = RingBuf::with_byte_size(64 << 10, 0);
/// Room to build one report (larger than the stack should hold).
#[map]
static HOLD_SCRATCH: PerCpuArray<HoldReport> = PerCpuArray::with_max_entries(1, 0);
/// The processes held now: pid → CLOCK_MONOTONIC ns of the hold. The daemon deletes a process's
/// entry when it resumes it; the hold guard resumes and deletes those held past
/// `mpi.hold_limit_s`, and all of them when the daemon dies.
#[map]
static HELD_PROCESSES: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);
/// Holds that could not be reported (the ring or HELD_PROCESSES was full): the process was not
/// held. After an open, only the daemon's scan after its exec finds the library; after a first
/// call, the thread's bursts count wall time as on-CPU time until the next statistics update
/// attaches the scheduler programs; after the exec of a launcher's child, the next statistics
/// update attaches the watch (its launcher runs), and what the child opened before is found by
/// the scan after its exec.
#[map]
static HOLDS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);
/// Set while `library_open_exit` is detached: the exec of a process a launcher started then
/// holds it until the daemon has attached the program again.
#[map]
static LIBRARY_WATCH_DETACHED: Array<u32> = Array::with_max_entries(1, 0);
/// The command names of the processes that start MPI ranks (`mpi.launchers`: mpirun, orted,
/// hydra_pmi_proxy, slurmstepd, ...), zero-padded as the kernel keeps them.
#[map]
static LAUNCHERS: HashMap<[u8; COMM_BYTES], u8> = HashMap::with_max_entries(256, 0);
/// The launchers running: pid → CLOCK_MONOTONIC ns of their exec. The daemon keeps the watch
/// attached while any runs.
#[map]
static LAUNCHER_PIDS: HashMap<u32, u64> = HashMap::with_max_entries(4096, 0);
/// The processes (and threads) launchers forked, until they exit (the daemon also forgets those
/// whose exit was missed).
#[map]
static LAUNCHED: LruHashMap<u32, u8> = LruHashMap::with_max_entries(16384, 0);

/// What a map insert with BPF_NOEXIST returns for a key that is there.
const EEXIST: i32 = -17;
const SIGCONT: u32 = 18;
const SIGSTOP: u32 = 19;
const O_ACCMODE: u64 = 3;
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
const PREFIX: &[u8; 6] = b"libmpi";
/// Threads whose name starts with this are never held: those of every mpiburst process (the
/// daemon's `mpiburst`, `mpiburst-http`, `mpiburst-analysis`, and the CLI), which open MPI
/// libraries to read them. Two daemons on one node (a test machine) would otherwise hold each
/// other, each waiting for the other to resume it.
const NEVER_HELD: &[u8; 8] = b"mpiburst";

#[tracepoint]
pub fn library_open_exit(ctx: TracePointContext) -> u32 {
    let _ = hold_new_library(&ctx);
    0
}

#[inline(always)]
fn hold_new_library(ctx: &TracePointContext) -> Option<()> {
    let ret: i64 = unsafe { ctx.read_at(config(&OPENAT_RET_OFFSET) as usize) }.ok()?;
    if ret < 0 {
        return None;
    }
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if pid == config(&DAEMON_PID) {
        return None;
    }
    // openat(dirfd, filename, flags, mode): the arguments are still in the registers the call
    // was made with.
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
    let flags = unsafe { bpf_probe_read_kernel(core::ptr::addr_of!((*regs).rdx)) }.ok()?;
    if flags & O_ACCMODE != 0 {
        return None;
    }
    let filename = unsafe { bpf_probe_read_kernel(core::ptr::addr_of!((*regs).rsi)) }.ok()?;
    let record = HOLD_SCRATCH.get_ptr_mut(0)?;
    let record = unsafe { &mut *record };
    let len = unsafe { bpf_probe_read_user_str_bytes(filename as *const u8, &mut record.path) }
        .ok()?
        .len();
    // The file name starts after the last '/'. Its start is kept in the record's fd field (set
    // for real below): a value in map memory, which the verifier does not track, so the loop's
    // states do not multiply with every place a '/' could be.
    // Volatile, so that the compiler keeps it there rather than in a register.
    let name_start = core::ptr::addr_of_mut!(record.fd);
    unsafe { core::ptr::write_volatile(name_start, 0) };
    for i in 0..LIBRARY_PATH_BYTES {
        if i >= len {
            break;
        }
        if record.path[i] == b'/' {
            unsafe { core::ptr::write_volatile(name_start, i as u32 + 1) };
        }
    }
    let base = unsafe { core::ptr::read_volatile(name_start) } as usize;
    for (k, &expected) in PREFIX.iter().enumerate() {
        let j = base + k;
        if j >= len || record.path.get(j) != Some(&expected) {
            return None;
        }
    }
    // Only for the names that passed: the whole path, as the key of the known paths.
    let mut hash = FNV_OFFSET;
    for i in 0..LIBRARY_PATH_BYTES {
        if i >= len {
            break;
        }
        hash = (hash ^ record.path[i] as u64).wrapping_mul(FNV_PRIME);
    }
    if unsafe { KNOWN_LIBRARY_PATHS.get(&hash) }.is_some() {
        return None;
    }
    if bpf_get_current_comm().ok()?.starts_with(NEVER_HELD) {
        return None;
    }
    record.reason = hold::LIBRARY_OPEN;
    record.fd = ret as u32;
    record.path_hash = hash;
    hold_and_report(record)
}

/// At every fork: notes the children of the launchers running.
#[inline(always)]
pub(crate) fn launcher_fork(parent: u32, child: u32) {
    if unsafe { LAUNCHER_PIDS.get(&parent) }.is_some() {
        let _ = LAUNCHED.insert(&child, &1, 0);
    }
}

/// At every exec: notes a launcher of MPI ranks as running, and holds a process a launcher
/// started while this program is detached, until the daemon has attached it again (the process
/// opens its MPI libraries after its exec). Not the launcher itself: an interactive shell, its
/// parent, waits with `WUNTRACED` and would take the terminal back at the stop. A launcher is
/// noted at its own exec, before it forks, and the daemon detaches only if it finds no launcher
/// a while after it set the flag: a launcher's child that execs later reads the flag set, and
/// is held.
#[inline(always)]
pub(crate) fn launched_exec(pid: u32) {
    let launched = launched(pid);
    if let Ok(comm) = bpf_get_current_comm() {
        if unsafe { LAUNCHERS.get(&comm) }.is_some() {
            // Full: the daemon, which forgets the exited launchers, finds the map not empty.
            let _ = LAUNCHER_PIDS.insert(&pid, &unsafe { bpf_ktime_get_ns() }, 0);
        }
    }
    if launched && LIBRARY_WATCH_DETACHED.get(0).is_some_and(|&d| d != 0) {
        hold_for(pid, hold::LAUNCHED);
    }
}

/// At the exit of a process.
#[inline(always)]
pub(crate) fn launcher_exit(pid: u32) {
    let _ = LAUNCHER_PIDS.remove(&pid);
}

/// At the exit of every thread: the fork program cannot tell a new thread from a new process,
/// and a stale id would make a later process of that pid count as launched.
#[inline(always)]
pub(crate) fn launched_exit(tid: u32) {
    let _ = LAUNCHED.remove(&tid);
}

/// Whether a launcher of MPI ranks started process `pid` (forked it). Only such a process is
/// held at its exec or its first MPI call: its parent, a launcher, does not wait for it with
/// `WUNTRACED`, where an interactive shell that started a program in the foreground would
/// report it stopped and take the terminal back.
#[inline(always)]
pub(crate) fn launched(pid: u32) -> bool {
    unsafe { LAUNCHED.get(&pid) }.is_some()
}

/// Holds the calling process for `reason` (a thread's first probed MPI call while the scheduler
/// programs are detached, the exec of a process a launcher started while this program is) and
/// reports it: the daemon attaches the programs and resumes it. The stop takes effect on the
/// return to user space.
#[inline(always)]
pub(crate) fn hold_for(pid: u32, reason: u32) {
    // The daemon's own calibration calls a probed function.
    if pid == config(&DAEMON_PID) || bpf_get_current_comm().is_ok_and(|c| c.starts_with(NEVER_HELD))
    {
        return;
    }
    let Some(record) = HOLD_SCRATCH.get_ptr_mut(0) else {
        return;
    };
    let record = unsafe { &mut *record };
    record.reason = reason;
    record.fd = 0;
    record.path_hash = 0;
    record.path[0] = 0;
    let _ = hold_and_report(record);
}

/// Stops the calling process and reports `record` (its reason set).
#[inline(always)]
fn hold_and_report(record: &mut HoldReport) -> Option<()> {
    // The pid and the time are this run's own, not the per-CPU record's: a probe can be
    // preempted, and another process's run on this CPU rewrite the record meanwhile. The process
    // stopped is then the one listed for the hold guard, whatever the report says.
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let held_ns = unsafe { bpf_ktime_get_ns() };
    // The stop is pending before the daemon can read the report: its SIGCONT, however soon it
    // comes, then either resumes the stopped process or discards the pending stop. The other
    // order would let a quick SIGCONT come first and the stop after it, for good.
    if unsafe { bpf_send_signal(SIGSTOP) } != 0 {
        return None;
    }
    // Listed only once the stop is pending, for the same reason: whoever deletes an entry and
    // then sends SIGCONT (the daemon, the guard) resumes every hold that entry stood for. So a
    // second thread's first call, made before the first one's stop took effect, is covered by
    // the first one's report, and reports nothing: its resume would find no entry. A library
    // open is reported whatever is listed, for the daemon to attach the file.
    let once = record.reason != hold::LIBRARY_OPEN;
    let flags = if once { BPF_NOEXIST as u64 } else { 0 };
    match HELD_PROCESSES.insert(&pid, &held_ns, flags) {
        Ok(()) => {}
        Err(EEXIST) if once => return None,
        Err(_) => {
            // Full: no guard would know of it, so it is not held.
            release(pid, false);
            return None;
        }
    }
    record.pid = pid;
    record.held_ns = held_ns;
    if HOLDS
        .output::<HoldReport>(record, BPF_RB_FORCE_WAKEUP as u64)
        .is_err()
    {
        release(pid, true);
        return None;
    }
    Some(())
}

/// Lets a process go that cannot be held after all: nobody would resume it. `listed`: its entry
/// in HELD_PROCESSES is deleted first (then the SIGCONT covers the hold it stood for). SIGCONT
/// discards the pending stop (or ends it); the hold counts as lost.
#[inline(always)]
fn release(pid: u32, listed: bool) {
    if listed {
        let _ = HELD_PROCESSES.remove(&pid);
    }
    unsafe { bpf_send_signal(SIGCONT) };
    if let Some(lost) = HOLDS_LOST.get_ptr_mut(0) {
        unsafe { *lost += 1 };
    }
}
