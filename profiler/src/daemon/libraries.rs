//! MPI libraries found at run time: those a process opens while held (`mpi.hold_new_libraries`),
//! those new processes map (the scans after exec), and the PMPI interposers of the processes
//! that map an MPI library. Their files are read off the loop with a deadline
//! (`mpi.library_read_timeout_ms`, file_reads.rs): a file on a hung mount delays no burst, and
//! a held process waits for it that long at most.

use std::{
    collections::HashMap,
    os::fd::OwnedFd,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use super::{
    attach::LibraryRead,
    file_reads::{FileReads, Finished, ReadProgress, MAX_STUCK},
    library_reads::{self, Opened, OpenedRead, ScannedProcess, SharedFiles},
    Daemon,
};
use crate::{
    capture::{usage, CaptureError, LibraryOpenEvent},
    export::LibraryOpenStats,
};

/// What a read of files was started for.
pub(super) enum ReadFor {
    /// The file held processes opened at the path with this hash.
    Opened { path_hash: u64 },
    /// The maps of new processes.
    Scan,
}

/// What a read found.
pub(super) enum ReadResult {
    Opened(Box<OpenedRead>),
    Scanned(Vec<ScannedProcess>),
}

/// What the daemon keeps about libraries found at run time.
pub(super) struct RunTimeLibraries {
    /// What the reads share with the loop.
    pub(super) files: Arc<SharedFiles>,
    reads: FileReads<ReadFor, ReadResult>,
    functions: Arc<[String]>,
    /// Processes held at the open of a path whose file is being read, by the path's hash: the
    /// ranks of a job open the same file at once, and one read serves them all.
    waiting: HashMap<u64, Vec<LibraryOpenEvent>>,
    /// A scan of new processes is being read: the next one waits for it, so that a file that
    /// hangs takes one thread, not one per process that maps it.
    scanning: bool,
    /// Reads are refused (the most are stuck), and a warning said so.
    refusing: bool,
    pub(super) stats: LibraryOpenStats,
}

impl RunTimeLibraries {
    pub(super) fn new(functions: &[String], deadline: Duration) -> Self {
        RunTimeLibraries {
            files: Default::default(),
            reads: FileReads::new(deadline),
            functions: functions.into(),
            waiting: HashMap::new(),
            scanning: false,
            refusing: false,
            stats: LibraryOpenStats::default(),
        }
    }

    /// The next read to finish, time out, or return after its deadline.
    pub(super) async fn read_finished(&mut self) -> Finished<ReadFor, ReadResult> {
        self.reads.next().await
    }

    /// Resumes every process waiting for a read (at shutdown).
    pub(super) fn release_waiting(&mut self) {
        self.waiting.clear();
    }

    /// Starts `read` with the probed functions and the shared files; false when refused
    /// because the most reads are stuck (said once until one returns).
    fn start(
        &mut self,
        what: ReadFor,
        read: impl FnOnce(&[String], &SharedFiles, &ReadProgress) -> ReadResult + Send + 'static,
    ) -> bool {
        let (functions, files) = (self.functions.clone(), self.files.clone());
        let started = self
            .reads
            .start(what, move |progress| read(&functions, &files, progress));
        if started.is_ok() {
            return true;
        }
        if !self.refusing {
            self.refusing = true;
            tracing::warn!(
                "{MAX_STUCK} reads of library files are stuck on file systems that do not answer \
                 (see the warnings before): until one returns, no library found at run time is \
                 read, held processes are resumed at once and run unprofiled, and new processes \
                 are not scanned; check the node's NFS and FUSE mounts"
            );
        }
        false
    }
}

/// The library open ring, for the daemon's loop to wait on; `None` while no process is held.
pub(super) type LibraryOpensReady = Option<AsyncFd<OwnedFd>>;

/// Waits until a library open is reported; never, when none can be.
pub(super) async fn library_open_reported(
    ready: &LibraryOpensReady,
) -> std::io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match ready {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

impl Daemon {
    /// Starts holding the processes that open an MPI library at a new path, unless
    /// `mpi.hold_new_libraries` is off; says which way a new library will be found.
    pub(super) fn watch_library_opens(&mut self) {
        let fallback = "a library found at run time is attached after the scan of its process's \
                        maps, and the first calls of the processes that use it first (MPI_Init \
                        and those after it) can be missed";
        if !self.config.mpi.hold_new_libraries {
            tracing::warn!("mpi.hold_new_libraries is off: {fallback}");
            return;
        }
        match self.capture.watch_library_opens() {
            Ok(()) => tracing::info!(
                "attaching to MPI libraries as processes open them: a process that opens one at \
                 a new path is held until its probes are attached"
            ),
            Err(e) => tracing::warn!("cannot watch library opens ({e}): {fallback}"),
        }
    }

    /// The ring the loop waits on for library opens.
    pub(super) fn library_opens_ready(&self) -> Result<LibraryOpensReady, CaptureError> {
        let Some(fd) = self.capture.library_opens_wakeup().transpose()? else {
            return Ok(None);
        };
        // SAFETY: the AsyncFd owns the descriptor (an OwnedFd), which stays open and names the
        // same ring buffer for as long as the AsyncFd lives.
        unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map(Some)
            .map_err(|source| CaptureError::Io {
                what: "waiting on the library open ring buffer".into(),
                source: source.into(),
            })
    }

    /// Starts the read of every file reported opened by a held process; resumes at once the
    /// processes that opened a file whose read is stuck.
    pub(super) fn handle_library_opens(&mut self) {
        let mut new: Vec<(u64, Vec<LibraryOpenEvent>)> = Vec::new();
        for event in self.capture.drain_library_opens() {
            let libraries = &mut self.run_time_libraries;
            if libraries.files.is_hung(Path::new(&event.path)) {
                tracing::debug!(
                    "pid {} opened {}, whose read is stuck: resumed unprofiled",
                    event.held.pid,
                    event.path
                );
                self.resume(vec![event], true);
            } else if let Some(waiting) = libraries.waiting.get_mut(&event.path_hash) {
                // Resumed with the processes of the read in flight; its interposers are looked
                // for by the scan after its exec.
                waiting.push(event);
            } else {
                match new.iter_mut().find(|(hash, _)| *hash == event.path_hash) {
                    Some((_, group)) => group.push(event),
                    None => new.push((event.path_hash, vec![event])),
                }
            }
        }
        for (path_hash, events) in new {
            let path = events[0].path.clone();
            let held: Vec<(u32, u32)> = events.iter().map(|e| (e.held.pid, e.fd)).collect();
            let libraries = &mut self.run_time_libraries;
            let started = libraries.start(ReadFor::Opened { path_hash }, move |f, files, p| {
                ReadResult::Opened(Box::new(library_reads::read_opened(
                    path_hash, &path, &held, f, files, p,
                )))
            });
            if started {
                libraries.waiting.insert(path_hash, events);
            } else {
                // Not marked handled: once reads return, the next open of the path is held.
                self.resume(events, false);
            }
        }
        self.run_time_libraries.stats.not_held = self.capture.library_opens_lost();
    }

    /// Starts the scan of the processes whose scan is due, unless one is being read.
    pub(super) fn start_scans(&mut self, now: Instant) {
        if self.run_time_libraries.scanning {
            return;
        }
        let (due, later): (Vec<_>, Vec<_>) = self.scans.drain(..).partition(|(t, _)| *t <= now);
        self.scans = later;
        let mut pids: Vec<u32> = due.into_iter().map(|(_, pid)| pid).collect();
        pids.sort_unstable();
        pids.dedup();
        if pids.is_empty() {
            return;
        }
        let libraries = &mut self.run_time_libraries;
        libraries.scanning = libraries.start(ReadFor::Scan, move |f, files, p| {
            ReadResult::Scanned(library_reads::scan_processes(&pids, f, files, p))
        });
    }

    /// Attaches what a read found, or resumes its held processes when it timed out.
    pub(super) fn finish_read(&mut self, finished: Finished<ReadFor, ReadResult>) {
        let deadline_ms = self.run_time_libraries.reads.deadline().as_millis();
        match finished {
            Finished::Done(_, ReadResult::Opened(read)) => self.attach_opened(*read),
            Finished::Done(_, ReadResult::Scanned(processes)) => {
                self.run_time_libraries.scanning = false;
                self.attach_scanned(processes);
            }
            Finished::TimedOut { context, at } => {
                let libraries = &mut self.run_time_libraries;
                libraries.stats.reads_timed_out += 1;
                // A read that had not come to a file yet (the pool's threads were all busy)
                // leaves no file to avoid.
                let (pid, file) = at.unwrap_or_default();
                if !file.as_os_str().is_empty() {
                    libraries.files.hung(&file);
                }
                let file = file.display();
                match context {
                    ReadFor::Opened { path_hash } => {
                        let events = libraries.waiting.remove(&path_hash).unwrap_or_default();
                        let pids: Vec<String> =
                            events.iter().map(|e| e.held.pid.to_string()).collect();
                        tracing::warn!(
                            "reading {file} for pid {pid} did not return within \
                             mpi.library_read_timeout_ms ({deadline_ms} ms): its file system does \
                             not answer; check that mount (`timeout 5 stat {file}`). Resumed pid \
                             {}, which runs unprofiled until the file is attached: it is not read \
                             again until that read returns, then the scan after the exec of a \
                             process that maps it attaches it, for every process that maps it",
                            pids.join(", ")
                        );
                        self.resume(events, true);
                    }
                    ReadFor::Scan => {
                        libraries.scanning = false;
                        tracing::warn!(
                            "reading {file}, mapped by pid {pid}, did not return within \
                             mpi.library_read_timeout_ms ({deadline_ms} ms): its file system does \
                             not answer; check that mount (`timeout 5 stat {file}`). The processes \
                             that map it run unprofiled until it is attached: it is not read again \
                             until that read returns, then the scan after the exec of a process \
                             that maps it attaches it"
                        );
                    }
                }
            }
            Finished::Returned { at, took } => {
                let libraries = &mut self.run_time_libraries;
                libraries.refusing = false;
                let (pid, file) = at.unwrap_or_default();
                libraries.files.answers_again(&file);
                tracing::info!(
                    "the stuck read of {} (pid {pid}) returned after {:.1} s: its file system \
                     answers again, and the file is read at the next scan after an exec that \
                     finds it mapped",
                    file.display(),
                    took.as_secs_f64()
                );
            }
        }
        self.run_time_libraries.stats.reads_stuck = self.run_time_libraries.reads.stuck() as u64;
        // The scans that came due meanwhile go on at once, not at the next drain.
        self.start_scans(Instant::now());
    }

    /// Attaches the library held processes opened (and their interposers), marks the path
    /// handled, and resumes the processes.
    fn attach_opened(&mut self, read: OpenedRead) {
        let events = self
            .run_time_libraries
            .waiting
            .remove(&read.path_hash)
            .unwrap_or_default();
        let pid = events.first().map_or(0, |e| e.held.pid);
        let name = read.name.display();
        match &read.opened {
            Opened::Mpi(_, Some(library)) => {
                if self.attach_read(library) {
                    self.run_time_libraries.stats.attached += 1;
                    tracing::info!(
                        "pid {pid} opened MPI library {name} ({:?} {:?}), attached before the \
                         process went on",
                        library.lib.flavor,
                        library.lib.binding
                    );
                }
            }
            Opened::Mpi(_, None) => {}
            Opened::Other(why) => {
                tracing::debug!("pid {pid} opened {name}, not an MPI library: {why}");
            }
        }
        for (pid, interposer) in &read.interposers {
            if self.attach_interposer(*pid, interposer) {
                self.run_time_libraries.stats.attached += 1;
            }
        }
        // Identified now, while held: a short rank could end before the scan after its exec
        // (which first reads every file it maps) and before its first burst or statistics tick,
        // and a process that is gone can no longer be told apart from any other.
        if matches!(read.opened, Opened::Mpi(..)) {
            let mut state = std::mem::take(&mut self.state);
            for event in &events {
                self.member(event.held.pid, &mut state);
            }
            self.state = state;
            if self.members_changed {
                self.publish();
            }
        }
        self.resume(events, true);
    }

    /// Attaches the MPI libraries and interposers new processes map, and identifies the
    /// processes that map an MPI library while they surely live, not when their first data
    /// arrives.
    fn attach_scanned(&mut self, processes: Vec<ScannedProcess>) {
        let mut state = std::mem::take(&mut self.state);
        for process in processes {
            for library in &process.libraries {
                self.attach_read(library);
            }
            for interposer in &process.interposers {
                self.attach_interposer(process.pid, interposer);
            }
            if process.maps_mpi {
                self.member(process.pid, &mut state);
            }
        }
        self.state = state;
        if self.members_changed {
            self.publish();
        }
    }

    /// Attaches a PMPI interposer process `pid` maps; whether it was attached now.
    fn attach_interposer(&mut self, pid: u32, interposer: &LibraryRead) -> bool {
        tracing::info!(
            "pid {pid} maps PMPI interposer {}: its MPI functions are probed, so that each call \
             counts once and its call site is the application's",
            interposer.lib.path.display()
        );
        self.attach_read(interposer)
    }

    /// Resumes held processes (dropping their events); `handled`: their path is marked handled,
    /// so that opening it again holds no process.
    fn resume(&mut self, events: Vec<LibraryOpenEvent>, handled: bool) {
        for event in events {
            if handled {
                if let Err(e) = self.capture.mark_library_path_known(event.path_hash) {
                    tracing::warn!("{e}: the next process opening {} is held again", event.path);
                }
            }
            let held_ns = usage::clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(event.opened_ns);
            let stats = &mut self.run_time_libraries.stats;
            stats.held += 1;
            stats.held_ns += held_ns;
            tracing::info!(
                "pid {} held {:.1} ms at its open of {}",
                event.held.pid,
                held_ns as f64 / 1e6,
                event.path
            );
            // Dropping the event resumes the process.
        }
    }
}
