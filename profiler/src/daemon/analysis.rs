//! The online phase analysis of every job on a thread of its own, so that a clustering (seconds
//! for a large window, or for a whole job at its end) never holds up the drain of the kernel's
//! ring buffer, the stats updates or the HTTP publication.
//!
//! The daemon's loop sends the bursts of each drain, the ticks of the stats timer and the jobs that
//! ended, in order, through a bounded channel: when the analysis falls more than
//! [`QUEUE_BATCHES`] messages or the node's burst budget (`daemon.max_bursts`, over all jobs)
//! behind, the loop waits for it instead of holding an unbounded backlog; the kernel's ring
//! buffer then holds what comes meanwhile, and counts what it cannot. The drains' batches in the
//! queue are those the store holds, shared, so the bursts in memory stay within about twice the
//! budget: the store's, and those of ended jobs on their way to their final clustering (plus, per
//! job, the evicted start of its oldest batch). The thread sends back each job's snapshot after
//! every tick, which the loop publishes.

use std::{
    collections::{BTreeMap, HashSet},
    sync::{mpsc, Arc, Condvar, Mutex, PoisonError},
    thread::JoinHandle,
};

use crate::{
    analysis::{
        analyse,
        online::{JobPhases, OnlineParams, PhaseEvent, PhasesSnapshot},
        AnalysisParams,
    },
    export::{phases, printed::JobEndReport, sites},
    model::{Burst, JobId},
    store::{bursts::Bursts, JobMeta},
    symbols::SiteResolver,
};

/// Messages the loop may be ahead of the analysis before it waits.
pub const QUEUE_BATCHES: usize = 1024;

/// What the loop asks of the analysis thread.
pub enum Request {
    /// The bursts of one job from one drain (the batch the job's store holds too), and its
    /// rank count here.
    Bursts {
        job: JobId,
        ranks: u32,
        bursts: Arc<Vec<Burst>>,
    },
    /// The stats timer: close the windows due at `now_ns` (Unix), with each job's ranks.
    Tick {
        now_ns: u64,
        ranks: BTreeMap<JobId, TickRanks>,
    },
    /// A job ended: print `report` with its phases over `bursts` (call sites named from the
    /// binaries `job` lists).
    Ended {
        job: Box<JobMeta>,
        ranks: u32,
        bursts: Bursts,
        report: JobEndReport,
    },
    /// The job was evicted: drop its analysis.
    Forget(JobId),
}

/// A job's ranks on this node at a tick.
pub struct TickRanks {
    pub count: u32,
    /// (rank, Unix ns) of each rank's MPI_Finalize entry, for those that entered it.
    pub finalized: Vec<(u32, u64)>,
}

impl Request {
    /// The bursts the request holds in memory until the analysis has taken it.
    fn bursts(&self) -> usize {
        match self {
            Request::Bursts { bursts, .. } => bursts.len(),
            Request::Ended { bursts, .. } => bursts.len(),
            Request::Tick { .. } | Request::Forget(_) => 0,
        }
    }
}

/// The bursts sent and not yet taken by the analysis, over all jobs, and the most allowed.
struct QueuedBursts {
    count: Mutex<usize>,
    taken: Condvar,
    limit: usize,
}

impl QueuedBursts {
    /// Waits until `n` more bursts fit (a batch larger than the limit goes alone), then counts
    /// them. A poisoned lock still holds a valid count.
    fn add(&self, n: usize) {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        if *count > 0 && *count + n > self.limit {
            tracing::debug!(queued = *count, batch = n, "waiting for the phase analysis");
        }
        while *count > 0 && *count + n > self.limit {
            count = self
                .taken
                .wait(count)
                .unwrap_or_else(PoisonError::into_inner);
        }
        *count += n;
    }

    fn take(&self, n: usize) {
        let mut count = self.count.lock().unwrap_or_else(PoisonError::into_inner);
        *count = count.saturating_sub(n);
        self.taken.notify_all();
    }
}

/// A job's new snapshot, or `None` when its analysis was dropped.
pub type Update = (JobId, Option<Arc<PhasesSnapshot>>);

/// The analysis thread. [`AnalysisWorker::finish`] lets it complete what was sent and joins it.
pub struct AnalysisWorker {
    requests: Option<mpsc::SyncSender<Request>>,
    queued: Arc<QueuedBursts>,
    thread: Option<JoinHandle<()>>,
}

impl AnalysisWorker {
    /// Starts the thread; at most `max_bursts` bursts wait for it, over all jobs.
    pub fn start(
        params: OnlineParams,
        max_bursts: usize,
    ) -> std::io::Result<(AnalysisWorker, tokio::sync::mpsc::UnboundedReceiver<Update>)> {
        let (requests, inbox) = mpsc::sync_channel(QUEUE_BATCHES);
        let (updates, results) = tokio::sync::mpsc::unbounded_channel();
        let queued = Arc::new(QueuedBursts {
            count: Mutex::new(0),
            taken: Condvar::new(),
            limit: max_bursts,
        });
        let taken = queued.clone();
        let thread = std::thread::Builder::new()
            .name("mpiburst-analysis".into())
            .spawn(move || Analyses::new(params).serve(inbox, &taken, updates))?;
        Ok((
            AnalysisWorker {
                requests: Some(requests),
                queued,
                thread: Some(thread),
            },
            results,
        ))
    }

