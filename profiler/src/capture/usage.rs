//! Kernel resource usage of the MPI processes (no PMU needed): CPU time in user and kernel mode,
//! resident memory and the CPUs each process may run on, read from /proc by
//! [`crate::proc::read_process`]; file I/O from the syscall tracepoints
//! ([`super::Capture::read_io`]). Summed per job by [`JobUsage`], which keeps the last reading of
//! every process so that a rank that ended still counts with what it had at its last reading (its
//! CPU time at most one stats interval short; its I/O exact, as the kernel entries are read once
//! more before they are removed). Also the clocks: the kernel's, and a process's start on it.

use std::collections::{BTreeMap, BTreeSet};

use crate::proc::{self, ProcError, ProcessUsage};

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
pub fn start_time_monotonic_ns(pid: u32) -> Result<u64, ProcError> {
    let started_ns = proc::start_time_ns(pid)?;
    let suspended_ns =
        clock_ns(libc::CLOCK_BOOTTIME).saturating_sub(clock_ns(libc::CLOCK_MONOTONIC));
    Ok(started_ns.saturating_sub(suspended_ns))
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
    use crate::proc::{node_memory_bytes, read_process};

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
