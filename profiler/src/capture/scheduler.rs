//! The scheduler programs (profiler-ebpf's scheduler.rs): the raw tracepoints sched_stat_runtime
//! and sched_switch, which give each MPI thread its on-CPU time.
//!
//! They run for every task on the node, at every context switch and every update of a task's
//! run time: about 100 ns per sched_yield of any process here (docs/performance.md, "System-call
//! tax"). With `capture.scheduler_on_demand`, where the daemon can hold processes (its hold
//! guard runs), they are attached only while the node has an MPI thread, and for
//! `capture.detach_idle_after_s` after the last one.
//!
//! A thread's on-CPU time is whole only if they run from its first probed call on. So while they
//! are detached, the BPF flag SCHEDULER_DETACHED is set, and a thread's first probed call holds
//! its process (a `hold::FIRST_CALL` report) until the daemon has attached them again
//! ([`FlaggedLinks`]): the work they wait for is a thread state, which a probe makes before it
//! reads the flag (threads.rs).

use aya::{
    programs::{raw_trace_point::RawTracePointLink, RawTracePoint},
    Ebpf, EbpfLoader,
};

use super::{on_demand::FlaggedLinks, program_mut, CaptureError, BPF_OBJECT};

/// The programs and the raw tracepoints they attach to.
pub(super) const SCHED_RAW_TRACEPOINTS: [(&str, &str); 2] = [
    ("sched_stat_runtime", "sched_stat_runtime"),
    ("sched_switch", "sched_switch"),
];

/// The scheduler programs' links.
pub(super) type SchedulerPrograms = FlaggedLinks<RawTracePoint, RawTracePointLink>;

/// Loads and attaches the programs: on from the start, so that the daemon's own measurements
/// and the processes it finds running are accounted.
pub(super) fn load(ebpf: &mut Ebpf) -> Result<SchedulerPrograms, CaptureError> {
    FlaggedLinks::load(
        ebpf,
        "scheduler programs",
        &SCHED_RAW_TRACEPOINTS,
        RawTracePoint::load,
        |p, tracepoint| p.attach(tracepoint).and_then(|id| p.take_link(id)),
        "SCHEDULER_DETACHED",
    )
}

/// The scheduler programs' floor (profiler-ebpf's `sched_switch_floor`, an empty program) on
/// sched_switch, alone, while this lives: what the kernel's dispatch of a raw tracepoint program
/// costs every context switch, the reference the overhead bench prints the real programs' cost
/// beside.
pub struct SchedulerFloor {
    /// The object, with its program attached: dropping it detaches the program.
    _ebpf: Ebpf,
}

impl SchedulerFloor {
    pub fn attach() -> Result<SchedulerFloor, CaptureError> {
        const NAME: &str = "sched_switch_floor";
        if BPF_OBJECT.is_empty() {
            return Err(CaptureError::NoBpfObject);
        }
        let mut ebpf = EbpfLoader::new().load(BPF_OBJECT)?;
        let program: &mut RawTracePoint = program_mut(&mut ebpf, NAME)?;
        program
            .load()
            .and_then(|()| program.attach("sched_switch"))
            .map_err(|source| CaptureError::Program {
                program: NAME,
                source,
            })?;
        Ok(SchedulerFloor { _ebpf: ebpf })
    }
}
