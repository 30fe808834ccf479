//! The file I/O programs, which count the file reads, writes, opens and closes of the MPI
//! processes the daemon tracks.
//!
//! They sit on the per-syscall tracepoints of the calls they count (attached by the daemon, see
//! `capture::IO_TRACEPOINTS`), so no other system call runs any of them. Every process on the
//! node makes those calls: the first test, whether the caller's process is tracked, is one bit of
//! an array. Reads and writes are counted at their exit alone, which has both the descriptor (in
//! the registers the call was made with) and the bytes: an entry tracepoint would be a second
//! program run per call, and the kernel copies the data of write and pwrite64 into their entry
//! records before any program runs.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task_btf, bpf_probe_read_kernel, bpf_task_pt_regs,
    },
    macros::{map, tracepoint},
    maps::{Array, HashMap, LruHashMap},
    programs::TracePointContext,
};
use profiler_common::IoTotals;

use crate::shared::{config, get_or_insert};

/// Field offsets of the system call tracepoints, read by the daemon from their tracefs `format`
/// files at load: the descriptor argument of close's entry and the return value of the exits.
#[no_mangle]
static IO_FD_OFFSET: u64 = 0;
#[no_mangle]
static IO_RET_OFFSET: u64 = 0;
/// The MPI processes the daemon tracks, as one bit per pid (bit pid % 64 of word pid / 64, up to
/// the kernel's largest pid_max, 2^22), written only by the daemon: their file I/O is counted.
/// Every process on the node passes the test in the file I/O programs, and an array read is far
/// cheaper than a hash lookup.
#[map]
static TRACKED_PIDS: Array<u64> = Array::with_max_entries(1 << 16, 0);
/// (pid << 32 | fd) of the descriptors the tracked processes opened: the files whose reads and
/// writes count.
#[map]
static IO_FILES: LruHashMap<u64, u32> = LruHashMap::with_max_entries(65536, 0);
/// File I/O totals per thread of the tracked processes, by tid.
#[map]
static IO_TOTALS: HashMap<u32, IoTotals> = HashMap::with_max_entries(16384, 0);

/// Whether the calling thread's process is tracked, and its (pid, tid).
#[inline(always)]
fn tracked_caller() -> Option<(u32, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let word = TRACKED_PIDS.get(pid >> 6)?;
    (word & (1 << (pid & 63)) != 0).then_some((pid, tid))
}

/// The calling thread's I/O totals (its process is tracked).
#[inline(always)]
fn io_totals(pid: u32, tid: u32) -> Option<&'static mut IoTotals> {
    get_or_insert(
        &IO_TOTALS,
        &tid,
        IoTotals {
            pid,
            ..IoTotals::default()
        },
    )
}

/// The IO_FILES key of a descriptor of process `pid`, if it is a counted file.
#[inline(always)]
fn counted_file(pid: u32, fd: u64) -> Option<u64> {
    if fd > u32::MAX as u64 {
        return None;
    }
    let key = ((pid as u64) << 32) | fd;
    unsafe { IO_FILES.get(&key) }?;
    Some(key)
}

/// The value a system call returned, from its exit record.
#[inline(always)]
fn syscall_ret(ctx: &TracePointContext) -> i64 {
    unsafe { ctx.read_at(config(&IO_RET_OFFSET) as usize) }.unwrap_or(-1)
}

/// Exit of a read or write of a tracked process: on a counted file, adds what it returned. The
/// descriptor is the first argument, still in the registers the call was made with.
#[inline(always)]
fn io_exit(ctx: &TracePointContext, write: bool) {
    let Some((pid, tid)) = tracked_caller() else {
        return;
    };
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
    let Ok(fd) = (unsafe { bpf_probe_read_kernel(core::ptr::addr_of!((*regs).rdi)) }) else {
        return;
    };
    if counted_file(pid, fd).is_none() {
        return;
    }
    let ret = syscall_ret(ctx);
    if ret < 0 {
        return;
    }
    let Some(t) = io_totals(pid, tid) else { return };
    if write {
        t.write_bytes += ret as u64;
        t.write_calls += 1;
    } else {
        t.read_bytes += ret as u64;
        t.read_calls += 1;
    }
}

/// Exit of read, pread64, readv, preadv and preadv2.
#[tracepoint]
pub fn io_read_exit(ctx: TracePointContext) -> u32 {
    io_exit(&ctx, false);
    0
}

/// Exit of write, pwrite64, writev, pwritev and pwritev2.
#[tracepoint]
pub fn io_write_exit(ctx: TracePointContext) -> u32 {
    io_exit(&ctx, true);
    0
}

/// Exit of open, creat, openat and openat2: the new descriptor is a file whose reads and writes
/// count.
#[tracepoint]
pub fn io_open_exit(ctx: TracePointContext) -> u32 {
    let Some((pid, tid)) = tracked_caller() else {
        return 0;
    };
    let ret = syscall_ret(&ctx);
    if ret < 0 {
        return 0;
    }
    if let Some(t) = io_totals(pid, tid) {
        t.opens += 1;
    }
    let _ = IO_FILES.insert(&(((pid as u64) << 32) | ret as u64), &1, 0);
    0
}

/// Entry of close: a counted descriptor stops counting (its number may be reused for a pipe).
/// At the entry, not the exit: once closed, the number may already belong to a file another
/// thread opened.
#[tracepoint]
pub fn io_close_enter(ctx: TracePointContext) -> u32 {
    let Some((pid, tid)) = tracked_caller() else {
        return 0;
    };
    let Ok(fd) = (unsafe { ctx.read_at::<u64>(config(&IO_FD_OFFSET) as usize) }) else {
        return 0;
    };
    let Some(key) = counted_file(pid, fd) else {
        return 0;
    };
    let _ = IO_FILES.remove(&key);
    if let Some(t) = io_totals(pid, tid) {
        t.closes += 1;
    }
    0
}
