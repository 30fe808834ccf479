//! The identify step: which job and rank each process of the node is. A process is identified
//! once, at its first data or as soon as it maps an MPI library, from its environment and its
//! launcher (see [`crate::discovery::identify`]); its job and rank record are made then.
//! Processes outside `daemon.cgroup` are remembered too, so that their data is dropped without
//! a second look.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use crate::{
    capture::usage,
    discovery,
    model::{unix_now_ns, JobId},
    proc,
    store::{clock::Clock, JobMeta, RankRecord, RankTotals},
};

/// How long the exec time of a process that is not (yet) a rank is kept. Every exec on the node
/// is noted, so this bounds the map (a minute of a node's execs); a rank makes its first call,
/// MPI_Init, within seconds of its exec, and one first seen later starts at its fork, to the
/// clock tick.
const EXEC_TIMES_KEPT: Duration = Duration::from_secs(60);

/// The identity of a pid as the store uses it.
#[derive(Clone, Debug)]
pub struct Member {
    pub job: JobId,
    pub rank: u32,
}

/// A process identified now: its job as discovery found it, and its rank's first record.
pub struct NewMember {
    pub member: Arc<Member>,
    pub meta: JobMeta,
    pub rank: RankRecord,
}

/// What the daemon knows of the node's processes.
pub struct Members {
    node: String,
    /// Only processes in this cgroup are profiled; empty for all.
    cgroup: String,
    /// Unix time the daemon started, in ns: the kernel totals start then.
    started_ns: u64,
    clock: Clock,
    /// Shared, so that looking a pid up for each burst copies no job id.
    members: HashMap<u32, Arc<Member>>,
    /// Processes outside `cgroup`: their data is dropped.
    outside: HashSet<u32>,
    /// The last exec of each process seen to exec since the daemon started (CLOCK_MONOTONIC
    /// ns), until the process becomes a rank or `EXEC_TIMES_KEPT` has passed: a rank's start to
    /// the nanosecond (see `program_start`).
    exec_times: HashMap<u32, u64>,
    /// A job id that a later run took again (Hydra's control port, reused by a later mpiexec) →
    /// the id of that later run here.
    instances: HashMap<JobId, JobId>,
}

impl Members {
    pub fn new(node: String, cgroup: String, clock: Clock) -> Self {
        Members {
            node,
            cgroup,
            started_ns: unix_now_ns(),
            clock,
            members: HashMap::new(),
            outside: HashSet::new(),
            exec_times: HashMap::new(),
            instances: HashMap::new(),
        }
    }

    /// The member a pid is, if it was identified.
    pub fn get(&self, pid: u32) -> Option<&Arc<Member>> {
        self.members.get(&pid)
    }

    /// Every identified process.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Arc<Member>)> {
        self.members.iter().map(|(&pid, m)| (pid, m))
    }

    /// Every identified process's pid.
    pub fn pids(&self) -> HashSet<u32> {
        self.members.keys().copied().collect()
    }

    /// Notes an exec: the process's program started then (CLOCK_MONOTONIC ns).
    pub fn exec(&mut self, pid: u32, exec_ns: u64) {
        self.exec_times.insert(pid, exec_ns);
    }

    /// The processes known (members and outside ones) that are gone now.
    pub fn gone(&self) -> HashSet<u32> {
        self.members
            .keys()
            .chain(&self.outside)
            .copied()
            .filter(|&pid| !proc::is_alive(pid))
            .collect()
    }

    /// Forgets gone processes, and the exec times older than `EXEC_TIMES_KEPT`.
    pub fn forget(&mut self, gone: &HashSet<u32>) {
        for pid in gone {
            self.members.remove(pid);
            self.outside.remove(pid);
        }
        let kept_from = Clock::monotonic_now_ns().saturating_sub(EXEC_TIMES_KEPT.as_nanos() as u64);
        self.exec_times.retain(|_, &mut exec| exec >= kept_from);
    }

    /// Identifies a process not seen before; `None` for one outside `daemon.cgroup`, or one
    /// already known. `taken(job, rank, pid)` says whether the job a process names is an
    /// earlier run that used the same id (it ended, or has that rank in another process): the
    /// process then starts a job of its own, named `ID+<its start, Unix s>`, which the later
    /// ranks of its run join.
    pub fn identify(
        &mut self,
        pid: u32,
        taken: impl Fn(&JobId, u32, u32) -> bool,
    ) -> Option<NewMember> {
        if self.members.contains_key(&pid) || self.outside.contains(&pid) {
            return None;
        }
        if !self.cgroup.is_empty() && !discovery::in_cgroup(pid, &self.cgroup) {
            tracing::debug!("pid {pid} is outside cgroup {}: not profiled", self.cgroup);
            self.outside.insert(pid);
            return None;
        }
        // From the process's start, but not before the daemon's: the kernel totals start then.
        // (The efficiencies use the region of interest from MPI_Init's return instead.)
        let first_seen_ns = self.start_of(pid).max(self.started_ns);
        self.exec_times.remove(&pid);
        let (mut meta, rank) = self.job_of(pid, first_seen_ns);
        let base = meta.id.clone();
        let mut id = self.instances.get(&base).cloned().unwrap_or(base.clone());
        if taken(&id, rank, pid) {
            id = JobId(format!("{}+{}", base.0, first_seen_ns / 1_000_000_000));
            tracing::info!("job id {base} was an earlier run's: this run is job {id} here");
            self.instances.insert(base, id.clone());
        }
        meta.id = id;
        let member = Arc::new(Member {
            job: meta.id.clone(),
            rank,
        });
        self.members.insert(pid, member.clone());
        Some(NewMember {
            member,
            meta,
            rank: RankRecord {
                call_sites: Vec::new(),
                rank,
                pid,
                first_seen_ns,
                ended_ns: None,
                totals: RankTotals::default(),
                functions: BTreeMap::new(),
                region: Default::default(),
                probe_cost: None,
            },
        })
    }

    /// The job of `pid` and its rank, as discovery finds them; a process that left before it
    /// could be identified keeps its data, in a job of its own.
    fn job_of(&self, pid: u32, first_seen_ns: u64) -> (JobMeta, u32) {
        match discovery::identify(pid, &self.node) {
            Ok(id) => (
                JobMeta {
                    id: id.job.clone(),
                    node: self.node.clone(),
                    size: id.size,
                    source: format!("{:?}", id.source),
                    executable: proc::executable(pid)
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    build_id: discovery::build_id(&proc::executable_file(pid))
                        .ok()
                        .flatten(),
                    scheduler_job: id.scheduler_job.clone(),
                    cgroup: id.cgroup.clone(),
                    modules: Default::default(),
                    first_seen_ns,
                    ended_ns: None,
                },
                id.rank,
            ),
            Err(e) => {
                tracing::debug!("pid {pid}: {e}");
                (
                    JobMeta {
                        id: JobId(format!("pid:{pid}")),
                        node: self.node.clone(),
                        size: 1,
                        source: format!("unidentified ({e})"),
                        executable: String::new(),
                        build_id: None,
                        scheduler_job: None,
                        cgroup: None,
                        modules: Default::default(),
                        first_seen_ns,
                        ended_ns: None,
                    },
                    0,
                )
            }
        }
    }

    /// When process `pid` started the program it runs (Unix ns): see `program_start`. Both
    /// times are compared on the BPF programs' clock, and converted as the bursts are.
    fn start_of(&self, pid: u32) -> u64 {
        program_start(
            self.exec_times.get(&pid).copied(),
            usage::start_time_monotonic_ns(pid).ok(),
        )
        .map_or_else(unix_now_ns, |start| self.clock.unix_ns(start))
    }
}

