//! Links of programs attached only while the node has work for them (the file I/O programs, the
//! scheduler programs): attached at once when work comes, detached once there has been none for
//! a while (`capture.detach_idle_after_s`: jobs often follow each other within seconds, and
//! attaching takes about 1 ms where detaching takes about 1 s), and dropped on a thread of their
//! own.

use std::{
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::{
    programs::{Program, ProgramError},
    Ebpf,
};

use super::{program_mut, CaptureError};

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
        if let Some(detaching) = self.detaching.take() {
            let _ = detaching.join();
        }
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
