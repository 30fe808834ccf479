//! The daemon: one loop that runs the stages as steps, on timers and on the kernel's wake-ups.
//!
//! ```text
//! drain     capture: exec notes, the burst ring                     (drain timer, ring wake-up)
//! identify  store::members: each new process's job and rank
//! ingest    store::ingest: records → bursts of their job, the analysis batch, the recording
//! totals    capture → store::readings: the kernel's exact totals per rank, usage, ended ranks
//!           and jobs; analysis (its own thread), properties, rank groups  (stats timer)
//! publish   export: the view the HTTP server and the metrics read
//! ```
//!
//! Beside them: the MPI libraries found at run time (attach.rs, libraries.rs, read off the loop
//! by file_reads.rs and library_reads.rs) and the probe governor (its own thread). Start-up is
//! in startup.rs. Every step is a type of its stage that owns its state; the daemon holds them
//! and passes each what it needs.

mod analysis;
mod attach;
mod file_reads;
mod groups;
mod instance;
mod launchers;
mod libraries;
mod library_reads;
pub mod privileges;
mod records;
mod startup;
mod wakeups;

use std::{collections::HashSet, sync::Arc, thread::JoinHandle, time::Instant};

use tokio::{signal::unix::SignalKind, sync::watch};

use crate::{
    analysis::online::PhasesSnapshot,
    capture::{self, governor::Governor, node_usage::NodeUsage, usage, Capture},
    config::Config,
    export::{
        printed::PrintedReports,
        published::{Published, SelfStats},
        recording::RecordingEnd,
        recording_sink::RecordingSink,
    },
    model::{unix_now_ns, JobId},
    proc,
    properties::{node::NodeProperties, LiveProperties},
    store::{
        clock::Clock,
        ingest::Ingest,
        members::{Member, Members},
        readings::Reading,
        JobStore,
    },
};
use analysis::AnalysisWorker;
use launchers::UnlistedLaunchers;
use libraries::Libraries;
use records::DrainRecords;
pub use startup::DaemonError;

/// What the daemon knows about the node's jobs. Only the daemon's thread touches it; after every
/// update it publishes a copy without the burst buffers ([`NodeState::published`]) for the HTTP
/// server.
#[derive(Default)]
struct NodeState {
    store: JobStore,
    health: SelfStats,
    /// The online phase analysis of each job, as of the last tick.
    phases: std::collections::BTreeMap<JobId, Arc<PhasesSnapshot>>,
    /// Each job's properties (life and last window), as of the last stats update.
    properties: std::collections::BTreeMap<JobId, Arc<LiveProperties>>,
    /// Each job's kernel usage (CPU time, memory, file I/O) on this node.
    usage: std::collections::BTreeMap<JobId, capture::usage::UsageTotals>,
    /// The start-up has attached the probes to the MPI libraries it found.
    probes_attached: bool,
    /// Each job's rank groups.
    groups: groups::GroupTrackers,
}

impl NodeState {
    fn published(&self) -> Published {
        Published {
            store: JobStore {
                jobs: self
                    .store
                    .jobs
                    .iter()
                    .map(|(id, job)| (id.clone(), job.without_bursts()))
                    .collect(),
            },
            bursts_held: self
                .store
                .jobs
                .iter()
                .map(|(id, job)| (id.clone(), job.bursts.len()))
                .collect(),
            health: self.health.clone(),
            phases: self.phases.clone(),
            properties: self.properties.clone(),
            usage: self.usage.clone(),
            probes_attached: self.probes_attached,
            rank_groups: self.groups.views.clone(),
        }
    }
}

/// The HTTP server and what it reads.
struct Server {
    /// The server's view of the node state, replaced at every publication; the server runs
    /// until it is dropped.
    publisher: watch::Sender<Arc<Published>>,
    addr: std::net::SocketAddr,
    _thread: JoinHandle<()>,
    /// Held until the daemon exits.
    _instance: Option<instance::InstanceLock>,
}

