//! Kernel resource usage of the MPI processes (no PMU needed): CPU time in user and kernel mode,
//! resident memory and the CPUs each process may run on, from procfs; file I/O from the syscall
//! tracepoints ([`super::Capture::read_io`]). Summed per job by [`JobUsage`], which keeps the last
//! reading of every process so that a rank that ended still counts with what it had at its last
//! reading (its CPU time at most one stats interval short; its I/O exact, as the kernel entries
//! are read once more before they are removed).

use std::collections::{BTreeMap, BTreeSet};

use super::cpu_list::parse_cpu_list;
use crate::discovery::StatFields;

/// One process's usage at one instant.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessUsage {
    pub user_ns: u64,
    pub system_ns: u64,
    pub rss_bytes: u64,
    pub cpus_allowed: BTreeSet<u32>,
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

fn invalid(what: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.into())
}

/// Field `n` (1-based, as in proc_pid_stat(5), n ≥ 3) of /proc/PID/stat, a time in clock ticks,
/// in ns.
fn stat_ticks_ns(stat: &StatFields, n: usize, tick_ns: u64) -> std::io::Result<u64> {
    let ticks = stat
        .number(n)
        .map_err(|e| invalid(format!("/proc/PID/stat: {e}")))?;
    ticks.checked_mul(tick_ns).ok_or_else(|| {
        invalid(format!(
            "/proc/PID/stat: field {n}, {ticks} ticks, overflows ns"
        ))
    })
}

fn stat_fields(stat: &[u8]) -> std::io::Result<StatFields<'_>> {
    StatFields::parse(stat).map_err(|e| invalid(format!("/proc/PID/stat: {e}")))
}

/// The time of `clock` now, in ns.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// When the process started (its fork), in CLOCK_MONOTONIC ns, the clock of the BPF programs,
/// to the kernel's clock-tick resolution. /proc counts it from boot in CLOCK_BOOTTIME, which
/// also holds the time the machine was suspended.
pub fn start_time_monotonic_ns(pid: u32) -> std::io::Result<u64> {
    let stat = std::fs::read(format!("/proc/{pid}/stat"))?;
    let suspended_ns =
        clock_ns(libc::CLOCK_BOOTTIME).saturating_sub(clock_ns(libc::CLOCK_MONOTONIC));
    Ok(parse_start_time_ns(&stat, ns_per_tick())?.saturating_sub(suspended_ns))
}

/// The start time in the text of /proc/PID/stat, in ns since boot, given the clock tick.
pub(crate) fn parse_start_time_ns(stat: &[u8], tick_ns: u64) -> std::io::Result<u64> {
    stat_ticks_ns(&stat_fields(stat)?, 22, tick_ns)
}

/// Reads /proc/PID/{stat,statm,status}. Fails when the process is gone.
pub fn read_process(pid: u32) -> std::io::Result<ProcessUsage> {
    let read = |what: &str| std::fs::read(format!("/proc/{pid}/{what}"));
    parse_process(
        &read("stat")?,
        &String::from_utf8_lossy(&read("statm")?),
        &String::from_utf8_lossy(&read("status")?),
        ns_per_tick(),
        sysconf(libc::_SC_PAGESIZE, 4096),
    )
    .map_err(|e| invalid(format!("process {pid}: {e}")))
}

/// [`read_process`] from the texts of /proc/PID/{stat,statm,status}, the clock tick and the
/// page size.
pub(crate) fn parse_process(
    stat: &[u8],
    statm: &str,
    status: &str,
    tick_ns: u64,
    page_bytes: u64,
) -> std::io::Result<ProcessUsage> {
    let fields = stat_fields(stat)?;
    let resident_pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| invalid("/proc/PID/statm: field 2 (resident) is not a number"))?;
    let cpus_allowed = match status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
    {
        Some(list) => parse_cpu_list(list)
            .map_err(|e| invalid(format!("/proc/PID/status: Cpus_allowed_list: {e}")))?,
        None => BTreeSet::new(),
    };
    Ok(ProcessUsage {
        user_ns: stat_ticks_ns(&fields, 14, tick_ns)?,
        system_ns: stat_ticks_ns(&fields, 15, tick_ns)?,
        rss_bytes: resident_pages
            .checked_mul(page_bytes)
            .ok_or_else(|| invalid("/proc/PID/statm: the resident size overflows bytes"))?,
        cpus_allowed,
    })
}

