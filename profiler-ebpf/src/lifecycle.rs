//! The process lifecycle tracepoints: sched_process_exec reports every exec on the node (for the
//! daemon to find new MPI libraries) and notes the launchers of MPI ranks; sched_process_fork
//! notes the launchers' children; sched_process_exit ends the state of every exiting thread,
//! forgets an exiting launcher and stamps the exit time of the MPI processes the daemon tracks.

use aya_ebpf::{
    bindings::BPF_RB_NO_WAKEUP,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{HashMap, RingBuf},
    programs::TracePointContext,
};
use profiler_common::{lost, ExecRecord};

use crate::{
    libraries::{launched_exec, launched_exit, launcher_exit, launcher_fork},
    shared::{config, count_lost},
    threads::{release_state, thread},
};

/// Field offsets of these classic tracepoints, read by the daemon from their tracefs `format`
/// files at load (they differ between kernel versions).
#[no_mangle]
static EXEC_PID_OFFSET: u64 = 0;
#[no_mangle]
static EXIT_GROUP_DEAD_OFFSET: u64 = 0;
#[no_mangle]
static FORK_CHILD_PID_OFFSET: u64 = 0;
/// The execs of every process on the node (16 bytes each: 8,192 per drain of the daemon).
#[map]
static EXECS: RingBuf = RingBuf::with_byte_size(128 << 10, 0);
/// The MPI processes the daemon identified, by pid: the value becomes the process's exit time
/// (0 while it runs).
#[map]
static TRACKED: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);

/// Every exec on the node, reported to the daemon to find new MPI libraries.
#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let pid: u32 = unsafe { ctx.read_at(config(&EXEC_PID_OFFSET) as usize) }.unwrap_or(0);
    // A new program image: what the thread read from the old one's memory no longer holds.
    if let Some(st) = thread(bpf_get_current_pid_tgid() as u32) {
        st.world_slot = 0;
        // Epochs start at 1: no datatype size is reused until the next read.
        st.dtype_epoch = 0;
    }
    launched_exec((bpf_get_current_pid_tgid() >> 32) as u32);
    let record = ExecRecord {
        pid,
        _pad: 0,
        exec_ns: unsafe { bpf_ktime_get_ns() },
    };
    if EXECS
        .output::<ExecRecord>(&record, BPF_RB_NO_WAKEUP as u64)
        .is_err()
    {
        count_lost(lost::EXECS);
    }
    0
}

/// Every fork and thread creation on the node, in the parent: the children of MPI launchers are
/// noted (libraries.rs).
#[tracepoint]
pub fn sched_process_fork(ctx: TracePointContext) -> u32 {
    if let Ok(child) = unsafe { ctx.read_at::<u32>(config(&FORK_CHILD_PID_OFFSET) as usize) } {
        launcher_fork((bpf_get_current_pid_tgid() >> 32) as u32, child);
    }
    0
}

/// The exit of a thread; `group_dead` says it is the last thread of its process.
#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    release_state(tid);
    // The fork program notes the threads launchers create too: each goes with its thread.
    launched_exit(tid);
    let group_dead: u8 =
        unsafe { ctx.read_at(config(&EXIT_GROUP_DEAD_OFFSET) as usize) }.unwrap_or(0);
    if group_dead == 0 {
        return 0;
    }
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    launcher_exit(pid);
    if let Some(exit) = TRACKED.get_ptr_mut(pid) {
        unsafe { *exit = bpf_ktime_get_ns() };
    }
    0
}
