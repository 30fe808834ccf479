//! The scheduler program (profiler-ebpf's scheduler.rs): the raw tracepoint sched_switch, which
//! gives each MPI thread its on-CPU time.
//!
//! It runs at every context switch on the node, whichever task it is for (docs/performance.md,
//! "System-call tax"). With `capture.scheduler_on_demand`, where the daemon can hold processes
//! (its hold guard runs), it is attached only while the node has an MPI thread, and for
//! `capture.detach_idle_after_s` after the last one.
//!
//! A thread's on-CPU time is right only if it runs from the thread's first probed call on. So
//! while it is detached, the BPF flag SCHEDULER_DETACHED is set, and a thread's first probed call
//! holds its process (a `hold::FIRST_CALL` report) until the daemon has attached it again
//! ([`FlaggedLinks`]): the work it waits for is a thread state, which a probe makes before it
//! reads the flag (threads.rs).

use aya::{
    programs::{raw_trace_point::RawTracePointLink, RawTracePoint},
    Ebpf, EbpfLoader,
};

use super::{on_demand::FlaggedLinks, program_mut, CaptureError, BPF_OBJECT};

/// The program and the raw tracepoint it attaches to.
pub(super) const SCHED_RAW_TRACEPOINTS: [(&str, &str); 1] = [("sched_switch", "sched_switch")];

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
