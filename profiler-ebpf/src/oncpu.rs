//! On-CPU time and hardware counters: the per-CPU perf-event counters, the last context switch
//! on each CPU, and a thread's on-CPU time and counter totals up to now.

use aya_ebpf::{
    bindings::{bpf_perf_event_value, BPF_F_CURRENT_CPU},
    helpers::bpf_perf_event_read_value,
    macros::map,
    maps::{Array, PerCpuArray, PerfEventArray},
};
use profiler_common::{CpuSwitch, ThreadState, NUM_COUNTERS};

use crate::shared::config;

/// 1 when the daemon filled the counter arrays with per-CPU perf events.
#[no_mangle]
pub(crate) static COUNTERS_ENABLED: u32 = 0;
/// 1 while the daemon has detached the scheduler programs (scheduler.rs), or is about to; 0
/// while they run.
#[map]
static SCHEDULER_DETACHED: Array<u32> = Array::with_max_entries(1, 0);

/// Whether a thread's first probed call must hold its process until the scheduler programs run
/// again: without them its on-CPU time would not be counted.
#[inline(always)]
pub(crate) fn scheduler_detached() -> bool {
    SCHEDULER_DETACHED.get(0).is_some_and(|&d| d != 0)
}

/// Per CPU, the last context switch to a profiled thread (sched_switch records no other).
#[map]
pub(crate) static CPU_SWITCH: PerCpuArray<CpuSwitch> = PerCpuArray::with_max_entries(1, 0);
/// Per-CPU counters, one array per counter: a perf-event array cannot be larger than the number
/// of CPUs.
#[map]
static COUNTER_INSTRUCTIONS: PerfEventArray<u32> = PerfEventArray::new(0);
#[map]
static COUNTER_CYCLES: PerfEventArray<u32> = PerfEventArray::new(0);

/// This CPU's count of the perf event in `array`, 0 where it cannot be read.
#[inline(always)]
fn read_counter(array: &PerfEventArray<u32>) -> u64 {
    let mut value = bpf_perf_event_value {
        counter: 0,
        enabled: 0,
        running: 0,
    };
    let rc = unsafe {
        bpf_perf_event_read_value(
            array as *const _ as *mut _,
            BPF_F_CURRENT_CPU,
            &mut value,
            core::mem::size_of::<bpf_perf_event_value>() as u32,
        )
    };
    if rc == 0 {
        value.counter
    } else {
        0
    }
}

/// This CPU's counts of every counter, all 0 without counters.
#[inline(always)]
pub(crate) fn read_counters() -> [u64; NUM_COUNTERS] {
    if config(&COUNTERS_ENABLED) == 0 {
        return [0; NUM_COUNTERS];
    }
    [
        read_counter(&COUNTER_INSTRUCTIONS),
        read_counter(&COUNTER_CYCLES),
    ]
}

/// On-CPU time and counter totals of the running thread (the caller's), up to `now`. The
/// scheduler's own accounting (which leaves out time a hypervisor stole from the virtual CPU,
/// as the thread's CLOCK_THREAD_CPUTIME_ID does) up to its last update, plus the wall time since
/// then or since the thread's switch-in, the last switch to a profiled thread on this CPU,
/// whichever is later (a scheduler tick updates the accounting every few ms, so little is left to
/// estimate).
#[inline(always)]
pub(crate) fn thread_now(st: &ThreadState, now: u64) -> (u64, [u64; NUM_COUNTERS]) {
    let mut counters = st.counters;
    let Some(cpu) = CPU_SWITCH.get(0) else {
        return (st.oncpu_ns, counters);
    };
    let since = st.oncpu_accounted_ns.max(cpu.last_switch_ns);
    // 0 until the first update after load: the time in progress is not counted.
    if since == 0 {
        return (st.oncpu_ns, counters);
    }
    if config(&COUNTERS_ENABLED) != 0 {
        let cur = read_counters();
        for i in 0..NUM_COUNTERS {
            counters[i] += cur[i].wrapping_sub(cpu.counters[i]);
        }
    }
    (st.oncpu_ns + now.saturating_sub(since), counters)
}
