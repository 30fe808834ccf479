//! Links of programs attached only while the node has work for them (the file I/O programs, the
//! scheduler programs, the library watch): attached at once when work comes, detached once there
//! has been none for a while (`capture.detach_idle_after_s`: jobs often follow each other within
//! seconds, and attaching takes about 1 ms where detaching takes about 1 s), and dropped on a
//! thread of their own.
//!
//! Where work the programs would miss can wait for them, a BPF flag tells the other programs
//! that they are detached, and the work holds its process until the daemon has attached them
//! again ([`FlaggedLinks`]).

use std::{
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, MapData},
    programs::{Program, ProgramError},
    Ebpf,
};

use super::{map_mut, program_mut, CaptureError};

/// The least time from setting a [`FlaggedLinks`] flag to the last look for work: far longer
/// than a BPF program takes from making its work visible to reading the flag.
const DRAIN_GRACE: Duration = Duration::from_millis(100);

/// Loads the programs named, each of type `P` with `load` (its type's load), to be attached
/// later.
pub(super) fn load_programs<P>(
    ebpf: &mut Ebpf,
    names: impl IntoIterator<Item = &'static str>,
    load: fn(&mut P) -> Result<(), ProgramError>,
) -> Result<(), CaptureError>
where
    for<'a> &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    for name in names {
        load(program_mut(ebpf, name)?).map_err(|source| CaptureError::Program {
            program: name,
            source,
        })?;
    }
    Ok(())
}

/// The links of a set of programs attached on demand.
pub(super) struct OnDemandLinks<L: Send + 'static> {
    /// Which programs (for the log).
    what: &'static str,
    /// Each attached link; empty while detached.
    links: Vec<L>,
    /// Since when the programs have had no work, while attached.
    idle_since: Option<Instant>,
    /// The thread that drops the last links, which may still run.
    detaching: Option<JoinHandle<()>>,
}

