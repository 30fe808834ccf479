//! The scheduler programs: sched_stat_runtime adds the run time the scheduler accounts to a
//! thread's on-CPU time, sched_switch gives the per-CPU counter counts since the last switch to
//! the thread leaving the CPU.
//!
//! They are raw tracepoints: the kernel skips a classic tracepoint's program whenever another BPF
//! program or a BPF map system call is active on the CPU, which would lose run time; a raw
//! tracepoint's program is only skipped when it would re-enter itself.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use profiler_common::NUM_COUNTERS;

use crate::{
    oncpu::{read_counters, COUNTERS_ENABLED, CPU_SWITCH},
    shared::config,
    threads::{task_filter_slot, thread, TASK_FILTER, TASK_THREADS},
};

/// Every time the scheduler accounts run time to a task (at every tick, switch, yield and
/// wake-up that updates it, possibly from another CPU): add it to the thread's on-CPU time.
/// It runs for every task on the node, hundreds of thousands of times a second beside processes
/// that poll with sched_yield, hence the filter in front of the lookup.
#[raw_tracepoint(tracepoint = "sched_stat_runtime")]
pub fn sched_stat_runtime(ctx: RawTracePointContext) -> i32 {
    let task: u64 = ctx.arg(0);
    let runtime: u64 = ctx.arg(1);
    let (word, bit) = task_filter_slot(task);
    if TASK_FILTER.get(word).is_none_or(|w| w & bit == 0) {
        return 0;
    }
    let Some(thread) = (unsafe { TASK_THREADS.get(&task) }) else {
        return 0;
    };
    if let Some(st) = self::thread(thread.tid) {
        st.oncpu_ns += runtime;
        st.oncpu_accounted_ns = unsafe { bpf_ktime_get_ns() };
    }
    0
}

/// Every context switch: the thread coming in starts its time on this CPU now. With counters,
/// the per-CPU counts since the last switch belong to the thread leaving (the current task).
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(_ctx: RawTracePointContext) -> i32 {
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(cpu) = CPU_SWITCH.get_ptr_mut(0) else {
        return 0;
    };
    let cpu = unsafe { &mut *cpu };
    let counters_now = read_counters();
    if config(&COUNTERS_ENABLED) != 0 {
        let prev = bpf_get_current_pid_tgid() as u32;
        if let Some(st) = thread(prev) {
            for i in 0..NUM_COUNTERS {
                st.counters[i] += counters_now[i].wrapping_sub(cpu.counters[i]);
            }
        }
    }
    cpu.last_switch_ns = now;
    cpu.counters = counters_now;
    0
}
