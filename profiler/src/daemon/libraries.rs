//! MPI libraries found at run time: those a process opens while held (`mpi.hold_new_libraries`),
//! and the PMPI interposers of the processes that map an MPI library.

use std::{
    collections::{HashMap, HashSet},
    os::{fd::OwnedFd, unix::fs::MetadataExt},
    path::{Path, PathBuf},
};

use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use super::Daemon;
use crate::{
    capture::{usage, CaptureError, LibraryOpenEvent},
    discovery::{self, MpiFlavor, MpiLibrary},
    export::LibraryOpenStats,
};

/// Upper bound on the files remembered as checked for PMPI interposers, and as opened by held
/// processes (as for the build-id cache: a node maps a few thousand distinct files).
const FILES_REMEMBERED: usize = 8192;

/// What the daemon keeps about libraries found at run time.
#[derive(Default)]
pub(super) struct RunTimeLibraries {
    /// (device, inode) of every mapped file looked at for PMPI interposers.
    checked: HashSet<(u64, u64)>,
    /// (device, inode) of every file a held process opened → its MPI flavour, `None` when it is
    /// no MPI library: the ranks of a job open the same file at once, and only the first one's
    /// hold reads its symbols.
    opened: HashMap<(u64, u64), Option<MpiFlavor>>,
    pub(super) stats: LibraryOpenStats,
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

    /// Handles every reported library open: attaches the library (and the process's PMPI
    /// interposers), marks the path known, and resumes the process.
    pub(super) fn handle_library_opens(&mut self) {
        for event in self.capture.drain_library_opens() {
            self.attach_opened_library(&event);
            if let Err(e) = self.capture.mark_library_path_known(event.path_hash) {
                tracing::warn!("{e}: the next process opening {} is held again", event.path);
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
        self.run_time_libraries.stats.not_held = self.capture.library_opens_lost();
    }

    fn attach_opened_library(&mut self, event: &LibraryOpenEvent) {
        let pid = event.held.pid;
        // The file the process opened, in whatever mount namespace it runs.
        let access = PathBuf::from(format!("/proc/{pid}/fd/{}", event.fd));
        let file = match std::fs::metadata(&access) {
            Ok(meta) if meta.is_file() => (meta.dev(), meta.ino()),
            // Anyone can open a FIFO or a device named libmpi*: opening one to read it would
            // block the daemon, and with it every held process.
            Ok(_) => {
                tracing::debug!("pid {pid} opened {}, not a regular file", event.path);
                return;
            }
            Err(e) => {
                tracing::debug!("pid {pid}: {} unreadable: {e}", access.display());
                return;
            }
        };
        let flavor = match self.run_time_libraries.opened.get(&file) {
            Some(known) => *known,
            None => {
                // The file itself rather than the name opened (often a symlink), as the process
                // sees it: what an operator looks for in the log.
                let name =
                    std::fs::read_link(&access).unwrap_or_else(|_| event.path.clone().into());
                let flavor = self.attach_new_file(pid, &access, &name);
                let opened = &mut self.run_time_libraries.opened;
                if opened.len() >= FILES_REMEMBERED {
                    opened.clear();
                }
                opened.insert(file, flavor);
                flavor
            }
        };
        // A preloaded interposer is mapped before the libraries the program needs.
        if let Some(flavor) = flavor {
            let before = self.libraries;
            self.attach_interposers(pid, flavor);
            self.run_time_libraries.stats.attached += (self.libraries - before) as u64;
        }
    }

    /// Classifies a file a held process opened and attaches it unless it is attached already;
    /// its MPI flavour, or `None` when it is no MPI library.
    fn attach_new_file(&mut self, pid: u32, access: &Path, opened: &Path) -> Option<MpiFlavor> {
        let lib = match MpiLibrary::open_as(access, opened) {
            Ok(lib) => lib,
            Err(e) => {
                tracing::debug!(
                    "pid {pid} opened {}, not an MPI library: {e}",
                    opened.display()
                );
                return None;
            }
        };
        let before = self.libraries;
        self.attach(&lib);
        if self.libraries > before {
            self.run_time_libraries.stats.attached += 1;
            tracing::info!(
                "pid {pid} opened MPI library {} ({:?} {:?}), attached before the process \
                 went on",
                opened.display(),
                lib.flavor,
                lib.binding
            );
        }
        Some(lib.flavor)
    }

    /// Attaches the PMPI interposers process `pid` maps (it uses an MPI library of `flavor`).
    pub(super) fn attach_interposers(&mut self, pid: u32, flavor: MpiFlavor) {
        let checked = &mut self.run_time_libraries.checked;
        if checked.len() >= FILES_REMEMBERED {
            checked.clear();
        }
        let interposers =
            match discovery::process_interposers(pid, flavor, &self.functions, checked) {
                Ok(found) => found,
                Err(e) => {
                    tracing::debug!("pid {pid}: not checked for PMPI interposers: {e}");
                    return;
                }
            };
        for lib in interposers {
            tracing::info!(
                "pid {pid} maps PMPI interposer {}: its MPI functions are probed, so that each \
                 call counts once and its call site is the application's",
                lib.path.display()
            );
            self.attach(&lib);
        }
    }
}
