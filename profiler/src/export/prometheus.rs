//! Prometheus exposition of the per-job totals and of the daemon's own health. Names follow
//! docs/metrics.md: prefix `mpiburst_`, base units, `_total` on counters; labels are bounded (job,
//! node, function, program); no per-rank label. The job label is `mpi_job`: Prometheus gives every
//! scraped series its own `job` label (the scrape job), and a target's `job` would be renamed.
//!
//! A `prometheus` registry holds two collectors: `StateCollector` builds the mpiburst families
//! from the daemon's shared state at each scrape, and the crate's process collector adds the
//! standard `process_*` metrics of the daemon itself. The crate's text encoder writes them.
//! The families are built per scrape rather than kept in the crate's metric vectors because the
//! values are a snapshot of the state (a job that is gone must leave no series behind) and some
//! families have a label only on some series (`phase` on per-phase properties).

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use prometheus::{
    core::{Collector, Desc},
    process_collector::ProcessCollector,
    proto::{Bucket, Counter, Gauge, Histogram, LabelPair, Metric, MetricFamily, MetricType},
    Registry, TextEncoder,
};

use crate::{
    analysis::{
        groups::RankGroupsView,
        online::{PhaseKey, PhaseView, PhasesSnapshot, WindowView},
        signature::AppSignature,
        tracking::StableId,
        ClusterStats,
    },
    capture::{LibraryOpenStats, ProgramStats},
    export::published::{Published, PublishedState, SelfStats},
    model::{unix_now_ns, JobId},
    properties::{
        Aggregate, JobAggregates, JobProperties, Outcome, PropertyResult, RankHistogram,
        RankSample, Summary,
    },
    store::{Job, JobStore, RankRecord},
};

/// Phases exported per job: the ones with the most time in the last window. Bounds the series
/// per job to O(phases), whatever the number of ranks.
pub const TOP_PHASES: usize = 10;

/// What `/metrics` serves: the daemon's families and the `process_*` metrics of the daemon.
#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
}

impl Metrics {
    pub fn new(state: PublishedState) -> prometheus::Result<Self> {
        Self::with_clock(state, unix_now_ns)
    }

    /// Metrics whose per-rank regions of ranks still running end at `now_ns()`.
    fn with_clock(state: PublishedState, now_ns: fn() -> u64) -> prometheus::Result<Self> {
        let registry = Registry::new();
        registry.register(Box::new(StateCollector::new(state, now_ns)?))?;
        registry.register(Box::new(ProcessCollector::for_self()))?;
        Ok(Metrics { registry })
    }

    /// The text exposition of every family that has a series.
    pub fn render(&self) -> prometheus::Result<String> {
        TextEncoder::new().encode_to_string(&self.registry.gather())
    }
}

/// Builds the mpiburst families from the shared state at each scrape.
struct StateCollector {
    state: PublishedState,
    now_ns: fn() -> u64,
    /// One per family, by name and help. Without label names: a family's label set can differ
    /// between its series.
    descs: Vec<Desc>,
}

impl StateCollector {
    fn new(state: PublishedState, now_ns: fn() -> u64) -> prometheus::Result<Self> {
        // An empty state still yields every family (without series), so the descriptors come
        // from the same code as the families.
        let descs = families(&Published::default(), 0)
            .iter()
            .map(|f| Desc::new(f.name().into(), f.help().into(), vec![], HashMap::new()))
            .collect::<prometheus::Result<_>>()?;
        Ok(StateCollector {
            state,
            now_ns,
            descs,
        })
    }
}

impl Collector for StateCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let published = self.state.borrow().clone();
        families(&published, (self.now_ns)())
    }
}

/// A series' labels, in the order they are written.
type Labels = Vec<(&'static str, String)>;

/// The longest label value that still counts as an identifier: a path, such as the executable.
pub const MAX_IDENTIFIER_LEN: usize = 256;

/// The first label of one exposition line (`name{a="x",b="y"} value`) whose value is free text
/// rather than an identifier: with white space, or longer than [`MAX_IDENTIFIER_LEN`]. Labels
/// carry identifiers only (job ids, node and function names, property ids, paths); texts belong
/// in the JSON API and the report. `None` for a line without labels.
pub fn free_text_label(series: &str) -> Option<(String, String)> {
    let (_, rest) = series.split_once('{')?;
    let mut chars = rest.chars();
    loop {
        let name: String = chars.by_ref().take_while(|&c| c != '=').collect();
        if name.is_empty() || chars.next() != Some('"') {
            return None;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => value.extend(chars.next()),
                c => value.push(c),
            }
        }
        if value.chars().any(char::is_whitespace) || value.len() > MAX_IDENTIFIER_LEN {
            return Some((name.trim_start_matches(',').to_string(), value));
        }
        match chars.next() {
            Some(',') => continue,
            _ => return None,
        }
    }
}

/// `labels` and one more.
fn with(labels: &Labels, name: &'static str, value: impl ToString) -> Labels {
    let mut out = labels.clone();
    out.push((name, value.to_string()));
    out
}

fn job_labels(id: &JobId, node: &str) -> Labels {
    vec![("mpi_job", id.0.clone()), ("node", node.to_string())]
}

/// The series of an aggregate over ranks: label `stat` = `sum`, `min`, `max`.
fn stat_series(labels: &Labels, a: Aggregate) -> [(Labels, f64); 3] {
    [("sum", a.sum), ("min", a.min), ("max", a.max)]
        .map(|(stat, v)| (with(labels, "stat", stat), v))
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Collects metric families, each with its series; a family without series is left for the
/// registry to drop.
#[derive(Default)]
struct Families(Vec<MetricFamily>);

impl Families {
    fn counter(&mut self, name: &str, help: &str, series: impl IntoIterator<Item = (Labels, f64)>) {
        self.family(name, help, MetricType::COUNTER, series);
    }

    fn gauge(&mut self, name: &str, help: &str, series: impl IntoIterator<Item = (Labels, f64)>) {
        self.family(name, help, MetricType::GAUGE, series);
    }

    fn family(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        series: impl IntoIterator<Item = (Labels, f64)>,
    ) {
        self.push(
            name,
            help,
            kind,
            series.into_iter().map(|(labels, value)| {
                let mut metric = labelled_metric(labels);
                if kind == MetricType::COUNTER {
                    let mut counter = Counter::default();
                    counter.set_value(value);
                    metric.set_counter(counter);
                } else {
                    let mut gauge = Gauge::default();
                    gauge.set_value(value);
                    metric.set_gauge(gauge);
                }
                metric
            }),
        );
    }

    /// A histogram family from rank distributions: their bucket counts, and the count and sum
    /// of their values (the exposition adds the `+Inf` bucket from the count).
    fn histogram<'a>(
        &mut self,
        name: &str,
        help: &str,
        series: impl IntoIterator<Item = (Labels, &'a Summary, &'a RankHistogram)>,
    ) {
        self.push(
            name,
            help,
            MetricType::HISTOGRAM,
            series.into_iter().map(|(labels, values, buckets)| {
                let mut histogram = Histogram::default();
                histogram.set_sample_count(values.count);
                histogram.set_sample_sum(values.sum);
                histogram.set_bucket(
                    buckets
                        .upper_bounds
                        .iter()
                        .zip(&buckets.cumulative_counts)
                        .map(|(&le, &count)| {
                            let mut bucket = Bucket::default();
                            bucket.set_upper_bound(le);
                            bucket.set_cumulative_count(count);
                            bucket
                        })
                        .collect(),
                );
                let mut metric = labelled_metric(labels);
                metric.set_histogram(histogram);
                metric
            }),
        );
    }

    fn push(
        &mut self,
        name: &str,
        help: &str,
        kind: MetricType,
        metrics: impl IntoIterator<Item = Metric>,
    ) {
        let mut family = MetricFamily::default();
        family.set_name(name.into());
        family.set_help(help.into());
        family.set_field_type(kind);
        family.set_metric(metrics.into_iter().collect());
        self.0.push(family);
    }
}

