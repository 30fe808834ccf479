//! The hold guard: a process of its own that resumes the processes the BPF program
//! `library_open_exit` holds when the daemon does not. A stopped daemon (SIGSTOP, and all its
//! threads with it) or a dead one resumes nothing; the guard outlives it. The daemon starts it
//! (`mpiburst hold-guard`, a hidden subcommand of the same binary) before the program is
//! attached, and hands it the map HELD_PROCESSES (pid → CLOCK_MONOTONIC ns of the hold) and the
//! read end of a pipe whose write end only the daemon holds. Every 100 ms the guard
//! resumes the processes held longer than `mpi.hold_limit_s`; at the pipe's end of file (the
//! daemon exited, however) or at SIGTERM or SIGINT (a service stop signals the whole cgroup) it
//! resumes every held process and exits.
//!
//! Whoever resumes a process deletes its entry first and sends SIGCONT after: the program lists
//! a process only once its stop is pending, so that SIGCONT covers every hold the entry stood
//! for, and a hold that begins after the delete has an entry of its own.

use std::{
    io::{BufRead, BufReader},
    os::{
        fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd},
        unix::process::CommandExt,
    },
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use aya::maps::{HashMap, IterableMap, Map, MapData, MapError};

use super::usage::clock_ns;

/// The hidden subcommand that runs the guard.
pub const SUBCOMMAND: &str = "hold-guard";
/// How often the guard looks at the held processes: one held past the limit waits this much
/// longer at most.
const SWEEP_INTERVAL: Duration = Duration::from_millis(100);
/// After the daemon exited: a run of the program that began before the daemon's exit detached it
/// may still be listing a process, which the guard's second look resumes.
const DETACH_GRACE: Duration = Duration::from_millis(50);
/// How long a daemon that exits waits for its guard to follow, before it kills it.
const EXIT_WAIT: Duration = Duration::from_secs(2);
/// The line the guard writes on its standard output once it watches the map.
const READY: &str = "hold guard ready";

#[derive(Debug, thiserror::Error)]
pub enum HoldGuardError {
    #[error(
        "cannot start the hold guard ({what}): {source}; it is the process that resumes held \
         processes when the daemon does not answer"
    )]
    Start {
        what: &'static str,
        source: std::io::Error,
    },
    #[error("the hold guard did not start ({0}); its own message is in the log above")]
    NotReady(String),
    #[error(
        "descriptor {fd} is not open ({source}): `mpiburst {SUBCOMMAND}` is started by the daemon, \
         which passes it its descriptors, not by hand"
    )]
    Descriptor { fd: RawFd, source: std::io::Error },
    #[error("the held processes' BPF map: {0}")]
    Map(#[from] MapError),
    #[error("the hold guard cannot {what}: {source}")]
    Io {
        what: &'static str,
        source: std::io::Error,
    },
}

/// The map HELD_PROCESSES: pid → CLOCK_MONOTONIC ns of its hold.
#[derive(Debug)]
struct HeldMap(HashMap<MapData, u32, u64>);

impl HeldMap {
    /// Every listed process and when it was held. An entry deleted meanwhile is left out.
    fn entries(&self) -> Vec<(u32, u64)> {
        let pids: Vec<u32> = self.0.keys().filter_map(Result::ok).collect();
        pids.into_iter()
            .filter_map(|pid| Some((pid, self.0.get(&pid, 0).ok()?)))
            .collect()
    }

    /// Deletes `pid`'s entry, then resumes it. Whether it was listed (not, when the other party
    /// resumed it already), and the error of SIGCONT (none for a process that has ended).
    fn resume(&mut self, pid: u32) -> (bool, std::io::Result<()>) {
        let listed = self.0.remove(&pid).is_ok();
        // SAFETY: kill has no memory preconditions.
        let sent = unsafe { libc::kill(pid as libc::pid_t, libc::SIGCONT) } == 0;
        let error = (!sent).then(std::io::Error::last_os_error);
        match error {
            Some(e) if e.raw_os_error() != Some(libc::ESRCH) => (listed, Err(e)),
            _ => (listed, Ok(())),
        }
    }

    fn raw_fd(&self) -> RawFd {
        self.0.map().fd().as_fd().as_raw_fd()
    }
}

/// The processes the program holds, as the daemon sees them: the map, and the guard that watches
/// it. Shared by every held process's handle and the capture's watch, so that the guard runs
/// until the last of them is resumed.
#[derive(Debug)]
pub struct HeldProcesses {
    map: Mutex<HeldMap>,
    guard: Mutex<HoldGuard>,
    limit: Duration,
    /// Held processes the guard had resumed when the daemon came to resume them.
    resumed_by_guard: AtomicU64,
    /// Guards started again after the one before exited.
    guard_restarts: AtomicU64,
}