/// Physical memory of the node (MemTotal), in bytes.
pub fn node_memory_bytes() -> std::io::Result<u64> {
    parse_mem_total(&std::fs::read_to_string("/proc/meminfo")?)
}

/// [`node_memory_bytes`] from the text of /proc/meminfo.
pub(crate) fn parse_mem_total(meminfo: &str) -> std::io::Result<u64> {
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .and_then(|kib| kib.checked_mul(1024))
        .ok_or_else(|| invalid("/proc/meminfo: no MemTotal line with a size in kB"))
}

/// File I/O counts of a process or a job's processes from the syscall tracepoints
/// (read/pread/readv…, write/pwrite/writev…, open/openat…, close), cumulative, or the difference
/// of two readings ([`IoCounts::since`]). Bytes are what the calls returned. This is the syscall
/// level, not the file system's (Guillén (2015) measured GPFS with mmpmon).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IoCounts {
    pub read_bytes: u64,
    pub read_calls: u64,
    pub write_bytes: u64,
    pub write_calls: u64,
    pub opens: u64,
    pub closes: u64,
}

impl IoCounts {
    fn zip(self, o: IoCounts, f: impl Fn(u64, u64) -> u64) -> IoCounts {
        IoCounts {
            read_bytes: f(self.read_bytes, o.read_bytes),
            read_calls: f(self.read_calls, o.read_calls),
            write_bytes: f(self.write_bytes, o.write_bytes),
            write_calls: f(self.write_calls, o.write_calls),
            opens: f(self.opens, o.opens),
            closes: f(self.closes, o.closes),
        }
    }

    /// The counts since an earlier reading of the same counters.
    pub fn since(self, before: IoCounts) -> IoCounts {
        self.zip(before, u64::saturating_sub)
    }
}

impl std::ops::Add for IoCounts {
    type Output = IoCounts;
    fn add(self, o: IoCounts) -> IoCounts {
        self.zip(o, |a, b| a + b)
    }
}

/// The kernel's per-process I/O totals as counts.
impl From<&profiler_common::IoTotals> for IoCounts {
    fn from(t: &profiler_common::IoTotals) -> Self {
        IoCounts {
            read_bytes: t.read_bytes,
            read_calls: t.read_calls,
            write_bytes: t.write_bytes,
            write_calls: t.write_calls,
            opens: t.opens,
            closes: t.closes,
        }
    }
}

/// Cumulative usage of one job's processes on this node up to the last reading.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UsageTotals {
    pub user_ns: u64,
    pub system_ns: u64,
    /// Resident memory of the live processes at the last reading.
    pub memory_used_bytes: u64,
    /// CPUs the live processes may use: the size of the union of their affinity masks, but no
    /// more than one per process (a rank without a cpuset may run anywhere, yet uses one CPU).
    pub cpus: u32,
    /// `None` when file I/O is not counted (`capture.file_io = false`).
    pub io: Option<IoCounts>,
}

/// The last reading of every process of one job, live or ended.
#[derive(Debug)]
pub struct JobUsage {
    processes: BTreeMap<u32, (ProcessUsage, bool)>,
    io: BTreeMap<u32, IoCounts>,
    file_io: bool,
}

impl JobUsage {
    /// `file_io`: whether the I/O tracepoints count (else the totals have no I/O).
    pub fn new(file_io: bool) -> Self {
        JobUsage {
            processes: BTreeMap::new(),
            io: BTreeMap::new(),
            file_io,
        }
    }