/// A series without its value.
fn labelled_metric(labels: Labels) -> Metric {
    let mut metric = Metric::default();
    metric.set_label(
        labels
            .into_iter()
            .map(|(name, value)| {
                let mut pair = LabelPair::default();
                pair.set_name(name.into());
                pair.set_value(value);
                pair
            })
            .collect(),
    );
    metric
}

/// A job's labels and the job.
type LabelledJobs<'a> = [(Labels, &'a Job)];

/// Every mpiburst family as of `shared`, with the per-rank regions of running ranks ending at
/// `now_ns`.
fn families(shared: &Published, now_ns: u64) -> Vec<MetricFamily> {
    let (store, health, phases) = (&shared.store, &shared.health, &shared.phases);
    let mut f = Families::default();
    let jobs: Vec<_> = store
        .jobs
        .values()
        .map(|j| (job_labels(&j.meta.id, &j.meta.node), j))
        .collect();
    job_families(&mut f, &jobs);
    mpi_function_families(&mut f, &jobs);
    rank_aggregate_families(&mut f, &jobs, now_ns);
    phase_families(&mut f, store, phases);
    group_families(&mut f, shared);
    usage_families(&mut f, shared);
    property_families(&mut f, shared);
    f.gauge(
        "mpiburst_jobs_tracked",
        "Jobs held by the daemon, running or ended.",
        [(vec![], store.jobs.len() as f64)],
    );
    capture_families(&mut f, health);
    library_open_families(&mut f, &health.library_opens);
    governor_families(&mut f, health);
    f.0
}

/// Each job's identity, size and exact totals on this node.
fn job_families(f: &mut Families, jobs: &LabelledJobs<'_>) {
    f.gauge(
        "mpiburst_job_info",
        "Always 1; identifies a job seen on this node, with where its identity came from.",
        jobs.iter().map(|(l, j)| {
            let l = with(l, "source", j.meta.source_kind());
            let l = with(&l, "executable", &j.meta.executable);
            // Only for a job inside a Slurm allocation: an empty label is no label.
            match &j.meta.scheduler_job {
                Some(scheduler_job) => (with(&l, "scheduler_job", scheduler_job), 1.0),
                None => (l, 1.0),
            }
        }),
    );
    f.gauge(
        "mpiburst_job_size_ranks",
        "Ranks in the job's world communicator (all nodes).",
        jobs.iter().map(|(l, j)| (l.clone(), j.meta.size as f64)),
    );
    f.gauge(
        "mpiburst_job_local_ranks",
        "Ranks of the job seen on this node.",
        jobs.iter().map(|(l, j)| (l.clone(), j.ranks.len() as f64)),
    );
    f.gauge(
        "mpiburst_job_running",
        "1 while the job has live ranks on this node, 0 once they all ended.",
        jobs.iter()
            .map(|(l, j)| (l.clone(), if j.is_ended() { 0.0 } else { 1.0 })),
    );
    let totals: Vec<_> = jobs.iter().map(|(l, j)| (l, j.totals())).collect();
    f.counter(
        "mpiburst_job_useful_seconds_total",
        "Wall time of all CPU bursts (computation between MPI calls) of the job's ranks here, exact.",
        totals.iter().map(|(l, t)| ((*l).clone(), secs(t.burst_ns))),
    );
    f.counter(
        "mpiburst_job_useful_oncpu_seconds_total",
        "On-CPU time inside the job's CPU bursts here (lower than useful time when descheduled).",
        totals
            .iter()
            .map(|(l, t)| ((*l).clone(), secs(t.burst_oncpu_ns))),
    );
    f.counter(
        "mpiburst_job_mpi_seconds_total",
        "Time inside outermost MPI calls, all functions, of the job's ranks here.",
        jobs.iter()
            .map(|(l, j)| (l.clone(), secs(j.ranks.values().map(|r| r.mpi_ns()).sum()))),
    );
    f.counter(
        "mpiburst_job_bursts_total",
        "CPU bursts of the job's ranks here, whatever their duration.",
        totals.iter().map(|(l, t)| ((*l).clone(), t.bursts as f64)),
    );
    f.counter(
        "mpiburst_job_filtered_bursts_total",
        "Bursts below the duration filter: summed in kernel, not shipped to the daemon.",
        totals
            .iter()
            .map(|(l, t)| ((*l).clone(), t.filtered_bursts as f64)),
    );
    f.counter(
        "mpiburst_job_filtered_seconds_total",
        "Wall time of the bursts below the duration filter.",
        totals
            .iter()
            .map(|(l, t)| ((*l).clone(), secs(t.filtered_ns))),
    );
    f.counter(
        "mpiburst_job_dropped_bursts_total",
        "Bursts above the filter lost because the ring buffer was full (their time is still counted).",
        totals.iter().map(|(l, t)| ((*l).clone(), t.dropped_bursts as f64)),
    );
    let probe_costs: Vec<_> = jobs
        .iter()
        .filter_map(|(l, j)| {
            let costs: Vec<_> = j.ranks.values().filter_map(|r| r.probe_cost).collect();
            (!costs.is_empty()).then_some((l, costs))
        })
        .collect();
    f.gauge(
        "mpiburst_job_profiling_cost_seconds",
        "Time the job's ranks here lost to profiling, estimated: their calls probed in full times what a probe hit costs them, and the daemon's CPU taken from them (docs/metrics.md, What profiling costs). Absent when the daemon measured no probe cost.",
        probe_costs.iter().map(|(l, costs)| {
            let lost = costs.iter().map(|c| c.lost_ns() + c.daemon_ns as f64);
            ((*l).clone(), lost.sum::<f64>() / 1e9)
        }),
    );
    f.gauge(
        "mpiburst_job_profiling_daemon_seconds",
        "The part of mpiburst_job_profiling_cost_seconds that is the daemon's own CPU: how long the daemon's threads ran after taking a rank's CPU from it mid-burst, summed over the ranks here. Absent when the daemon measured no probe cost.",
        probe_costs.iter().map(|(l, costs)| {
            let daemon = costs.iter().map(|c| c.daemon_ns as f64);
            ((*l).clone(), daemon.sum::<f64>() / 1e9)
        }),
    );
    f.gauge(
        "mpiburst_job_profiling_storm_seconds",
        "CPU the probes of polling storms took from the job's ranks here (calls the probe governor counted at entry only or sampled): inside waiting, not lost run time.",
        probe_costs.iter().map(|(l, costs)| {
            ((*l).clone(), costs.iter().map(|c| c.storm_ns()).sum::<f64>() / 1e9)
        }),
    );
}

/// Each job's calls, time and bytes per MPI function, and the functions the governor demoted.
fn mpi_function_families(f: &mut Families, jobs: &LabelledJobs<'_>) {
    let per_function: Vec<_> = jobs
        .iter()
        .flat_map(|(l, j)| {
            j.functions()
                .into_iter()
                .map(move |(name, s)| (with(l, "function", name), s))
                .collect::<Vec<_>>()
        })
        .collect();
    f.counter(
        "mpiburst_job_mpi_calls_total",
        "Outermost calls per MPI function (PMPI and Fortran wrappers count once).",
        per_function
            .iter()
            .map(|(l, s)| (l.clone(), s.calls as f64)),
    );
    f.gauge(
        "mpiburst_job_mpi_governed",
        "1 where the probe governor demoted the function while a rank of the job ran: mode=count_only, its time covers only the calls probed in full; mode=sampled, only the calls in its sampling windows are counted (a lower bound).",
        per_function.iter().flat_map(|(l, s)| {
            [("count_only", s.count_only), ("sampled", s.sampled)]
                .into_iter()
                .filter(|(_, on)| *on)
                .map(|(mode, _)| (with(l, "mode", mode), 1.0))
                .collect::<Vec<_>>()
        }),
    );
    f.counter(
        "mpiburst_job_mpi_call_seconds_total",
        "Time inside each MPI function.",
        per_function
            .iter()
            .map(|(l, s)| (l.clone(), secs(s.time_ns))),
    );
    f.counter(
        "mpiburst_job_mpi_bytes_total",
        "Bytes passed to each MPI function (count times datatype size), for calls with a known datatype size.",
        per_function.iter().filter(|(_, s)| s.sized_calls > 0).map(|(l, s)| (l.clone(), s.bytes as f64)),
    );
}

