//! The scheduler programs: sched_stat_runtime adds the run time the scheduler accounts to a
//! thread's on-CPU time, sched_switch gives the per-CPU counter counts since the last switch to
//! the thread leaving the CPU. Both run for every task on the node and leave after one array
//! read unless a task they name is one of the profiled threads (TASK_FILTER).
//!
//! The daemon detaches them while the node has no MPI thread (see the capture's scheduler.rs):
//! oncpu.rs's SCHEDULER_DETACHED is set then, and a thread's first probed call holds its process
//! until they are attached again.
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
    if !profiled(task) {
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

/// Every context switch to a profiled thread: it starts its time on this CPU now, and with
/// counters the per-CPU counts from now on are its own. With counters, the counts since a
/// profiled thread came in belong to it when it leaves (the current task). A switch between two
/// other tasks, most of them, reads no clock and no counter: the time and counts since the last
/// switch matter only to the profiled thread that is running (`oncpu::thread_now`), whose own
/// switch in set them.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> i32 {
    // TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next, ...)
    let (prev, next): (u64, u64) = (ctx.arg(1), ctx.arg(2));
    let counting = config(&COUNTERS_ENABLED) != 0;
    let leaving = counting && profiled(prev);
    let coming = profiled(next);
    if !leaving && !coming {
        return 0;
    }
    let Some(cpu) = CPU_SWITCH.get_ptr_mut(0) else {
        return 0;
    };
    let cpu = unsafe { &mut *cpu };
    let counters_now = read_counters();
    if leaving {
        let prev = bpf_get_current_pid_tgid() as u32;
        if let Some(st) = thread(prev) {
            for i in 0..NUM_COUNTERS {
                st.counters[i] += counters_now[i].wrapping_sub(cpu.counters[i]);
            }
        }
    }
    if coming {
        cpu.last_switch_ns = unsafe { bpf_ktime_get_ns() };
        cpu.counters = counters_now;
    }
    0
}

/// The floor of the scheduler programs: an empty program on sched_switch. The daemon never
/// attaches it; the overhead bench attaches it alone, as the cost per context switch of the
/// kernel's dispatch of any raw tracepoint program, beside the real ones'.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch_floor(_ctx: RawTracePointContext) -> i32 {
    0
}

/// Whether `task` may be a profiled thread: its bit in TASK_FILTER (shared by a few others).
#[inline(always)]
fn profiled(task: u64) -> bool {
    let (word, bit) = task_filter_slot(task);
    TASK_FILTER.get(word).is_some_and(|w| w & bit != 0)
}