impl HeldProcesses {
    /// Starts the guard on `map`, which resumes a process held longer than `limit`.
    pub(super) fn start(
        map: HashMap<MapData, u32, u64>,
        limit: Duration,
    ) -> Result<Arc<Self>, HoldGuardError> {
        let map = HeldMap(map);
        let guard = HoldGuard::start(&map, limit)?;
        Ok(Arc::new(HeldProcesses {
            map: Mutex::new(map),
            guard: Mutex::new(guard),
            limit,
            resumed_by_guard: AtomicU64::new(0),
            guard_restarts: AtomicU64::new(0),
        }))
    }

    /// The guard's pid.
    pub(super) fn guard_pid(&self) -> u32 {
        lock(&self.guard).child.id()
    }

    /// Resumes `pid` and takes it off the map: see [`HeldMap::resume`].
    pub(super) fn resume(&self, pid: u32) -> (bool, std::io::Result<()>) {
        let (listed, sent) = lock(&self.map).resume(pid);
        if !listed && sent.is_ok() {
            self.resumed_by_guard.fetch_add(1, Ordering::Relaxed);
        }
        (listed, sent)
    }

    /// Starts the guard again if it exited (killed, or failed): without a guard, a process held
    /// while the daemon is stopped or hung stays stopped. Returns the exit status of the guard
    /// that was gone and the new guard's pid; `None` while the guard runs.
    pub(super) fn keep_guard(&self) -> Result<Option<(String, u32)>, HoldGuardError> {
        let mut guard = lock(&self.guard);
        let status = match guard.child.try_wait() {
            Ok(None) => return Ok(None),
            Ok(Some(status)) => status.to_string(),
            Err(e) => format!("not waitable: {e}"),
        };
        let map = lock(&self.map);
        *guard = HoldGuard::start(&map, self.limit)?;
        self.guard_restarts.fetch_add(1, Ordering::Relaxed);
        Ok(Some((status, guard.child.id())))
    }

    /// The held processes the guard resumed before the daemon did, and the guard's restarts.
    pub(super) fn counts(&self) -> (u64, u64) {
        (
            self.resumed_by_guard.load(Ordering::Relaxed),
            self.guard_restarts.load(Ordering::Relaxed),
        )
    }
}

/// The value behind `mutex`, whether or not a thread panicked holding it: a map handle and a
/// child process stay usable.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The daemon's handle on the guard: stops it when dropped.
#[derive(Debug)]
struct HoldGuard {
    child: Child,
    /// The write end of the pipe whose end of file tells the guard the daemon is gone.
    daemon_end: Option<OwnedFd>,
}

