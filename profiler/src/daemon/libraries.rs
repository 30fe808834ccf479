//! MPI libraries found at run time: those a process opens while held (`mpi.hold_new_libraries`),
//! those new processes map (the scans after exec), and the PMPI interposers of the processes
//! that map an MPI library. Their files are read off the loop with a deadline
//! (`mpi.library_read_timeout_ms`, file_reads.rs): a file on a hung mount delays no burst, and
//! a held process waits for it that long at most (or `mpi.hold_limit_s`, when shorter: the hold
//! guard resumes it then).

use std::{
    collections::HashMap,
    path::Path,
    sync::Arc,
    time::{Duration, Instant},
};

use super::{
    attach::Attacher,
    file_reads::{FileReads, Finished, ReadProgress, MAX_STUCK},
    library_reads::{self, LibraryRead, Opened, OpenedRead, ScannedProcess, SharedFiles},
};
use crate::{
    capture::{
        config::FunctionSpec, usage, Capture, HeldProcess, HoldEvent, LibraryOpenEvent,
        LibraryOpenStats,
    },
    config::Config,
    discovery::MpiLibrary,
};

/// Scan an exec'ed process's maps after these delays (counted from when the exec notification
/// is drained, itself up to one drain interval late): the dynamic loader maps its libraries
/// within milliseconds of exec; the later scans catch libraries opened with dlopen.
const EXEC_SCAN_DELAYS: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_secs(1),
    Duration::from_secs(5),
];

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

/// What a process was held at.
#[derive(Clone, Copy)]
enum Held {
    LibraryOpen,
    FirstCall,
    Launched,
}

/// Detaches the watch on library opens while the node runs no launcher of `launchers` and no
/// MPI process (none listed: it stays attached), and says so.
fn detach_library_watch_when_idle(capture: &mut Capture, launchers: &[String]) {
    match capture.detach_library_watch_when_idle() {
        Ok(()) => tracing::info!(
            "the watch on library opens is detached while the node runs no MPI launcher ({}) and \
             no MPI process (capture.detach_idle_after_s); the exec of a process a launcher \
             starts then holds that process until the watch is attached again",
            launchers.join(", ")
        ),
        Err(e) => tracing::warn!(
            "the watch on library opens stays attached ({e}): every system call on the node takes \
             the kernel's traced path"
        ),
    }
}

/// The MPI libraries the daemon attaches: those known at start, and those found at run time.
pub(super) struct Libraries {
    pub(super) attacher: Attacher,
    /// Processes that open a library at a new path are held until it is attached
    /// (`mpi.hold_new_libraries`), this long at most (`mpi.hold_limit_s`).
    hold_new_libraries: bool,
    hold_limit: Duration,
    /// What the reads share with the loop.
    files: Arc<SharedFiles>,
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
    /// The scans of new processes' maps to come, and when.
    scans: Vec<(Instant, u32)>,
    /// Processes held at the open of a library just attached: resumed once identified
    /// ([`Libraries::resume_identified`]).
    identifying: Vec<LibraryOpenEvent>,
}

impl Libraries {
    pub(super) fn new(
        functions: &[String],
        specs: Vec<FunctionSpec>,
        hold_new_libraries: bool,
        hold_limit: Duration,
        deadline: Duration,
    ) -> Self {
        let files = Arc::<SharedFiles>::default();
        Libraries {
            attacher: Attacher::new(functions.to_vec(), specs, files.clone()),
            hold_new_libraries,
            hold_limit,
            files,
            reads: FileReads::new(deadline),
            functions: functions.into(),
            waiting: HashMap::new(),
            scanning: false,
            refusing: false,
            stats: LibraryOpenStats::default(),
            scans: Vec::new(),
            identifying: Vec::new(),
        }
    }

    /// Attaches a library known at start.
    pub(super) fn attach_known(&mut self, capture: &mut Capture, lib: &MpiLibrary) {
        self.attacher.attach(capture, lib);
    }

    /// Schedules the scans of the maps of a process that exec'ed (drained at `now`).
    pub(super) fn exec(&mut self, pid: u32, now: Instant) {
        self.scans
            .extend(EXEC_SCAN_DELAYS.iter().map(|d| (now + *d, pid)));
    }

    /// The next read to finish, time out, or return after its deadline.
    pub(super) async fn read_finished(&mut self) -> Finished<ReadFor, ReadResult> {
        self.reads.next().await
    }

