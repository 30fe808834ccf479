//! The per-job store: what the daemon knows about each job on this node (identity, ranks, exact
//! per-rank totals from the kernel, and a bounded window of recent bursts). Live capture and
//! recordings both fill it, so reports and exports read it the same way.

pub mod bursts;
pub mod clock;
pub mod ingest;
pub mod job_wide;
pub mod members;
pub mod probe_cost;
pub mod readings;

use std::{collections::BTreeMap, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::model::{
    is_lifecycle_function, Burst, CallSite, JobId, FINALIZE_FUNCTION, INIT_FUNCTIONS,
};
use bursts::Bursts;

/// Exact per-rank burst totals (from the kernel; independent of the duration filter).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankTotals {
    pub bursts: u64,
    pub burst_ns: u64,
    pub burst_oncpu_ns: u64,
    /// Bursts below the duration filter: summed in kernel, not shipped.
    pub filtered_bursts: u64,
    pub filtered_ns: u64,
    /// Bursts at or above the filter lost because the ring buffer was full.
    pub dropped_bursts: u64,
    /// The two counter slots (the daemon's counter events) summed over all bursts, whatever the
    /// filter; `None` when counters are off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counter_sums: Option<[u64; 2]>,
}

/// Calls, bytes and peers of one MPI function at one call site of a rank (outermost calls only).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteStats {
    pub function: String,
    pub site: CallSite,
    pub calls: u64,
    pub bytes: u64,
    /// Calls whose peer (destination or source) was a rank of MPI_COMM_WORLD, and the sum of
    /// those peers: their mean less the rank is the mean relative peer.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub world_peer_calls: u64,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub world_peer_sum: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Calls, time and bytes of one MPI function in one rank (outermost calls only).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallStats {
    pub calls: u64,
    pub time_ns: u64,
    pub bytes: u64,
    /// Calls whose datatype size was known; `bytes` covers exactly these.
    pub sized_calls: u64,
    /// The probe governor counted some of these calls at their entry only (a polling storm):
    /// `time_ns` covers only the others.
    #[serde(default, skip_serializing_if = "is_false")]
    pub count_only: bool,
    /// The probe governor sampled this function while the rank ran: calls between its sampling
    /// windows are not counted, and `calls` is a lower bound.
    #[serde(default, skip_serializing_if = "is_false")]
    pub sampled: bool,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What the kernel saw of a rank's region of interest (see [`crate::model::INIT_FUNCTIONS`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionMarks {
    /// Unix ns at the return of MPI_Init/MPI_Init_thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_return_ns: Option<u64>,
    /// Unix ns at the entry of MPI_Finalize.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finalize_entry_ns: Option<u64>,
    /// Unix ns at the entry of each outermost MPI call (other than the lifecycle calls) that a
    /// thread of the rank was inside at the last kernel read: their time so far is MPI time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub open_calls_since_ns: Vec<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankRecord {
    pub rank: u32,
    pub pid: u32,
    /// Unix ns when the rank's program started (its last exec, else its fork, or the daemon's
    /// start if later) and when it ended.
    pub first_seen_ns: u64,
    pub ended_ns: Option<u64>,
    pub totals: RankTotals,
    pub functions: BTreeMap<String, CallStats>,
    /// The same calls by call site, in (function, site) order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub call_sites: Vec<SiteStats>,
    #[serde(default)]
    pub region: RegionMarks,
    /// The rank's probe hits and what a hit cost on its node; `None` where the daemon measured
    /// no probe cost (its probe governor off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_cost: Option<probe_cost::RankProbeCost>,
}

impl RankRecord {
    /// Time inside every outermost MPI call, the lifecycle calls included.
    pub fn mpi_ns(&self) -> u64 {
        self.functions.values().map(|f| f.time_ns).sum()
    }
    pub fn calls(&self) -> u64 {
        self.functions.values().map(|f| f.calls).sum()
    }

