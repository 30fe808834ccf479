//! The watch on library opens: the BPF program `library_open_exit` (profiler-ebpf's
//! libraries.rs) holds a process that opens an MPI library at a path the daemon has not handled
//! and reports it here; the daemon attaches, marks the path known, and resumes the process. The
//! hold guard (hold_guard.rs) resumes it instead when the daemon does not in time. The same ring
//! reports the processes held at a thread's first probed call while the scheduler programs are
//! detached (scheduler.rs).
//!
//! While it is attached, every system call on the node takes the kernel's traced path (about
//! 40 ns here). With `mpi.launchers`, it is attached only while the node runs a launcher of MPI
//! ranks or an MPI process: while it is detached, the BPF flag LIBRARY_WATCH_DETACHED is set and
//! the exec of a process a launcher started holds that process (a `hold::LAUNCHED` report) until
//! the daemon has attached the watch again ([`FlaggedLinks`]).

use std::{
    collections::HashSet,
    os::fd::{AsFd, OwnedFd},
    sync::Arc,
    time::Duration,
};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{trace_point::TracePointLink, TracePoint},
};
use profiler_common::{hold, HoldReport, COMM_BYTES, LIBRARY_PATH_BYTES};

use super::{
    hold_guard::HeldProcesses, map_mut, map_ref, on_demand::FlaggedLinks, read_record, take_map,
    tracefs, usage, Capture, CaptureError,
};

/// The program and the tracepoint it runs at: the exit of openat, the call the dynamic loader
/// opens libraries with.
pub(super) const PROGRAM: &str = "library_open_exit";
const CATEGORY: &str = "syscalls";
const EVENT: &str = "sys_exit_openat";
const PLACES: [(&str, &str); 1] = [(PROGRAM, EVENT)];

/// `library_open_exit`'s link.
pub(super) type LibraryWatch = FlaggedLinks<TracePoint, TracePointLink>;

/// A process the BPF programs held, and why.
#[derive(Debug)]
pub enum HoldEvent {
    LibraryOpen(LibraryOpenEvent),
    /// One of its threads made its first probed call while the scheduler programs were
    /// detached: resumed once they are attached.
    FirstCall {
        held: HeldProcess,
        /// CLOCK_MONOTONIC ns of the hold.
        held_ns: u64,
    },
    /// A launcher of MPI ranks started it, and it exec'ed while the library watch was detached:
    /// resumed once the watch is attached.
    Launched {
        held: HeldProcess,
        /// CLOCK_MONOTONIC ns of the hold.
        held_ns: u64,
    },
}

/// A process opened a file named like an MPI library at a path the daemon has not handled; it is
/// stopped until the event is dropped, which resumes it.
#[derive(Debug)]
pub struct LibraryOpenEvent {
    pub held: HeldProcess,
    pub fd: u32,
    /// The key to mark known once handled.
    pub path_hash: u64,
    /// CLOCK_MONOTONIC ns of the open (when the process was stopped).
    pub opened_ns: u64,
    /// The path as the process passed it (for the log; cut at LIBRARY_PATH_BYTES).
    pub path: String,
}

/// Whether process `pid` runs a program named like one of `launchers`: false once it has exited
/// or runs another program, `None` when /proc cannot tell (it is kept then).
fn runs_launcher(launchers: &HashSet<String>, pid: u32) -> Option<bool> {
    match crate::proc::read_stat(pid) {
        Ok(stat) => Some(launchers.contains(&stat.comm)),
        Err(crate::proc::ProcError::ProcessGone { .. }) => Some(false),
        Err(_) => None,
    }
}

/// An MPI process whose parent is not a launcher of `mpi.launchers`
/// ([`Capture::unlisted_parent`]).
#[derive(Debug)]
pub struct UnlistedParent {
    /// The process's command name.
    pub comm: String,
    pub ppid: u32,
    /// The parent's command name, as `ps -o comm` shows it.
    pub parent: String,
    /// A listed launcher started the parent (a wrapper script, a container starter): the parent
    /// starts MPI ranks, and listing it would hold them between jobs.
    pub parent_launched: bool,
}

