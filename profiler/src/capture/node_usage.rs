//! The kernel usage (CPU time, memory, file I/O) of every job on the node, read per process at
//! each statistics update: /proc for CPU time and memory, the file I/O tracepoints' totals for
//! I/O. A process that ended keeps its CPU time in its job's totals.

use std::collections::{BTreeMap, HashSet};

use profiler_common::IoTotals;

use crate::{
    capture::usage::{JobUsage, UsageTotals},
    model::JobId,
    proc,
};

/// Each job's usage on this node.
pub struct NodeUsage {
    jobs: BTreeMap<JobId, JobUsage>,
    /// The I/O tracepoints count (`capture.file_io`).
    file_io: bool,
}

impl NodeUsage {
    pub fn new(file_io: bool) -> Self {
        NodeUsage {
            jobs: BTreeMap::new(),
            file_io,
        }
    }

    /// Reads the CPU time, memory and file I/O of every process of `members` (pid and job) into
    /// its job's usage; the `gone` ones are marked ended.
    pub fn read<'a>(
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