    /// Time inside MPI_Init/MPI_Init_thread.
    pub fn init_ns(&self) -> u64 {
        INIT_FUNCTIONS
            .iter()
            .filter_map(|f| self.functions.get(*f))
            .map(|s| s.time_ns)
            .sum()
    }

    /// Time inside MPI_Finalize.
    pub fn finalize_ns(&self) -> u64 {
        self.functions
            .get(FINALIZE_FUNCTION)
            .map_or(0, |s| s.time_ns)
    }

    /// The rank's region of interest up to `now_ns` (Unix ns): from the return of its init call
    /// to the entry of MPI_Finalize, or to its exit when it ended without one, or to `now_ns`.
    /// A rank whose init return the daemon did not see but which made other MPI calls or bursts
    /// initialised before the daemon saw it: its region starts when the daemon first saw it.
    /// `None` while the rank has not returned from its init call.
    pub fn region_span(&self, now_ns: u64) -> Option<(u64, u64)> {
        let start = match self.region.init_return_ns {
            Some(t) => t,
            None if self.totals.bursts > 0 || self.region_functions().any(|(_, s)| s.calls > 0) => {
                self.first_seen_ns
            }
            None => return None,
        };
        let end = self
            .region
            .finalize_entry_ns
            .or(self.ended_ns)
            .unwrap_or(now_ns)
            .max(start);
        Some((start, end))
    }

    /// Time inside outermost MPI calls in the region up to `now_ns`: every call but the
    /// lifecycle ones, completed or (at the last kernel read) in progress.
    pub fn region_mpi_ns(&self, now_ns: u64) -> u64 {
        let completed: u64 = self.region_functions().map(|(_, s)| s.time_ns).sum();
        let end = self.region_span(now_ns).map_or(now_ns, |(_, end)| end);
        let open: u64 = self
            .region
            .open_calls_since_ns
            .iter()
            .map(|&since| end.saturating_sub(since))
            .sum();
        completed + open
    }