/// A process the BPF program stopped: resumed (SIGCONT) and taken off the held processes when
/// dropped, whatever happened to the event in between, so no error path of the daemon leaves it
/// stopped.
#[derive(Debug)]
pub struct HeldProcess {
    pub pid: u32,
    /// Keeps the hold guard running until the process is resumed.
    held: Arc<HeldProcesses>,
}

impl Drop for HeldProcess {
    fn drop(&mut self) {
        let pid = self.pid;
        match self.held.resume(pid) {
            (_, Err(error)) => tracing::error!(
                "cannot resume pid {pid}, stopped at an MPI library's open, at its first MPI \
                 call or at its exec: {error}; resume it with `kill -CONT {pid}` (the daemon \
                 needs CAP_KILL for another user's process)"
            ),
            (false, Ok(())) => tracing::info!(
                "pid {pid} had been resumed by the hold guard already: it was held longer than \
                 mpi.hold_limit_s"
            ),
            (true, Ok(())) => {}
        }
    }
}

/// The ring the programs report holds on, and the processes held.
pub(super) struct Holding {
    ring: RingBuf<MapData>,
    held: Arc<HeldProcesses>,
}

/// The offset of the return value in sys_exit_openat's records, for the program's globals.
pub(super) fn openat_ret_offset() -> Result<u64, CaptureError> {
    tracefs::field_offset(CATEGORY, EVENT, "ret")
}

impl Capture {
    /// Starts holding processes for the daemon: the ring the programs report holds on, and the
    /// hold guard, which resumes a process held longer than `hold_limit`. Returns the guard's
    /// pid. Nothing is held until [`Capture::watch_library_opens`] or
    /// [`Capture::detach_scheduler_when_idle`].
    pub fn start_holding(&mut self, hold_limit: Duration) -> Result<u32, CaptureError> {
        // The ring and the guard first: the programs stop processes that only a drained ring or
        // the guard resumes.
        let ring: RingBuf<MapData> = take_map(&mut self.ebpf, "HOLDS")?;
        let held = HeldProcesses::start(take_map(&mut self.ebpf, "HELD_PROCESSES")?, hold_limit)?;
        let guard_pid = held.guard_pid();
        self.holding = Some(Holding { ring, held });
        Ok(guard_pid)
    }

    /// Attaches the program that holds processes opening new MPI libraries (once holding).
    pub fn watch_library_opens(&mut self) -> Result<(), CaptureError> {
        if let Some(unavailable) = self.library_watch_unavailable.take() {
            return Err(unavailable);
        }
        if self.holding.is_none() {
            return Err(CaptureError::NotHolding);
        }
        self.library_watch = Some(FlaggedLinks::load(
            &mut self.ebpf,
            "library watch",
            &PLACES,
            TracePoint::load,
            |p, event| p.attach(CATEGORY, event).and_then(|id| p.take_link(id)),
            "LIBRARY_WATCH_DETACHED",
        )?);
        Ok(())
    }