/// Mergeable per-rank aggregates over each rank's region of interest (the same samples the
/// properties use): summed (sum, count) or maxed/minned across nodes in PromQL, they give exact
/// job-wide load balance and communication efficiency (dashboards/rules). Regions of running
/// ranks end at `now_ns`.
fn rank_aggregate_families(f: &mut Families, jobs: &LabelledJobs<'_>, now_ns: u64) {
    let lifetimes: Vec<_> = jobs
        .iter()
        .map(|(l, j)| {
            let samples: Vec<RankSample> = j
                .ranks
                .values()
                .map(|r| RankSample::lifetime(r, now_ns))
                .collect();
            (l, JobAggregates::from_ranks(&samples))
        })
        .collect();
    f.gauge(
        "mpiburst_job_region_ranks",
        "Ranks of the job here past the return of MPI_Init (the count of the per-rank aggregates).",
        lifetimes
            .iter()
            .map(|(l, a)| ((*l).clone(), a.useful_seconds.count as f64)),
    );
    for (name, help, field) in [
        (
            "mpiburst_job_rank_useful_seconds",
            "Per-rank useful time (region of interest minus MPI time) over the job's ranks here: stat=sum|min|max.",
            (|a: &JobAggregates| a.useful_seconds) as fn(&JobAggregates) -> Aggregate,
        ),
        ("mpiburst_job_rank_mpi_seconds", "Per-rank time in MPI inside the region of interest: stat=sum|min|max.", |a| a.mpi_seconds),
        (
            "mpiburst_job_rank_runtime_seconds",
            "Per-rank region of interest, from the return of MPI_Init to the entry of MPI_Finalize (or exit, or now): stat=sum|min|max.",
            |a| a.runtime_seconds,
        ),
    ] {
        f.gauge(
            name,
            help,
            lifetimes
                .iter()
                .filter(|(_, a)| a.useful_seconds.count > 0)
                .flat_map(|(l, a)| stat_series(l, field(a))),
        );
    }
    for (name, help, value) in [
        (
            "mpiburst_job_rank_init_seconds",
            "Per-rank time inside MPI_Init/MPI_Init_thread (start-up, outside the efficiencies): stat=sum|min|max.",
            RankRecord::init_ns as fn(&RankRecord) -> u64,
        ),
        (
            "mpiburst_job_rank_finalize_seconds",
            "Per-rank time inside MPI_Finalize (shut-down, outside the efficiencies): stat=sum|min|max.",
            RankRecord::finalize_ns,
        ),
    ] {
        f.gauge(
            name,
            help,
            jobs.iter().filter(|(_, j)| !j.ranks.is_empty()).flat_map(|(l, j)| {
                stat_series(l, Aggregate::of(j.ranks.values().map(|r| secs(value(r)))))
            }),
        );
    }
}

/// The kernel side's losses and BPF program statistics, and the daemon's own usage, probes and
/// libraries.
fn capture_families(f: &mut Families, health: &SelfStats) {
    f.counter(
        "mpiburst_lost_events_total",
        "Events the kernel side could not deliver or record, by kind.",
        [
            ("bursts", health.lost.bursts),
            ("execs", health.lost.execs),
            ("thread_states", health.lost.thread_states),
            ("thread_stats", health.lost.thread_stats),
            ("counters_descheduled", health.lost.counters_descheduled),
        ]
        .map(|(k, v)| (vec![("kind", k.to_string())], v as f64)),
    );
    f.gauge(
        "mpiburst_on_demand_programs_attached",
        "1 while each set of BPF programs attached only while the node has MPI processes (the library watch: or MPI launchers) is attached (capture.detach_idle_after_s).",
        [
            ("file_io", health.file_io_attached),
            ("scheduler", health.scheduler_attached),
            ("library_watch", health.library_watch_attached),
        ]
        .map(|(k, v)| (vec![("programs", k.to_string())], f64::from(u8::from(v)))),
    );
    let programs = |value: fn(&ProgramStats) -> Option<f64>| {
        health
            .programs
            .iter()
            .filter_map(move |p| Some((vec![("program", p.name.to_string())], value(p)?)))
            .collect::<Vec<_>>()
    };
    f.counter(
        "mpiburst_bpf_run_seconds_total",
        "Time the kernel spent running each BPF program (kernel BPF statistics).",
        programs(|p| Some(p.run_time?.as_secs_f64())),
    );
    f.counter(
        "mpiburst_bpf_runs_total",
        "Runs of each BPF program.",
        programs(|p| Some(p.run_count? as f64)),
    );
    f.counter(
        "mpiburst_bpf_missed_runs_total",
        "Runs of each BPF program the kernel skipped because another tracing program was active on the CPU.",
        programs(|p| Some(p.missed as f64)),
    );
    let process = health.process.as_ref();
    f.counter(
        "mpiburst_daemon_cpu_seconds_total",
        "CPU time of the daemon itself, by mode (user, system).",
        process.into_iter().flat_map(|p| {
            [("user", p.user_ns), ("system", p.system_ns)]
                .map(|(mode, ns)| (vec![("mode", mode.to_string())], secs(ns)))
        }),
    );
    f.gauge(
        "mpiburst_daemon_resident_memory_bytes",
        "Resident memory of the daemon itself.",
        process.map(|p| (vec![], p.rss_bytes as f64)),
    );
    f.gauge(
        "mpiburst_probes_attached",
        "MPI entry points probed (each with a uprobe and a uretprobe).",
        [(vec![], health.probes as f64)],
    );
    f.gauge(
        "mpiburst_libraries_attached",
        "MPI library files attached.",
        [(vec![], health.libraries as f64)],
    );
}

/// Processes held at the open of an MPI library until its probes were attached, and reads of
/// library files.
fn library_open_families(f: &mut Families, opens: &LibraryOpenStats) {
    let holds = [
        (
            "library_opens",
            "Processes stopped at the open of an MPI library at a path not seen before, until its probes were attached.",
            opens.held,
            opens.held_ns,
        ),
        (
            "first_calls",
            "Processes stopped at a thread's first MPI call until the scheduler programs were attached again (detached while the node had no MPI thread).",
            opens.first_calls_held,
            opens.first_calls_held_ns,
        ),
        (
            "launched",
            "Processes that launchers of MPI ranks (mpi.launchers) started, stopped at their exec until the watch on library opens was attached again (detached while the node had no launcher and no MPI process).",
            opens.launched_held,
            opens.launched_held_ns,
        ),
    ];
    for (what, help, count, ns) in holds {
        f.counter(
            &format!("mpiburst_{what}_held_total"),
            help,
            [(vec![], count as f64)],
        );
        f.counter(
            &format!("mpiburst_{what}_held_seconds_total"),
            "Time those processes were stopped, summed.",
            [(vec![], secs(ns))],
        );
    }
    f.counter(
        "mpiburst_library_opens_attached_total",
        "Library files (MPI libraries, PMPI interposers) attached while a process was held.",
        [(vec![], opens.attached as f64)],
    );
    f.counter(
        "mpiburst_library_opens_not_held_total",
        "Holds not reported (ring buffer full), at the open of an MPI library at a new path, at a thread's first MPI call or at the exec of a process a launcher started: the process ran on, and its first calls may be missed or lack on-CPU time.",
        [(vec![], opens.not_held as f64)],
    );
    f.counter(
        "mpiburst_library_reads_timed_out_total",
        "Reads of a library file found at run time that did not return within mpi.library_read_timeout_ms (a hung file system): a held process was resumed unprofiled, or new processes were not attached from that file.",
        [(vec![], opens.reads_timed_out as f64)],
    );
    f.gauge(
        "mpiburst_library_reads_stuck",
        "Those reads still blocked in the file system, each holding a thread of the daemon.",
        [(vec![], opens.reads_stuck as f64)],
    );
    f.counter(
        "mpiburst_library_opens_resumed_by_guard_total",
        "Held processes the hold guard resumed before the daemon did, held past mpi.hold_limit_s (a stopped, hung or slow daemon): they ran on, probes attached or not.",
        [(vec![], opens.resumed_by_guard as f64)],
    );
    f.counter(
        "mpiburst_hold_guard_restarts_total",
        "Hold guards the daemon started again after the one before exited.",
        [(vec![], opens.guard_restarts as f64)],
    );
}

