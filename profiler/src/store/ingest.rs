//! The ingest step: burst records from the kernel become [`Burst`]s of their job. Each record's
//! times move to Unix time, its function ids become names, its call sites become module and
//! offset; the burst goes to a [`BurstSink`] (the recording) and into the drain's batch of its
//! job, which the job's buffer and the phase analysis then share.

use std::{collections::BTreeMap, sync::Arc};

use profiler_common::{BurstRecord, BURST_HAS_COUNTERS, NO_FUNC};

use crate::{
    discovery::AddressResolver,
    model::{Burst, CallSite, HwCounters, JobId, Name},
    store::{clock::Clock, members::Member, Job, JobMeta, JobStore},
};

/// Where ingested bursts go besides the store: the recording.
pub trait BurstSink {
    /// The job's metadata changed (a module of its call sites was found).
    fn job(&mut self, meta: &JobMeta);
    /// A burst of `job`, with the raw values of its counter slots when it has them.
    fn burst(&mut self, job: &JobId, burst: &Burst, event_counts: Option<[u64; 2]>);
}

/// The names of the probed functions by id, shared so that a burst costs no allocation for its
/// names.
pub struct FunctionNames {
    names: Vec<String>,
    /// By id, then "-" (no function) and "?" (an unknown id).
    shared: Vec<Name>,
}

impl FunctionNames {
    pub fn new(names: Vec<String>) -> Self {
        let shared = names
            .iter()
            .map(|f| Name::new(f))
            .chain([Name::new("-"), Name::new("?")])
            .collect();
        FunctionNames { names, shared }
    }

    /// Every probed function, by id.
    pub fn all(&self) -> &[String] {
        &self.names
    }

    /// The name of function `id`, or `#id` for an id the daemon did not attach.
    pub fn name(&self, id: u32) -> String {
        self.names
            .get(id as usize)
            .cloned()
            .unwrap_or_else(|| format!("#{id}"))
    }

    /// The shared name of function `id`: its own, "-" for no function, "?" for an id the daemon
    /// did not attach.
    pub fn shared(&self, id: u32) -> Name {
        let known = self.shared.len() - 2;
        let index = match id {
            NO_FUNC => known,
            id if (id as usize) < known => id as usize,
            _ => known + 1,
        };
        self.shared[index]
    }
}

/// Turns burst records into bursts; keeps the batch of the current drain for the analysis.
pub struct Ingest {
    pub names: FunctionNames,
    clock: Clock,
    /// The counter slots hold instructions and cycles (else software events, not shown as
    /// such).
    hardware_counters: bool,
    /// Call sites to module and offset, per process.
    pub resolver: AddressResolver,
    /// The bursts of the current drain for the analysis, by job, with the job's rank count.
    batch: BTreeMap<JobId, (u32, Vec<Burst>)>,
}

impl Ingest {
    pub fn new(names: FunctionNames, clock: Clock, hardware_counters: bool) -> Self {
        Ingest {
            names,
            clock,
            hardware_counters,
            resolver: AddressResolver::new(),
            batch: BTreeMap::new(),
        }
    }