    /// Notes the launchers of MPI ranks, by the command names of `launchers` (as `ps -o comm`
    /// shows them, 15 bytes at most): those running now, and from now on those that exec and
    /// the processes they fork. Only these processes are held at their exec or first MPI call
    /// (see [`Capture::detach_library_watch_when_idle`], [`Capture::detach_scheduler_when_idle`]).
    pub fn note_launchers(&mut self, launchers: &[String]) -> Result<(), CaptureError> {
        let map = |map| move |source| CaptureError::Map { map, source };
        let mut names: HashMap<&mut MapData, [u8; COMM_BYTES], u8> =
            map_mut(&mut self.ebpf, "LAUNCHERS")?;
        for launcher in launchers {
            let mut comm = [0u8; COMM_BYTES];
            let len = launcher.len().min(COMM_BYTES - 1);
            comm[..len].copy_from_slice(&launcher.as_bytes()[..len]);
            names.insert(comm, 1, 0).map_err(map("LAUNCHERS"))?;
        }
        let launchers: HashSet<String> = launchers.iter().cloned().collect();
        // Those the exec program did not see start, which may start ranks any time.
        let running = crate::proc::pids().map_err(|e| CaptureError::Io {
            what: "the list of processes, to find the launchers running".into(),
            source: std::io::Error::other(e),
        })?;
        let mut pids: HashMap<&mut MapData, u32, u64> = map_mut(&mut self.ebpf, "LAUNCHER_PIDS")?;
        let now = usage::clock_ns(libc::CLOCK_MONOTONIC);
        for pid in running {
            if runs_launcher(&launchers, pid) == Some(true) {
                pids.insert(pid, now, 0).map_err(map("LAUNCHER_PIDS"))?;
            }
        }
        // Only once all is noted: holds depend on it.
        self.launchers = launchers;
        Ok(())
    }

    /// From now on the library watch is detached while the node runs no launcher and no MPI
    /// process, and the exec of a process a launcher started holds it until the watch is
    /// attached again (once watching, and launchers noted).
    pub fn detach_library_watch_when_idle(&mut self) -> Result<(), CaptureError> {
        if self.launchers.is_empty() {
            return Err(CaptureError::NoLaunchers);
        }
        let Some(watch) = &mut self.library_watch else {
            return Err(CaptureError::NotHolding);
        };
        watch.detach_when_idle();
        Ok(())
    }

    /// Attaches the library watch unless it is (a process a launcher started was held at its
    /// exec for it); whether it is.
    pub fn attach_library_watch(&mut self) -> bool {
        let Some(watch) = &mut self.library_watch else {
            return false;
        };
        if let Err(e) = watch.attach(&mut self.ebpf) {
            tracing::error!(
                "cannot attach the library watch ({e}): a process that opens an MPI library at a \
                 new path is not held; attaching is tried again at the next statistics update"
            );
            return false;
        }
        true
    }

    /// Whether the library watch is attached.
    pub fn library_watch_attached(&self) -> bool {
        self.library_watch
            .as_ref()
            .is_some_and(LibraryWatch::attached)
    }

    /// Whether a launcher of MPI ranks runs on the node. Forgets the launchers that have exited
    /// (or whose pid another program has taken) and the processes and threads launchers started
    /// that have exited, unseen by the exit tracepoint's program: a stale pid would make a
    /// later process of that pid a launcher, or one a launcher started, and so held.
    pub(super) fn launchers_running(&mut self) -> bool {
        if let Ok(mut launched) =
            map_mut::<HashMap<&mut MapData, u32, u8>>(&mut self.ebpf, "LAUNCHED")
        {
            let gone: Vec<u32> = launched
                .keys()
                .filter_map(Result::ok)
                .filter(|&id| !crate::proc::is_alive(id))
                .collect();
            for id in &gone {
                let _ = launched.remove(id);
            }
        }
        let Ok(mut pids) =
            map_mut::<HashMap<&mut MapData, u32, u64>>(&mut self.ebpf, "LAUNCHER_PIDS")
        else {
            // Unreadable: as if one ran, the watch stays attached.
            return true;
        };
        let gone: Vec<u32> = pids
            .keys()
            .filter_map(Result::ok)
            .filter(|&pid| runs_launcher(&self.launchers, pid) == Some(false))
            .collect();
        for pid in &gone {
            let _ = pids.remove(pid);
        }
        pids.keys().next().is_some()
    }

