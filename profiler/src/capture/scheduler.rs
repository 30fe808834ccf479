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
//! its process (a `hold::FIRST_CALL` report) until the daemon has attached them again. Detaching
//! takes two statistics updates: the first sets the flag; the second, at least DRAIN_GRACE
//! later, detaches only if it still finds no thread state. A thread that made its state after
//! that look read the flag after making it (threads.rs), so it is held.

use std::time::{Duration, Instant};

use aya::{
    maps::{Array, MapData},
    programs::{raw_trace_point::RawTracePointLink, RawTracePoint},
    Ebpf,
};

use super::{
    map_mut,
    on_demand::{self, OnDemandLinks},
    CaptureError,
};

/// The programs and the raw tracepoints they attach to.
pub(super) const SCHED_RAW_TRACEPOINTS: [(&str, &str); 2] = [
    ("sched_stat_runtime", "sched_stat_runtime"),
    ("sched_switch", "sched_switch"),
];
const FLAG_MAP: &str = "SCHEDULER_DETACHED";
/// The least time from setting the flag to the last look for thread states: far longer than a
/// probe takes from making a state to reading the flag.
const DRAIN_GRACE: Duration = Duration::from_millis(100);

/// The scheduler programs' links, and whether they may be detached.
pub(super) struct SchedulerPrograms {
    links: OnDemandLinks<RawTracePointLink>,
    /// Detached while the node has no MPI thread: only once a thread's first call can be held.
    on_demand: bool,
    /// Since when the flag is set while the programs are still attached.
    draining_since: Option<Instant>,
}

impl SchedulerPrograms {
    /// Loads and attaches the programs: on from the start, so that the daemon's own measurements
    /// and the processes it finds running are accounted.
    pub(super) fn load(ebpf: &mut Ebpf) -> Result<SchedulerPrograms, CaptureError> {
        let names = SCHED_RAW_TRACEPOINTS.map(|(name, _)| name);
        on_demand::load_programs(ebpf, names, RawTracePoint::load)?;
        let mut programs = SchedulerPrograms {
            links: OnDemandLinks::new("scheduler programs"),
            on_demand: false,
            draining_since: None,
        };
        programs.attach(ebpf)?;
        Ok(programs)
    }

    /// Whether the programs are attached.
    pub(super) fn attached(&self) -> bool {
        self.links.attached()
    }

    /// From now on the programs are detached while the node has no MPI thread (a thread's first
    /// call is held until they are attached again).
    pub(super) fn detach_when_idle(&mut self) {
        self.on_demand = true;
    }

    /// Lets every thread's first call run on unheld from now on, the programs attached or not
    /// (at shutdown: nobody would resume it).
    pub(super) fn never_hold(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        self.on_demand = false;
        self.draining_since = None;
        set_flag(ebpf, false)
    }

    /// Attaches the programs unless they are, then lets new threads run unheld.
    pub(super) fn attach(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        self.links.attach(
            ebpf,
            SCHED_RAW_TRACEPOINTS,
            |p: &mut RawTracePoint, tracepoint| p.attach(tracepoint).and_then(|id| p.take_link(id)),
        )?;
        // Cleared only once attached: a thread made before would run without them.
        self.draining_since = None;
        set_flag(ebpf, false)
    }

    /// One step of detaching, at each statistics update, or an attach when the node is `busy`
    /// (it has an MPI thread or a tracked process); `idle_after`, how long it must have had
    /// none.
    pub(super) fn detach_if_idle(
        &mut self,
        ebpf: &mut Ebpf,
        busy: bool,
        idle_after: Duration,
        now: Instant,
    ) -> Result<(), CaptureError> {
        if !self.on_demand {
            return Ok(());
        }
        if busy {
            // Attached again if they are not: a thread whose first call could not be held (the
            // ring or the map of held processes was full) has run without them until now.
            return self.attach(ebpf);
        }
        match self.draining_since {
            Some(since) if now.duration_since(since) >= DRAIN_GRACE => {
                // The flag stays set: the next thread's first call is held.
                self.draining_since = None;
                self.links.detach();
            }
            Some(_) => {}
            None if self.links.idle_long_enough(false, now, idle_after) => {
                set_flag(ebpf, true)?;
                self.draining_since = Some(now);
            }
            None => {}
        }
        Ok(())
    }
}

/// Sets or clears SCHEDULER_DETACHED.
fn set_flag(ebpf: &mut Ebpf, detached: bool) -> Result<(), CaptureError> {
    let mut flag: Array<&mut MapData, u32> = map_mut(ebpf, FLAG_MAP)?;
    flag.set(0, u32::from(detached), 0)
        .map_err(|source| CaptureError::Map {
            map: FLAG_MAP,
            source,
        })
}