pub struct Daemon {
    config: Config,
    capture: Capture,
    /// The MPI libraries attached, and those found at run time.
    libraries: Libraries,
    /// The identify step.
    members: Members,
    /// The ingest step.
    ingest: Ingest,
    /// The records of the current drain, kept between drains so that a storm's drains do not
    /// grow a new buffer each time.
    records: DrainRecords,
    state: NodeState,
    /// Online phase analysis of every job, on its own thread.
    analysis: AnalysisWorker,
    /// Its snapshots after each tick, for the loop to publish.
    analysis_updates: tokio::sync::mpsc::UnboundedReceiver<analysis::Update>,
    usage: NodeUsage,
    properties: NodeProperties,
    recording: RecordingSink,
    reports: PrintedReports,
    /// The probe governor, unless it is off.
    governor: Option<Governor>,
    /// What a probe hit costs here, unless it could not be measured.
    probe_cost: Option<capture::ProbeCost>,
    clock: Clock,
    server: Server,
    /// A process joined a job since the last publication.
    members_changed: bool,
    /// The parents of MPI processes that no listed launcher started, reported.
    unlisted_launchers: UnlistedLaunchers,
}

impl Daemon {
    /// Runs until SIGINT or SIGTERM, then drains once more, writes the final state and detaches
    /// (dropping the BPF object closes every link).
    pub async fn run(mut self) -> Result<(), DaemonError> {
        let addr = self.server.addr;
        // The daemon's own state is in /metrics from the first scrape on.
        self.state.health = self.health()?;
        self.publish();
        eprintln!(
            "mpiburst ready: metrics at http://{addr}/metrics, jobs at http://{addr}/api/jobs"
        );
        let mut drain = tokio::time::interval(self.config.capture.drain_interval());
        // The BPF side wakes this when the burst ring fills faster than the timer drains it.
        let ring = wakeups::readable(self.capture.bursts_wakeup()?, "the burst ring buffer")?;
        // The BPF side reports a process it holds at the open of a new MPI library at once.
        let library_opens = wakeups::library_opens_ready(&self.capture)?;
        let mut stats = tokio::time::interval(self.config.capture.stats_interval());
        // Both streams exist for the whole loop: a signal that arrives while a drain or an update
        // runs is kept for the next select (a stream made inside the loop would miss it).
        let (mut sigint, mut sigterm) = (
            wakeups::signal(SignalKind::interrupt(), "SIGINT")?,
            wakeups::signal(SignalKind::terminate(), "SIGTERM")?,
        );
        loop {
            tokio::select! {
                _ = drain.tick() => self.drain(),
                ready = ring.readable() => {
                    if let Ok(mut guard) = ready {
                        self.drain();
                        guard.clear_ready();
                    }
                }
                ready = wakeups::library_open_reported(&library_opens) => {
                    if let Ok(mut guard) = ready {
                        self.libraries.handle_holds(&mut self.capture);
                        guard.clear_ready();
                    }
                }
                finished = self.libraries.read_finished() => {
                    let found = self.libraries.finish_read(&mut self.capture, finished);
                    self.identify_now(&found);
                    self.libraries.resume_identified(&mut self.capture);
                }
                _ = stats.tick() => self.update_totals(false)?,
                Some(update) = self.analysis_updates.recv() => self.take_analysis_updates(update),
                _ = sigint.recv() => break,
                _ = sigterm.recv() => break,
            }
        }
        self.shut_down()
    }

    /// The last steps: releases every held process first, then updates once more, ends the
    /// recording and lets the analysis print the last jobs' phases.
    fn shut_down(mut self) -> Result<(), DaemonError> {
        tracing::info!("shutting down: final drain");
        // No process may wait on the final drain, the recording or the last clustering, nor on
        // the governor's thread, which a window may hold for a grace period of the kernel.
        self.capture.release_held_processes();
        if let Some(g) = &mut self.governor {
            g.stop();
        }
        self.libraries.release_waiting();
        self.update_totals(true)?;
        let lost = self.capture.lost()?;
        self.recording.finish(|| RecordingEnd {
            ended_ns: unix_now_ns(),
            lost,
        });
        // The phases of the jobs that ended last are printed before the daemon exits.
        self.analysis.finish();
        // Dropping the daemon drops the publisher, which stops the server.
        Ok(())
    }

    /// Publishes the current state to the HTTP server.
    fn publish(&mut self) {
        self.server
            .publisher
            .send_replace(Arc::new(self.state.published()));
        self.members_changed = false;
    }

