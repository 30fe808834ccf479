//! The kernel usage (CPU time, memory, file I/O) of every job on the node, read per process at
//! each statistics update: /proc for CPU time and memory, the file I/O tracepoints' totals for
//! I/O. A process that ended keeps its CPU time in its job's totals.
//!
//! Also what the daemon's own CPU took from each job between two readings. The daemon's work
//! comes out of the node's idle time where there is some; the rest was taken from what ran on
//! the node, and from each job in proportion to the CPU its processes had. MPI ranks poll while
//! they wait, so on a node whose cores a job's ranks fill, all of the daemon's CPU while the job
//! runs is taken from its ranks. The daemon's CPU clock is also read at its drains, so that what
//! it took is placed in time within the interval: the last clustering of a job that ended, a
//! burst of tens of ms, is charged to the ranks that ran while it ran, not spread over the
//! whole interval (a job that starts within it would pay for it from its start).

use std::collections::{BTreeMap, HashSet};

use profiler_common::IoTotals;

use crate::{
    capture::usage::{clock_ns, JobUsage, UsageTotals},
    model::JobId,
    proc::{self, NodeCpu},
};

/// Each job's usage on this node.
pub struct NodeUsage {
    jobs: BTreeMap<JobId, JobUsage>,
    /// The I/O tracepoints count (`capture.file_io`).
    file_io: bool,
    /// The CPU of the node, of the daemon and of each job at the last reading.
    last: Option<CpuSample>,
    /// The daemon's CPU clock since the last reading, at most one every [`MARK_GAP_NS`]: (Unix
    /// ns, CPU ns).
    marks: Vec<(u64, u64)>,
    /// /proc/stat could not be read (said once).
    node_cpu_unread: bool,
}

/// One reading (Unix ns) of the cumulative CPU times, in ns.
struct CpuSample {
    at_ns: u64,
    node: NodeCpu,
    daemon_cpu_ns: u64,
    jobs: BTreeMap<JobId, u64>,
}

/// The shortest time between two reads of the daemon's CPU clock at its drains: half the drain
/// timer's default period, so that every tick of the timer reads it, while a storm, which wakes
/// the drain far more often, does not add reads.
const MARK_GAP_NS: u64 = 50_000_000;

/// The daemon's CPU taken from each job between two readings, and when within them the daemon
/// used CPU.
#[derive(Debug, Default, PartialEq)]
pub struct DaemonCpuTaken {
    pub jobs: BTreeMap<JobId, u64>,
    /// The daemon's CPU between the readings, by consecutive spans that cover them.
    pub spans: Vec<DaemonCpuSpan>,
}

/// The daemon's CPU in ns from `from_ns` to `to_ns` (Unix ns).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DaemonCpuSpan {
    pub from_ns: u64,
    pub to_ns: u64,
    pub cpu_ns: u64,
}

impl NodeUsage {
    pub fn new(file_io: bool) -> Self {
        NodeUsage {
            jobs: BTreeMap::new(),
            file_io,
            last: None,
            marks: Vec::new(),
            node_cpu_unread: false,
        }
    }

