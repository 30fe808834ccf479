//! The online phase analysis of every job on a thread of its own, so that a clustering (seconds
//! for a large window, or for a whole job at its end) never holds up the drain of the kernel's
//! ring buffer, the stats updates or the HTTP publication.
//!
//! The daemon's loop sends the bursts of each drain, the ticks of the stats timer and the jobs that
//! ended, in order, through a bounded channel: when the analysis falls more than
//! [`QUEUE_BATCHES`] messages behind, the loop waits for it instead of holding an unbounded
//! backlog. The thread sends back each job's snapshot after every tick, which the loop publishes.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{mpsc, Arc},
    thread::JoinHandle,
};

use crate::{
    analysis::{
        analyse,
        online::{JobPhases, OnlineParams, PhaseEvent, PhasesSnapshot},
        AnalysisParams,
    },
    export::{phases, sites},
    model::{Burst, JobId},
    store::JobMeta,
    symbols::SiteResolver,
};

/// Messages the loop may be ahead of the analysis before it waits.
pub const QUEUE_BATCHES: usize = 1024;

/// What the loop asks of the analysis thread.
pub enum Request {
    /// The bursts of one job from one drain, and its rank count here.
    Bursts {
        job: JobId,
        ranks: u32,
        bursts: Vec<Burst>,
    },
    /// The stats timer: close the windows due at `now_ns` (Unix), with each job's rank count.
    Tick {
        now_ns: u64,
        ranks: BTreeMap<JobId, u32>,
    },
    /// A job ended: print `report`, its phases over `bursts` (call sites named from the
    /// binaries `job` lists), then `bottlenecks`, together.
    Ended {
        job: Box<JobMeta>,
        ranks: u32,
        bursts: Vec<Burst>,
        report: String,
        bottlenecks: Option<String>,
    },
    /// The job was evicted: drop its analysis.
    Forget(JobId),
}

/// A job's new snapshot, or `None` when its analysis was dropped.
pub type Update = (JobId, Option<Arc<PhasesSnapshot>>);

/// The analysis thread. [`AnalysisWorker::finish`] lets it complete what was sent and joins it.
pub struct AnalysisWorker {
    requests: Option<mpsc::SyncSender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl AnalysisWorker {
    pub fn start(
        params: OnlineParams,
    ) -> std::io::Result<(AnalysisWorker, tokio::sync::mpsc::UnboundedReceiver<Update>)> {
        let (requests, inbox) = mpsc::sync_channel(QUEUE_BATCHES);
        let (updates, results) = tokio::sync::mpsc::unbounded_channel();
        let thread = std::thread::Builder::new()
            .name("mpiburst-analysis".into())
            .spawn(move || Analyses::new(params).serve(inbox, updates))?;
        Ok((
            AnalysisWorker {
                requests: Some(requests),
                thread: Some(thread),
            },
            results,
        ))
    }

    /// Sends a request; waits while the analysis is [`QUEUE_BATCHES`] behind.
    pub fn send(&self, request: Request) {
        if let Some(requests) = &self.requests {
            if requests.send(request).is_err() {
                tracing::error!(
                    "the phase analysis thread has stopped; phases are no longer updated"
                );
            }
        }
    }

    /// Lets the thread finish the requests already sent (the phases of jobs that just ended are
    /// printed), then joins it.
    pub fn finish(mut self) {
        self.requests = None;
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("the phase analysis thread panicked");
            }
        }
    }
}

/// The analysis thread's state: each job's online analysis.
struct Analyses {
    params: OnlineParams,
    jobs: BTreeMap<JobId, JobPhases>,
    /// Jobs whose analysis could not start (the error is logged once).
    disabled: HashSet<JobId>,
    /// Names the call sites of the phases printed at a job's end; its cache outlives the jobs.
    sites: SiteResolver,
}

impl Analyses {
    fn new(params: OnlineParams) -> Self {
        Analyses {
            params,
            jobs: BTreeMap::new(),
            disabled: HashSet::new(),
            sites: SiteResolver::new(),
        }
    }

    fn serve(
        mut self,
        inbox: mpsc::Receiver<Request>,
        updates: tokio::sync::mpsc::UnboundedSender<Update>,
    ) {
        for request in inbox {
            match request {
                Request::Bursts { job, ranks, bursts } => {
                    if let Some(phases) = self.job(&job, ranks) {
                        for burst in &bursts {
                            phases.push(burst);
                        }
                    }
                }
                Request::Tick { now_ns, ranks } => {
                    for (id, phases) in &mut self.jobs {
                        if let Some(&r) = ranks.get(id) {
                            phases.set_ranks(r);
                        }
                        log_events(id, phases.tick(now_ns));
                        // The loop may be gone at shutdown; the final prints still happen.
                        let _ = updates.send((id.clone(), Some(Arc::new(phases.snapshot()))));
                    }
                }
                Request::Ended {
                    job,
                    ranks,
                    bursts,
                    report,
                    bottlenecks,
                } => {
                    println!("{report}");
                    println!("{}", self.final_phases(&job, ranks, &bursts));
                    if let Some(text) = bottlenecks {
                        println!("{text}");
                    }
                }
                Request::Forget(job) => {
                    self.jobs.remove(&job);
                    self.disabled.remove(&job);
                    let _ = updates.send((job, None));
                }
            }
        }
    }

    /// The phases of an ended job, clustered over the bursts the node kept of it (the same
    /// analysis as `mpiburst report --phases`), their call sites named from the job's binaries.
    fn final_phases(&mut self, job: &JobMeta, ranks: u32, bursts: &[Burst]) -> String {
        match analyse(bursts, ranks, &AnalysisParams::default()) {
            Ok(analysis) => {
                let names = sites::names(&mut self.sites, &[job], sites::analysis_sites(&analysis));
                phases::render_phases(&job.id, &analysis, &names)
            }
            Err(e) => format!("   phases of job {}: not analysed ({e})", job.id),
        }
    }

    fn job(&mut self, id: &JobId, ranks: u32) -> Option<&mut JobPhases> {
        if self.disabled.contains(id) {
            return None;
        }
        if !self.jobs.contains_key(id) {
            match JobPhases::new(ranks, self.params.clone()) {
                Ok(p) => {
                    self.jobs.insert(id.clone(), p);
                }
                Err(err) => {
                    tracing::error!("phase analysis of job {id} disabled: {err}");
                    self.disabled.insert(id.clone());
                    return None;
                }
            }
        }
        self.jobs.get_mut(id)
    }
}

fn log_events(id: &JobId, events: Vec<PhaseEvent>) {
    for event in events {
        match event {
            PhaseEvent::Reclustered {
                window,
                partial,
                phases,
                spmd_score,
                ..
            } => tracing::info!(
                "job {id}: window {window}{} clustered: {phases} phases, SPMD score {spmd_score:.3}",
                if partial { " (early)" } else { "" }
            ),
            PhaseEvent::Tracking(t) => {
                tracing::info!(
                    "job {id}: phase {:?} {:?} → {:?} in window {}",
                    t.kind,
                    t.from,
                    t.to,
                    t.window
                )
            }
            PhaseEvent::AnalysisFailed { window, error } => {
                tracing::warn!("job {id}: clustering window {window} failed: {error}")
            }
        }
    }
}