    /// Takes in a run of burst records of one process, `member`: the job and its batch are
    /// looked up once per run, not per burst (a drain in a storm holds tens of thousands of
    /// records, grouped by process). The sink gets every burst, also of a job no longer held;
    /// the job's store gets its batch at the end of the drain ([`Ingest::end_drain`]).
    pub fn run(
        &mut self,
        run: &[BurstRecord],
        member: &Member,
        store: &mut JobStore,
        sink: &mut impl BurstSink,
    ) {
        let mut job = store.jobs.get_mut(&member.job);
        let mut batch = match &job {
            Some(job) => {
                let batch = match self.batch.get_mut(&member.job) {
                    Some(batch) => batch,
                    None => self.batch.entry(member.job.clone()).or_default(),
                };
                batch.0 = job.ranks.len().max(1) as u32;
                batch.1.reserve(run.len());
                Some(batch)
            }
            None => None,
        };
        // The modules of the previous burst's sites, already noted in the job's metadata: a
        // run's sites nearly all share them, and comparing two names is cheaper than looking
        // them up.
        let mut noted: Option<[Name; 2]> = None;
        // The end site of the last burst, resolved: a thread's next burst starts at the call its
        // last one ended in, so most start sites need no lookup.
        let mut last_end: Option<(u64, CallSite)> = None;
        for record in run {
            let has_counters = record.flags & BURST_HAS_COUNTERS != 0;
            let start_site = match &last_end {
                Some((address, site)) if *address == record.start_site => site.clone(),
                _ => self.resolver.resolve(record.pid, record.start_site),
            };
            let end_site = self.resolver.resolve(record.pid, record.end_site);
            last_end = (!end_site.is_unknown()).then(|| (record.end_site, end_site.clone()));
            let burst = Burst {
                pid: record.pid,
                tid: record.tid,
                rank: member.rank,
                start_ns: self.clock.unix_ns(record.start_ns),
                duration_ns: record.duration_ns,
                oncpu_ns: record.oncpu_ns,
                counters: (has_counters && self.hardware_counters).then(|| HwCounters {
                    instructions: record.counters[0],
                    cycles: record.counters[1],
                }),
                start_func: self.names.shared(record.start_func),
                end_func: self.names.shared(record.end_func),
                start_site,
                end_site,
            };
            let modules = [burst.start_site.module, burst.end_site.module];
            if let Some(job) = job.as_deref_mut().filter(|_| noted != Some(modules)) {
                if note_modules(&self.resolver, job, [&burst.start_site, &burst.end_site]) {
                    sink.job(&job.meta);
                }
                noted = Some(modules);
            }
            sink.burst(&member.job, &burst, has_counters.then_some(record.counters));
            if let Some(batch) = batch.as_mut() {
                batch.1.push(burst);
            }
        }
    }

    /// Ends the drain: each job's batch goes into its store, within the node's budget of
    /// `max_bursts`, and is returned for the analysis, shared rather than copied, by job with
    /// the job's rank count. The budget takes the jobs' batches in the order of their ids, not
    /// in the order their records came within the drain; the job holding the most still gives
    /// up bursts first.
    pub fn end_drain(
        &mut self,
        store: &mut JobStore,
        max_bursts: usize,
    ) -> Vec<(JobId, u32, Arc<Vec<Burst>>)> {
        std::mem::take(&mut self.batch)
            .into_iter()
            .map(|(job, (ranks, mut bursts))| {
                // A batch stays as long as its bursts: without the room it grew into.
                bursts.shrink_to_fit();
                let bursts = Arc::new(bursts);
                store.push_bursts(&job, bursts.clone(), max_bursts);
                (job, ranks, bursts)
            })
            .collect()
    }
}

/// Keeps where the job's processes mapped the modules of a burst's call sites, so that reports
/// can name them (see [`JobMeta::modules`]); whether one was new.
fn note_modules(resolver: &AddressResolver, job: &mut Job, sites: [&CallSite; 2]) -> bool {
    let mut added = false;
    for site in sites {
        if job.meta.modules.contains_key(site.module.as_ref()) {
            continue;
        }
        if let Some(path) = resolver.path_of(&site.module) {
            let path = path.display().to_string();
            job.meta.modules.insert(site.module.to_string(), path);
            added = true;
        }
    }
    added
}

#[cfg(test)]
mod tests {
    use profiler_common::{BurstRecord, BURST_HAS_COUNTERS, NO_FUNC};

    use std::sync::Arc;

    use super::*;
    use crate::{
        store::{members::NewMember, RankRecord},
        test_support::JobMetaBuilder,
    };

    /// What the sink was given.
    #[derive(Default)]
    struct Seen {
        jobs: Vec<JobMeta>,
        bursts: Vec<(JobId, Burst, Option<[u64; 2]>)>,
    }

    impl BurstSink for Seen {
        fn job(&mut self, meta: &JobMeta) {
            self.jobs.push(meta.clone());
        }

        fn burst(&mut self, job: &JobId, burst: &Burst, event_counts: Option<[u64; 2]>) {
            self.bursts.push((job.clone(), burst.clone(), event_counts));
        }
    }

    fn names() -> FunctionNames {
        FunctionNames::new(vec!["MPI_Send".into(), "MPI_Recv".into()])
    }