/// What a probe hit costs, the probe governor's modes and changes, and the counter events read
/// per burst.
fn governor_families(f: &mut Families, health: &SelfStats) {
    let governor = &health.governor;
    f.gauge(
        "mpiburst_probe_hit_cost_seconds",
        "What a probe hit costs on this node, measured at start: probe=\"full\" (entry and return, calls back to back), probe=\"count_only\" (entry only, with uprobe sessions, back to back), probe=\"full_among_work\" (entry and return, each call after a pass over the core's cache). Absent when it could not be measured.",
        health.probe_cost.into_iter().flat_map(|c| {
            [
                ("full", Some(c.full_ns)),
                ("count_only", c.count_only_ns),
                ("full_among_work", Some(c.full_among_work_ns)),
            ]
                .into_iter()
                .filter_map(|(probe, ns)| Some((vec![("probe", probe.to_string())], ns? / 1e9)))
        }),
    );
    f.gauge(
        "mpiburst_probe_program_run_seconds",
        "The mean run of the probe program of an ordinary MPI call in the same measurement, as the probes time one run in 16: probe=\"full\" (back to back), probe=\"full_among_work\". A rank whose runs take k times the first loses k times a hit back to back per call (docs/metrics.md, What profiling costs).",
        health.probe_cost.into_iter().flat_map(|c| {
            [
                ("full", c.run_back_to_back_ns),
                ("full_among_work", c.run_among_work_ns),
            ]
            .into_iter()
            .filter_map(|(probe, ns)| Some((vec![("probe", probe.to_string())], ns? / 1e9)))
        }),
    );
    f.gauge(
        "mpiburst_governor_function_mode",
        "1 for the mode the governor has each polling function probed in: full, count_only (entry only, its time stays in the bursts) or sampled (calls counted in sampling windows only).",
        governor.functions.iter().map(|(function, g)| {
            (
                vec![("function", function.clone()), ("mode", g.mode.to_string())],
                1.0,
            )
        }),
    );
    f.counter(
        "mpiburst_governor_changes_total",
        "Changes of a polling function's probe mode by the governor, by the mode changed to.",
        governor.functions.iter().flat_map(|(function, g)| {
            g.changes.iter().map(|(mode, n)| {
                (
                    vec![("function", function.clone()), ("mode", mode.to_string())],
                    *n as f64,
                )
            })
        }),
    );
    f.counter(
        "mpiburst_governor_sampling_windows_total",
        "Sampling windows of each sampled polling function.",
        governor
            .functions
            .iter()
            .filter(|(_, g)| g.windows > 0)
            .map(|(function, g)| (vec![("function", function.clone())], g.windows as f64)),
    );
    f.gauge(
        "mpiburst_counters_info",
        "1 for the counter events read per burst; event=\"none\" when no counters are available.",
        [(
            vec![
                ("event", health.counter_events.clone()),
                ("hardware", health.hardware_counters.to_string()),
            ],
            1.0,
        )],
    );
}

/// Phase metrics of the last closed window of each job, for its top phases by time.
fn phase_families(
    f: &mut Families,
    store: &JobStore,
    phases: &BTreeMap<JobId, Arc<PhasesSnapshot>>,
) {
    let labelled: Vec<(Labels, &PhasesSnapshot)> = phases
        .iter()
        .filter_map(|(id, p)| {
            let job = store.jobs.get(id)?;
            Some((job_labels(id, &job.meta.node), p.as_ref()))
        })
        .collect();
    let top: Vec<(Labels, &ClusterStats)> = labelled
        .iter()
        .filter_map(|(l, p)| Some((l, p.last_window.as_ref()?)))
        .flat_map(|(l, w)| {
            let mut ranked: Vec<_> = w.phases.iter().collect();
            ranked.sort_by_key(|p| p.time_rank);
            ranked
                .into_iter()
                .take(TOP_PHASES)
                .map(move |p| (with(l, "phase", p.id), &p.stats))
        })
        .collect();
    f.gauge(
        "mpiburst_job_spmd_score",
        "Cluster Sequence Score of the job's last closed window (1 = every rank runs every phase in step).",
        labelled.iter().filter_map(|(l, p)| Some((l.clone(), p.last_window.as_ref()?.spmd_score))),
    );
    f.counter(
        "mpiburst_job_phase_windows_total",
        "Analysis windows closed for the job.",
        labelled
            .iter()
            .map(|(l, p)| (l.clone(), p.totals.windows_closed as f64)),
    );
    f.counter(
        "mpiburst_job_phase_events_total",
        "Phase tracking events across windows, by kind (appear, vanish, split, merge, moved).",
        labelled.iter().flat_map(|(l, p)| {
            let c = &p.event_counts;
            [
                ("appear", c.appear),
                ("vanish", c.vanish),
                ("split", c.split),
                ("merge", c.merge),
                ("moved", c.moved),
            ]
            .map(|(kind, n)| (with(l, "kind", kind), n as f64))
        }),
    );
    f.gauge(
        "mpiburst_phase_time_share",
        "Share of the window's computation time in the phase (label phase: stable id across windows).",
        top.iter().map(|(l, c)| (l.clone(), c.time_share)),
    );
    f.gauge(
        "mpiburst_phase_time_seconds",
        "Computation time in the phase during the last closed window.",
        top.iter().map(|(l, c)| (l.clone(), secs(c.time_ns))),
    );
    f.gauge(
        "mpiburst_phase_bursts",
        "CPU bursts of the phase in the last closed window.",
        top.iter().map(|(l, c)| (l.clone(), c.bursts as f64)),
    );
    f.gauge(
        "mpiburst_phase_spmd_score",
        "Cluster Sequence Score of the phase: share of ranks running it in step.",
        top.iter().map(|(l, c)| (l.clone(), c.spmd_score)),
    );
    f.gauge(
        "mpiburst_phase_load_balance",
        "Duration load balance of the phase: mean over ranks of their time in it / the largest.",
        top.iter().map(|(l, c)| (l.clone(), c.lb_duration)),
    );
    f.gauge(
        "mpiburst_phase_burst_duration_seconds",
        "Burst duration percentiles of the phase in the last closed window: stat=p10|p50|p90|p99|max.",
        top.iter().flat_map(|(l, c)| {
            let d = &c.duration;
            [("p10", d.p10_ns), ("p50", d.p50_ns), ("p90", d.p90_ns), ("p99", d.p99_ns), ("max", d.max_ns)]
                .map(|(stat, v)| (with(l, "stat", stat), secs(v)))
        }),
    );
    f.gauge(
        "mpiburst_phase_ipc",
        "Instructions per cycle of the phase (only with hardware counters).",
        top.iter().filter_map(|(l, c)| Some((l.clone(), c.ipc?))),
    );
    phase_key_families(f, &labelled);
    signature_families(f, &labelled);
}

