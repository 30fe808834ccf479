//! What the daemon reads from the files of libraries found at run time, on the threads of
//! [`FileReads`](super::file_reads::FileReads): the file a held process opened, and the MPI
//! libraries and PMPI interposers a new process maps. Any of them may be on a file system that
//! does not answer (a hung NFS or FUSE mount); the loop attaches what comes back in time.

use std::{
    collections::HashSet,
    hash::Hash,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Mutex, MutexGuard, PoisonError},
};

use super::file_reads::ReadProgress;
use crate::{
    discovery::{self, Binding, DiscoveryError, MpiFlavor, MpiLibrary, ProbePoints},
    proc,
};

/// What attaching a library takes from its file. For a library found at run time it is read off
/// the daemon's loop: the file may be on a file system that does not answer.
pub(super) struct LibraryRead {
    pub(super) lib: MpiLibrary,
    pub(super) points: Result<ProbePoints, DiscoveryError>,
    /// Open MPI's C library: where its datatypes keep their size.
    pub(super) dtype_size_offset: Option<Result<u64, DiscoveryError>>,
}

impl LibraryRead {
    /// Reads the entry points of `functions` in `lib`, and where its datatypes keep their size.
    pub(super) fn read(lib: MpiLibrary, functions: &[String]) -> Self {
        let points = discovery::probe_points(&lib, functions);
        let dtype_size_offset = (lib.binding == Binding::C && lib.flavor == MpiFlavor::OpenMpi)
            .then(|| discovery::openmpi_datatype_size_offset(&lib));
        LibraryRead {
            lib,
            points,
            dtype_size_offset,
        }
    }
}

/// Upper bound on the files remembered as attached and as checked for PMPI interposers (as for
/// the build-id cache: a node maps a few thousand distinct files).
const FILES_REMEMBERED: usize = 8192;

/// What the reads share with the loop. Each lock is held for one lookup or insert, never across
/// a file access, so a read stuck on a file holds none.
#[derive(Default)]
pub(super) struct SharedFiles {
    /// (device, inode) of the files attached: their probe points are not read again.
    attached: Mutex<HashSet<(u64, u64)>>,
    /// (device, inode) of every mapped file looked at for PMPI interposers.
    checked: Mutex<HashSet<(u64, u64)>>,
    /// Files whose read is stuck (their file system does not answer), by the path the process
    /// knows them by: not read again until that read returns.
    hung: Mutex<HashSet<PathBuf>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Adds `key` to a bounded set; whether it was not there.
fn remember<K: Eq + Hash>(set: &Mutex<HashSet<K>>, key: K) -> bool {
    let mut set = lock(set);
    if set.len() >= FILES_REMEMBERED && !set.contains(&key) {
        set.clear();
    }
    set.insert(key)
}

impl SharedFiles {
    /// Notes a file attached.
    pub(super) fn attached(&self, file: (u64, u64)) {
        remember(&self.attached, file);
    }

    fn is_attached(&self, file: (u64, u64)) -> bool {
        lock(&self.attached).contains(&file)
    }

    /// Notes that a read of `path` is stuck.
    pub(super) fn hung(&self, path: &Path) {
        lock(&self.hung).insert(path.to_path_buf());
    }

    /// Notes that the stuck read of `path` returned.
    pub(super) fn answers_again(&self, path: &Path) {
        lock(&self.hung).remove(path);
    }

    pub(super) fn is_hung(&self, path: &Path) -> bool {
        lock(&self.hung).contains(path)
    }

    /// Notes where a read is about to go (process `pid`, file `path`); whether it may (the file
    /// is not one whose read is stuck).
    fn may_read(&self, progress: &ReadProgress, pid: u32, path: &Path) -> bool {
        progress.reading(pid, path);
        !self.is_hung(path)
    }