impl HoldGuard {
    /// Runs `mpiburst hold-guard` on `map` and waits until it watches it.
    fn start(map: &HeldMap, limit: Duration) -> Result<HoldGuard, HoldGuardError> {
        let failed = |what| move |source| HoldGuardError::Start { what, source };
        let (guard_end, daemon_end) = std::io::pipe().map_err(failed("a pipe"))?;
        let (map_fd, pipe_fd) = (map.raw_fd(), guard_end.as_raw_fd());
        let mut command = Command::new("/proc/self/exe");
        command
            .arg(SUBCOMMAND)
            .args(["--map-fd", &map_fd.to_string()])
            .args(["--daemon-fd", &pipe_fd.to_string()])
            .args(["--limit-ms", &limit.as_millis().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        // SAFETY: fcntl is async-signal-safe and changes only the child's descriptor table.
        unsafe {
            command.pre_exec(move || {
                for fd in [map_fd, pipe_fd] {
                    // Both are close-on-exec, as every descriptor of the daemon: these two stay.
                    if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            })
        };
        let mut child = command.spawn().map_err(failed("running /proc/self/exe"))?;
        drop(guard_end);
        let mut line = String::new();
        let stdout = child
            .stdout
            .take()
            .expect("the guard's standard output is piped");
        let read = BufReader::new(stdout).read_line(&mut line);
        if read.is_err() || line.trim_end() != READY {
            let _ = child.kill();
            let status = child
                .wait()
                .map_or_else(|e| e.to_string(), |s| s.to_string());
            return Err(HoldGuardError::NotReady(status));
        }
        Ok(HoldGuard {
            child,
            daemon_end: Some(daemon_end.into()),
        })
    }
}

impl Drop for HoldGuard {
    fn drop(&mut self) {
        // The guard reads the end of file, resumes what is still listed (nothing, once the
        // daemon resumed its own) and exits.
        self.daemon_end = None;
        let deadline = Instant::now() + EXIT_WAIT;
        while Instant::now() < deadline {
            match self.child.try_wait() {
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                _ => return,
            }
        }
        tracing::warn!(
            "the hold guard (pid {}) did not exit within {} s of the daemon's stop: killed",
            self.child.id(),
            EXIT_WAIT.as_secs()
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the guard woke up for.
enum Wake {
    /// Time to look for processes held past the limit.
    Sweep,
    /// The daemon exited: its end of the pipe is closed.
    DaemonGone,
    /// SIGTERM or SIGINT.
    Stopped,
}

/// The guard's main: watches the map on descriptor `map_fd` until the pipe on `daemon_fd` ends
/// or a signal stops it, resuming each process held longer than `limit`.
pub fn run(map_fd: RawFd, daemon_fd: RawFd, limit: Duration) -> Result<(), HoldGuardError> {
    // Named like every mpiburst process: the program holds none of them.
    // SAFETY: the name is a NUL-terminated string that outlives the call.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"mpiburst-guard".as_ptr()) };
    let mut map = HeldMap(HashMap::try_from(Map::HashMap(MapData::from_fd(
        inherited(map_fd)?,
    )?))?);
    let daemon = inherited(daemon_fd)?;
    let signals = termination_signals()?;
    println!("{READY}");
    let limit_ns = limit.as_nanos() as u64;
    loop {
        match wait(&daemon, &signals)? {
            Wake::Sweep => {
                let now = clock_ns(libc::CLOCK_MONOTONIC);
                for (pid, held_ns) in map.entries() {
                    if now.saturating_sub(held_ns) > limit_ns {
                        resume(
                            &mut map,
                            pid,
                            held_ns,
                            &format!(
                                "past mpi.hold_limit_s ({:.1} s): the daemon did not resume it \
                                 (it is stopped, hung or slow), and the calls of the library it \
                                 opened may go unprofiled",
                                limit.as_secs_f64()
                            ),
                        );
                    }
                }
            }
            Wake::DaemonGone => {
                resume_all(&mut map, "the daemon exited while holding it");
                std::thread::sleep(DETACH_GRACE);
                resume_all(&mut map, "the daemon exited while holding it");
                return Ok(());
            }
            Wake::Stopped => {
                resume_all(&mut map, "the hold guard was stopped (SIGTERM or SIGINT)");
                return Ok(());
            }
        }
    }
}

/// Takes descriptor `fd`, which the daemon left open across the exec.
fn inherited(fd: RawFd) -> Result<OwnedFd, HoldGuardError> {
    // SAFETY: F_GETFD reads only the descriptor table.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
        let source = std::io::Error::last_os_error();
        return Err(HoldGuardError::Descriptor { fd, source });
    }
    // SAFETY: the descriptor is open, and nothing else in this process owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A signalfd for SIGTERM and SIGINT, blocked so that they arrive only there.
fn termination_signals() -> Result<OwnedFd, HoldGuardError> {
    let failed = |what| HoldGuardError::Io {
        what,
        source: std::io::Error::last_os_error(),
    };
    // SAFETY: the set is initialised by sigemptyset before use; the calls take valid pointers.
    unsafe {
        let mut set = std::mem::zeroed::<libc::sigset_t>();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) == -1 {
            return Err(failed("block SIGTERM and SIGINT"));
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC);
        if fd == -1 {
            return Err(failed("make a signalfd"));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Waits up to `SWEEP_INTERVAL` for the daemon's pipe or a signal.
fn wait(daemon: &OwnedFd, signals: &OwnedFd) -> Result<Wake, HoldGuardError> {
    let mut fds = [daemon, signals].map(|fd| libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    });
    // SAFETY: fds is a valid array of two pollfds.
    let ready = unsafe { libc::poll(fds.as_mut_ptr(), 2, SWEEP_INTERVAL.as_millis() as i32) };
    if ready == -1 {
        let source = std::io::Error::last_os_error();
        if source.kind() == std::io::ErrorKind::Interrupted {
            return Ok(Wake::Sweep);
        }
        return Err(HoldGuardError::Io {
            what: "wait on the daemon's pipe",
            source,
        });
    }
    // The daemon writes nothing: the only event on its pipe is the end of file.
    Ok(if fds[0].revents != 0 {
        Wake::DaemonGone
    } else if fds[1].revents != 0 {
        Wake::Stopped
    } else {
        Wake::Sweep
    })
}

/// Resumes every listed process.
fn resume_all(map: &mut HeldMap, why: &str) {
    for (pid, held_ns) in map.entries() {
        resume(map, pid, held_ns, why);
    }
}

/// Resumes `pid`, held since `held_ns`, and says so with `why`.
fn resume(map: &mut HeldMap, pid: u32, held_ns: u64, why: &str) {
    let held_s = clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(held_ns) as f64 / 1e9;
    match map.resume(pid) {
        (_, Err(e)) => tracing::error!(
            "hold guard: cannot resume pid {pid}, held {held_s:.1} s at its open of an MPI \
             library: {e}; resume it with `kill -CONT {pid}` (the guard needs CAP_KILL for \
             another user's process)"
        ),
        (true, Ok(())) => tracing::warn!(
            "hold guard: resumed pid {pid}, held {held_s:.1} s at its open of an MPI library, \
             {why}"
        ),
        // The daemon resumed it between the look and the delete.
        (false, Ok(())) => {}
    }
}
