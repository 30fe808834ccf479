//! One daemon per lock file: a file the daemon holds an exclusive flock on for its life, with
//! its pid in it, so that a second daemon started by mistake refuses before it truncates a
//! recording or attaches a second set of probes.
//!
//! The file is never removed: removing a lock file races with a daemon that has just opened it
//! (it would lock the removed file while a third locks a new one). The kernel drops the lock
//! when its holder exits, however it exits, so a stale file locks nothing.

use std::{
    fs::File,
    io::{Read as _, Seek as _, Write as _},
    os::fd::AsRawFd as _,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

/// The lock file's name in the runtime directory systemd gives the service
/// (`RuntimeDirectory=`, passed as $RUNTIME_DIRECTORY).
const NAME: &str = "mpiburst.lock";

#[derive(Debug, thiserror::Error)]
pub enum InstanceError {
    #[error(
        "another daemon is already running (pid {pid}): it holds the lock file {path}; stop it first \
         (`systemctl stop mpiburst`), or give this daemon a lock file of its own \
         (`daemon.lock_file`)"
    )]
    Running { pid: String, path: PathBuf },
    #[error(
        "cannot take the lock file {path}: {source}; make its directory writable by the daemon's \
         user or choose another path in `daemon.lock_file`"
    )]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where the lock file is: `daemon.lock_file` when set, else in the service's runtime directory
/// when systemd gave it one, else nowhere (a daemon run by hand is kept from a second one by its
/// listen address only).
pub fn lock_path(configured: &str, runtime_directory: Option<&str>) -> Option<PathBuf> {
    if !configured.is_empty() {
        return Some(PathBuf::from(configured));
    }
    // systemd separates several runtime directories with colons; the first is the unit's own.
    let dir = runtime_directory?
        .split(':')
        .next()
        .filter(|d| !d.is_empty())?;
    Some(Path::new(dir).join(NAME))
}

/// The held lock; dropping it (or the daemon exiting) releases it.
#[derive(Debug)]
pub struct InstanceLock {
    file: File,
}

impl InstanceLock {
    /// Takes the lock at `path` without waiting, and writes this process's pid into it.
    pub fn acquire(path: &Path) -> Result<InstanceLock, InstanceError> {
        let io = |source| InstanceError::Io {
            path: path.to_path_buf(),
            source,
        };
        // Not truncated on open: until the lock is ours the pid in it is the holder's.
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map_err(io)?;
        // SAFETY: flock on a file descriptor this function owns.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            let error = std::io::Error::last_os_error();
            if error.kind() != std::io::ErrorKind::WouldBlock {
                return Err(io(error));
            }
            let mut pid = String::new();
            file.read_to_string(&mut pid).map_err(io)?;
            let pid = pid.trim();
            return Err(InstanceError::Running {
                pid: if pid.is_empty() { "unknown" } else { pid }.to_string(),
                path: path.to_path_buf(),
            });
        }
        file.set_len(0).map_err(io)?;
        file.rewind().map_err(io)?;
        writeln!(file, "{}", std::process::id()).map_err(io)?;
        Ok(InstanceLock { file })
    }
}

impl Drop for InstanceLock {
    fn drop(&mut self) {
        // The pid of a daemon that has stopped would mislead whoever reads the file.
        let _ = self.file.set_len(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_configured_path_wins_then_the_runtime_directory() {
        assert_eq!(
            lock_path("/var/lock/mb.lock", Some("/run/mpiburst")),
            Some(PathBuf::from("/var/lock/mb.lock"))
        );
        assert_eq!(
            lock_path("", Some("/run/mpiburst:/run/other")),
            Some(PathBuf::from("/run/mpiburst/mpiburst.lock"))
        );
        assert_eq!(lock_path("", None), None);
        assert_eq!(lock_path("", Some("")), None);
    }

    #[test]
    fn a_second_holder_is_refused_with_the_first_ones_pid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(NAME);
        let first = InstanceLock::acquire(&path).unwrap();
        let pid = std::process::id().to_string();
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), pid);
        // flock locks belong to the open file description: a second open conflicts even within
        // one process, as a second daemon's would.
        let e = InstanceLock::acquire(&path).unwrap_err().to_string();
        assert!(e.contains(&format!("already running (pid {pid})")), "{e}");
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), pid);
        drop(first);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        let again = InstanceLock::acquire(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap().trim(), pid);
        drop(again);
    }
}
