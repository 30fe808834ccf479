//! The governor of polling MPI functions (MPI_Test, MPI_Iprobe, ...), at the entry of an
//! outermost polling call: how the daemon has the function probed (in full, sampled or count
//! only), the count of the calls not probed in full, and the watch for polling storms.

use aya_ebpf::{
    bindings::BPF_RB_FORCE_WAKEUP,
    helpers::bpf_probe_read_user,
    macros::map,
    maps::{Array, HashMap, RingBuf},
};
use profiler_common::{
    cookie, mode, Governance, Sample, StormEvent, ThreadFunc, ThreadState, GOVERNED_FUNCS,
    STORM_WINDOW_NS,
};

use crate::{call_stats::call_stats, shared::get_or_insert};

/// How the governor has each polling function probed, by function id.
#[map]
static GOVERNANCE: Array<Governance> = Array::with_max_entries(GOVERNED_FUNCS, 0);
/// Polling storms for the daemon: a thread's window of polling calls that reached its limit.
#[map]
static STORMS: RingBuf = RingBuf::with_byte_size(16 << 10, 0);
/// What the sampling windows of governed functions saw, per thread and function; the daemon
/// takes and deletes the entries after each window.
#[map]
static SAMPLES: HashMap<ThreadFunc, Sample> = HashMap::with_max_entries(4096, 0);

/// The entry of an outermost polling call, as the governor has the function probed: watches the
/// thread's rate of polling calls, and where the function is not probed in full, counts the call
/// here, at its entry, at the call site the return address at `sp` names. Whether the call was
/// counted (its return is then not probed).
#[inline(always)]
pub(super) fn governed_entry(
    st: &mut ThreadState,
    sp: u64,
    c: u64,
    now: u64,
    tid: u32,
    pid: u32,
) -> bool {
    let func = cookie::func(c);
    let governance = GOVERNANCE.get(func).copied().unwrap_or_default();
    let mode = governance.mode;
    if mode != mode::FULL && c & cookie::WRAPPER != 0 {
        // Not counted: the C call it makes is, at its own entry (the depth stays 0 here).
        return true;
    }
    watch_storm(st, func, governance, now, tid, pid);
    if mode == mode::FULL {
        return false;
    }
    let site = unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0);
    if let Some(s) = call_stats(st, func, site, now) {
        s.calls += 1;
    }
    st.polling_calls += 1;
    if mode == mode::SAMPLED {
        let key = ThreadFunc { tid, func };
        let first = Sample {
            calls: 0,
            first_ns: now,
            last_ns: now,
        };
        if let Some(s) = get_or_insert(&SAMPLES, &key, first) {
            s.calls += 1;
            s.last_ns = now;
        }
    }
    true
}

/// Counts an outermost polling call in the thread's storm watch window, and tells the daemon
/// when the window reaches the function's limit for its mode; a count-only function's window
/// that reaches the limit of full probes is stamped in its `GOVERNANCE` entry. Sampled functions
/// are not watched: the daemon sees their rate in each window.
#[inline(always)]
fn watch_storm(st: &mut ThreadState, func: u32, g: Governance, now: u64, tid: u32, pid: u32) {
    let (mode, limit) = (g.mode, g.storm_calls);
    if limit == 0 || mode == mode::SAMPLED {
        return;
    }
    if now.wrapping_sub(st.storm_start_ns) >= STORM_WINDOW_NS {
        st.storm_start_ns = now;
        st.storm_reported = 0;
        st.storm_calls = 0;
    }
    st.storm_calls += 1;
    // Reached once per window: no more than one store per thread every 10 ms.
    if mode == mode::COUNT_ONLY && st.storm_calls == g.full_storm_calls {
        if let Some(p) = GOVERNANCE.get_ptr_mut(func) {
            unsafe { core::ptr::write_volatile(core::ptr::addr_of_mut!((*p).full_storm_ns), now) };
        }
    }
    // Once per window and mode: a thread that polls two functions in two modes counts both.
    let bit = 1 << (mode & 31);
    if st.storm_calls >= limit && st.storm_reported & bit == 0 {
        st.storm_reported |= bit;
        let event = StormEvent {
            pid,
            tid,
            func,
            mode,
            calls: st.storm_calls,
            _pad: 0,
            window_start_ns: st.storm_start_ns,
            at_ns: now,
        };
        let _ = STORMS.output::<StormEvent>(&event, BPF_RB_FORCE_WAKEUP as u64);
    }
}
