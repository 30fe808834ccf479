//! The MPI probes: the uprobe session program `mpi_session` attached to every MPI entry point, or
//! on kernels without sessions the uprobe/uretprobe pair `mpi_enter`/`mpi_exit` (the attach
//! cookie says which function it is), and the empty pair `floor_enter`/`floor_exit` the overhead
//! bench measures them against.
//!
//! The entry of an outermost call that does not poll closes the thread's open burst (the time
//! since the return of its last MPI call), and its return sums the call per call site, ships the
//! burst and opens the next one. Reading the calls' arguments (bytes, peer) is in `arguments`, the
//! governor of polling functions in `governor`.

mod arguments;
mod governor;

use aya_ebpf::{
    bindings::{pt_regs, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    helpers::{bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, uprobe, uretprobe},
    maps::{HashMap, RingBuf},
    programs::{ProbeContext, RetProbeContext},
    EbpfContext,
};
use profiler_common::{
    cookie, lost, BurstRecord, RankRegion, ThreadState, BURST_HAS_COUNTERS, NUM_COUNTERS,
    OUTER_BURST_PENDING, OUTER_BYTES_DONE, OUTER_PEER_DONE, OUTER_POLLING, OUTER_REGION_START,
    OUTER_WORLD_PEER, TIMED_RUN_ONE_IN,
};

use crate::{
    call_stats::call_stats,
    libraries::DAEMON_PID,
    oncpu::{thread_now, COUNTERS_ENABLED},
    shared::{config, count_lost, get_or_insert},
    threads::{thread, thread_state},
};
use arguments::{call_bytes, raise_dtype_epoch, world_peer};
use governor::governed_entry;

/// Bursts shorter than this are only summed in kernel. Set by the daemon at load time.
#[no_mangle]
static MIN_BURST_NS: u64 = 0;
/// A quarter of the BURSTS ring buffer's size, in bytes: from this much unread data on, every
/// record wakes the daemon.
#[no_mangle]
static RING_WAKE_BYTES: u64 = 0;
/// Region of interest per process (by pid).
#[map]
static REGIONS: HashMap<u32, RankRegion> = HashMap::with_max_entries(16384, 0);
/// The bursts that pass the MIN_BURST_NS filter, for the daemon.
#[map]
static BURSTS: RingBuf = RingBuf::with_byte_size(4 << 20, 0);

/// Closes the open burst at the entry of the call that ends it: sums it into the thread's totals,
/// and keeps it for shipping at that call's return when it passes the filter.
#[inline(always)]
fn close_burst(st: &mut ThreadState, tid: u32, now: u64, end_func: u32) {
    if st.burst_start_ns == 0 {
        return;
    }
    let (oncpu_now, counters_now) = thread_now(st, now);
    let duration = now
        .saturating_sub(st.burst_start_ns)
        .saturating_sub(st.polled_ns);
    // The scheduler accounts runtime on its run-queue clock, a few microseconds behind this
    // clock, so the estimate can pass the wall time of a burst that ran throughout; a thread is
    // never on a CPU longer than the wall time.
    let oncpu = oncpu_now
        .saturating_sub(st.burst_start_oncpu)
        .saturating_sub(st.polled_oncpu)
        .min(duration);
    let start_ns = st.burst_start_ns;
    st.burst_start_ns = 0;

    // The totals are the thread's own, so plain adds are exact: one thread runs on one CPU at a
    // time.
    let totals = &mut st.totals;
    let counters_on = config(&COUNTERS_ENABLED) != 0;
    let mut counters = [0u64; NUM_COUNTERS];
    if counters_on {
        for i in 0..NUM_COUNTERS {
            counters[i] = counters_now[i]
                .wrapping_sub(st.burst_start_counters[i])
                .wrapping_sub(st.polled_counters[i]);
            totals.counters[i] += counters[i];
        }
    }
    totals.bursts += 1;
    totals.burst_ns += duration;
    totals.burst_oncpu_ns += oncpu;
    // The daemon's own calls (measuring what a probe hit costs) ship nothing.
    if duration < config(&MIN_BURST_NS) || st.pid == config(&DAEMON_PID) {
        totals.filtered_bursts += 1;
        totals.filtered_ns += duration;
        return;
    }
    st.pending = BurstRecord {
        pid: st.pid,
        tid,
        start_ns,
        duration_ns: duration,
        oncpu_ns: oncpu,
        counters,
        start_site: st.burst_start_site,
        end_site: 0,
        start_func: st.burst_start_func,
        end_func,
        polling_calls: st.polling_calls,
        flags: if counters_on { BURST_HAS_COUNTERS } else { 0 },
    };
    st.outer_flags |= OUTER_BURST_PENDING;
}

/// Ships the burst kept by `close_burst`, now that its end call site is known.
#[inline(always)]
fn ship_pending(st: &mut ThreadState, site: u64) {
    st.pending.end_site = site;
    let Some(mut entry) = BURSTS.reserve::<BurstRecord>(0) else {
        st.totals.dropped_bursts += 1;
        count_lost(lost::BURSTS);
        return;
    };
    entry.write(st.pending);
    // No wakeup per record: the daemon drains on a timer, and a wakeup costs more than the
    // probe. Once the ring is a quarter full, a burst storm could fill it before the next tick:
    // then every record wakes the daemon until it has drained.
    let filling = BURSTS.query(BPF_RB_AVAIL_DATA as u64) >= config(&RING_WAKE_BYTES);
    let wakeup = if filling {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    entry.submit(wakeup as u64);
}

/// Entry of a probed call, with the thread's state: the outermost call (depth 0) ends the open
/// burst; the first C-level call inside it gives its bytes and peer. Returns whether the call
/// is the outermost one. The caller keeps the depth.
#[inline(always)]
fn enter(st: &mut ThreadState, regs: &pt_regs, c: u64, now: u64, tid: u32, pid: u32) -> bool {
    if c & cookie::DTYPE_FREE != 0 {
        raise_dtype_epoch();
    }
    let outermost = st.depth == 0;
    if outermost {
        st.outer_entry_sp = unsafe { core::ptr::read_volatile(&regs.rsp) };
        st.outer_func = cookie::func(c);
        st.outer_entry_ns = now;
        st.outer_bytes = 0;
        if c & cookie::REGION_END != 0 {
            set_region(pid, |r| r.finalize_entry_ns = now);
        }
        if cookie::polling(c) {
            st.outer_flags = OUTER_POLLING;
            let (oncpu, counters) = thread_now(st, now);
            st.poll_entry_oncpu = oncpu;
            st.poll_entry_counters = counters;
        } else {
            st.outer_flags = if c & cookie::REGION_START != 0 {
                OUTER_REGION_START
            } else {
                0
            };
            close_burst(st, tid, now, cookie::func(c));
        }
    }
    // Bytes come from the first C-level call inside the outermost one (a Fortran wrapper passes
    // pointers; the C call it makes has the values).
    if st.outer_flags & OUTER_BYTES_DONE == 0 && cookie::dtype(c) != cookie::DTYPE_NONE {
        st.outer_flags |= OUTER_BYTES_DONE;
        if let Some(bytes) = call_bytes(st, regs, c, now) {
            st.outer_bytes = bytes;
        } else {
            st.outer_flags &= !OUTER_BYTES_DONE;
        }
    }
    if st.outer_flags & OUTER_PEER_DONE == 0 && cookie::comm(c) != cookie::COMM_NONE {
        st.outer_flags |= OUTER_PEER_DONE;
        if let Some(peer) = world_peer(st, regs, c) {
            st.outer_peer = peer;
            st.outer_flags |= OUTER_WORLD_PEER;
        }
    }
    outermost
}

/// Return of the outermost call in progress (the depth is back at 0): sums the call, ships the
/// burst it closed and opens the next one at `site`, the return address.
#[inline(always)]
fn outermost_return(st: &mut ThreadState, now: u64, site: u64) {
    let elapsed = now.saturating_sub(st.outer_entry_ns);
    if st.outer_flags & OUTER_REGION_START != 0 {
        set_region(st.pid, |r| r.init_return_ns = now);
    }
    let (func, flags, bytes, peer) = (st.outer_func, st.outer_flags, st.outer_bytes, st.outer_peer);
    if let Some(s) = call_stats(st, func, site, now) {
        s.calls += 1;
        s.time_ns += elapsed;
        if flags & OUTER_BYTES_DONE != 0 {
            s.bytes += bytes;
            s.sized_calls += 1;
        }
        if flags & OUTER_WORLD_PEER != 0 {
            s.world_peer_calls += 1;
            s.world_peer_sum += peer as u64;
        }
    }
    if st.outer_flags & OUTER_POLLING != 0 {
        // A polling call stays inside the burst; only its time is taken out of it.
        let (oncpu, counters) = thread_now(st, now);
        st.polled_ns += elapsed;
        st.polled_oncpu += oncpu.saturating_sub(st.poll_entry_oncpu);
        for i in 0..NUM_COUNTERS {
            st.polled_counters[i] += counters[i].wrapping_sub(st.poll_entry_counters[i]);
        }
        st.polling_calls += 1;
        return;
    }
    if st.outer_flags & OUTER_BURST_PENDING != 0 {
        ship_pending(st, site);
    }
    let (oncpu, counters) = thread_now(st, now);
    st.burst_start_ns = now;
    st.burst_start_func = st.outer_func;
    st.burst_start_site = site;
    st.burst_start_oncpu = oncpu;
    st.burst_start_counters = counters;
    st.polled_ns = 0;
    st.polled_oncpu = 0;
    st.polled_counters = [0; NUM_COUNTERS];
    st.polling_calls = 0;
}

/// Times one run of an outermost call's probe in `TIMED_RUN_ONE_IN`, from its first clock read,
/// `start`, to here. Chosen by bits of the clock that `call_stats` does not draw on, so that a
/// timed run is not more often one that takes a cache way. A run longer than
/// `LONGEST_TIMED_RUN_NS` was interrupted, and is left out.
#[inline(always)]
fn time_run(st: &mut ThreadState, start: u64) {
    if (start >> 10) % TIMED_RUN_ONE_IN != 0 {
        return;
    }
    let ns = unsafe { bpf_ktime_get_ns() }.saturating_sub(start);
    if ns <= LONGEST_TIMED_RUN_NS {
        st.totals.timed_runs += 1;
        st.totals.timed_run_ns += ns;
    }
}

/// A probe run takes well under a µs even with the core's caches cold: one of over 20 µs had an
/// interrupt in it.
const LONGEST_TIMED_RUN_NS: u64 = 20_000;

/// The instruction pointer at a return probe: the return address, i.e. the call site. User
/// stacks cannot be walked without frame pointers, but this needs none.
#[inline(always)]
fn return_site(regs: &pt_regs) -> u64 {
    unsafe { core::ptr::read_volatile(&regs.rip) }
}

/// What a probe reads first: the time, and the calling thread and process.
#[inline(always)]
fn probe_start() -> (u64, u32, u32) {
    let now = unsafe { bpf_ktime_get_ns() };
    let id = bpf_get_current_pid_tgid();
    (now, id as u32, (id >> 32) as u32)
}

/// The attach cookie of the probe: which function it is and how to read its arguments.
#[inline(always)]
fn attach_cookie(ctx: &ProbeContext) -> u64 {
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// Entry of every probed call where the kernel has no uprobe sessions (before 6.13), paired
/// with `mpi_exit`: the depth counts every call in progress, nested ones included.
#[uprobe]
pub fn mpi_enter(ctx: ProbeContext) -> u32 {
    let (now, tid, pid) = probe_start();
    let Some(st) = thread_state(tid, pid) else {
        return 0;
    };
    let outermost = enter(
        st,
        unsafe { &*ctx.regs },
        attach_cookie(&ctx),
        now,
        tid,
        pid,
    );
    st.depth += 1;
    if outermost {
        time_run(st, now);
    }
    0
}

/// Return of every probed call where the kernel has no uprobe sessions, paired with
/// `mpi_enter`: the return of the outermost call sums it and opens the next burst.
#[uretprobe]
pub fn mpi_exit(ctx: RetProbeContext) -> u32 {
    let now = unsafe { bpf_ktime_get_ns() };
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(st) = thread(tid) else {
        return 0;
    };
    // Depth 0 here means the daemon attached while this call was already running.
    if st.depth == 0 {
        return 0;
    }
    st.depth -= 1;
    if st.depth == 0 {
        outermost_return(st, now, return_site(unsafe { &*ctx.regs }));
        time_run(st, now);
    }
    0
}

/// Entry and return of every probed call in one program, attached as a uprobe session (kernel
/// 6.13 and later): an entry that returns 1 has the kernel skip that call's return, so a call
/// nested in another probed call (a Fortran wrapper calling C, an interposer calling PMPI)
/// costs one trap instead of two. Only the outermost call's return runs, and it is told from an
/// entry by the stack pointer: 16-byte aligned, the outermost entry's with the return address
/// popped.
///
/// Not declared with `#[uprobe]`: that macro's wrapper returns 0 whatever the function returns,
/// and the kernel reads a session program's return value.
#[no_mangle]
#[link_section = "uprobe"]
pub fn mpi_session(ctx: *mut core::ffi::c_void) -> u32 {
    session(ProbeContext::new(ctx))
}

/// The body of `mpi_session`: 1 when the kernel is to skip this call's return.
#[inline(always)]
fn session(ctx: ProbeContext) -> u32 {
    let (now, tid, pid) = probe_start();
    let regs = unsafe { &*ctx.regs };
    let sp = unsafe { core::ptr::read_volatile(&regs.rsp) };
    // The ABI keeps the stack 16-byte aligned at every call: an entry sees the stack pointer at
    // the return address, 8 bytes off, and a return sees it back at the caller's, aligned.
    if sp & 15 == 0 {
        // Only the outermost call's return runs; a thread without a state here (its process
        // forked inside the call, say) has no call to end.
        if let Some(st) = thread(tid) {
            if st.depth != 0 && sp == st.outer_entry_sp.wrapping_add(8) {
                st.depth = 0;
                outermost_return(st, now, return_site(regs));
                time_run(st, now);
            }
        }
        return 0;
    }
    let Some(st) = thread_state(tid, pid) else {
        return 1;
    };
    // Read at entries only: a return needs none of it.
    let c = attach_cookie(&ctx);
    // An entry from a frame above the call in progress: that call was left without returning
    // (an error handler's longjmp, say), and this one is the outermost. An entry at the same
    // stack pointer is nested: a tail call (a PMPI interposer's `return PMPI_Send(...)`).
    if st.depth != 0 && sp > st.outer_entry_sp {
        st.depth = 0;
    }
    if st.depth == 0 && cookie::polling(c) && governed_entry(st, sp, c, now, tid, pid) {
        return 1;
    }
    if enter(st, regs, c, now, tid, pid) {
        st.depth = 1;
        time_run(st, now);
        0
    } else {
        1
    }
}

/// Records a region boundary of a process (the first thread to reach it sets it).
#[inline(always)]
fn set_region(pid: u32, set: impl FnOnce(&mut RankRegion)) {
    let Some(region) = get_or_insert(&REGIONS, &pid, RankRegion::default()) else {
        return;
    };
    set(region);
}

/// Empty programs: the bare uprobe + uretprobe cost that `cargo xtask bench overhead` compares
/// the real probes against, on the same function in the same run.
#[uprobe]
pub fn floor_enter(_ctx: ProbeContext) -> u32 {
    0
}

/// The return half of the empty pair (see `floor_enter`).
#[uretprobe]
pub fn floor_exit(_ctx: RetProbeContext) -> u32 {
    0
}