/// When a process started the program it runs, from its last exec seen (to the nanosecond)
/// and its fork as /proc gives it (to the clock tick, rounded down). An exec before the fork is
/// a former process's of the same pid, not yet forgotten.
fn program_start(exec_ns: Option<u64>, fork_ns: Option<u64>) -> Option<u64> {
    match (exec_ns, fork_ns) {
        (Some(exec), Some(fork)) => Some(exec.max(fork)),
        (exec, fork) => exec.or(fork),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_starts_at_its_exec_unless_the_exec_was_a_former_process_s() {
        // Fork known to the tick (rounded down), exec to the nanosecond after it.
        assert_eq!(
            program_start(Some(1_004_321), Some(1_000_000)),
            Some(1_004_321)
        );
        // An exec before the fork: a process that had the pid before.
        assert_eq!(
            program_start(Some(900_000), Some(1_000_000)),
            Some(1_000_000)
        );
        assert_eq!(program_start(None, Some(1_000_000)), Some(1_000_000));
        assert_eq!(program_start(Some(1_004_321), None), Some(1_004_321));
        assert_eq!(program_start(None, None), None);
    }

    #[test]
    fn a_process_is_identified_once_and_its_rank_starts_no_earlier_than_the_daemon() {
        let pid = std::process::id();
        let mut members = Members::new("n".into(), String::new(), Clock::read());
        let new = members
            .identify(pid, |_, _, _| false)
            .expect("a process in no cgroup scope is profiled");
        assert_eq!(new.meta.node, "n");
        assert_eq!(new.member.job, new.meta.id);
        assert_eq!((new.rank.pid, new.rank.rank), (pid, new.member.rank));
        assert!(new.rank.first_seen_ns >= members.started_ns);
        assert!(
            members.identify(pid, |_, _, _| false).is_none(),
            "identified once"
        );
        assert_eq!(members.get(pid).map(|m| m.job.clone()), Some(new.meta.id));
        assert!(members.gone().is_empty(), "this process lives");
        members.forget(&[pid].into());
        assert!(members.get(pid).is_none());
    }

    #[test]
    fn a_job_id_an_earlier_run_took_names_a_job_of_its_own_that_the_run_keeps() {
        let pid = std::process::id();
        let mut members = Members::new("n".into(), String::new(), Clock::read());
        let base = members.identify(pid, |_, _, _| false).unwrap().meta.id;
        members.forget(&[pid].into());
        // The same id again, taken by an earlier run: a job of its own.
        let again = members.identify(pid, |id, _, _| *id == base).unwrap();
        assert!(
            again.meta.id.0.starts_with(&format!("{}+", base.0)),
            "{:?}",
            again.meta.id
        );
        assert_eq!(again.member.job, again.meta.id);
        // A later rank of the same run joins it, as long as that job is not taken in turn.
        members.forget(&[pid].into());
        let later = members.identify(pid, |id, _, _| *id == base).unwrap();
        assert_eq!(later.meta.id, again.meta.id);
    }

    #[test]
    fn a_process_outside_the_cgroup_scope_is_dropped_once_and_for_all() {
        let pid = std::process::id();
        let scope = "/mpiburst-test/no-such-cgroup".to_string();
        let mut members = Members::new("n".into(), scope, Clock::read());
        assert!(members.identify(pid, |_, _, _| false).is_none());
        assert!(members.outside.contains(&pid));
        assert!(members.identify(pid, |_, _, _| false).is_none());
        assert!(members.get(pid).is_none());
    }
}