    fn region_functions(&self) -> impl Iterator<Item = (&String, &CallStats)> {
        self.functions
            .iter()
            .filter(|(name, _)| !is_lifecycle_function(name))
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobMeta {
    pub id: JobId,
    pub node: String,
    /// Ranks in the job's world (on all nodes).
    pub size: u32,
    /// Where the identity came from (environment of a launcher, or the launcher process).
    pub source: String,
    /// Executable of the first rank seen.
    pub executable: String,
    /// Its GNU build-id in hex, when it has one: what tells runs of the same application apart
    /// from runs of a rebuilt one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub build_id: Option<String>,
    /// The Slurm job the job ran in, whoever launched it (see
    /// [`crate::discovery::ProcessIdentity::scheduler_job`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler_job: Option<String>,
    /// The Slurm job's cgroup, when Slurm put the job in one (see
    /// [`crate::discovery::ProcessIdentity::cgroup`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// Where the job's processes mapped the modules of its call sites: module id (GNU build-id in
    /// hex, as [`crate::model::CallSite::module`] holds it) → path of the file as the processes
    /// saw it. Symbolization reads the file only while it still carries that build-id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub modules: BTreeMap<String, String>,
    pub first_seen_ns: u64,
    pub ended_ns: Option<u64>,
}

impl JobMeta {
    /// Where the identity came from, as an identifier: the discovery method (`OpenMpiEnv`,
    /// `SlurmEnv`, …) or `unidentified`, without the reason `source` adds to the latter.
    pub fn source_kind(&self) -> &str {
        self.source
            .split_once(" (")
            .map_or(self.source.as_str(), |(kind, _)| kind)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Job {
    pub meta: JobMeta,
    pub ranks: BTreeMap<u32, RankRecord>,
    /// The most recent bursts, bounded by the configuration.
    pub bursts: Bursts,
    /// Bursts received but no longer held because of the bound.
    pub bursts_evicted: u64,
}

impl Job {
    pub fn new(meta: JobMeta) -> Self {
        Job {
            meta,
            ranks: BTreeMap::new(),
            bursts: Bursts::default(),
            bursts_evicted: 0,
        }
    }

    /// Drops the job's `n` oldest bursts from memory (their time stays in the totals).
    fn evict_oldest_bursts(&mut self, n: usize) {
        self.bursts_evicted += self.bursts.evict_oldest(n) as u64;
    }

    /// The job's records without its burst buffer (the count of evicted bursts is kept): what the
    /// daemon publishes to the HTTP server.
    pub fn without_bursts(&self) -> Job {
        Job {
            meta: self.meta.clone(),
            ranks: self.ranks.clone(),
            bursts: Bursts::default(),
            bursts_evicted: self.bursts_evicted,
        }
    }

    /// Per-function totals over all ranks, by function name.
    pub fn functions(&self) -> BTreeMap<&str, CallStats> {
        let mut out: BTreeMap<&str, CallStats> = BTreeMap::new();
        for r in self.ranks.values() {
            for (name, s) in &r.functions {
                let e = out.entry(name.as_str()).or_default();
                e.calls += s.calls;
                e.time_ns += s.time_ns;
                e.bytes += s.bytes;
                e.sized_calls += s.sized_calls;
                e.count_only |= s.count_only;
                e.sampled |= s.sampled;
            }
        }
        out
    }

    pub fn totals(&self) -> RankTotals {
        let mut t = RankTotals::default();
        for r in self.ranks.values() {
            t.bursts += r.totals.bursts;
            t.burst_ns += r.totals.burst_ns;
            t.burst_oncpu_ns += r.totals.burst_oncpu_ns;
            t.filtered_bursts += r.totals.filtered_bursts;
            t.filtered_ns += r.totals.filtered_ns;
            t.dropped_bursts += r.totals.dropped_bursts;
        }
        // Counter sums of the job only when every rank has them.
        t.counter_sums = self.ranks.values().try_fold([0u64; 2], |[a, b], r| {
            let [x, y] = r.totals.counter_sums?;
            Some([a + x, b + y])
        });
        t
    }

    /// The number of ranks a node-local phase analysis is over (m in
    /// [`analyse`](crate::analysis::analyse)): the job's ranks this node saw, from their kernel
    /// totals or their bursts. Not the job's world size: a node sees only its own ranks, and
    /// counting the others as ranks without bursts would cut every load balance and SPMD score by
    /// the share of ranks running elsewhere. A local rank without any analysed burst still counts,
    /// as it should.
    pub fn node_ranks(&self) -> u32 {
        self.ranks
            .keys()
            .copied()
            .chain(self.bursts.iter().map(|b| b.rank))
            .collect::<std::collections::BTreeSet<_>>()
            .len() as u32
    }

    pub fn is_ended(&self) -> bool {
        self.meta.ended_ns.is_some()
    }
}

/// All jobs of this node, keyed by id.
#[derive(Default)]
pub struct JobStore {
    pub jobs: BTreeMap<JobId, Job>,
}

impl JobStore {
    /// The rank of a process identified before.
    pub fn rank_mut(&mut self, member: &members::Member) -> Option<&mut RankRecord> {
        self.jobs
            .get_mut(&member.job)
            .and_then(|j| j.ranks.get_mut(&member.rank))
    }

    /// Adds a process identified now: its job, when it is the job's first, and its rank.
    /// Whether its job is new.
    pub fn add_member(&mut self, new: members::NewMember) -> bool {
        let mut added = false;
        let job = self.jobs.entry(new.meta.id.clone()).or_insert_with(|| {
            added = true;
            Job::new(new.meta)
        });
        job.ranks.entry(new.rank.rank).or_insert(new.rank);
        added
    }

    /// Keeps a drain's `batch` of a job's bursts in its memory, within a budget of `max_bursts`
    /// over the whole node: when the jobs hold that many, the oldest burst of the job holding
    /// the most goes first, so a burst storm in one job never pushes out the bursts of the
    /// others. Nothing happens for a job that is not held.
    pub fn push_bursts(&mut self, id: &JobId, batch: Arc<Vec<Burst>>, max_bursts: usize) {
        let max_bursts = max_bursts.max(1);
        let mut job = None;
        let mut others = Vec::new();
        for (key, j) in self.jobs.iter_mut() {
            if key == id {
                job = Some(j);
            } else {
                others.push(j);
            }
        }
        let Some(job) = job else { return };
        let held = others.iter().map(|j| j.bursts.len()).sum::<usize>() + job.bursts.len();
        // The bursts past the budget each push one out: the oldest of the job holding the most,
        // or this job's own when no other holds more. Who gives up how many is worked out on the
        // jobs' lengths, burst by burst, and the bursts then go in bulk.
        let over = (held + batch.len())
            .saturating_sub(max_bursts)
            .min(batch.len());
        let mut job_len = job.bursts.len() + batch.len() - over;
        let mut other_lens: Vec<usize> = others.iter().map(|j| j.bursts.len()).collect();
        let mut from_others = vec![0; others.len()];
        let mut own = 0;
        for _ in 0..over {
            let most = (0..others.len()).max_by_key(|&i| other_lens[i]);
            match most {
                Some(i) if other_lens[i] > job_len => {
                    other_lens[i] -= 1;
                    from_others[i] += 1;
                    job_len += 1;
                }
                _ => own += 1,
            }
        }
        for (other, n) in others.iter_mut().zip(from_others) {
            other.evict_oldest_bursts(n);
        }
        // This job's own evictions take its held bursts first, then the oldest of the batch.
        job.bursts.push_batch(batch);
        job.evict_oldest_bursts(own);
    }

    /// Drops jobs that ended more than `grace_ns` before `now_ns`, and then, while more than
    /// `max_jobs` are held, the ended jobs that ended first (running jobs are never dropped);
    /// returns their ids.
    pub fn evict_ended(&mut self, now_ns: u64, grace_ns: u64, max_jobs: usize) -> Vec<JobId> {
        let mut ended: Vec<(u64, &JobId)> = self
            .jobs
            .iter()
            .filter_map(|(id, j)| Some((j.meta.ended_ns?, id)))
            .collect();
        ended.sort();
        let excess = self.jobs.len().saturating_sub(max_jobs);
        let expired: Vec<JobId> = ended
            .iter()
            .enumerate()
            .filter(|(i, (end, _))| *i < excess || now_ns.saturating_sub(*end) > grace_ns)
            .map(|(_, (_, id))| (*id).clone())
            .collect();
        for id in &expired {
            self.jobs.remove(id);
        }
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::JobMetaBuilder;

    #[test]
    fn ended_jobs_are_evicted_after_the_grace_period_only() {
        let mut store = JobStore::default();
        store.jobs.insert(
            JobId("j".into()),
            Job::new(JobMetaBuilder::new("j").ended_ns(Some(100)).build()),
        );
        assert!(store.evict_ended(150, 100, 10).is_empty());
        assert_eq!(store.evict_ended(201, 100, 10), vec![JobId("j".into())]);
        assert!(store.jobs.is_empty());
    }

    #[test]
    fn over_the_job_limit_the_earliest_ended_jobs_go_first() {
        let mut store = JobStore::default();
        for (id, ended) in [
            ("a", Some(30)),
            ("b", Some(10)),
            ("c", None),
            ("d", Some(20)),
            ("e", None),
        ] {
            store.jobs.insert(
                JobId(id.into()),
                Job::new(JobMetaBuilder::new(id).ended_ns(ended).build()),
            );
        }
        // Five jobs, at most three: the two that ended first go, whatever the grace period.
        assert_eq!(
            store.evict_ended(40, 1000, 3),
            vec![JobId("b".into()), JobId("d".into())]
        );
        // Running jobs stay even above the limit.
        assert_eq!(store.evict_ended(40, 1000, 1), vec![JobId("a".into())]);
        assert_eq!(store.jobs.len(), 2);
    }

    /// A burst of the budget tests, told apart by its start.
    fn at(start_ns: u64) -> Burst {
        Burst {
            pid: 1,
            tid: 1,
            rank: 0,
            start_ns,
            duration_ns: 1,
            oncpu_ns: 1,
            counters: None,
            start_func: "MPI_Init".into(),
            end_func: "MPI_Barrier".into(),
            start_site: CallSite::unknown(1),
            end_site: CallSite::unknown(2),
        }
    }

    /// A drain's batch of bursts starting at `starts`.
    fn batch(starts: impl IntoIterator<Item = u64>) -> Arc<Vec<Burst>> {
        Arc::new(starts.into_iter().map(at).collect())
    }

    /// A store holding a job of each id, without bursts.
    fn store_of<const N: usize>(ids: [&str; N]) -> (JobStore, [JobId; N]) {
        let mut store = JobStore::default();
        let ids = ids.map(|id| JobId(id.into()));
        for id in &ids {
            store.jobs.insert(
                id.clone(),
                Job::new(JobMetaBuilder::new(id.0.as_str()).build()),
            );
        }
        (store, ids)
    }

    #[test]
    fn the_node_wide_burst_budget_takes_from_the_job_holding_most() {
        let (mut store, [storm, quiet]) = store_of(["storm", "quiet"]);
        store.push_bursts(&quiet, batch([0]), 4);
        for i in 1..=6 {
            store.push_bursts(&storm, batch([i]), 4);
        }
        store.push_bursts(&JobId("gone".into()), batch([9]), 4);
        let (s, q) = (&store.jobs[&storm], &store.jobs[&quiet]);
        assert_eq!((s.bursts.len(), q.bursts.len()), (3, 1));
        assert_eq!(s.bursts_evicted, 3);
        assert_eq!(s.bursts.front().unwrap().start_ns, 4);
        assert_eq!(q.bursts_evicted, 0);

        // A drain's batch larger than the budget keeps its newest bursts, and still not the
        // quiet job's.
        store.push_bursts(&storm, batch(7..17), 4);
        let (s, q) = (&store.jobs[&storm], &store.jobs[&quiet]);
        assert_eq!((s.bursts.len(), q.bursts.len()), (3, 1));
        assert_eq!(s.bursts.front().unwrap().start_ns, 14);
        assert_eq!(s.bursts_evicted, 13);

        // A job that fills the budget alone holds the budget, no more.
        let budget = 5000;
        for i in 0..2 * budget as u64 {
            store.push_bursts(&storm, batch([i]), budget);
        }
        let s = &store.jobs[&storm];
        assert_eq!(s.bursts.len() + store.jobs[&quiet].bursts.len(), budget);
    }

    #[test]
    fn a_batch_past_the_budget_takes_from_a_job_holding_more_until_they_hold_as_much() {
        let (mut store, [old, new]) = store_of(["old", "new"]);
        store.push_bursts(&old, batch(0..6), 8);
        // Burst by burst: two fit, the old job gives up two of its oldest (6 > 2, 5 > 3), and
        // the fifth takes the new job's own oldest (4 is not more than 4).
        store.push_bursts(&new, batch(10..15), 8);
        let (o, n) = (&store.jobs[&old], &store.jobs[&new]);
        let starts = |j: &Job| j.bursts.iter().map(|b| b.start_ns).collect::<Vec<_>>();
        assert_eq!(starts(o), [2, 3, 4, 5]);
        assert_eq!(starts(n), [11, 12, 13, 14]);
        assert_eq!((o.bursts_evicted, n.bursts_evicted), (2, 1));
    }
}