    /// Reads the daemon's CPU clock at `now_ns` (Unix ns), unless it was read less than 50 ms
    /// ago (`MARK_GAP_NS`).
    pub fn mark_daemon_cpu(&mut self, now_ns: u64) {
        let last = self.marks.last().map(|&(at, _)| at);
        let last = last.or(self.last.as_ref().map(|s| s.at_ns));
        if last.is_none_or(|at| now_ns >= at + MARK_GAP_NS) {
            self.marks
                .push((now_ns, clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID)));
        }
    }

    /// Reads the CPU time, memory and file I/O of every process of `members` (pid and job) into
    /// its job's usage; the `gone` ones are marked ended. Returns what the daemon's CPU took from
    /// each job since the last reading (none at the first, or when /proc/stat cannot be read).
    pub fn read<'a>(
        &mut self,
        members: impl Iterator<Item = (u32, &'a JobId)>,
        io: &BTreeMap<u32, IoTotals>,
        gone: &HashSet<u32>,
        now_ns: u64,
    ) -> DaemonCpuTaken {
        self.read_processes(members, io, gone);
        let node = match proc::node_cpu() {
            Ok(node) => node,
            Err(e) => {
                // The next reading covers this interval too, evenly: the marks go, or they
                // would pile up while /proc/stat stays unreadable.
                self.marks.clear();
                if !self.node_cpu_unread {
                    tracing::warn!(
                        "{e}: the daemon's own CPU is left out of what profiling costs until \
                         the node's CPU time can be read"
                    );
                    self.node_cpu_unread = true;
                }
                return DaemonCpuTaken::default();
            }
        };
        let sample = CpuSample {
            at_ns: now_ns,
            node,
            daemon_cpu_ns: clock_ns(libc::CLOCK_PROCESS_CPUTIME_ID),
            jobs: self
                .jobs
                .iter()
                .map(|(id, u)| {
                    let t = u.totals();
                    (id.clone(), t.user_ns + t.system_ns)
                })
                .collect(),
        };
        let taken = self
            .last
            .as_ref()
            .map_or_else(DaemonCpuTaken::default, |last| {
                daemon_cpu_taken(last, &self.marks, &sample)
            });
        self.last = Some(sample);
        self.marks.clear();
        taken
    }

    fn read_processes<'a>(
        &mut self,
        members: impl Iterator<Item = (u32, &'a JobId)>,
        io: &BTreeMap<u32, IoTotals>,
        gone: &HashSet<u32>,
    ) {
        for (pid, job) in members {
            let usage = self
                .jobs
                .entry(job.clone())
                .or_insert_with(|| JobUsage::new(self.file_io));
            if let Some(counts) = io.get(&pid) {
                usage.update_io(pid, counts.into());
            }
            if gone.contains(&pid) {
                usage.ended(pid);
            } else if let Ok(u) = proc::read_process(pid) {
                usage.update(pid, u);
            }
        }
    }

    /// A job's usage totals, once any of its processes was read.
    pub fn totals(&self, job: &JobId) -> Option<UsageTotals> {
        self.jobs.get(job).map(JobUsage::totals)
    }

    /// Drops an evicted job's usage.
    pub fn forget(&mut self, job: &JobId) {
        self.jobs.remove(job);
    }
}