    /// A burst record of this process between two call sites in this test's own binary, so that
    /// the resolver finds a module with a path.
    fn record(start_ns: u64, flags: u32) -> BurstRecord {
        let site = record as fn(u64, u32) -> BurstRecord as usize as u64;
        BurstRecord {
            pid: std::process::id(),
            tid: std::process::id(),
            start_ns,
            duration_ns: 1_000,
            oncpu_ns: 900,
            counters: [7, 11],
            start_site: site,
            end_site: site + 4,
            start_func: 1,
            end_func: NO_FUNC,
            flags,
            ..BurstRecord::default()
        }
    }

    #[test]
    fn function_ids_become_names_and_unknown_ids_say_so() {
        let names = names();
        assert_eq!(names.shared(0).as_str(), "MPI_Send");
        assert_eq!(names.shared(NO_FUNC).as_str(), "-");
        assert_eq!(names.shared(9).as_str(), "?");
        assert_eq!(names.name(1), "MPI_Recv");
        assert_eq!(names.name(9), "#9");
    }

    #[test]
    fn a_run_of_records_becomes_bursts_of_its_job_its_batch_and_the_sink() {
        let clock = Clock::read();
        let mut ingest = Ingest::new(names(), clock, false);
        let mut store = JobStore::default();
        let meta = JobMetaBuilder::new("j").build();
        let rank = RankRecord {
            call_sites: Vec::new(),
            rank: 3,
            pid: std::process::id(),
            first_seen_ns: 0,
            ended_ns: None,
            totals: Default::default(),
            functions: Default::default(),
            region: Default::default(),
            probe_cost: None,
        };
        store.add_member(NewMember {
            member: Arc::new(Member {
                job: meta.id.clone(),
                rank: 3,
            }),
            meta: meta.clone(),
            rank,
        });
        let member = Member {
            job: meta.id.clone(),
            rank: 3,
        };
        let mut seen = Seen::default();
        let run = [record(1_000, BURST_HAS_COUNTERS), record(5_000, 0)];
        ingest.run(&run, &member, &mut store, &mut seen);
        assert!(
            store.jobs[&meta.id].bursts.is_empty(),
            "stored at the drain's end"
        );
        let batch = ingest.end_drain(&mut store, 100);
        assert_eq!(batch.len(), 1);
        let (id, ranks, bursts) = &batch[0];
        assert_eq!((id, *ranks), (&meta.id, 1), "the job's ranks on the node");
        assert!(
            ingest.end_drain(&mut store, 100).is_empty(),
            "a batch is taken once"
        );

        let job = &store.jobs[&meta.id];
        assert_eq!(job.bursts.len(), 2);
        assert!(
            job.bursts.iter().eq(bursts.iter()),
            "the store's and the analysis's"
        );
        let burst = job.bursts.front().unwrap();
        assert_eq!(
            (burst.rank, burst.start_ns, burst.oncpu_ns),
            (3, clock.unix_ns(1_000), 900)
        );
        assert_eq!(
            (burst.start_func.as_str(), burst.end_func.as_str()),
            ("MPI_Recv", "-")
        );
        // Software or absent counters are not instructions and cycles; the sink has the raw
        // values of the burst that carried them.
        assert!(burst.counters.is_none());
        let counts: Vec<_> = seen.bursts.iter().map(|(_, _, c)| *c).collect();
        assert_eq!(counts, [Some([7, 11]), None]);
        // The module of this binary is noted once for the run, and the sink hears of it.
        assert_eq!(job.meta.modules.len(), 1);
        assert_eq!(seen.jobs.len(), 1);
    }

    #[test]
    fn the_bursts_of_a_job_no_longer_held_still_reach_the_sink() {
        let mut ingest = Ingest::new(names(), Clock::read(), false);
        let mut store = JobStore::default();
        let member = Member {
            job: JobId("gone".into()),
            rank: 0,
        };
        let mut seen = Seen::default();
        ingest.run(&[record(1, 0)], &member, &mut store, &mut seen);
        assert_eq!(seen.bursts.len(), 1);
        assert!(ingest.end_drain(&mut store, 100).is_empty());
        assert!(store.jobs.is_empty());
    }
}
