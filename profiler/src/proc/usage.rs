//! A process's kernel resource usage from /proc/PID/{stat,statm,status} (CPU time in user and
//! kernel mode, resident memory, the CPUs it may run on) and its start time; the node's memory
//! from /proc/meminfo.

use std::collections::BTreeSet;

use super::cpu_list::{parse_cpu_list, CpuListError};
use super::stat::{StatError, StatFields};
use super::{read_process_file, ProcError};

/// One process's usage at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessUsage {
    pub user_ns: u64,
    pub system_ns: u64,
    pub rss_bytes: u64,
    pub cpus_allowed: BTreeSet<u32>,
}

/// What is wrong with the texts a usage reading parses, named by file.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("stat: {0}")]
    Stat(#[from] StatError),
    #[error("stat: field {field}, {ticks} ticks, overflows ns")]
    TicksOverflow { field: usize, ticks: u64 },
    #[error("statm: field 2 (resident) is not a number")]
    Resident,
    #[error("statm: the resident size overflows bytes")]
    ResidentOverflow,
    #[error("status: Cpus_allowed_list: {0}")]
    CpusAllowed(#[from] CpuListError),
    #[error("no MemTotal line with a size in kB")]
    MemTotal,
}

/// `sysconf(name)`, or the POSIX default where this system does not know the name.
fn sysconf(name: libc::c_int, default: u64) -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(name) };
    if v > 0 {
        v as u64
    } else {
        default
    }
}

/// The length of the kernel's clock tick (the unit of the times in /proc/PID/stat).
fn ns_per_tick() -> u64 {
    1_000_000_000 / sysconf(libc::_SC_CLK_TCK, 100)
}

/// Field `n` (1-based, as in proc_pid_stat(5), n ≥ 3) of /proc/PID/stat, a time in clock ticks,
/// in ns.
fn stat_ticks_ns(stat: &StatFields, n: usize, tick_ns: u64) -> Result<u64, UsageError> {
    let ticks = stat.number(n)?;
    ticks
        .checked_mul(tick_ns)
        .ok_or(UsageError::TicksOverflow { field: n, ticks })
}

/// The content of a file of process `pid` was not what the kernel writes.
fn format_error(pid: u32, error: UsageError) -> ProcError {
    ProcError::Format {
        path: format!("/proc/{pid}").into(),
        detail: error.to_string(),
    }
}

/// When process `pid` started (its fork), in ns after boot (CLOCK_BOOTTIME, which also counts
/// the time the machine was suspended), to the kernel's clock-tick resolution.
pub fn start_time_ns(pid: u32) -> Result<u64, ProcError> {
    let stat = read_process_file(pid, "stat")?;
    parse_start_time_ns(&stat, ns_per_tick()).map_err(|e| format_error(pid, e))
}

/// The start time in the text of /proc/PID/stat, in ns since boot, given the clock tick.
pub(crate) fn parse_start_time_ns(stat: &[u8], tick_ns: u64) -> Result<u64, UsageError> {
    stat_ticks_ns(&StatFields::parse(stat)?, 22, tick_ns)
}

/// Reads /proc/PID/{stat,statm,status}. Fails when the process is gone.
pub fn read_process(pid: u32) -> Result<ProcessUsage, ProcError> {
    let read = |file: &str| read_process_file(pid, file);
    parse_process(
        &read("stat")?,
        &String::from_utf8_lossy(&read("statm")?),
        &String::from_utf8_lossy(&read("status")?),
        ns_per_tick(),
        sysconf(libc::_SC_PAGESIZE, 4096),
    )
    .map_err(|e| format_error(pid, e))
}