    /// The PMPI interposers process `pid` maps that were not looked at before, read for
    /// attaching.
    fn interposers(
        &self,
        pid: u32,
        flavor: MpiFlavor,
        functions: &[String],
        progress: &ReadProgress,
    ) -> Vec<LibraryRead> {
        let first_look = |file| remember(&self.checked, file);
        let may_read = |path: &Path| self.may_read(progress, pid, path);
        match discovery::process_interposers(pid, flavor, functions, &first_look, &may_read) {
            Ok(found) => found
                .into_iter()
                .map(|lib| LibraryRead::read(lib, functions))
                .collect(),
            Err(e) => {
                tracing::debug!("pid {pid}: not checked for PMPI interposers: {e}");
                Vec::new()
            }
        }
    }
}

/// What the file a held process opened is.
pub(super) enum Opened {
    /// An MPI library: read for attaching, unless attached already.
    Mpi(MpiFlavor, Option<LibraryRead>),
    /// Not an MPI library, or not readable: why.
    Other(String),
}

/// The read of the file held processes opened at one path.
pub(super) struct OpenedRead {
    /// The key of the path among the BPF program's known paths.
    pub(super) path_hash: u64,
    /// The file itself rather than the name opened (often a symlink), as the process sees it:
    /// what an operator looks for in the log.
    pub(super) name: PathBuf,
    pub(super) opened: Opened,
    /// The PMPI interposers the held processes map, each with the first process that maps it.
    pub(super) interposers: Vec<(u32, LibraryRead)>,
}

/// Reads the file opened at `path` by the `held` processes (pid, descriptor) through the first
/// one's descriptor, in whatever mount namespace it runs.
pub(super) fn read_opened(
    path_hash: u64,
    path: &str,
    held: &[(u32, u32)],
    functions: &[String],
    files: &SharedFiles,
    progress: &ReadProgress,
) -> OpenedRead {
    let (pid, fd) = held[0];
    progress.reading(pid, Path::new(path));
    let access = proc::open_file(pid, fd);
    let name = std::fs::read_link(&access).unwrap_or_else(|_| path.into());
    let opened = match std::fs::metadata(&access) {
        Ok(meta) if meta.is_file() && files.is_attached((meta.dev(), meta.ino())) => {
            // Its flavour, for its interposers: the symbols only, not the probe points.
            match MpiLibrary::open_as(&access, &name) {
                Ok(lib) => Opened::Mpi(lib.flavor, None),
                Err(e) => Opened::Other(e.to_string()),
            }
        }
        Ok(meta) if meta.is_file() => match MpiLibrary::open_as(&access, &name) {
            Ok(lib) => Opened::Mpi(lib.flavor, Some(LibraryRead::read(lib, functions))),
            Err(e) => Opened::Other(e.to_string()),
        },
        // Anyone can open a FIFO or a device named libmpi*: reading one would block.
        Ok(_) => Opened::Other("not a regular file".into()),
        Err(e) => Opened::Other(format!("{} unreadable: {e}", access.display())),
    };
    // A preloaded interposer is mapped before the libraries the program needs.
    let interposers = match &opened {
        Opened::Mpi(flavor, _) => held
            .iter()
            .flat_map(|&(pid, _)| {
                files
                    .interposers(pid, *flavor, functions, progress)
                    .into_iter()
                    .map(move |lib| (pid, lib))
            })
            .collect(),
        Opened::Other(_) => Vec::new(),
    };
    OpenedRead {
        path_hash,
        name,
        opened,
        interposers,
    }
}

/// What the scan of a new process found.
pub(super) struct ScannedProcess {
    pub(super) pid: u32,
    /// It maps an MPI library.
    pub(super) maps_mpi: bool,
    /// Its MPI libraries not attached yet, read for attaching.
    pub(super) libraries: Vec<LibraryRead>,
    /// Its PMPI interposers not looked at before, read for attaching.
    pub(super) interposers: Vec<LibraryRead>,
}

/// Scans the maps of new processes for MPI libraries and PMPI interposers, skipping the files
/// whose read is stuck.
pub(super) fn scan_processes(
    pids: &[u32],
    functions: &[String],
    files: &SharedFiles,
    progress: &ReadProgress,
) -> Vec<ScannedProcess> {
    let mut read_now = HashSet::new();
    pids.iter()
        .map(|&pid| {
            // Reading the maps waits for the process's memory map lock, which a page fault on a
            // hung file holds.
            progress.reading(pid, &proc::maps_path(pid));
            let may_read = |path: &Path| files.may_read(progress, pid, path);
            let found = discovery::process_libraries(pid, &may_read).unwrap_or_default();
            let interposers = found
                .first()
                .map(|lib| files.interposers(pid, lib.flavor, functions, progress))
                .unwrap_or_default();
            ScannedProcess {
                pid,
                maps_mpi: !found.is_empty(),
                libraries: found
                    .into_iter()
                    .filter(|lib| {
                        let file = (lib.dev, lib.inode);
                        !files.is_attached(file) && read_now.insert(file)
                    })
                    .map(|lib| LibraryRead::read(lib, functions))
                    .collect(),
                interposers,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::test_support::{Spawned, MPICH_C};

    #[test]
    fn a_scan_reads_no_file_known_to_hang_and_says_where_it_is() {
        let mut cmd = std::process::Command::new("sleep");
        cmd.arg("10").env("LD_PRELOAD", "libmpich.so.12");
        let child = Spawned::start(cmd);
        let functions = vec!["MPI_Send".to_string()];
        let files = SharedFiles::default();
        let progress = ReadProgress::default();
        let scanned = child.wait_until(|| {
            let scan = scan_processes(&[child.pid()], &functions, &files, &progress);
            scan.into_iter().find(|p| p.maps_mpi)
        });
        assert_eq!(scanned.libraries.len(), 1);
        let mapped = std::fs::canonicalize(MPICH_C).unwrap();
        assert_eq!(scanned.libraries[0].lib.path, mapped);
        // The mapped path was the last one an MPI library was read at.
        files.hung(&mapped);
        let scan = scan_processes(&[child.pid()], &functions, &files, &progress);
        assert!(!scan[0].maps_mpi, "a file known to hang was read");
        files.answers_again(&mapped);
        let scan = scan_processes(&[child.pid()], &functions, &files, &progress);
        assert!(scan[0].maps_mpi);
    }
}