    /// The parent of MPI process `pid` when only the processes that the launchers start are
    /// held between jobs and its parent is not one of them: this process would not have been
    /// held, nor one started the same way between jobs. `None` otherwise, or when /proc cannot
    /// tell.
    pub fn unlisted_parent(&self, pid: u32) -> Option<UnlistedParent> {
        let holding_for_launchers = self.scheduler.on_demand()
            || self
                .library_watch
                .as_ref()
                .is_some_and(LibraryWatch::on_demand);
        if self.launchers.is_empty() || !holding_for_launchers {
            return None;
        }
        let process = crate::proc::read_stat(pid).ok()?;
        let parent = crate::proc::read_stat(process.ppid).ok()?;
        if self.launchers.contains(&parent.comm) {
            return None;
        }
        let parent_launched = map_ref::<HashMap<&MapData, u32, u8>>(&self.ebpf, "LAUNCHED")
            .is_ok_and(|launched| launched.get(&parent.pid, 0).is_ok());
        Some(UnlistedParent {
            comm: process.comm,
            ppid: parent.pid,
            parent: parent.comm,
            parent_launched,
        })
    }

    /// From now on the scheduler programs are detached while the node has no MPI thread, and
    /// the first probed call of a thread of a process a launcher started holds it until they are
    /// attached again (once holding, and launchers noted).
    pub fn detach_scheduler_when_idle(&mut self) -> Result<(), CaptureError> {
        if self.holding.is_none() {
            return Err(CaptureError::NotHolding);
        }
        if self.launchers.is_empty() {
            return Err(CaptureError::NoLaunchers);
        }
        self.scheduler.detach_when_idle();
        Ok(())
    }

    /// Starts the hold guard again if it exited (killed, or failed): the guard that was gone's
    /// exit status and the new guard's pid. `None` while it runs, or when no process is held.
    pub fn keep_hold_guard(&self) -> Option<Result<(String, u32), CaptureError>> {
        let watch = self.holding.as_ref()?;
        watch
            .held
            .keep_guard()
            .map_err(CaptureError::from)
            .transpose()
    }

    /// The held processes the hold guard resumed before the daemon did, and the guard's
    /// restarts.
    pub fn hold_guard_counts(&self) -> (u64, u64) {
        self.holding
            .as_ref()
            .map_or((0, 0), |watch| watch.held.counts())
    }

    /// Detaches the program: no process is held at a library open or at its exec from now
    /// on (those already reported are still drained by [`Capture::drain_holds`]).
    pub fn stop_watching_library_opens(&mut self) {
        let Some(mut watch) = self.library_watch.take() else {
            return;
        };
        if let Err(e) = watch.never_hold(&mut self.ebpf) {
            tracing::warn!("{e}: the exec of a process a launcher started may still hold it");
        }
        watch.detach_now();
    }

    /// A descriptor that becomes readable when a hold is reported; `None` while not watching.
    pub fn library_opens_wakeup(&self) -> Option<Result<OwnedFd, CaptureError>> {
        let watch = self.holding.as_ref()?;
        Some(
            watch
                .ring
                .as_fd()
                .try_clone_to_owned()
                .map_err(|source| CaptureError::Io {
                    what: "a descriptor of the ring buffer of held processes".into(),
                    source,
                }),
        )
    }

    /// The holds reported since the last call: each process is stopped until resumed.
    pub fn drain_holds(&mut self) -> Vec<HoldEvent> {
        let Some(watch) = self.holding.as_mut() else {
            return Vec::new();
        };
        let mut events = Vec::new();
        while let Some(item) = watch.ring.next() {
            let Some(record) = read_record::<HoldReport>(&item) else {
                continue;
            };
            let held = HeldProcess {
                pid: record.pid,
                held: watch.held.clone(),
            };
            let held_ns = record.held_ns;
            match record.reason {
                hold::FIRST_CALL => {
                    events.push(HoldEvent::FirstCall { held, held_ns });
                    continue;
                }
                hold::LAUNCHED => {
                    events.push(HoldEvent::Launched { held, held_ns });
                    continue;
                }
                _ => {}
            }
            let len = record
                .path
                .iter()
                .position(|&b| b == 0)
                .unwrap_or(LIBRARY_PATH_BYTES);
            events.push(HoldEvent::LibraryOpen(LibraryOpenEvent {
                held,
                fd: record.fd,
                path_hash: record.path_hash,
                opened_ns: record.held_ns,
                path: String::from_utf8_lossy(&record.path[..len]).into_owned(),
            }));
        }
        events
    }