/// The job's signature here up to the end of the last clustered window, as sums over this node's
/// ranks that add up exactly across nodes: the recording rules turn them into each phase's W
/// (repetitions per rank) and PET and the job's PAET. Phases are keyed by `phase_key`, the key of
/// the first phase of their dominant region ([`PhaseKey::of_region`]).
fn signature_families(f: &mut Families, labelled: &[(Labels, &PhasesSnapshot)]) {
    let signatures: Vec<(&Labels, &AppSignature)> = labelled
        .iter()
        .filter_map(|(l, p)| Some((l, &p.signature.as_ref()?.signature)))
        .collect();
    f.gauge(
        "mpiburst_job_signature_ranks",
        "Ranks here with a CPU burst before the end of the last clustered window: what the signature's repetitions per rank divide by.",
        signatures.iter().map(|(l, s)| ((*l).clone(), s.ranks as f64)),
    );
    f.gauge(
        "mpiburst_job_signature_runtime_seconds",
        "Longest time here from a rank's first CPU burst to MPI_Finalize or the end of the last clustered window.",
        signatures.iter().map(|(l, s)| ((*l).clone(), secs(s.runtime_ns))),
    );
    // (labels, repetitions, their seconds), summed over the ranks here: W and W × PET are means
    // over them.
    let phases: Vec<(Labels, f64, f64)> = signatures
        .iter()
        .flat_map(|&(l, s)| {
            let ranks = s.ranks as f64;
            s.phases.iter().map(move |p| {
                let key = PhaseKey::of_region(&p.key.start, &p.key.end);
                let repetitions = (p.weight * ranks).round();
                (
                    with(l, "phase_key", key),
                    repetitions,
                    p.time_ns() * ranks / 1e9,
                )
            })
        })
        .collect();
    f.gauge(
        "mpiburst_phase_key_repetitions",
        "Repetitions of the phase (a CPU burst of it and the MPI time until the next) by the ranks here, from the job's start to the end of the last clustered window.",
        phases.iter().map(|(l, n, _)| (l.clone(), *n)),
    );
    f.gauge(
        "mpiburst_phase_key_repetition_seconds",
        "Time of those repetitions, summed over the ranks here.",
        phases.iter().map(|(l, _, s)| (l.clone(), *s)),
    );
}

/// Per-phase sums of the last closed window of each job, keyed by phase key (the same phase's
/// name on every node), that add up exactly across nodes: the recording rules sum them by
/// `phase_key` into the job-wide time share and mean burst duration of each phase. Values are
/// scaled from the clustered sample up to all bursts the window held here (a factor of 1 unless
/// the window was sampled), so that nodes sampled at different rates weigh by their real time.
/// A window clustered early (partial) is left out: its node would mix another window into the
/// sums. At most the tracker's `max_phases` phases per job, those with the most time.
fn phase_key_families(f: &mut Families, labelled: &[(Labels, &PhasesSnapshot)]) {
    let windows: Vec<(&Labels, &WindowView, usize)> = labelled
        .iter()
        .filter_map(|(l, p)| {
            let w = p.last_window.as_ref().filter(|w| !w.partial)?;
            Some((l, w, p.samples.params.tracking.max_phases))
        })
        .collect();
    f.gauge(
        "mpiburst_job_phase_window_seconds",
        "Computation time of the job's ranks here in the last closed analysis window: the total the per-phase sums are shares of.",
        windows.iter().map(|(l, w, _)| ((*l).clone(), secs(w.time_seen_ns))),
    );
    f.gauge(
        "mpiburst_job_phase_window_end_timestamp_seconds",
        "Aligned Unix time the last closed analysis window ends at: the same on every node for the same window.",
        windows.iter().map(|(l, w, _)| ((*l).clone(), w.end_ns as f64 / 1e9)),
    );
    let phases: Vec<(Labels, PhaseSums)> = windows
        .iter()
        .flat_map(|&(l, w, max_phases)| {
            let mut ranked: Vec<&PhaseView> = w.phases.iter().collect();
            ranked.sort_by_key(|p| p.time_rank);
            ranked
                .into_iter()
                .take(max_phases)
                .map(move |p| (with(l, "phase_key", p.key), PhaseSums::of(w, p)))
        })
        .collect();
    f.gauge(
        "mpiburst_phase_key_bursts",
        "CPU bursts of the phase here in the last closed window (label phase_key: the same on every node), scaled to all of the window's bursts.",
        phases.iter().map(|(l, s)| (l.clone(), s.bursts)),
    );
    f.gauge(
        "mpiburst_phase_key_seconds",
        "Computation time of the phase here in the last closed window (the sum of its burst durations), scaled to all of the window's bursts.",
        phases.iter().map(|(l, s)| (l.clone(), s.seconds)),
    );
    f.gauge(
        "mpiburst_phase_key_ranks",
        "Ranks here that ran the phase in the last closed window.",
        phases.iter().map(|(l, s)| (l.clone(), s.ranks as f64)),
    );
}

/// What one phase of a window adds to the job-wide sums.
struct PhaseSums {
    bursts: f64,
    seconds: f64,
    ranks: usize,
}

impl PhaseSums {
    fn of(w: &WindowView, p: &PhaseView) -> PhaseSums {
        // The sample's share of the window: its time analysed against the time pushed, and the
        // same for the bursts.
        let scale = |seen: u64, analysed: u64| {
            if analysed == 0 {
                1.0
            } else {
                seen as f64 / analysed as f64
            }
        };
        PhaseSums {
            bursts: p.stats.bursts as f64 * scale(w.bursts_seen, w.bursts_analysed),
            seconds: secs(p.stats.time_ns) * scale(w.time_seen_ns, w.filter.time_in_ns),
            ranks: w
                .sequences
                .iter()
                .filter(|r| r.phases.contains(&p.id))
                .count(),
        }
    }
}

/// Rank groups of each job: how many, and the behaviour changes found so far.
fn group_families(f: &mut Families, shared: &Published) {
    let labelled: Vec<(Labels, &RankGroupsView)> = shared
        .rank_groups
        .iter()
        .filter_map(|(id, view)| {
            let job = shared.store.jobs.get(id)?;
            Some((job_labels(id, &job.meta.node), view.as_ref()))
        })
        .collect();
    f.gauge(
        "mpiburst_job_rank_groups",
        "Behaviour groups of the job's ranks (CallPath+Parameter clustering); the groups, leads and members are in /api/jobs/JOB/ranks.",
        labelled.iter().map(|(l, v)| (l.clone(), v.groups.len() as f64)),
    );
    f.counter(
        "mpiburst_job_behaviour_changes_total",
        "Behaviour changes of the job: re-clusterings in which ranks kept another call path.",
        labelled
            .iter()
            .map(|(l, v)| (l.clone(), v.changes.len() as f64)),
    );
}

/// Kernel usage of each job on this node: CPU time, memory, file I/O.
fn usage_families(f: &mut Families, shared: &Published) {
    let usage: Vec<_> = shared
        .usage
        .iter()
        .filter_map(|(id, u)| Some((job_labels(id, &shared.store.jobs.get(id)?.meta.node), u)))
        .collect();
    f.counter(
        "mpiburst_job_cpu_seconds_total",
        "CPU time of the job's processes here, by mode (user, system), from procfs.",
        usage.iter().flat_map(|(l, u)| {
            [("user", u.user_ns), ("system", u.system_ns)]
                .map(|(mode, ns)| (with(l, "mode", mode), secs(ns)))
        }),
    );
    f.gauge(
        "mpiburst_job_memory_used_bytes",
        "Resident memory of the job's live processes here.",
        usage
            .iter()
            .map(|(l, u)| (l.clone(), u.memory_used_bytes as f64)),
    );
    f.counter(
        "mpiburst_job_io_bytes_total",
        "File bytes the job's processes read or wrote here (syscall tracepoints; files they opened, not pipes or sockets), by direction.",
        usage.iter().filter_map(|(l, u)| Some((l, u.io?))).flat_map(|(l, io)| {
            [("read", io.read_bytes), ("write", io.write_bytes)]
                .map(|(d, v)| (with(l, "direction", d), v as f64))
        }),
    );
    f.counter(
        "mpiburst_job_io_requests_total",
        "File read and write system calls of the job's processes here, by direction.",
        usage
            .iter()
            .filter_map(|(l, u)| Some((l, u.io?)))
            .flat_map(|(l, io)| {
                [("read", io.read_calls), ("write", io.write_calls)]
                    .map(|(d, v)| (with(l, "direction", d), v as f64))
            }),
    );
    f.counter(
        "mpiburst_job_io_opens_total",
        "Successful file opens of the job's processes here.",
        usage
            .iter()
            .filter_map(|(l, u)| Some((l.clone(), u.io?.opens as f64))),
    );
    f.counter(
        "mpiburst_job_io_closes_total",
        "Closes of the files the job's processes opened here.",
        usage
            .iter()
            .filter_map(|(l, u)| Some((l.clone(), u.io?.closes as f64))),
    );
}

