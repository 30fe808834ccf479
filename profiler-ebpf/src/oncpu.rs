//! On-CPU time and hardware counters: the per-CPU perf-event counters, the last context switch
//! on each CPU, and a thread's on-CPU time and counter totals up to now.
//!
//! A thread's on-CPU time is the scheduler's own accounting, its task's `se.sum_exec_runtime`
//! (what CLOCK_THREAD_CPUTIME_ID reads: it leaves out the time a hypervisor stole from the
//! virtual CPU, and the time of interrupts where the kernel accounts it). The scheduler updates
//! it at every switch out, so it is exact when the thread comes on a CPU (`account_from`).
//! From then on the wall time counts, less the time the CPU's run queue clock has since lost to
//! steal and interrupts: its `clock` less its `clock_task`, which the kernel brings up to date at
//! every tick and switch. A probe reads the run queue again once the time counted so passes
//! REFRESH_NS. The offsets of these fields come from the kernel's BTF (the daemon's
//! capture/kernel_btf.rs).
//!
//! Some kernels bring a thread back on a CPU without a sched_switch event now and then (about
//! once a second per CPU on a VM of the tests): a probe finds its thread is not the task the
//! CPU's last traced switch brought in, and takes the thread's time from its task then, as the
//! scheduler last updated it (at most a tick before).

use aya_ebpf::{
    bindings::{bpf_perf_event_value, BPF_F_CURRENT_CPU},
    helpers::{bpf_perf_event_read_value, bpf_probe_read_kernel},
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

/// Offsets in the kernel's structures (`task_struct`, `cfs_rq`, `rq`), set by the daemon at load
/// from the kernel's BTF. TASK_CFS_RQ_OFFSET is 0 on kernels without group scheduling, which
/// give no way to the run queue: the wall time since a switch in then counts whole.
#[no_mangle]
static TASK_RUNTIME_OFFSET: u64 = 0;
#[no_mangle]
static TASK_CFS_RQ_OFFSET: u64 = 0;
#[no_mangle]
static CFS_RQ_RQ_OFFSET: u64 = 0;
#[no_mangle]
static RQ_CLOCK_OFFSET: u64 = 0;
#[no_mangle]
static RQ_CLOCK_TASK_OFFSET: u64 = 0;

/// How much wall time a probe counts on from the last reading of the run queue before it reads
/// it again: a scheduler tick (1–10 ms) brings the run queue's clocks up to date, so reading
/// more often would mostly find the same values.
const REFRESH_NS: u64 = 1_000_000;

/// Per CPU, its run queue, the task its last context switch brought in, and the counters when
/// the profiled thread running on it came in.
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

/// The u64 at kernel address `addr`, 0 where it cannot be read.
#[inline(always)]
fn kernel_u64(addr: u64) -> u64 {
    unsafe { bpf_probe_read_kernel(addr as *const u64) }.unwrap_or(0)
}

/// This CPU's run queue, found once from the fair-class queue of `task`, the task coming on (or
/// running on) it; 0 where the kernel gives no way to it.
#[inline(always)]
fn cpu_rq(cpu: &mut CpuSwitch, task: u64) -> u64 {
    let cfs_rq_offset = config(&TASK_CFS_RQ_OFFSET);
    if cpu.rq == 0 && cfs_rq_offset != 0 {
        let cfs_rq = kernel_u64(task + cfs_rq_offset);
        if cfs_rq != 0 {
            cpu.rq = kernel_u64(cfs_rq + config(&CFS_RQ_RQ_OFFSET));
        }
    }
    cpu.rq
}

/// What run queue `rq`'s clock has lost to steal and interrupts so far (0 without it).
#[inline(always)]
fn rq_lost_ns(rq: u64) -> u64 {
    if rq == 0 {
        return 0;
    }
    let clock = kernel_u64(rq + config(&RQ_CLOCK_OFFSET));
    let clock_task = kernel_u64(rq + config(&RQ_CLOCK_TASK_OFFSET));
    clock.saturating_sub(clock_task)
}

/// Takes the on-CPU time of the thread of `task`, which is on this CPU (`cpu`) at `now`: the
/// scheduler's accounting (exact when it comes in), and the run queue's lost time from which the
/// wall time on counts.
#[inline(always)]
pub(crate) fn account_from(st: &mut ThreadState, cpu: &mut CpuSwitch, task: u64, now: u64) {
    st.oncpu_ns = kernel_u64(task + config(&TASK_RUNTIME_OFFSET));
    st.oncpu_accounted_ns = now;
    st.oncpu_rq_lost_ns = rq_lost_ns(cpu_rq(cpu, task));
}

/// The same for a thread whose state starts at `now`, while it runs on this CPU. The scheduler's
/// accounting is then as of its last update (at most a tick before).
#[inline(always)]
pub(crate) fn account_start(st: &mut ThreadState, task: u64, now: u64) {
    st.task = task;
    if let Some(cpu) = CPU_SWITCH.get_ptr_mut(0) {
        let cpu = unsafe { &mut *cpu };
        cpu.task = task;
        account_from(st, cpu, task, now);
    }
}

/// On-CPU time and counter totals of the running thread (the caller's), up to `now`: its time at
/// its switch in, plus the wall time since, less what its run queue lost meanwhile (read again
/// once REFRESH_NS have passed), and the counts since its switch in.
#[inline(always)]
pub(crate) fn thread_now(st: &mut ThreadState, now: u64) -> (u64, [u64; NUM_COUNTERS]) {
    let mut counters = st.counters;
    let Some(cpu) = CPU_SWITCH.get_ptr_mut(0) else {
        return (st.oncpu_ns, counters);
    };
    let cpu = unsafe { &mut *cpu };
    if cpu.task != st.task {
        // The thread came back on this CPU without a traced switch: its time is the task's, as
        // the scheduler last updated it, and counts on from now.
        cpu.task = st.task;
        account_from(st, cpu, st.task, now);
    }
    if config(&COUNTERS_ENABLED) != 0 {
        let cur = read_counters();
        for i in 0..NUM_COUNTERS {
            counters[i] += cur[i].wrapping_sub(cpu.counters[i]);
        }
    }
    let mut since = now.saturating_sub(st.oncpu_accounted_ns);
    if since >= REFRESH_NS {
        let lost_now = rq_lost_ns(cpu.rq);
        let lost = lost_now.saturating_sub(st.oncpu_rq_lost_ns);
        // More lost than passed means the two readings are not of one run queue's clocks.
        if lost <= since {
            since -= lost;
        }
        st.oncpu_ns += since;
        st.oncpu_accounted_ns = now;
        st.oncpu_rq_lost_ns = lost_now;
        since = 0;
    }
    (st.oncpu_ns + since, counters)
}
