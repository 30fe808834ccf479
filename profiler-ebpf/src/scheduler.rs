//! The scheduler program: sched_switch notes on each CPU the task a switch brings in, takes a
//! profiled thread's on-CPU time from the scheduler when it comes on a CPU (oncpu.rs), and with
//! counters gives the per-CPU counter counts since its switch in to the thread leaving the CPU.
//! It runs at every context switch on the node and leaves after one array read unless a task it
//! names is one of the profiled threads (TASK_FILTER).
//!
//! It also measures what the daemon's own CPU delays the ranks: a profiled thread that a switch
//! takes off its CPU mid-burst while it could run on (preempted: the scheduler's `prev_state` is
//! TASK_RUNNING) has lost the CPU to the task coming in. When that task is a thread of the
//! daemon, the next switch on the CPU ends its run, and the run's time, from the thread's switch
//! out, is charged to the thread (`BurstTotals::daemon_delay_ns`) unless it came back on another
//! CPU meanwhile. A thread inside an MPI call, or polling, waits: a delay there costs it nothing.
//!
//! The daemon detaches it while the node has no MPI thread (see the capture's scheduler.rs):
//! oncpu.rs's SCHEDULER_DETACHED is set then, and a thread's first probed call holds its process
//! until it is attached again.
//!
//! It is a raw tracepoint: the kernel skips a classic tracepoint's program whenever another BPF
//! program or a BPF map system call is active on the CPU, which would lose switches; a raw
//! tracepoint's program is only skipped when it would re-enter itself.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use profiler_common::{CpuSwitch, NUM_COUNTERS};

use crate::{
    libraries::DAEMON_PID,
    oncpu::{account_from, read_counters, COUNTERS_ENABLED, CPU_SWITCH},
    shared::config,
    threads::{maybe_profiled, thread, TASK_THREADS},
};

/// Every context switch: the CPU notes the task coming in. A profiled thread coming in takes its
/// on-CPU time from the scheduler and counts on from now, and with counters the per-CPU counts
/// from now on are its own. With counters, the counts since a profiled thread came in belong to
/// it when it leaves (the current task). A switch between two other tasks, most of them, reads
/// no clock and no counter: the time and counts since the last switch matter only to the
/// profiled thread that is running (`oncpu::thread_now`), whose own switch in set them.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(ctx: RawTracePointContext) -> i32 {
    // TP_PROTO(bool preempt, struct task_struct *prev, struct task_struct *next,
    //          unsigned int prev_state)
    let (prev, next, prev_state): (u64, u64, u64) = (ctx.arg(1), ctx.arg(2), ctx.arg(3));
    let Some(cpu) = CPU_SWITCH.get_ptr_mut(0) else {
        return 0;
    };
    let cpu = unsafe { &mut *cpu };
    cpu.task = next;
    if cpu.displaced_tid != 0 {
        end_displacement(cpu);
    }
    let leaving = maybe_profiled(prev);
    let coming = maybe_profiled(next);
    if !leaving && !coming {
        return 0;
    }
    let counting = config(&COUNTERS_ENABLED) != 0;
    let counters_now = read_counters();
    if leaving {
        let prev = bpf_get_current_pid_tgid() as u32;
        if let Some(st) = thread(prev) {
            if counting {
                for i in 0..NUM_COUNTERS {
                    st.counters[i] += counters_now[i].wrapping_sub(cpu.counters[i]);
                }
            }
            // TASK_RUNNING (0): taken off the CPU while it could run on.
            if prev_state as u32 == 0 && st.depth == 0 && st.polling_calls == 0 {
                let now = unsafe { bpf_ktime_get_ns() };
                st.displaced_ns = now;
                cpu.displaced_tid = prev;
                cpu.displaced_ns = now;
            }
        }
    }
    if coming {
        cpu.counters = counters_now;
        let Some(known) = (unsafe { TASK_THREADS.get(&next) }) else {
            return 0;
        };
        if let Some(st) = thread(known.tid) {
            st.displaced_ns = 0;
            account_from(st, cpu, next, unsafe { bpf_ktime_get_ns() });
        }
    }
    0
}

/// The switch after a profiled thread was displaced on this CPU ends the run of the task that
/// displaced it (the current one): a thread of the daemon's delayed the thread by its run, unless
/// the thread came back on another CPU meanwhile.
#[inline(always)]
fn end_displacement(cpu: &mut CpuSwitch) {
    let tid = cpu.displaced_tid;
    cpu.displaced_tid = 0;
    if (bpf_get_current_pid_tgid() >> 32) as u32 != config(&DAEMON_PID) {
        return;
    }
    if let Some(st) = thread(tid) {
        if st.displaced_ns == cpu.displaced_ns {
            let now = unsafe { bpf_ktime_get_ns() };
            st.totals.daemon_delay_ns += now.saturating_sub(cpu.displaced_ns);
        }
    }
}

/// The floor of the scheduler programs: an empty program on sched_switch. The daemon never
/// attaches it; the overhead bench attaches it alone, as the cost per context switch of the
/// kernel's dispatch of any raw tracepoint program, beside the real ones'.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch_floor(_ctx: RawTracePointContext) -> i32 {
    0
}