    /// Sends a request; waits while the analysis is [`QUEUE_BATCHES`] requests or the burst
    /// budget behind.
    pub fn send(&self, request: Request) {
        if let Some(requests) = &self.requests {
            let n = request.bursts();
            self.queued.add(n);
            if requests.send(request).is_err() {
                self.queued.take(n);
                tracing::error!(
                    "the phase analysis thread has stopped; phases are no longer updated"
                );
            }
        }
    }

    /// Lets the thread finish the requests already sent (the phases of jobs that just ended are
    /// printed), then joins it.
    pub fn finish(&mut self) {
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
        queued: &QueuedBursts,
        updates: tokio::sync::mpsc::UnboundedSender<Update>,
    ) {
        for request in inbox {
            let n = request.bursts();
            self.handle(request, &updates);
            queued.take(n);
        }
    }

    /// Carries out one request of the loop.
    fn handle(&mut self, request: Request, updates: &tokio::sync::mpsc::UnboundedSender<Update>) {
        match request {
            Request::Bursts { job, ranks, bursts } => {
                if let Some(phases) = self.job(&job, ranks) {
                    let pushed = isolated(|| phases.push_all(&bursts));
                    if let Err(why) = pushed {
                        self.disable(&job, &why);
                    }
                }
            }
            Request::Tick { now_ns, ranks } => {
                let mut failed = Vec::new();
                for (id, phases) in &mut self.jobs {
                    let here = ranks.get(id);
                    if let Some(r) = here {
                        phases.set_ranks(r.count);
                    }
                    let ticked = isolated(|| {
                        for &(rank, at_ns) in here.map_or(&[][..], |r| &r.finalized) {
                            phases.finalize(rank, at_ns);
                        }
                        (phases.tick(now_ns), phases.snapshot())
                    });
                    match ticked {
                        Ok((events, snapshot)) => {
                            log_events(id, events);
                            // The loop may be gone at shutdown; the final prints still happen.
                            let _ = updates.send((id.clone(), Some(Arc::new(snapshot))));
                        }
                        Err(why) => failed.push((id.clone(), why)),
                    }
                }
                for (id, why) in failed {
                    self.disable(&id, &why);
                }
            }
            Request::Ended {
                job,
                ranks,
                bursts,
                report,
            } => report.print(&self.final_phases(&job, ranks, &Vec::from(bursts))),
            Request::Forget(job) => {
                self.jobs.remove(&job);
                self.disabled.remove(&job);
                let _ = updates.send((job, None));
            }
        }
    }

    /// The phases of an ended job, clustered over the bursts the node kept of it (the same
    /// analysis as `mpiburst report --phases`), their call sites named from the job's binaries.
    fn final_phases(&mut self, job: &JobMeta, ranks: u32, bursts: &[Burst]) -> String {
        let analysed = isolated(|| analyse(bursts, ranks, &AnalysisParams::default()));
        match analysed {
            Ok(Ok(analysis)) => {
                let names = sites::names(&mut self.sites, &[job], sites::analysis_sites(&analysis));
                phases::render_phases(&job.id, &analysis, &names)
            }
            Ok(Err(e)) => format!("   phases of job {}: not analysed ({e})", job.id),
            Err(why) => format!(
                "   phases of job {}: not analysed (the analysis failed: {why})",
                job.id
            ),
        }
    }

    /// Stops the online analysis of a job whose analysis panicked: its state may be half
    /// updated. The other jobs, and the job's exact totals and properties, go on.
    fn disable(&mut self, id: &JobId, why: &Panicked) {
        tracing::error!(
            "phase analysis of job {id} failed and is stopped for this job ({why}); its totals \
             and properties are still measured. Please report this with the job's recording."
        );
        self.jobs.remove(id);
        self.disabled.insert(id.clone());
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

/// A piece of analysis work that panicked, with the panic's message.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error("{0}")]
struct Panicked(String);

/// Runs `work`, turning a panic into its message: a bug in one job's analysis must not stop the
/// analysis of every job on the node.
fn isolated<T>(work: impl FnOnce() -> T) -> Result<T, Panicked> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).map_err(|panic| {
        Panicked(
            panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into()),
        )
    })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_queue_holds_at_most_the_burst_budget_and_a_larger_batch_alone() {
        let queued = Arc::new(QueuedBursts {
            count: Mutex::new(0),
            taken: Condvar::new(),
            limit: 100,
        });
        queued.add(60);
        // 60 + 50 is over the budget: the sender waits until the analysis takes the first 60.
        let sender = queued.clone();
        let (added, done) = mpsc::channel();
        let waiting = std::thread::spawn(move || {
            sender.add(50);
            added.send(()).unwrap();
        });
        assert!(
            done.recv_timeout(std::time::Duration::from_millis(200))
                .is_err(),
            "added beyond the budget"
        );
        queued.take(60);
        done.recv_timeout(std::time::Duration::from_secs(60))
            .expect("added once taken");
        waiting.join().unwrap();
        // A batch larger than the whole budget waits for an empty queue and goes alone.
        queued.take(50);
        queued.add(500);
        assert_eq!(*queued.count.lock().unwrap(), 500);
    }

    #[test]
    fn a_panic_in_one_piece_of_work_becomes_its_message() {
        assert_eq!(isolated(|| 7), Ok(7));
        assert_eq!(
            isolated(|| -> u32 { panic!("window {} broke", 3) }),
            Err(Panicked("window 3 broke".to_string()))
        );
        assert_eq!(
            isolated(|| -> u32 { panic!("static message") }),
            Err(Panicked("static message".to_string()))
        );
    }
}