    /// The drain step: exec notifications, pending library scans, and the burst ring buffer.
    /// Publishes when a process joined a job, so the API lists a new job before its first stats
    /// update.
    fn drain(&mut self) {
        self.libraries.handle_holds(&mut self.capture);
        let now = Instant::now();
        for exec in self.capture.drain_execs() {
            self.members.exec(exec.pid, exec.exec_ns);
            self.libraries.exec(exec.pid, now);
        }
        self.libraries.start_scans(now);
        self.capture.forward_bpf_log();
        let mut records = std::mem::take(&mut self.records);
        self.capture.drain_bursts(|r| records.push(r));
        for run in records.grouped().chunk_by(|a, b| a.pid == b.pid) {
            if let Some(member) = self.member(run[0].pid) {
                self.ingest
                    .run(run, &member, &mut self.state.store, &mut self.recording);
            }
        }
        records.clear();
        self.records = records;
        let batches = self
            .ingest
            .end_drain(&mut self.state.store, self.config.daemon.max_bursts);
        for (job, ranks, bursts) in batches {
            self.analysis
                .send(analysis::Request::Bursts { job, ranks, bursts });
        }
        if self.members_changed {
            self.publish();
        }
    }

    /// The identify step for one process: its job and rank, found and registered in the store at
    /// its first sight; `None` for a process outside `daemon.cgroup`.
    fn member(&mut self, pid: u32) -> Option<Arc<Member>> {
        if let Some(member) = self.members.get(pid) {
            return Some(member.clone());
        }
        let store = &self.state.store;
        let new = self.members.identify(pid, |id, rank, pid| {
            store.jobs.get(id).is_some_and(|job| {
                job.is_ended() || job.ranks.get(&rank).is_some_and(|r| r.pid != pid)
            })
        })?;
        let member = new.member.clone();
        if self.state.store.add_member(new) {
            let meta = &self.state.store.jobs[&member.job].meta;
            tracing::info!("new job {} ({}), {} ranks", meta.id, meta.source, meta.size);
            self.recording.write(|w| w.job(meta));
        }
        if let Err(e) = self.capture.track(pid) {
            tracing::warn!("pid {pid}: file I/O not counted, exit time approximate: {e}");
        }
        if let Some(unlisted) = self.capture.unlisted_parent(pid) {
            self.unlisted_launchers.report(pid, unlisted);
        }
        self.members_changed = true;
        Some(member)
    }

    /// Identifies processes now, while they surely live (they map an MPI library), rather than
    /// when their first data arrives, and publishes them.
    fn identify_now(&mut self, pids: &[u32]) {
        for &pid in pids {
            self.member(pid);
        }
        if self.members_changed {
            self.publish();
        }
    }

    /// The totals step: reads the exact in-kernel totals, notices ended ranks and jobs, updates
    /// the analysis, the properties and the rank groups, prints the reports due, and publishes.
    /// `last`: the daemon's final update, at shut-down.
    fn update_totals(&mut self, last: bool) -> Result<(), DaemonError> {
        // Liveness first: whatever the kernel holds for a pid already gone is final. Drain after
        // it, so the last bursts of a process that just ended reach its job before it is forgotten.
        let gone = self.members.gone();
        self.drain();
        let now = unix_now_ns();
        let oldest_start = self.read_ranks(&gone, now)?;
        let io = self.capture.read_io()?;
        self.usage.read(
            self.members.iter().map(|(pid, m)| (pid, &m.job)),
            &io,
            &gone,
        );
        // A rank that exited without MPI_Finalize has its region end at its exit.
        self.mark_ended(&gone, now);
        self.end_ranks(&gone, last)?;
        self.tick_analysis(now);
        self.evaluate_properties(now);
        self.end_jobs(now);
        self.update_groups(now);
        self.reports.print_running(&self.state.store, now, last);
        self.evict_ended(now);
        self.libraries.keep_hold_guard(&self.capture);
        self.capture.detach_idle_programs();
        self.state.health = self.health()?;
        if let Some(g) = &self.governor {
            g.shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .forget_before(oldest_start);
        }
        self.recording.write(|w| w.flush());
        self.publish();
        Ok(())
    }

