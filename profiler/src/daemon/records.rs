//! The burst records of one drain, grouped by process.
//!
//! The ring buffer holds records in the order their CPUs committed them, so the ranks of a job,
//! each on its own core, interleave record by record. Grouped by process (each process's records
//! in the order they came, the processes in the order of their first record), a drain comes in as
//! many runs as it has processes, and the loop and the online analysis look up a job, a batch, a
//! window and a stratum once per run rather than once per burst. Only the order across processes
//! changes, within one drain: no consumer relies on it.

use profiler_common::BurstRecord;

use crate::analysis::hashing::FastMap;

/// The records of the current drain, and room to group them, kept between drains so that a
/// storm's drains do not grow new buffers each time.
#[derive(Default)]
pub struct DrainRecords {
    records: Vec<BurstRecord>,
    grouped: Vec<BurstRecord>,
    /// The group (process) of each record, by position in `records`.
    group_of: Vec<u32>,
    /// Per group: its size, then where its next record goes in `grouped`.
    groups: Vec<usize>,
    group_of_pid: FastMap<u32, u32>,
}

impl DrainRecords {
    pub fn push(&mut self, record: BurstRecord) {
        self.records.push(record);
    }

    /// The records, grouped by process (a stable counting sort on the pid).
    pub fn grouped(&mut self) -> &[BurstRecord] {
        self.groups.clear();
        self.group_of.clear();
        self.group_of_pid.clear();
        let mut last: Option<(u32, u32)> = None;
        for record in &self.records {
            let group = match last {
                Some((pid, group)) if pid == record.pid => group,
                _ => {
                    let new = self.groups.len() as u32;
                    let group = *self.group_of_pid.entry(record.pid).or_insert(new);
                    if group == new {
                        self.groups.push(0);
                    }
                    last = Some((record.pid, group));
                    group
                }
            };
            self.groups[group as usize] += 1;
            self.group_of.push(group);
        }
        if self.groups.len() > 1 {
            let mut start = 0;
            for slot in &mut self.groups {
                let size = *slot;
                *slot = start;
                start += size;
            }
            self.grouped.clear();
            self.grouped
                .resize(self.records.len(), BurstRecord::default());
            for (record, &group) in self.records.iter().zip(&self.group_of) {
                let slot = &mut self.groups[group as usize];
                self.grouped[*slot] = *record;
                *slot += 1;
            }
            std::mem::swap(&mut self.records, &mut self.grouped);
        }
        &self.records
    }

    /// Empties the records for the next drain; returns how many there were.
    pub fn clear(&mut self) -> usize {
        let n = self.records.len();
        self.records.clear();
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: u32, start_ns: u64) -> BurstRecord {
        BurstRecord {
            pid,
            start_ns,
            ..BurstRecord::default()
        }
    }

    #[test]
    fn records_of_one_process_stay_in_their_order_and_together() {
        let mut drain = DrainRecords::default();
        let arrived = [(7, 1), (9, 2), (7, 3), (8, 4), (9, 5), (7, 6)];
        for (pid, t) in arrived {
            drain.push(record(pid, t));
        }
        let order: Vec<(u32, u64)> = drain
            .grouped()
            .iter()
            .map(|r| (r.pid, r.start_ns))
            .collect();
        assert_eq!(order, [(7, 1), (7, 3), (7, 6), (9, 2), (9, 5), (8, 4)]);
        assert_eq!(drain.clear(), 6);
        // The next drain starts empty; one process alone is left as it came.
        drain.push(record(3, 2));
        drain.push(record(3, 1));
        let order: Vec<u64> = drain.grouped().iter().map(|r| r.start_ns).collect();
        assert_eq!(order, [2, 1]);
    }
}