    /// Records a reading of a live process.
    pub fn update(&mut self, pid: u32, usage: ProcessUsage) {
        self.processes.insert(pid, (usage, true));
    }

    /// Records the I/O counts of a process.
    pub fn update_io(&mut self, pid: u32, io: IoCounts) {
        self.io.insert(pid, io);
    }

    /// Marks a process ended: its CPU time stays counted, its memory no longer.
    pub fn ended(&mut self, pid: u32) {
        if let Some((_, live)) = self.processes.get_mut(&pid) {
            *live = false;
        }
    }

    pub fn totals(&self) -> UsageTotals {
        let live: Vec<&ProcessUsage> = self
            .processes
            .values()
            .filter(|(_, l)| *l)
            .map(|(u, _)| u)
            .collect();
        let allowed: BTreeSet<u32> = live
            .iter()
            .flat_map(|u| u.cpus_allowed.iter().copied())
            .collect();
        UsageTotals {
            user_ns: self.processes.values().map(|(u, _)| u.user_ns).sum(),
            system_ns: self.processes.values().map(|(u, _)| u.system_ns).sum(),
            memory_used_bytes: live.iter().map(|u| u.rss_bytes).sum(),
            cpus: (allowed.len() as u32).min(live.len() as u32),
            io: self
                .file_io
                .then(|| self.io.values().fold(IoCounts::default(), |a, b| a + *b)),
        }
    }
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
        let error = |r: std::io::Result<_>| r.map(|_: u64| ()).unwrap_err().to_string();
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

    #[test]
    fn reads_this_process() {
        // Burn 50 ms of this thread's CPU time (not wall time, which a busy machine may spend
        // elsewhere) so the reading, in clock ticks, is not zero.
        let start = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
        let mut x = 0u64;
        while clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) - start < 50_000_000 {
            // Mostly user time: the clock read is a system call.
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        }
        let u = read_process(std::process::id()).unwrap();
        assert!(u.user_ns > 0 && u.rss_bytes > 0, "{u:?}");
        assert!(!u.cpus_allowed.is_empty());
        assert!(read_process(u32::MAX).is_err());
        // This test process started moments ago.
        let started = start_time_monotonic_ns(std::process::id()).unwrap();
        let now = clock_ns(libc::CLOCK_MONOTONIC);
        assert!(
            started <= now && now - started < 600_000_000_000,
            "started {started}, now {now}"
        );
        assert!(node_memory_bytes().unwrap() > u.rss_bytes);
    }

    #[test]
    fn ended_processes_keep_cpu_time_not_memory() {
        let p = |user_ns, rss_bytes, cpus: &[u32]| ProcessUsage {
            user_ns,
            system_ns: 1,
            rss_bytes,
            cpus_allowed: cpus.iter().copied().collect(),
        };
        let mut job = JobUsage::new(true);
        job.update(1, p(10, 100, &[0, 1, 2, 3]));
        job.update(2, p(20, 200, &[0, 1, 2, 3]));
        let io = |write_bytes| IoCounts {
            write_bytes,
            write_calls: 1,
            ..IoCounts::default()
        };
        job.update_io(1, io(5));
        job.update_io(2, io(7));
        let io_sum = IoCounts {
            write_bytes: 12,
            write_calls: 2,
            ..IoCounts::default()
        };
        assert_eq!(
            job.totals(),
            UsageTotals {
                user_ns: 30,
                system_ns: 2,
                memory_used_bytes: 300,
                cpus: 2,
                io: Some(io_sum)
            }
        );
        job.ended(1);
        assert_eq!(
            job.totals(),
            UsageTotals {
                user_ns: 30,
                system_ns: 2,
                memory_used_bytes: 200,
                cpus: 1,
                io: Some(io_sum)
            }
        );
    }
}