    /// Reads the kernel's totals into every rank, identifying the processes first seen there.
    /// Returns the oldest start of a rank read (CLOCK_MONOTONIC ns): the governor's demotions
    /// that ended before it mark no one.
    fn read_ranks(&mut self, gone: &HashSet<u32>, now: u64) -> Result<u64, DaemonError> {
        let totals = self.capture.read_totals()?;
        let mut per_process = capture::per_process(&totals);
        // The measurement of the probe cost at start ran the probes in this process.
        per_process.remove(&std::process::id());
        let governor = self
            .governor
            .as_ref()
            .map(|g| g.shared.lock().unwrap_or_else(|e| e.into_inner()).clone());
        let now_mono = usage::clock_ns(libc::CLOCK_MONOTONIC);
        let mut oldest_start = now_mono;
        for (pid, process) in &per_process {
            let Some(member) = self.member(*pid) else {
                continue;
            };
            let Some(rank) = self.state.store.rank_mut(&member) else {
                continue;
            };
            // The rank's life in the kernel's clock, to its exit or now. A process found gone in
            // this update has its end set after this reading: its exit time counts here too, or
            // a demotion that came after it would mark it.
            let ended = rank.ended_ns.or_else(|| {
                gone.contains(pid)
                    .then(|| ended_at(&self.capture, &self.clock, *pid, rank.first_seen_ns, now))
            });
            let life = (
                self.clock.monotonic_ns(rank.first_seen_ns),
                ended.map_or(now_mono, |t| self.clock.monotonic_ns(t)),
            );
            oldest_start = oldest_start.min(life.0);
            let reading = Reading {
                totals: &totals,
                names: &self.ingest.names,
                governor: governor.as_ref(),
                probe_cost: self.probe_cost,
                counters: self.capture.counters.is_ok(),
                clock: self.clock,
            };
            reading.read(rank, *pid, process, life, &mut self.ingest.resolver);
        }
        Ok(oldest_start)
    }

    /// Sets the end of the ranks whose process is gone.
    fn mark_ended(&mut self, gone: &HashSet<u32>, now: u64) {
        for pid in gone {
            let Some(member) = self.members.get(*pid) else {
                continue;
            };
            let Some(rank) = self.state.store.rank_mut(member) else {
                continue;
            };
            if rank.ended_ns.is_none() {
                rank.ended_ns = Some(ended_at(
                    &self.capture,
                    &self.clock,
                    *pid,
                    rank.first_seen_ns,
                    now,
                ));
            }
        }
    }

    /// Writes the ranks whose process is gone to the recording (at the daemon's last update every
    /// rank), and forgets the gone processes.
    fn end_ranks(&mut self, gone: &HashSet<u32>, last: bool) -> Result<(), DaemonError> {
        let ended = if last {
            self.members.pids()
        } else {
            gone.clone()
        };
        for pid in &ended {
            let Some(member) = self.members.get(*pid) else {
                continue;
            };
            if let Some(rank) = self.state.store.rank_mut(member) {
                self.recording.write(|w| w.rank(&member.job, rank));
            }
        }
        if !gone.is_empty() {
            self.capture.forget_processes(gone)?;
            for pid in gone {
                self.ingest.resolver.forget(*pid);
            }
        }
        self.members.forget(gone);
        Ok(())
    }

    /// Asks the analysis thread to close the windows due (they close on Unix time); it sends
    /// back every job's snapshot, which [`Daemon::take_analysis_updates`] publishes.
    fn tick_analysis(&mut self, now: u64) {
        let ranks = self
            .state
            .store
            .jobs
            .iter()
            .map(|(id, job)| {
                let finalized = job
                    .ranks
                    .values()
                    .filter_map(|r| Some((r.rank, r.region.finalize_entry_ns?)))
                    .collect();
                let count = job.ranks.len().max(1) as u32;
                (id.clone(), analysis::TickRanks { count, finalized })
            })
            .collect();
        self.analysis
            .send(analysis::Request::Tick { now_ns: now, ranks });
    }

    /// Evaluates every job's properties (over its life and its last complete window).
    fn evaluate_properties(&mut self, now: u64) {
        let evaluated =
            self.properties
                .evaluate(&self.state.store, &self.usage, &self.state.phases, now);
        self.state.usage = evaluated.usage;
        self.state.properties = evaluated.properties;
    }