/// One property's series labels: job, span, strategy, property and (per phase) phase, with the
/// phase's key when the last clustered window of the job has that phase (`keys`), so that the
/// rules can merge a phase's properties across nodes, where its id differs.
fn property_labels(
    job: &Labels,
    span: &str,
    p: &PropertyResult,
    phase: Option<u32>,
    keys: &BTreeMap<StableId, PhaseKey>,
) -> Labels {
    let mut labels = with(job, "span", span);
    labels.push(("strategy", p.strategy.clone()));
    labels.push(("property", p.name.clone()));
    if let Some(id) = phase {
        labels.push(("phase", id.to_string()));
        labels.extend(keys.get(&id).map(|key| ("phase_key", key.to_string())));
    }
    labels
}

/// The key of each phase of the job's last clustered window, by stable id.
fn phase_keys_of(shared: &Published, job: &JobId) -> BTreeMap<StableId, PhaseKey> {
    shared
        .phases
        .get(job)
        .and_then(|p| p.last_window.as_ref())
        .map(|w| w.phases.iter().map(|p| (p.id, p.key)).collect())
        .unwrap_or_default()
}

/// Every property result of a span, with its phase: job-level ones, then those of the top
/// phases by time share (bounded like the phase metrics).
fn span_results(props: &JobProperties) -> Vec<(&PropertyResult, Option<u32>)> {
    let mut phases: Vec<_> = props.phases.iter().collect();
    phases.sort_by(|a, b| b.time_share.total_cmp(&a.time_share));
    props
        .properties
        .iter()
        .map(|p| (p, None))
        .chain(
            phases
                .into_iter()
                .take(TOP_PHASES)
                .flat_map(|ph| ph.properties.iter().map(move |p| (p, Some(ph.phase)))),
        )
        .collect()
}