    /// Marks a path handled: opening it again holds no process.
    pub fn mark_library_path_known(&mut self, path_hash: u64) -> Result<(), CaptureError> {
        let mut known: HashMap<&mut MapData, u64, u8> =
            map_mut(&mut self.ebpf, "KNOWN_LIBRARY_PATHS")?;
        known
            .insert(path_hash, 1, 0)
            .map_err(|source| CaptureError::Map {
                map: "KNOWN_LIBRARY_PATHS",
                source,
            })
    }

    /// Detaches the program and resumes every process it reported and the daemon has not
    /// handled: first thing at shutdown, and on any error that ends the daemon.
    pub fn release_held_processes(&mut self) {
        if self.holding.is_none() {
            return;
        }
        self.stop_watching_library_opens();
        // A run of the program that began before the detach may still be stopping a process and
        // reporting it: give it time to finish before the last drain. No thread's first call
        // holds its process from now on either.
        if let Err(e) = self.scheduler.never_hold(&mut self.ebpf) {
            tracing::warn!("{e}: a thread's first MPI call may still hold its process");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
        // Dropped at once: each resumes its process.
        let released = self.drain_holds().len();
        if released > 0 {
            tracing::info!("resumed {released} held processes at shutdown");
        }
        // Nothing is reported any more: later drains find no ring, and a second call does nothing.
        // The guard stops once the processes the daemon still holds (waiting for a read) are
        // resumed too.
        self.holding = None;
    }

    /// Holds the programs could not report (the ring or the map of held processes was full):
    /// those processes were not held.
    pub fn holds_lost(&self) -> u64 {
        map_ref::<PerCpuArray<&MapData, u64>>(&self.ebpf, "HOLDS_LOST")
            .ok()
            .and_then(|array| array.get(&0, 0).ok())
            .map_or(0, |values| values.iter().sum())
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.release_held_processes();
    }
}

/// Processes held at the open of an MPI library at a new path (see `mpi.hold_new_libraries`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LibraryOpenStats {
    /// Processes stopped until the daemon had handled the library they opened.
    pub held: u64,
    /// Their stopped time, summed: from the open to the resume, in ns.
    pub held_ns: u64,
    /// Library files (MPI libraries and PMPI interposers) attached while a process was held.
    pub attached: u64,
    /// Processes stopped at a thread's first probed call until the scheduler programs were
    /// attached again (they are detached while the node has no MPI thread).
    pub first_calls_held: u64,
    /// Their stopped time, summed, in ns.
    pub first_calls_held_ns: u64,
    /// Processes that launchers of MPI ranks started, stopped at their exec until the library
    /// watch was attached again (it is detached while the node has no launcher and no MPI
    /// process).
    pub launched_held: u64,
    /// Their stopped time, summed, in ns.
    pub launched_held_ns: u64,
    /// Holds that could not be reported (the ring buffer or the map of held processes was
    /// full): not held.
    pub not_held: u64,
    /// Reads of library files found at run time that did not return within
    /// `mpi.library_read_timeout_ms` (a file system that does not answer).
    pub reads_timed_out: u64,
    /// Those reads still running.
    pub reads_stuck: u64,
    /// Held processes the hold guard resumed before the daemon did (held past
    /// `mpi.hold_limit_s`).
    pub resumed_by_guard: u64,
    /// Hold guards started again after the one before exited.
    pub guard_restarts: u64,
}
