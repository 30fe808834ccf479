//! Reading /proc, below capture and discovery, which both read it through this module. Of a
//! process: whether it still runs, its executable, its stat line (command name, parent, start
//! time, CPU time), its memory maps, its environment, its command line, its cgroups, its resident memory and the
//! CPUs it may run on (statm and status), and the path of a file as it sees it (its root) or as
//! it has it open (its descriptors). Of this process: its status (capabilities). Of the node: its
//! processes, its memory (meminfo) and the kernel's settings (/proc/sys/kernel). Also the kernel's CPU list format, which
//! /proc/PID/status shares with /sys. The parsers take the files' text, so that tests and the
//! fuzz targets drive them without a live process; the readers fail with a [`ProcError`] that
//! tells a process that has exited (a normal race for a profiler) from a file mpiburst may not
//! read.

mod cpu_list;
mod maps;
mod stat;
mod usage;

use std::path::{Path, PathBuf};

use procfs::process::Process;
use procfs::{FromBufRead, ProcessCGroups};

pub(crate) use cpu_list::parse_cpu_list;
pub use maps::{parse_maps, read_maps, Mapping, MapsError};
pub(crate) use stat::{parse_stat, read_stat, ProcStat};
pub use usage::{node_memory_bytes, read_process, start_time_ns, ProcessUsage};
pub(crate) use usage::{parse_mem_total, parse_process, parse_start_time_ns};

/// A failed read of a /proc file, or a file whose content is not what Linux writes there.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error("process {pid} exited before {path} could be read")]
    ProcessGone { pid: u32, path: PathBuf },

    #[error(
        "cannot read {path}: {source}; run mpiburst as root (or with CAP_SYS_PTRACE) so it can \
         read other users' processes"
    )]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("unexpected content in {path}: {detail}; is /proc a Linux procfs?")]
    Format { path: PathBuf, detail: String },
}

impl ProcError {
    /// Classifies a failed read of `path`, a file of process `pid`. ENOENT or ESRCH mean the
    /// process has gone, unlike a permission problem the operator must fix.
    fn process_read(pid: u32, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound
            || source.raw_os_error() == Some(libc::ESRCH)
        {
            ProcError::ProcessGone { pid, path }
        } else {
            ProcError::Read { path, source }
        }
    }

    /// Classifies a failed read of `path` through procfs, as [`ProcError::process_read`] does a
    /// direct one.
    fn procfs(pid: u32, path: impl Into<PathBuf>, error: procfs::ProcError) -> Self {
        use procfs::ProcError as Procfs;
        let path = path.into();
        match error {
            Procfs::NotFound(_) => ProcError::ProcessGone { pid, path },
            Procfs::PermissionDenied(_) => ProcError::Read {
                path,
                source: std::io::ErrorKind::PermissionDenied.into(),
            },
            Procfs::Io(source, _) => ProcError::Read { path, source },
            // procfs reports a read that fails midway as incomplete data, as when the process
            // is reaped meanwhile.
            Procfs::Incomplete(_) if !is_alive(pid) => ProcError::ProcessGone { pid, path },
            Procfs::Incomplete(_) | Procfs::Other(_) | Procfs::InternalError(_) => {
                ProcError::Format {
                    path,
                    detail: error.to_string(),
                }
            }
        }
    }
}

/// The bytes of /proc/PID/`file`.
fn read_process_file(pid: u32, file: &str) -> Result<Vec<u8>, ProcError> {
    let path = format!("/proc/{pid}/{file}");
    std::fs::read(&path).map_err(|e| ProcError::process_read(pid, path, e))
}

/// Whether process `pid` exists (running, or a zombie not yet reaped).
pub fn is_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Whether thread `tid` of process `pid` exists.
pub fn thread_exists(pid: u32, tid: u32) -> bool {
    Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}

/// The path of the file process `pid` executes.
pub fn executable(pid: u32) -> Result<PathBuf, ProcError> {
    let path = format!("/proc/{pid}/exe");
    std::fs::read_link(&path).map_err(|e| ProcError::process_read(pid, path, e))
}

/// A path that reaches the file process `pid` has open as descriptor `fd`, even where the
/// process sees it under another path (a container) or it was deleted.
pub fn open_file(pid: u32, fd: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/fd/{fd}"))
}

/// The same for a descriptor of this process.
pub fn own_open_file(fd: i32) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{fd}"))
}

/// The path of process `pid`'s memory maps (what a read of them waits on, for its progress).
pub fn maps_path(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/maps"))
}

/// This process's status (its capabilities among them).
pub fn own_status() -> std::io::Result<String> {
    std::fs::read_to_string("/proc/self/status")
}

/// A kernel setting under /proc/sys/kernel, trimmed: `hostname`, `bpf_stats_enabled`, ….
pub fn kernel_setting(name: &str) -> std::io::Result<String> {
    std::fs::read_to_string(format!("/proc/sys/kernel/{name}")).map(|v| v.trim().to_string())
}

/// A path that reaches the file process `pid` executes even where the process's mount namespace
/// (a container) has it under another path, or it was deleted.
pub fn executable_file(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/exe"))
}

/// Where `path`, as process `pid` sees it, is reached from here: through the process's root
/// directory, which is the process's own in a container. (procfs offers only the link's target,
/// `Process::root`, which does not lead into that namespace.)
pub fn in_root(pid: u32, path: &Path) -> PathBuf {
    let relative = path.strip_prefix("/").unwrap_or(path);
    Path::new(&format!("/proc/{pid}/root")).join(relative)
}

/// The environment of process `pid` as /proc/PID/environ holds it: `NAME=value` entries, each
/// ended by a NUL byte.
pub fn environ(pid: u32) -> Result<Vec<u8>, ProcError> {
    read_process_file(pid, "environ")
}

/// The command line of process `pid` as /proc/PID/cmdline holds it: its arguments, each ended
/// by a NUL byte.
pub fn cmdline(pid: u32) -> Result<Vec<u8>, ProcError> {
    read_process_file(pid, "cmdline")
}

/// The pids of the node's processes.
pub fn pids() -> Result<Vec<u32>, ProcError> {
    let entries = std::fs::read_dir("/proc").map_err(|source| ProcError::Read {
        path: "/proc".into(),
        source,
    })?;
    Ok(entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect())
}

/// The cgroups of process `pid`, one per hierarchy (/proc/PID/cgroup).
pub fn cgroups(pid: u32) -> Result<ProcessCGroups, ProcError> {
    Process::new(pid as i32)
        .and_then(|process| process.cgroups())
        .map_err(|e| ProcError::procfs(pid, format!("/proc/{pid}/cgroup"), e))
}

/// Parses the text of a /proc/PID/cgroup file as [`cgroups`] reads it.
pub fn parse_cgroups(text: &[u8]) -> Result<ProcessCGroups, ProcError> {
    ProcessCGroups::from_buf_read(text).map_err(|e| ProcError::Format {
        path: "/proc/PID/cgroup".into(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_runs_its_executable() {
        let pid = std::process::id();
        assert!(is_alive(pid));
        assert!(!is_alive(u32::MAX));
        assert_eq!(executable(pid).unwrap(), std::env::current_exe().unwrap());
        assert!(matches!(
            executable(u32::MAX),
            Err(ProcError::ProcessGone { .. })
        ));
        assert!(pids().unwrap().contains(&pid));
        assert_eq!(
            in_root(pid, Path::new("/usr/lib")),
            PathBuf::from(format!("/proc/{pid}/root/usr/lib"))
        );
    }
}