/// [`read_process`] from the texts of /proc/PID/{stat,statm,status}, the clock tick and the
/// page size.
pub(crate) fn parse_process(
    stat: &[u8],
    statm: &str,
    status: &str,
    tick_ns: u64,
    page_bytes: u64,
) -> Result<ProcessUsage, UsageError> {
    let fields = StatFields::parse(stat)?;
    let resident_pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or(UsageError::Resident)?;
    let cpus_allowed = match status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
    {
        Some(list) => parse_cpu_list(list)?,
        None => BTreeSet::new(),
    };
    Ok(ProcessUsage {
        user_ns: stat_ticks_ns(&fields, 14, tick_ns)?,
        system_ns: stat_ticks_ns(&fields, 15, tick_ns)?,
        rss_bytes: resident_pages
            .checked_mul(page_bytes)
            .ok_or(UsageError::ResidentOverflow)?,
        cpus_allowed,
    })
}

/// Physical memory of the node (MemTotal), in bytes.
pub fn node_memory_bytes() -> Result<u64, ProcError> {
    read_node_file("/proc/meminfo", parse_mem_total)
}

/// Parses the node-wide file at `path` with `parse`.
fn read_node_file<T>(
    path: &str,
    parse: impl FnOnce(&str) -> Result<T, UsageError>,
) -> Result<T, ProcError> {
    let text = std::fs::read_to_string(path).map_err(|source| ProcError::Read {
        path: path.into(),
        source,
    })?;
    parse(&text).map_err(|e| ProcError::Format {
        path: path.into(),
        detail: e.to_string(),
    })
}

/// [`node_memory_bytes`] from the text of /proc/meminfo.
pub(crate) fn parse_mem_total(meminfo: &str) -> Result<u64, UsageError> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .and_then(|kib| kib.checked_mul(1024))
        .ok_or(UsageError::MemTotal)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A /proc/PID/stat text with utime, stime and starttime (fields 14, 15 and 22) as given.
    fn stat_text(utime: &str, stime: &str, starttime: &str) -> Vec<u8> {
        format!("99 (a) b) R 1 99 99 0 -1 0 0 0 0 0 {utime} {stime} 0 0 20 0 1 0 {starttime} 0 0\n")
            .into_bytes()
    }

    #[test]
    fn parses_the_stat_statm_and_status_texts() {
        let usage = parse_process(
            &stat_text("3", "4", "5"),
            "100 25 0 0 0 0 0\n",
            "Name:\ta\nCpus_allowed_list:\t0-1,3\n",
            10_000_000,
            4096,
        )
        .unwrap();
        assert_eq!(
            usage,
            ProcessUsage {
                user_ns: 30_000_000,
                system_ns: 40_000_000,
                rss_bytes: 25 * 4096,
                cpus_allowed: [0, 1, 3].into(),
            }
        );
        let start = parse_start_time_ns(&stat_text("0", "0", "5"), 10_000_000).unwrap();
        assert_eq!(start, 50_000_000);
        assert_eq!(parse_mem_total("MemTotal:  2048 kB\n").unwrap(), 2 << 20);
    }

    #[test]
    fn values_beyond_u64_nanoseconds_or_bytes_are_errors() {
        let huge = u64::MAX.to_string();
        let error = |r: Result<_, UsageError>| r.map(|_: u64| ()).unwrap_err().to_string();
        assert!(
            error(parse_start_time_ns(&stat_text("0", "0", &huge), 10_000_000))
                .contains("field 22")
        );
        assert!(error(parse_mem_total(&format!("MemTotal: {huge} kB"))).contains("MemTotal"));
        let status = "Cpus_allowed_list:\t0\n";
        let usage = |stat: &[u8], statm: &str| {
            parse_process(stat, statm, status, 10_000_000, 4096)
                .unwrap_err()
                .to_string()
        };
        assert!(usage(&stat_text(&huge, "0", "0"), "1 1").contains("field 14"));
        assert!(usage(&stat_text("0", "0", "0"), &format!("1 {huge}")).contains("statm"));
        assert!(usage(b"no command name", "1 1").contains("no '('"));
        let bad_cpus = parse_process(
            &stat_text("0", "0", "0"),
            "1 1",
            "Cpus_allowed_list:\t0-4294967295\n",
            1,
            1,
        );
        assert!(bad_cpus.unwrap_err().to_string().contains("above 65535"));
    }
}