/// Properties of each job over its life (span="job") and its last complete window
/// (span="window"), the recommendations that apply, and the window's mergeable aggregates.
fn property_families(f: &mut Families, shared: &Published) {
    let keys: BTreeMap<&JobId, BTreeMap<StableId, PhaseKey>> = shared
        .properties
        .keys()
        .map(|id| (id, phase_keys_of(shared, id)))
        .collect();
    let spans: Vec<(Labels, &'static str, &JobProperties, &JobId)> = shared
        .properties
        .iter()
        .filter_map(|(id, live)| {
            Some((
                job_labels(id, &shared.store.jobs.get(id)?.meta.node),
                live,
                id,
            ))
        })
        .flat_map(|(l, live, id)| {
            std::iter::once((l.clone(), "job", &live.job, id)).chain(
                live.window
                    .as_ref()
                    .map(|w| (l, "window", &w.properties, id)),
            )
        })
        .collect();
    let results: Vec<(Labels, &PropertyResult)> = spans
        .iter()
        .flat_map(|(l, span, props, id)| {
            let keys = &keys[id];
            span_results(props)
                .into_iter()
                .map(move |(p, phase)| (property_labels(l, span, p, phase, keys), p))
        })
        .collect();
    let evaluated = || {
        results
            .iter()
            .filter_map(|(l, p)| Some((l, p.evaluation()?)))
    };
    f.gauge(
        "mpiburst_property_value",
        "Value of a bottleneck property in its base unit (docs/metrics.md lists them); span=job: the job's life here, span=window: the last complete window.",
        evaluated().map(|(l, ev)| (l.clone(), ev.value)),
    );
    f.gauge(
        "mpiburst_property_severity",
        "Severity of the property, 0 (fine) to 1 (worst), from its threshold and exponent.",
        evaluated().map(|(l, ev)| (l.clone(), ev.severity)),
    );
    f.gauge(
        "mpiburst_property_firing",
        "1 when the property's condition holds and its severity is above 0 (its recommendation applies), else 0.",
        evaluated().map(|(l, ev)| (l.clone(), if ev.condition && ev.severity > 0.0 { 1.0 } else { 0.0 })),
    );
    f.gauge(
        "mpiburst_property_rank_value",
        "Per-rank properties: quantiles of the value over the job's ranks here (rank_quantile 0 = minimum, 1 = maximum).",
        evaluated().flat_map(|(l, ev)| {
            let q = ev.ranks.as_ref().map(|r| r.values.quantiles.clone()).unwrap_or_default();
            let n = q.len().saturating_sub(1).max(1) as f64;
            q.into_iter().enumerate().map(move |(i, v)| (with(l, "rank_quantile", i as f64 / n), v))
        }),
    );
    f.histogram(
        "mpiburst_property_rank_values",
        "Per-rank properties: the ranks' values here in the fixed buckets of the property's unit (docs/metrics.md), which add up across nodes: histogram_quantile over their sum by mpi_job, span, strategy, property and le gives the quantiles over all of the job's ranks.",
        evaluated().filter_map(|(l, ev)| {
            let ranks = ev.ranks.as_ref()?;
            Some((l.clone(), &ranks.values, ranks.histogram.as_ref()?))
        }),
    );
    f.gauge(
        "mpiburst_property_not_measured",
        "1 for a property that could not be evaluated here; outcome=not_measured (no source, e.g. no PMU) or no_data (too little in the span). The reason is in /api/jobs/JOB/properties.",
        results.iter().filter_map(|(l, p)| match &p.outcome {
            Outcome::Evaluated(_) => None,
            Outcome::NotMeasured { .. } => Some((with(l, "outcome", "not_measured"), 1.0)),
            Outcome::NoData { .. } => Some((with(l, "outcome", "no_data"), 1.0)),
        }),
    );
    f.gauge(
        "mpiburst_recommendation_severity",
        "Severity of each property that fires, so its recommendation applies: the text is in docs/metrics.md, the job report and /api/jobs/JOB/properties.",
        spans.iter().flat_map(|(l, span, props, _)| {
            span_results(props)
                .into_iter()
                .filter_map(move |(p, phase)| {
                    let ev = p
                        .evaluation()
                        .filter(|ev| ev.condition && ev.severity > 0.0)?;
                    ev.recommendation.as_ref()?;
                    let mut labels = with(l, "span", span);
                    labels.push(("property", p.name.clone()));
                    labels.extend(phase.map(|id| ("phase", id.to_string())));
                    Some((labels, ev.severity))
                })
        }),
    );
    let windows: Vec<_> = shared
        .properties
        .iter()
        .filter_map(|(id, live)| {
            Some((
                job_labels(id, &shared.store.jobs.get(id)?.meta.node),
                live.window.as_ref()?,
            ))
        })
        .collect();
    for (name, help, field) in [
        (
            "mpiburst_job_window_rank_useful_seconds",
            "Per-rank useful time (region of interest minus MPI time) in the last complete window over the job's ranks here: stat=sum|min|max.",
            (|a: &JobAggregates| a.useful_seconds) as fn(&JobAggregates) -> Aggregate,
        ),
        ("mpiburst_job_window_rank_mpi_seconds", "Per-rank MPI time in the last complete window: stat=sum|min|max.", |a| a.mpi_seconds),
        ("mpiburst_job_window_rank_runtime_seconds", "Per-rank region of interest inside the last complete window: stat=sum|min|max.", |a| a.runtime_seconds),
    ] {
        f.gauge(
            name,
            help,
            windows
                .iter()
                .flat_map(|(l, w)| stat_series(l, field(&w.properties.aggregates))),
        );
    }
    f.gauge(
        "mpiburst_job_window_ranks",
        "Ranks of the job here whose region of interest overlaps the last complete window (the count of the window aggregates).",
        windows.iter().map(|(l, w)| (l.clone(), w.properties.aggregates.useful_seconds.count as f64)),
    );
    f.gauge(
        "mpiburst_job_window_end_timestamp_seconds",
        "Aligned Unix time the last complete window ends at: the same on every node for the same window (the daemon closes it at its first update after that).",
        windows.iter().map(|(l, w)| (l.clone(), w.aligned_end_ns as f64 / 1e9)),
    );
}

#[cfg(test)]
mod tests {

    use super::*;
    use crate::{
        store::{probe_cost::RankProbeCost, CallStats, Job, RankTotals, RegionMarks},
        test_support::JobMetaBuilder,
    };

    /// What `/metrics` serves for `shared`, with the regions of running ranks ending at `now_ns()`.
    fn exposition(shared: Published, now_ns: fn() -> u64) -> String {
        // The receiver keeps the last value after the sender is gone.
        let (_, state) = tokio::sync::watch::channel(Arc::new(shared));
        Metrics::with_clock(state, now_ns)
            .unwrap()
            .render()
            .unwrap()
    }

    /// A rank that returned from MPI_Init (after 0.5 s in it) when first seen and spent `mpi_s`
    /// in MPI_Barrier since.
    fn rank(rank: u32, mpi_s: u64, first_seen_s: u64, ended_s: Option<u64>) -> RankRecord {
        let mut functions = BTreeMap::new();
        functions.insert(
            "MPI_Init".into(),
            CallStats {
                calls: 1,
                time_ns: 500_000_000,
                ..Default::default()
            },
        );
        functions.insert(
            "MPI_Barrier".into(),
            CallStats {
                calls: 1,
                time_ns: mpi_s * 1_000_000_000,
                ..Default::default()
            },
        );
        RankRecord {
            call_sites: Vec::new(),
            rank,
            pid: 100 + rank,
            first_seen_ns: first_seen_s * 1_000_000_000,
            ended_ns: ended_s.map(|s| s * 1_000_000_000),
            totals: RankTotals {
                bursts: 1,
                ..Default::default()
            },
            functions,
            region: RegionMarks {
                init_return_ns: Some(first_seen_s * 1_000_000_000),
                ..Default::default()
            },
            probe_cost: None,
        }
    }

    #[test]
    fn rank_aggregates_are_mergeable_sums_minima_and_maxima() {
        let mut job = Job::new(
            JobMetaBuilder::new("slurm:7.0")
                .node("n\"1")
                .size(4)
                .source("SlurmEnv")
                .executable("/bin/x")
                .build(),
        );
        // Regions of 10 s and 20 s, useful 2 s and 6 s.
        job.ranks.insert(0, rank(0, 8, 0, Some(10)));
        job.ranks.insert(1, rank(1, 14, 1, None));
        // 1,000 calls in full at 2 µs a hit, and a polling storm of 10⁶ calls at 1 µs.
        job.ranks.get_mut(&1).unwrap().probe_cost = Some(RankProbeCost {
            full_calls: 1_000,
            storm_calls: 1_000_000,
            full_hit_ns: 2_000.0,
            entry_hit_ns: Some(1_000.0),
            daemon_ns: 3_000_000,
            ..RankProbeCost::default()
        });
        let mut shared = Published::default();
        shared.store.jobs.insert(job.meta.id.clone(), job);
        let text = exposition(shared, || 21_000_000_000);
        let labels = r#"mpi_job="slurm:7.0",node="n\"1""#;
        for line in [
            format!("mpiburst_job_rank_useful_seconds{{{labels},stat=\"sum\"}} 8"),
            format!("mpiburst_job_rank_useful_seconds{{{labels},stat=\"min\"}} 2"),
            format!("mpiburst_job_rank_useful_seconds{{{labels},stat=\"max\"}} 6"),
            format!("mpiburst_job_rank_runtime_seconds{{{labels},stat=\"max\"}} 20"),
            format!("mpiburst_job_rank_runtime_seconds{{{labels},stat=\"min\"}} 10"),
            format!("mpiburst_job_local_ranks{{{labels}}} 2"),
            format!("mpiburst_job_region_ranks{{{labels}}} 2"),
            format!("mpiburst_job_rank_init_seconds{{{labels},stat=\"max\"}} 0.5"),
            format!("mpiburst_job_profiling_cost_seconds{{{labels}}} 0.005"),
            format!("mpiburst_job_profiling_daemon_seconds{{{labels}}} 0.003"),
            format!("mpiburst_job_profiling_storm_seconds{{{labels}}} 1"),
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
        // Every family is announced once, before its samples.
        let types: Vec<_> = text.lines().filter(|l| l.starts_with("# TYPE")).collect();
        let unique: std::collections::BTreeSet<_> = types.iter().collect();
        assert_eq!(types.len(), unique.len());
    }

    #[test]
    fn job_info_names_the_slurm_job_of_a_job_inside_an_allocation_only() {
        let mut shared = Published::default();
        for meta in [
            JobMetaBuilder::new("pmix:1371602945")
                .source("OpenMpiEnv")
                .scheduler_job("4242")
                .build(),
            JobMetaBuilder::new("hydra:n1:43419")
                .source("HydraEnv")
                .build(),
        ] {
            shared.store.jobs.insert(meta.id.clone(), Job::new(meta));
        }
        let text = exposition(shared, || 0);
        for line in [
            r#"mpiburst_job_info{mpi_job="pmix:1371602945",node="n",source="OpenMpiEnv",executable="/bin/app",scheduler_job="4242"} 1"#,
            r#"mpiburst_job_info{mpi_job="hydra:n1:43419",node="n",source="HydraEnv",executable="/bin/app"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line} in\n{text}");
        }
    }

    /// Series of one job in the exposition: everything labelled with its id. (Phase series are
    /// bounded separately: at most TOP_PHASES phases per job.)
    fn series_of(job_ranks: u32) -> usize {
        use crate::{
            analysis::synthetic::{Phase, SyntheticJob},
            export::recording::{
                RecordedBurst, Recording, RecordingHeader, RecordingWriter, FORMAT_VERSION,
            },
        };
        let bursts = SyntheticJob {
            ranks: job_ranks,
            iterations: 4,
            phases: vec![
                Phase::new(1e7, 1.5, 0.02),
                Phase::new(5e7, 1.0, 0.02),
                Phase::new(2e8, 0.5, 0.02),
            ],
            tiny_bursts_per_phase: 0,
            outlier_share: 0.0,
            counters: false,
            seed: 7,
        }
        .bursts();
        // Through a recording, as a replayed job would come.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("synthetic.jsonl");
        let meta = JobMetaBuilder::new("slurm:42.0")
            .node("n1")
            .size(job_ranks)
            .source("SlurmEnv")
            .build();
        let id = meta.id.clone();
        let header = RecordingHeader {
            version: FORMAT_VERSION,
            node: "n1".into(),
            started_ns: 0,
            min_burst_ns: 0,
            counter_events: None,
            counters_note: "synthetic".into(),
            functions: vec!["MPI_Allreduce".into(), "MPI_Send".into()],
            rank_groups: None,
        };
        let mut w = RecordingWriter::create(&path, header).unwrap();
        w.job(&meta).unwrap();
        for b in &bursts {
            w.burst(RecordedBurst {
                job: id.clone(),
                burst: b.clone(),
                event_counts: None,
            })
            .unwrap();
        }
        for r in 0..job_ranks {
            let mut record = rank(r, 1 + u64::from(r % 3), 0, None);
            for f in ["MPI_Allreduce", "MPI_Send"] {
                record.functions.insert(
                    f.to_string(),
                    CallStats {
                        calls: 12,
                        time_ns: 1_000,
                        bytes: 96,
                        sized_calls: 12,
                        ..Default::default()
                    },
                );
            }
            w.rank(&id, &record).unwrap();
        }
        w.finish(crate::export::recording::RecordingEnd {
            ended_ns: 1,
            lost: Default::default(),
        })
        .unwrap();
        let recording = Recording::read(&path).unwrap();

        let mut shared = Published::default();
        shared.store.jobs.extend(recording.jobs);
        let job = &shared.store.jobs[&id];
        assert_eq!(job.ranks.len(), job_ranks as usize);
        // Properties over the job's life and over a window with its phases, per-rank quantiles
        // included.
        // The phases of ten ranks: phase series are bounded by TOP_PHASES, not by the ranks, and
        // aligning 10 000 rank sequences would only slow the test.
        let ten: Vec<_> = bursts.iter().filter(|b| b.rank < 10).cloned().collect();
        let analysis = crate::analysis::analyse(&ten, 10, &Default::default()).unwrap();
        let config = crate::properties::PropertyConfig::default();
        let mut input = crate::properties::JobInput::lifetime(job, 10_000_000_000);
        let lifetime = crate::properties::evaluate_job(&input, &config);
        input.phases = Some((&analysis).into());
        let window = crate::properties::WindowProperties {
            window: 0,
            aligned_end_ns: 30_000_000_000,
            properties: crate::properties::evaluate_job(&input, &config),
        };
        assert!(!window.properties.phases.is_empty());
        shared.properties.insert(
            id.clone(),
            Arc::new(crate::properties::LiveProperties {
                job: lifetime,
                window: Some(window),
            }),
        );
        let text = exposition(shared, || 1);
        assert!(
            text.contains("mpiburst_property_rank_value{mpi_job=\"slurm:42.0\""),
            "{text}"
        );
        assert!(text.contains("phase=\""), "{text}");
        assert!(
            text.contains("mpiburst_property_rank_values_bucket{mpi_job=\"slurm:42.0\""),
            "{text}"
        );
        // docs/metrics.md lists every family the exposition has, the daemon's process_* ones
        // included.
        assert!(
            text.contains("# TYPE process_resident_memory_bytes gauge"),
            "{text}"
        );
        let docs = include_str!("../../../docs/metrics.md");
        for family in text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
        {
            assert!(
                docs.contains(&format!("`{family}`")),
                "{family} is not in docs/metrics.md"
            );
        }
        for series in text.lines().filter(|l| !l.starts_with('#')) {
            assert_eq!(free_text_label(series), None, "{series}");
        }
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains("mpi_job=\"slurm:42.0\""))
            .count()
    }

    #[test]
    fn phases_are_exported_by_key_with_sums_that_add_up_to_the_window() {
        let id = JobId("pmix:5".into());
        let mut shared = Published::default();
        let job = Job::new(JobMetaBuilder::new(&id.0).node("n1").size(4).build());
        shared.store.jobs.insert(id.clone(), job);
        // Windows 0 and 1 of the synthetic job closed.
        let snapshot = crate::export::phases::synthetic_snapshot(250, 1_700_000_002_500_000_000);
        let window = snapshot.last_window.clone().unwrap();
        assert!(!window.partial && window.bursts_dropped == 0);
        shared.phases.insert(id, Arc::new(snapshot));
        let text = exposition(shared, || 1);
        let values = |family: &str| -> BTreeMap<String, f64> {
            let prefix = format!("{family}{{mpi_job=\"pmix:5\",node=\"n1\",phase_key=\"");
            text.lines()
                .filter_map(|l| l.strip_prefix(&prefix))
                .map(|l| {
                    let (key, value) = l.split_once("\"} ").unwrap();
                    (key.to_string(), value.parse().unwrap())
                })
                .collect()
        };
        let seconds = values("mpiburst_phase_key_seconds");
        let expected: BTreeMap<String, f64> = window
            .phases
            .iter()
            .map(|p| (p.key.to_string(), secs(p.stats.time_ns)))
            .collect();
        assert_eq!(seconds, expected, "{text}");
        let ranks = values("mpiburst_phase_key_ranks");
        assert!(ranks.values().all(|&r| r == 4.0), "{ranks:?}");
        let bursts = values("mpiburst_phase_key_bursts");
        let total: f64 = bursts.values().sum();
        assert!(
            total > 0.0 && total <= window.bursts_seen as f64,
            "{bursts:?}"
        );
        // The phases' time is a share of the window's total, which the rules divide by.
        let window_seconds = format!(
            "mpiburst_job_phase_window_seconds{{mpi_job=\"pmix:5\",node=\"n1\"}} {}",
            secs(window.time_seen_ns)
        );
        assert!(text.lines().any(|l| l == window_seconds), "{text}");
        assert!(seconds.values().sum::<f64>() <= secs(window.time_seen_ns));

        // The signature up to the window's end: each phase's repetitions by the 4 ranks, under
        // the key of its dominant region, which is the key of the window's phase of it.
        let repetitions = values("mpiburst_phase_key_repetitions");
        assert_eq!(
            repetitions.keys().collect::<Vec<_>>(),
            expected.keys().collect::<Vec<_>>(),
            "{text}"
        );
        // 10 ms iterations over the job's first 2 s, on 4 ranks.
        assert!(
            repetitions.values().all(|&n| (760.0..=800.0).contains(&n)),
            "{repetitions:?}"
        );
        let repetition_seconds: f64 = values("mpiburst_phase_key_repetition_seconds")
            .values()
            .sum();
        assert!(
            (7.5..=8.0).contains(&repetition_seconds),
            "4 ranks × 2 s: {repetition_seconds}"
        );
        assert!(text.contains("mpiburst_job_signature_ranks{mpi_job=\"pmix:5\",node=\"n1\"} 4\n"));
        assert!(text.contains(
            "mpiburst_job_signature_runtime_seconds{mpi_job=\"pmix:5\",node=\"n1\"} 2\n"
        ));
    }

    #[test]
    fn free_text_labels_are_found() {
        assert_eq!(free_text_label("up 1"), None);
        assert_eq!(
            free_text_label(r#"a{mpi_job="pmix:7",exe="/usr/bin/x",q="0.1"} 1"#),
            None
        );
        assert_eq!(
            free_text_label(r#"a{mpi_job="pmix:7",recommendation="Balance the work."} 1"#),
            Some(("recommendation".into(), "Balance the work.".into()))
        );
        assert_eq!(
            free_text_label(r#"a{x="a\"b c"} 1"#),
            Some(("x".into(), "a\"b c".into()))
        );
        let long = format!(r#"a{{x="{}"}} 1"#, "y".repeat(MAX_IDENTIFIER_LEN + 1));
        assert!(free_text_label(&long).is_some());
    }

    #[test]
    fn the_docs_list_every_recommendation_by_property() {
        let docs = include_str!("../../../docs/metrics.md");
        let rows: Vec<String> = crate::properties::catalogue()
            .into_iter()
            .filter_map(|p| Some(format!("| `{}` | {} |", p.name, p.recommendation?)))
            .collect();
        let missing: Vec<&String> = rows.iter().filter(|r| !docs.contains(r.as_str())).collect();
        assert!(
            missing.is_empty(),
            "docs/metrics.md, section Recommendations, lacks these rows (the table in full):\n{}",
            rows.join("\n")
        );
    }

    #[test]
    fn series_per_job_do_not_grow_with_ranks() {
        let (ten, ten_thousand) = (series_of(10), series_of(10_000));
        assert!(ten > 20, "{ten} series");
        assert_eq!(
            ten, ten_thousand,
            "series per job: 10 ranks {ten}, 10 000 ranks {ten_thousand}"
        );
    }
}
