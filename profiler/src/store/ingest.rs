//! The ingest step: burst records from the kernel become [`Burst`]s of their job. Each record's
//! times move to Unix time, its function ids become names, its call sites become module and
//! offset; the burst goes into the job's buffer, into the batch for the phase analysis, and to a
//! [`BurstSink`] (the recording).

use std::collections::BTreeMap;

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
    /// records, grouped by process). The sink gets every burst, also of a job no longer held.
    pub fn run(
        &mut self,
        run: &[BurstRecord],
        member: &Member,
        store: &mut JobStore,
        max_bursts: usize,
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
        let first_new = batch.as_ref().map_or(0, |batch| batch.1.len());
        // The modules of the previous burst's sites, already noted in the job's metadata: a
        // run's sites nearly all share them, and comparing two names is cheaper than looking
        // them up.
        let mut noted: Option<[Name; 2]> = None;
        for record in run {
            let has_counters = record.flags & BURST_HAS_COUNTERS != 0;
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
                start_site: self.resolver.resolve(record.pid, record.start_site),
                end_site: self.resolver.resolve(record.pid, record.end_site),
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
        if let Some(batch) = batch {
            store.push_bursts(
                &member.job,
                batch.1[first_new..].iter().cloned(),
                max_bursts,
            );
        }
    }

    /// The bursts of the drain for the analysis, by job, with the job's rank count.
    pub fn take_batch(&mut self) -> BTreeMap<JobId, (u32, Vec<Burst>)> {
        std::mem::take(&mut self.batch)
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