/// What the daemon's CPU between readings `a` and `b` took from each job: the part the node's
/// idle time could not hold, shared by the jobs by their CPU over the CPU of all but the daemon.
/// With the daemon's CPU clock at `marks` (Unix ns, CPU ns) between them.
fn daemon_cpu_taken(a: &CpuSample, marks: &[(u64, u64)], b: &CpuSample) -> DaemonCpuTaken {
    let daemon = b.daemon_cpu_ns.saturating_sub(a.daemon_cpu_ns);
    let idle = b.node.idle_ns.saturating_sub(a.node.idle_ns);
    let others = b
        .node
        .busy_ns
        .saturating_sub(a.node.busy_ns)
        .saturating_sub(daemon);
    let jobs: BTreeMap<&JobId, u64> = b
        .jobs
        .iter()
        .map(|(id, &t)| (id, t.saturating_sub(a.jobs.get(id).copied().unwrap_or(0))))
        .collect();
    // The processes' times and the node's come from different readings at tick resolution: the
    // jobs' sum can exceed what the node counted for all but the daemon.
    let running = others.max(jobs.values().sum());
    let taken = daemon.saturating_sub(idle) as u128;
    let clock = std::iter::once((a.at_ns, a.daemon_cpu_ns))
        .chain(
            marks
                .iter()
                .copied()
                .filter(|&(at, _)| at > a.at_ns && at < b.at_ns),
        )
        .chain(std::iter::once((b.at_ns, b.daemon_cpu_ns)));
    let clock: Vec<(u64, u64)> = clock.collect();
    let spans = clock
        .windows(2)
        .map(|w| DaemonCpuSpan {
            from_ns: w[0].0,
            to_ns: w[1].0,
            cpu_ns: w[1].1.saturating_sub(w[0].1),
        })
        .collect();
    DaemonCpuTaken {
        spans,
        jobs: jobs
            .into_iter()
            .filter(|&(_, t)| t > 0 && taken > 0)
            .map(|(id, t)| (id.clone(), (taken * t as u128 / running as u128) as u64))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(
        at_s: u64,
        busy_ms: u64,
        idle_ms: u64,
        daemon_ms: u64,
        jobs: &[(&str, u64)],
    ) -> CpuSample {
        let ms = 1_000_000;
        CpuSample {
            at_ns: at_s * 1_000_000_000,
            node: NodeCpu {
                busy_ns: busy_ms * ms,
                idle_ns: idle_ms * ms,
            },
            daemon_cpu_ns: daemon_ms * ms,
            jobs: jobs
                .iter()
                .map(|&(id, t)| (JobId(id.into()), t * ms))
                .collect(),
        }
    }

    fn taken_ms(taken: &DaemonCpuTaken) -> Vec<(&str, u64)> {
        taken
            .jobs
            .iter()
            .map(|(id, &t)| (id.0.as_str(), t / 1_000_000))
            .collect()
    }

    fn span_ms(from_ms: u64, to_ms: u64, cpu_ms: u64) -> DaemonCpuSpan {
        let ms = 1_000_000;
        DaemonCpuSpan {
            from_ns: from_ms * ms,
            to_ns: to_ms * ms,
            cpu_ns: cpu_ms * ms,
        }
    }

    #[test]
    fn the_daemon_s_cpu_is_placed_in_time_by_its_clock_at_the_drains() {
        let a = sample(10, 0, 0, 0, &[("a", 0)]);
        let b = sample(11, 2_000, 0, 60, &[("a", 2_000)]);
        let ms = 1_000_000;
        // Marks outside the interval (a drain racing the reading) are left out.
        let marks = [
            (9_900 * ms, 0),
            (10_300 * ms, 5 * ms),
            (10_700 * ms, 55 * ms),
            (11_000 * ms, 60 * ms),
        ];
        let taken = daemon_cpu_taken(&a, &marks, &b);
        assert_eq!(
            taken.spans,
            [
                span_ms(10_000, 10_300, 5),
                span_ms(10_300, 10_700, 50),
                span_ms(10_700, 11_000, 5)
            ]
        );
        assert_eq!(taken_ms(&taken), [("a", 60)]);
    }

    #[test]
    fn the_daemon_s_cpu_beyond_the_idle_time_is_taken_from_the_jobs_by_their_cpu() {
        let a = sample(10, 0, 0, 0, &[("a", 0), ("b", 0)]);
        // Two cores for 1 s, no idle time: the daemon's 30 ms came out of the ranks of a (1.5 s
        // of CPU) and of b (0.47 s), and the rest of the node (0 ms).
        let full = sample(11, 2_000, 0, 30, &[("a", 1_500), ("b", 470)]);
        let taken = daemon_cpu_taken(&a, &[], &full);
        assert_eq!(taken.spans, [span_ms(10_000, 11_000, 30)]);
        assert_eq!(taken_ms(&taken), [("a", 22), ("b", 7)]);
        // 20 ms idle: only 10 ms of the daemon's CPU was taken.
        let idle = sample(11, 1_980, 20, 30, &[("a", 1_500), ("b", 470)]);
        assert_eq!(
            taken_ms(&daemon_cpu_taken(&a, &[], &idle)),
            [("a", 7), ("b", 2)]
        );
        // An idle core: nothing taken; a job that ran nothing is not listed.
        let spare = sample(11, 1_030, 970, 30, &[("a", 1_000), ("b", 0)]);
        assert_eq!(
            daemon_cpu_taken(&a, &[], &spare),
            DaemonCpuTaken {
                jobs: BTreeMap::new(),
                spans: vec![span_ms(10_000, 11_000, 30)],
            }
        );
        // Other processes ran 1 s: a had half of the CPU that was not the daemon's.
        let shared = sample(11, 2_000, 0, 40, &[("a", 980)]);
        assert_eq!(taken_ms(&daemon_cpu_taken(&a, &[], &shared)), [("a", 20)]);
        // The jobs' times read more than the node's (tick rounding): the daemon's CPU is shared
        // by the jobs, never more.
        let rounded = sample(11, 2_000, 0, 30, &[("a", 1_000), ("b", 1_000)]);
        assert_eq!(
            taken_ms(&daemon_cpu_taken(&a, &[], &rounded)),
            [("a", 15), ("b", 15)]
        );
    }
}