    /// Resumes every process waiting for a read (at shutdown).
    pub(super) fn release_waiting(&mut self) {
        self.waiting.clear();
        self.identifying.clear();
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

    /// Starts holding processes where the configuration asks for it: at the open of an MPI
    /// library at a new path (`mpi.hold_new_libraries`), at the exec of a process a launcher
    /// (`mpi.launchers`) started while the watch on library opens is detached, and at the first
    /// call of a thread of such a process while the scheduler programs are
    /// (`capture.scheduler_on_demand`); says which way a new library will be found, and which
    /// programs are detached when idle.
    pub(super) fn start_holding(&self, capture: &mut Capture, config: &Config) {
        let scheduler_on_demand = config.capture.scheduler_on_demand;
        let fallback = "a library found at run time is attached after the scan of its process's \
                        maps, and the first calls of the processes that use it first (MPI_Init \
                        and those after it) can be missed";
        let always_on = "the scheduler programs stay attached (about 0.1 us on every context \
                         switch of the node)";
        if !self.hold_new_libraries && !scheduler_on_demand {
            tracing::warn!("mpi.hold_new_libraries is off: {fallback}");
            return;
        }
        let guard_pid = match capture.start_holding(self.hold_limit) {
            Ok(pid) => pid,
            Err(e) => {
                tracing::warn!("cannot hold processes ({e}): {fallback}; {always_on}");
                return;
            }
        };
        if let Err(e) = capture.note_launchers(&config.mpi.launchers) {
            tracing::warn!("cannot note the launchers of MPI ranks: {e}");
        }
        if !self.hold_new_libraries {
            tracing::warn!("mpi.hold_new_libraries is off: {fallback}");
        } else {
            match capture.watch_library_opens() {
                Ok(()) => {
                    tracing::info!(
                        "attaching to MPI libraries as processes open them: a process that opens \
                         one at a new path is held until its probes are attached, {:.1} s at \
                         most (mpi.hold_limit_s): past it, or when the daemon exits, the hold \
                         guard (pid {guard_pid}) resumes it",
                        self.hold_limit.as_secs_f64()
                    );
                    detach_library_watch_when_idle(capture, &config.mpi.launchers);
                }
                Err(e) => tracing::warn!(
                    "cannot watch library opens, so no process is held at its open of a library \
                     ({e}): {fallback}"
                ),
            }
        }
        if !scheduler_on_demand {
            return;
        }
        match capture.detach_scheduler_when_idle() {
            Ok(()) => tracing::info!(
                "the scheduler programs are detached while the node has no MPI process \
                 (capture.detach_idle_after_s), and the first MPI call of a thread of a process \
                 that a launcher started then holds that process until they are attached again \
                 (the hold guard, pid {guard_pid}, resumes it past mpi.hold_limit_s); another \
                 process's first bursts then count wall time as on-CPU time until the next \
                 statistics update"
            ),
            Err(e) => tracing::warn!("{e}: {always_on}"),
        }
    }

    /// Starts the hold guard again if it exited, and takes its counts into the statistics.
    pub(super) fn keep_hold_guard(&mut self, capture: &Capture) {
        match capture.keep_hold_guard() {
            Some(Ok((status, pid))) => tracing::error!(
                "the hold guard exited ({status}); started it again as pid {pid}, so that a \
                 process held while the daemon is stopped or hung is resumed within \
                 mpi.hold_limit_s"
            ),
            Some(Err(e)) => tracing::error!(
                "the hold guard exited and cannot be started again ({e}): a process held while \
                 the daemon is stopped or hung stays stopped until the daemon resumes it; \
                 restart the daemon"
            ),
            None => {}
        }
        (self.stats.resumed_by_guard, self.stats.guard_restarts) = capture.hold_guard_counts();
    }

    /// Handles the holds reported: starts the read of every file reported opened by a held
    /// process, and resumes at once the processes that opened a file whose read is stuck; attaches
    /// the scheduler programs for the processes held at a thread's first call, and resumes them.
    pub(super) fn handle_holds(&mut self, capture: &mut Capture) {
        let mut new: Vec<(u64, Vec<LibraryOpenEvent>)> = Vec::new();
        let mut first_calls = Vec::new();
        let mut launched = Vec::new();
        for event in capture.drain_holds() {
            let event = match event {
                HoldEvent::LibraryOpen(event) => event,
                HoldEvent::FirstCall { held, held_ns } => {
                    first_calls.push((held, held_ns));
                    continue;
                }
                HoldEvent::Launched { held, held_ns } => {
                    launched.push((held, held_ns));
                    continue;
                }
            };
            if self.files.is_hung(Path::new(&event.path)) {
                tracing::debug!(
                    "pid {} opened {}, whose read is stuck: resumed unprofiled",
                    event.held.pid,
                    event.path
                );
                self.resume(capture, vec![event], true);
            } else if let Some(waiting) = self.waiting.get_mut(&event.path_hash) {
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
            let started = self.start(ReadFor::Opened { path_hash }, move |f, files, p| {
                ReadResult::Opened(Box::new(library_reads::read_opened(
                    path_hash, &path, &held, f, files, p,
                )))
            });
            if started {
                self.waiting.insert(path_hash, events);
            } else {
                // Not marked handled: once reads return, the next open of the path is held.
                self.resume(capture, events, false);
            }
        }
        if !launched.is_empty() {
            let attached = capture.attach_library_watch();
            self.resume_after_attach(launched, Held::Launched, attached);
        }
        if !first_calls.is_empty() {
            let attached = capture.attach_scheduler();
            self.resume_after_attach(first_calls, Held::FirstCall, attached);
        }
        self.stats.not_held = capture.holds_lost();
    }

    /// Starts the scan of the processes whose scan is due, unless one is being read.
    pub(super) fn start_scans(&mut self, now: Instant) {
        if self.scanning {
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
        self.scanning = self.start(ReadFor::Scan, move |f, files, p| {
            ReadResult::Scanned(library_reads::scan_processes(&pids, f, files, p))
        });
    }

    /// Attaches what a read found, or resumes its held processes when it timed out. Returns the
    /// processes found to map an MPI library, to be identified while they surely live.
    pub(super) fn finish_read(
        &mut self,
        capture: &mut Capture,
        finished: Finished<ReadFor, ReadResult>,
    ) -> Vec<u32> {
        let deadline_ms = self.reads.deadline().as_millis();
        let mut found = Vec::new();
        match finished {
            Finished::Done(_, ReadResult::Opened(read)) => {
                found = self.attach_opened(capture, *read)
            }
            Finished::Done(_, ReadResult::Scanned(processes)) => {
                self.scanning = false;
                found = self.attach_scanned(capture, processes);
            }
            Finished::TimedOut { context, at } => {
                self.stats.reads_timed_out += 1;
                // A read that had not come to a file yet (the pool's threads were all busy)
                // leaves no file to avoid.
                let (pid, file) = at.unwrap_or_default();
                if !file.as_os_str().is_empty() {
                    self.files.hung(&file);
                }
                let file = file.display();
                match context {
                    ReadFor::Opened { path_hash } => {
                        let events = self.waiting.remove(&path_hash).unwrap_or_default();
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
                        self.resume(capture, events, true);
                    }
                    ReadFor::Scan => {
                        self.scanning = false;
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
                self.refusing = false;
                let (pid, file) = at.unwrap_or_default();
                self.files.answers_again(&file);
                tracing::info!(
                    "the stuck read of {} (pid {pid}) returned after {:.1} s: its file system \
                     answers again, and the file is read at the next scan after an exec that \
                     finds it mapped",
                    file.display(),
                    took.as_secs_f64()
                );
            }
        }
        self.stats.reads_stuck = self.reads.stuck() as u64;
        // The scans that came due meanwhile go on at once, not at the next drain.
        self.start_scans(Instant::now());
        found
    }

    /// Attaches the library held processes opened (and their interposers), marks the path
    /// handled, and resumes the processes; returns them when the library is an MPI library.
    fn attach_opened(&mut self, capture: &mut Capture, read: OpenedRead) -> Vec<u32> {
        let events = self.waiting.remove(&read.path_hash).unwrap_or_default();
        let pid = events.first().map_or(0, |e| e.held.pid);
        let name = read.name.display();
        match &read.opened {
            Opened::Mpi(_, Some(library)) => {
                if self.attacher.attach_read(capture, library) {
                    self.stats.attached += 1;
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
            if self.attach_interposer(capture, *pid, interposer) {
                self.stats.attached += 1;
            }
        }
        // Identified while held: a short rank could end before the scan after its exec (which
        // first reads every file it maps) and before its first burst or statistics tick, and a
        // process that is gone can no longer be told apart from any other. The caller
        // identifies them before they are resumed, when the events are dropped.
        let mpi: Vec<u32> = match read.opened {
            Opened::Mpi(..) => events.iter().map(|e| e.held.pid).collect(),
            Opened::Other(_) => Vec::new(),
        };
        self.identifying.extend(events);
        mpi
    }

    /// Resumes the processes held at the open of a library just attached, once the caller has
    /// identified those [`Libraries::finish_read`] returned.
    pub(super) fn resume_identified(&mut self, capture: &mut Capture) {
        let events = std::mem::take(&mut self.identifying);
        self.resume(capture, events, true);
    }

    /// Attaches the MPI libraries and interposers new processes map, and identifies the
    /// processes that map an MPI library while they surely live, not when their first data
    /// arrives.
    fn attach_scanned(
        &mut self,
        capture: &mut Capture,
        processes: Vec<ScannedProcess>,
    ) -> Vec<u32> {
        let mut mpi = Vec::new();
        for process in processes {
            for library in &process.libraries {
                self.attacher.attach_read(capture, library);
            }
            for interposer in &process.interposers {
                self.attach_interposer(capture, process.pid, interposer);
            }
            if process.maps_mpi {
                mpi.push(process.pid);
            }
        }
        mpi
    }

    /// Attaches a PMPI interposer process `pid` maps; whether it was attached now.
    fn attach_interposer(
        &mut self,
        capture: &mut Capture,
        pid: u32,
        interposer: &LibraryRead,
    ) -> bool {
        tracing::info!(
            "pid {pid} maps PMPI interposer {}: its MPI functions are probed, so that each call \
             counts once and its call site is the application's",
            interposer.lib.path.display()
        );
        self.attacher.attach_read(capture, interposer)
    }

    /// Resumes held processes (dropping their events); `handled`: their path is marked handled,
    /// so that opening it again holds no process.
    fn resume(&mut self, capture: &mut Capture, events: Vec<LibraryOpenEvent>, handled: bool) {
        for event in events {
            if handled {
                if let Err(e) = capture.mark_library_path_known(event.path_hash) {
                    tracing::warn!("{e}: the next process opening {} is held again", event.path);
                }
            }
            let at = format!("its open of {}", event.path);
            self.count_resumed(event.held, event.opened_ns, Held::LibraryOpen, &at);
        }
    }

    /// Resumes the processes held (each with the CLOCK_MONOTONIC ns of its hold) `why`: at a
    /// thread's first call, for the scheduler programs, or at the exec of a process a launcher
    /// started, for the library watch; `attached`, whether the programs are now.
    fn resume_after_attach(&mut self, held: Vec<(HeldProcess, u64)>, why: Held, attached: bool) {
        let at = match (why, attached) {
            (Held::FirstCall, true) => {
                "its first MPI call, until the scheduler programs were attached"
            }
            (Held::FirstCall, false) => {
                "its first MPI call, and resumed without the scheduler programs (see the error \
                 above): its bursts count wall time as on-CPU time until they are attached"
            }
            (_, true) => {
                "its exec (an MPI launcher started it), until the watch on library opens was \
                 attached"
            }
            (_, false) => {
                "its exec (an MPI launcher started it), and resumed without the watch on library \
                 opens (see the error above)"
            }
        };
        for (held, held_ns) in held {
            self.count_resumed(held, held_ns, why, at);
        }
    }

    /// Counts and logs a process held since `held_ns` (CLOCK_MONOTONIC) `at` a library open, a
    /// thread's first call or its exec (`why`); resumes it (dropping `held`).
    fn count_resumed(&mut self, held: HeldProcess, held_ns: u64, why: Held, at: &str) {
        let held_for = usage::clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(held_ns);
        let stats = &mut self.stats;
        let (count, ns) = match why {
            Held::LibraryOpen => (&mut stats.held, &mut stats.held_ns),
            Held::FirstCall => (&mut stats.first_calls_held, &mut stats.first_calls_held_ns),
            Held::Launched => (&mut stats.launched_held, &mut stats.launched_held_ns),
        };
        *count += 1;
        *ns += held_for;
        tracing::info!(
            "pid {} held {:.1} ms at {at}",
            held.pid,
            held_for as f64 / 1e6
        );
    }
}