    /// Marks the jobs whose ranks have all ended as ended, and hands each to the analysis
    /// thread, which prints its report with its phases once it has clustered it: together, and
    /// without holding up the loop. The bursts move there as they are held, in batches: nothing
    /// on this side reads an ended job's bursts, and the copy into one vector that the clustering
    /// needs is made there.
    fn end_jobs(&mut self, now: u64) {
        for job in self.state.store.jobs.values_mut() {
            if job.meta.ended_ns.is_some()
                || job.ranks.is_empty()
                || job.ranks.values().any(|r| r.ended_ns.is_none())
            {
                continue;
            }
            job.meta.ended_ns = Some(now);
            self.recording.write(|w| w.job(&job.meta));
            let properties = self.state.properties.get(&job.meta.id);
            let report = self.reports.job_end(job, properties.map(|p| &**p), now);
            self.analysis.send(analysis::Request::Ended {
                job: Box::new(job.meta.clone()),
                ranks: job.node_ranks(),
                bursts: std::mem::take(&mut job.bursts),
                report,
            });
        }
    }

    /// Updates every job's rank groups; the ranks of a job whose window closed go to the
    /// recording.
    fn update_groups(&mut self, now: u64) {
        let (params, window_s) = (&self.config.groups, self.config.analysis.window_s);
        let store = &self.state.store;
        for id in self.state.groups.update(store, now, params, window_s) {
            for rank in store.jobs[&id].ranks.values() {
                self.recording.write(|w| w.rank_reading(&id, rank, now));
            }
        }
    }

    /// Drops the jobs that ended long enough ago, or the oldest ended ones beyond
    /// `daemon.max_jobs`, from every stage.
    fn evict_ended(&mut self, now: u64) {
        let daemon = &self.config.daemon;
        let grace = (daemon.ended_job_grace_s * 1e9) as u64;
        for id in self.state.store.evict_ended(now, grace, daemon.max_jobs) {
            tracing::info!(
                "job {id} evicted (ended over {} s ago, or more than {} jobs held)",
                daemon.ended_job_grace_s,
                daemon.max_jobs
            );
            self.analysis.send(analysis::Request::Forget(id.clone()));
            self.usage.forget(&id);
            self.properties.forget(&id);
            self.state.phases.remove(&id);
            self.state.properties.remove(&id);
            self.state.usage.remove(&id);
            self.state.groups.forget(&id);
        }
    }

    /// The daemon's own health: losses, the BPF programs' cost, the probes and libraries, the
    /// governor.
    fn health(&mut self) -> Result<SelfStats, DaemonError> {
        let governor = self.governor.as_ref().map(|g| {
            g.shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .stats
                .clone()
        });
        Ok(SelfStats {
            lost: self.capture.lost()?,
            programs: self.capture.program_stats(),
            probes: self.capture.probes(),
            libraries: self.libraries.attacher.attached,
            library_opens: self.libraries.stats,
            file_io_attached: self.capture.counts_file_io(),
            scheduler_attached: self.capture.scheduler_attached(),
            library_watch_attached: self.capture.library_watch_attached(),
            counter_events: match &self.capture.counters {
                Ok(e) => format!("{},{}", e[0].name, e[1].name),
                Err(_) => "none".into(),
            },
            hardware_counters: startup::counters_in_use(&self.capture).1,
            process: proc::read_process(std::process::id()).ok(),
            governor: governor.unwrap_or_default(),
            probe_cost: self.probe_cost,
        })
    }

    /// Takes the snapshots the analysis thread has sent since the last call, and publishes them.
    fn take_analysis_updates(&mut self, first: analysis::Update) {
        let mut update = Some(first);
        while let Some((id, snapshot)) = update {
            match snapshot {
                // A snapshot of a job evicted meanwhile is dropped with it.
                Some(s) if self.state.store.jobs.contains_key(&id) => {
                    self.state.phases.insert(id, s);
                }
                _ => {
                    self.state.phases.remove(&id);
                }
            }
            update = self.analysis_updates.try_recv().ok();
        }
        self.publish();
    }
}

/// When the gone process `pid` of a rank seen since `first_seen_ns` ended (Unix ns): the
/// kernel's exit time, else (not tracked) `now`, when its absence was noticed.
fn ended_at(capture: &Capture, clock: &Clock, pid: u32, first_seen_ns: u64, now: u64) -> u64 {
    let exited = capture.exit_time(pid).map(|t| clock.unix_ns(t));
    exited.unwrap_or(now).clamp(first_seen_ns, now)
}