impl<L: Send + 'static> OnDemandLinks<L> {
    pub(super) fn new(what: &'static str) -> Self {
        OnDemandLinks {
            what,
            links: Vec::new(),
            idle_since: None,
            detaching: None,
        }
    }

    /// Whether the programs run: attached, or being detached.
    pub(super) fn attached(&self) -> bool {
        !self.links.is_empty()
            || self
                .detaching
                .as_ref()
                .is_some_and(|thread| !thread.is_finished())
    }

    /// Attaches each (program, event) of `places` with `attach` (the program type's attach and
    /// `take_link`), unless the programs are attached; they have work from now on. On an
    /// error, nothing stays attached.
    pub(super) fn attach<P>(
        &mut self,
        ebpf: &mut Ebpf,
        places: impl IntoIterator<Item = (&'static str, &'static str)>,
        attach: impl Fn(&mut P, &str) -> Result<L, ProgramError>,
    ) -> Result<(), CaptureError>
    where
        for<'a> &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
    {
        self.idle_since = None;
        if !self.links.is_empty() {
            return Ok(());
        }
        // A program attaches to an event once: the links being dropped must be gone first.
        self.join_detach();
        for (name, event) in places {
            let link = program_mut(ebpf, name).and_then(|program| {
                attach(program, event).map_err(|source| CaptureError::Program {
                    program: name,
                    source,
                })
            });
            match link {
                Ok(link) => self.links.push(link),
                Err(e) => {
                    self.detach();
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Waits until the links being dropped are gone.
    fn join_detach(&mut self) {
        if let Some(detaching) = self.detaching.take() {
            let _ = detaching.join();
        }
    }

    /// Notes whether the programs have work now; true once they have had none for `idle_after`
    /// while attached.
    pub(super) fn idle_long_enough(
        &mut self,
        busy: bool,
        now: Instant,
        idle_after: Duration,
    ) -> bool {
        if busy || self.links.is_empty() {
            self.idle_since = None;
            return false;
        }
        now.duration_since(*self.idle_since.get_or_insert(now)) >= idle_after
    }

    /// Drops the links on a thread of their own: the kernel waits for a grace period of the
    /// tracepoints at each (about 1 s for the system call tracepoints here), which would stall
    /// the daemon's loop.
    pub(super) fn detach(&mut self) {
        self.idle_since = None;
        let links = std::mem::take(&mut self.links);
        if links.is_empty() {
            return;
        }
        // Named like every thread of the daemon (never held at an open of an MPI library).
        let spawned = std::thread::Builder::new()
            .name("mpiburst-detach".into())
            .spawn(move || drop(links));
        match spawned {
            Ok(handle) => self.detaching = Some(handle),
            Err(e) => tracing::warn!(
                "cannot start a thread to detach the {} ({e}): they were detached in the \
                 daemon's loop",
                self.what
            ),
        }
    }
}

/// Links attached on demand whose absence a BPF flag (an array of one `u32`, 1 while detached)
/// tells the programs, so that the work that needs them holds its process until the daemon has
/// attached them again: the scheduler programs (a thread's first probed call), the library
/// watch (the exec of a process a launcher started).
///
/// Detaching takes two steps, at two statistics updates: the first sets the flag; the second,
/// at least DRAIN_GRACE later, detaches only if the node still has no work for them. The BPF
/// side makes its work visible (a thread's state, a launcher's pid) before it reads the flag, so
/// work that the second look misses read the flag set, and is held.
pub(super) struct FlaggedLinks<P: 'static, L: Send + 'static> {
    links: OnDemandLinks<L>,
    /// Each (program, event) to attach.
    places: &'static [(&'static str, &'static str)],
    /// The program type's attach and `take_link`.
    attach_one: fn(&mut P, &str) -> Result<L, ProgramError>,
    /// The flag's map.
    flag: &'static str,
    /// Detached when idle: only once the work can be held.
    on_demand: bool,
    /// Since when the flag is set while the programs are still attached.
    draining_since: Option<Instant>,
}

impl<P: 'static, L: Send + 'static> FlaggedLinks<P, L>
where
    for<'a> &'a mut P: TryFrom<&'a mut Program, Error = ProgramError>,
{
    /// Loads the programs of `places` (`load`, their type's load) and attaches them: on from
    /// the start, until [`FlaggedLinks::detach_when_idle`].
    pub(super) fn load(
        ebpf: &mut Ebpf,
        what: &'static str,
        places: &'static [(&'static str, &'static str)],
        load: fn(&mut P) -> Result<(), ProgramError>,
        attach_one: fn(&mut P, &str) -> Result<L, ProgramError>,
        flag: &'static str,
    ) -> Result<Self, CaptureError> {
        load_programs(ebpf, places.iter().map(|&(name, _)| name), load)?;
        let mut programs = FlaggedLinks {
            links: OnDemandLinks::new(what),
            places,
            attach_one,
            flag,
            on_demand: false,
            draining_since: None,
        };
        programs.attach(ebpf)?;
        Ok(programs)
    }

    /// Whether the programs run.
    pub(super) fn attached(&self) -> bool {
        self.links.attached()
    }

    /// From now on the programs are detached while the node has no work for them (the work is
    /// held until they are attached again).
    pub(super) fn detach_when_idle(&mut self) {
        self.on_demand = true;
    }

    /// Whether the programs are detached while the node has no work for them.
    pub(super) fn on_demand(&self) -> bool {
        self.on_demand
    }

    /// Lets the work run on unheld from now on, the programs attached or not (at shutdown:
    /// nobody would resume it).
    pub(super) fn never_hold(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        self.on_demand = false;
        self.draining_since = None;
        set_flag(ebpf, self.flag, false)
    }

    /// Attaches the programs unless they are, then lets new work run unheld.
    pub(super) fn attach(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        self.links
            .attach(ebpf, self.places.iter().copied(), self.attach_one)?;
        // Cleared only once attached: work that came before would run without them.
        self.draining_since = None;
        set_flag(ebpf, self.flag, false)
    }

    /// Detaches the programs at once and waits until they are (at shutdown); the flag stays as
    /// it is.
    pub(super) fn detach_now(&mut self) {
        self.draining_since = None;
        self.links.detach();
        self.links.join_detach();
    }

    /// One step of detaching, at each statistics update, or an attach when the node is `busy`
    /// (it has work for them); `idle_after`, how long it must have had none.
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
            // Attached again if they are not: work that could not be held (the ring or the map
            // of held processes was full) has run without them until now.
            return self.attach(ebpf);
        }
        match self.draining_since {
            Some(since) if now.duration_since(since) >= DRAIN_GRACE => {
                // The flag stays set: the next work is held.
                self.draining_since = None;
                self.links.detach();
            }
            Some(_) => {}
            None if self.links.idle_long_enough(false, now, idle_after) => {
                set_flag(ebpf, self.flag, true)?;
                self.draining_since = Some(now);
            }
            None => {}
        }
        Ok(())
    }
}

/// Sets or clears the flag in map `name`.
fn set_flag(ebpf: &mut Ebpf, name: &'static str, detached: bool) -> Result<(), CaptureError> {
    let mut flag: Array<&mut MapData, u32> = map_mut(ebpf, name)?;
    flag.set(0, u32::from(detached), 0)
        .map_err(|source| CaptureError::Map { map: name, source })
}
