//! The property catalogue: strategies over one job on this node (POP efficiencies, structure,
//! hardware counters, kernel resource usage, I/O) and over each of its phases, with their
//! formulas, default thresholds and recommendations. See the module documentation of
//! [`crate::properties`] for the definitions.

use serde::{Deserialize, Serialize};

use super::engine::{
    Condition, Formula, Node, Observation, PropertyDef, PropertyResult, Scope, Setting, Strategy,
    StrategySettings, NO_PMU,
};
use super::inputs::{IoStats, JobInput, RankSample, ResourceUsage};
use super::pop::{JobAggregates, PopEfficiencies, Reading};
use super::window::Span;
use crate::analysis::{ClusterId, ClusterStats};
use crate::model::JobId;

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

const NO_RESOURCES: &str = "not measured (kernel resource usage not collected)";
const NO_IO: &str = "not measured (I/O syscall tracepoints not collected)";

/// What the job strategies read: the input, reduced once.
struct JobContext {
    ranks: Vec<RankSample>,
    pop: PopEfficiencies,
    /// Whether every rank has hardware counters.
    counters: Result<(), MissingCounters>,
    nominal_hz: Option<f64>,
    resources: Option<ResourceUsage>,
    io: Option<IoStats>,
    analysis_filtered_share: Option<f64>,
}

fn reading(r: &Reading) -> Observation {
    match r {
        Reading::Measured { value } => Observation::Scalar(*value),
        Reading::NotMeasured { reason } => Observation::NotMeasured(reason.clone()),
        Reading::NoData { reason } => Observation::NoData(reason.clone()),
    }
}

fn ratio(num: u64, den: u64) -> f64 {
    num as f64 / den as f64
}

fn per_rank(values: Vec<f64>, empty: &str) -> Observation {
    if values.is_empty() {
        Observation::NoData(empty.to_string())
    } else {
        Observation::PerDevice(values)
    }
}

// ---- strategy "pop" ----

fn parallel_efficiency(c: &JobContext) -> Observation {
    reading(&c.pop.parallel_efficiency)
}

fn load_balance(c: &JobContext) -> Observation {
    reading(&c.pop.load_balance)
}

fn communication_efficiency(c: &JobContext) -> Observation {
    reading(&c.pop.communication_efficiency)
}

fn compute_rates(ranks: &[RankSample]) -> Vec<f64> {
    ranks
        .iter()
        .filter(|r| r.runtime_ns > 0)
        .map(|r| ratio(r.useful_oncpu_ns, r.runtime_ns))
        .collect()
}

fn intra_node_imbalance(c: &JobContext) -> Observation {
    let rates = compute_rates(&c.ranks);
    if rates.is_empty() {
        return Observation::NoData("no rank has run time in the span".into());
    }
    let max = rates.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min = rates.iter().copied().fold(f64::INFINITY, f64::min);
    Observation::Scalar(max - min)
}

fn mpi_time_fraction(c: &JobContext) -> Observation {
    per_rank(
        c.ranks
            .iter()
            .filter(|r| r.runtime_ns > 0)
            .map(|r| ratio(r.mpi_ns, r.runtime_ns))
            .collect(),
        "no rank has run time in the span",
    )
}

fn oncpu_share(c: &JobContext) -> Observation {
    per_rank(
        c.ranks
            .iter()
            .filter(|r| r.useful_ns > 0)
            .map(|r| ratio(r.useful_oncpu_ns, r.useful_ns).min(1.0))
            .collect(),
        "no rank computed in the span",
    )
}

// ---- strategy "structure" ----

fn fragmentation(c: &JobContext) -> Observation {
    let useful: u64 = c.ranks.iter().map(|r| r.useful_ns).sum();
    if useful == 0 {
        return Observation::NoData("no useful computation in the span".into());
    }
    let below_kernel_filter = ratio(c.ranks.iter().map(|r| r.filtered_ns).sum(), useful).min(1.0);
    let analysis = c.analysis_filtered_share.unwrap_or(0.0);
    Observation::Scalar(below_kernel_filter + (1.0 - below_kernel_filter) * analysis)
}

// ---- strategy "compute" (hardware counters) ----

fn counters(c: &JobContext) -> Result<Vec<super::inputs::PmuCounters>, Observation> {
    if let Err(reason) = &c.counters {
        return Err(Observation::NotMeasured(reason.to_string()));
    }
    Ok(c.ranks.iter().filter_map(|r| r.pmu).collect())
}

fn cpi(c: &JobContext) -> Observation {
    match counters(c) {
        Err(o) => o,
        Ok(pmu) => per_rank(
            pmu.iter()
                .filter(|p| p.instructions > 0)
                .map(|p| ratio(p.cycles, p.instructions))
                .collect(),
            "no instructions counted in the span",
        ),
    }
}

fn per_instruction(
    c: &JobContext,
    event: fn(&super::inputs::PmuCounters) -> Option<u64>,
    missing: &str,
) -> Observation {
    let pmu = match counters(c) {
        Err(o) => return o,
        Ok(pmu) => pmu,
    };
    let Some(values) = pmu
        .iter()
        .map(|p| event(p).map(|e| (e, p.instructions)))
        .collect::<Option<Vec<_>>>()
    else {
        return Observation::NotMeasured(missing.to_string());
    };
    per_rank(
        values
            .into_iter()
            .filter(|&(_, i)| i > 0)
            .map(|(e, i)| ratio(e, i))
            .collect(),
        "no instructions counted in the span",
    )
}

fn llc_misses_per_instruction(c: &JobContext) -> Observation {
    per_instruction(
        c,
        |p| p.llc_misses,
        "not measured (no last-level cache miss counts: the per-burst counters are instructions and cycles)",
    )
}

fn branch_misses_per_instruction(c: &JobContext) -> Observation {
    per_instruction(
        c,
        |p| p.branch_misses,
        "not measured (no branch miss counts: the per-burst counters are instructions and cycles)",
    )
}

fn core_frequency(c: &JobContext) -> Observation {
    let pmu = match counters(c) {
        Err(o) => return o,
        Ok(pmu) => pmu,
    };
    let Some(refs) = pmu
        .iter()
        .map(|p| p.ref_cycles.map(|r| (p.cycles, r)))
        .collect::<Option<Vec<_>>>()
    else {
        return Observation::NotMeasured(
            "not measured (no reference cycle counts: the per-burst counters are instructions and cycles)".into(),
        );
    };
    let Some(nominal) = c.nominal_hz.filter(|f| f.is_finite() && *f > 0.0) else {
        return Observation::NotMeasured("not measured (nominal CPU frequency unknown)".into());
    };
    per_rank(
        refs.into_iter()
            .filter(|&(_, r)| r > 0)
            .map(|(cy, r)| ratio(cy, r) * nominal)
            .collect(),
        "no reference cycles counted in the span",
    )
}

// ---- strategy "resources" (kernel, no PMU) ----

fn resources(c: &JobContext) -> Result<ResourceUsage, Observation> {
    c.resources
        .ok_or_else(|| Observation::NotMeasured(NO_RESOURCES.into()))
}

fn memory_used_share(c: &JobContext) -> Observation {
    match resources(c) {
        Err(o) => o,
        Ok(r) if r.memory_available_bytes == 0 => {
            Observation::NoData("available memory unknown (0 bytes)".into())
        }
        Ok(r) => Observation::Scalar(ratio(r.memory_used_bytes, r.memory_available_bytes)),
    }
}

fn cpu_share(c: &JobContext, time: fn(&ResourceUsage) -> f64) -> Observation {
    match resources(c) {
        Err(o) => o,
        Ok(r) if r.seconds.is_nan() || r.cpus.is_nan() || r.seconds <= 0.0 || r.cpus <= 0.0 => {
            Observation::NoData("the usage covers no time or no CPUs".into())
        }
        Ok(r) => Observation::Scalar(time(&r) / (r.seconds * r.cpus)),
    }
}

fn user_time_share(c: &JobContext) -> Observation {
    cpu_share(c, |r| r.user_seconds)
}

fn system_time_share(c: &JobContext) -> Observation {
    cpu_share(c, |r| r.system_seconds)
}

// ---- strategy "io" (syscall tracepoints, no PMU) ----

fn io_rate(c: &JobContext, count: fn(&IoStats) -> u64) -> Observation {
    match c.io {
        None => Observation::NotMeasured(NO_IO.into()),
        // NaN seconds count as no time.
        Some(io) if io.seconds.is_nan() || io.seconds <= 0.0 => {
            Observation::NoData("the I/O counts cover no time".into())
        }
        Some(io) => Observation::Scalar(count(&io) as f64 / io.seconds),
    }
}

/// Request sizes are judged only for at least this many requests in the span, and at least
/// [`MIN_IO_REQUEST_RATE`] per second: fewer cost too little (tens of microseconds each) for their
/// size to matter, and a job's reads of configuration and library files at start-up must not make
/// it look I/O-bound.
pub const MIN_IO_REQUESTS: u64 = 100;
pub const MIN_IO_REQUEST_RATE: f64 = 10.0;

fn io_request_size(
    c: &JobContext,
    bytes_calls: fn(&IoStats) -> (u64, u64),
    what: &str,
) -> Observation {
    match c.io {
        None => Observation::NotMeasured(NO_IO.into()),
        Some(io) => match bytes_calls(&io) {
            (_, 0) => Observation::NoData(format!("no {what} requests in the span")),
            (_, calls)
                if calls < MIN_IO_REQUESTS || (calls as f64) < MIN_IO_REQUEST_RATE * io.seconds =>
            {
                Observation::NoData(format!(
                    "{calls} {what} requests in {:.1} s: too few for their size to matter (at \
                     least {MIN_IO_REQUESTS}, and {MIN_IO_REQUEST_RATE} per second)",
                    io.seconds
                ))
            }
            (bytes, calls) => Observation::Scalar(ratio(bytes, calls)),
        },
    }
}

fn io_read_bandwidth(c: &JobContext) -> Observation {
    io_rate(c, |io| io.counts.read_bytes)
}
fn io_write_bandwidth(c: &JobContext) -> Observation {
    io_rate(c, |io| io.counts.write_bytes)
}
fn io_read_request_size(c: &JobContext) -> Observation {
    io_request_size(c, |io| (io.counts.read_bytes, io.counts.read_calls), "read")
}
fn io_write_request_size(c: &JobContext) -> Observation {
    io_request_size(
        c,
        |io| (io.counts.write_bytes, io.counts.write_calls),
        "write",
    )
}
fn io_open_rate(c: &JobContext) -> Observation {
    io_rate(c, |io| io.counts.opens)
}
fn io_close_rate(c: &JobContext) -> Observation {
    io_rate(c, |io| io.counts.closes)
}

// ---- strategy "phase" (per cluster) ----

fn phase_load_balance(c: &ClusterStats) -> Observation {
    Observation::Scalar(c.lb_duration)
}

fn phase_instruction_balance(c: &ClusterStats) -> Observation {
    match c.lb_instructions {
        Some(lb) => Observation::Scalar(lb),
        None => Observation::NotMeasured(NO_PMU.into()),
    }
}

fn phase_ipc(c: &ClusterStats) -> Observation {
    match (c.ipc, c.instructions_mean) {
        (Some(ipc), _) => Observation::Scalar(ipc),
        (None, Some(_)) => Observation::NoData("no cycles counted in this phase".into()),
        (None, None) => Observation::NotMeasured(NO_PMU.into()),
    }
}

fn phase_spmd_score(c: &ClusterStats) -> Observation {
    Observation::Scalar(c.spmd_score)
}

// ---- definitions ----

const POP_NOTE: &str = "POP methodology: efficiencies below 0.8 are flagged";

/// The job strategies, in the order they are evaluated and listed.
fn job_strategies() -> Vec<Strategy<JobContext>> {
    vec![
        pop_strategy(),
        ranks_strategy(),
        structure_strategy(),
        compute_strategy(),
        resources_strategy(),
        Strategy {
            name: "io",
            roots: io_roots(),
        },
    ]
}

/// The POP efficiencies: parallel efficiency and its factors, load balance and communication
/// efficiency.
fn pop_strategy() -> Strategy<JobContext> {
    use Formula::*;
    use Scope::*;
    Strategy {
        name: "pop",
        roots: vec![Node::new(
            PropertyDef::new(
                "parallel_efficiency",
                "POP parallel efficiency: load_balance × communication_efficiency = mean useful time ÷ run time",
                "ratio",
                Job,
                parallel_efficiency,
            )
            .severity(F2, 0.8, 1.0, POP_NOTE)
            .condition(Condition::Always)
            .recommend(
                "The ranks compute during only part of the run time. Its two factors tell why: \
                 load_balance (ranks waiting for slower ones) and communication_efficiency (time \
                 in communication itself); follow the one that fires.",
            ),
            vec![
                Node::new(
                    PropertyDef::new(
                        "load_balance",
                        "POP load balance: mean ÷ maximum of the ranks' useful time (time in CPU bursts)",
                        "ratio",
                        Job,
                        load_balance,
                    )
                    .severity(F2, 0.8, 1.0, POP_NOTE)
                    .recommend(
                        "Some ranks compute much longer than others, and the rest wait for them in \
                         MPI. Balance the work: partition the data by cost rather than by element \
                         count, use dynamic load balancing (work stealing, DLB, repartitioning \
                         between steps), or give the loaded ranks more cores (MPI + OpenMP). \
                         phase_load_balance shows which phase is imbalanced.",
                    ),
                    vec![Node::leaf(
                        PropertyDef::new(
                            "intra_node_imbalance",
                            "max − min over this node's ranks of the compute rate (on-CPU seconds in \
                             bursts per second of run time): PerSyst's intra-node load imbalance \
                             (Eq. 3.9) with this work metric",
                            "seconds_per_second",
                            Job,
                            intra_node_imbalance,
                        )
                        .severity(
                            F1,
                            0.5,
                            1.0,
                            "assumption: 0.5 s/s of compute rate, the 0.5 × peak of Guillén (2015) \
                             (hardware heuristic, Table 7.12) in this work metric",
                        )
                        .recommend(
                            "The ranks on this node do very different amounts of computation per \
                             second. Redistribute the work among them, or run fewer ranks with \
                             threads (MPI + OpenMP) so that idle cores help the loaded ones. If \
                             ranks were left with little work on purpose (e.g. for memory per \
                             rank), check memory_used_share before acting.",
                        ),
                    )],
                ),
                Node::leaf(
                    PropertyDef::new(
                        "communication_efficiency",
                        "POP communication efficiency: maximum useful time ÷ run time",
                        "ratio",
                        Job,
                        communication_efficiency,
                    )
                    .severity(F2, 0.8, 1.0, POP_NOTE)
                    .recommend(
                        "Even the rank that computes most spends a large share of the run time in \
                         MPI: communication itself, not imbalance, costs time. Send fewer, larger \
                         messages; overlap communication with computation (non-blocking calls \
                         completed after the interior work); call collectives less often; check \
                         the rank placement against the network topology.",
                    ),
                ),
            ],
        )],
    }
}

/// The per-rank shares of time in MPI and on the CPU.
fn ranks_strategy() -> Strategy<JobContext> {
    use Formula::*;
    use Scope::*;
    Strategy {
        name: "ranks",
        roots: vec![
            Node::leaf(
                PropertyDef::new(
                    "mpi_time_fraction",
                    "time inside MPI ÷ run time, per rank",
                    "ratio",
                    Rank,
                    mpi_time_fraction,
                )
                .severity(F1, 0.2, 1.0, "0.2, the complement of the POP threshold 0.8 on communication efficiency")
                .recommend(
                    "Ranks spend a large share of their time inside MPI. If the share differs \
                     strongly between ranks (see the quantiles), it is waiting caused by load \
                     imbalance (see load_balance); if it is similar on all ranks, it is the cost of \
                     communication (see communication_efficiency): aggregate messages, overlap \
                     communication with computation, or use fewer ranks.",
                ),
            ),
            Node::leaf(
                PropertyDef::new(
                    "oncpu_share",
                    "on-CPU time ÷ wall time inside CPU bursts, per rank",
                    "ratio",
                    Rank,
                    oncpu_share,
                )
                .severity(F2, 0.9, 1.0, "assumption: more than 10 % of the burst time off the CPU")
                .recommend(
                    "Ranks are off the CPU during their computation. Typical causes: the node is \
                     oversubscribed (more ranks or threads than cores), other processes compete \
                     for the cores, unpinned ranks migrate, or bursts block in page faults or file \
                     I/O. Run at most one rank or thread per core, bind ranks to cores (e.g. \
                     mpirun --bind-to core), and check for other load on the node.",
                ),
            ),
        ],
    }
}

/// How much of the computation is too fine-grained to analyse.
fn structure_strategy() -> Strategy<JobContext> {
    use Formula::*;
    use Scope::*;
    Strategy {
        name: "structure",
        roots: vec![Node::leaf(
            PropertyDef::new(
                "fragmentation",
                "share of useful time in bursts too short to be analysed: k + (1 − k)·a, k = share \
                 below the kernel's duration filter (exact totals), a = share of the shipped burst \
                 time the analysis filtered out (0 without an analysis)",
                "ratio",
                Job,
                fragmentation,
            )
            .severity(F1, 0.1, 1.0, "assumption: 10 % of the useful time in unanalysed short bursts")
            .recommend(
                "Much of the computation happens in very short stretches between MPI calls: the \
                 code communicates at a fine grain, so per-call MPI overhead and latency weigh \
                 heavily, and these stretches belong to no analysed phase. Communicate less often \
                 with more data per call (aggregate messages, exchange halos for several fields at \
                 once or every few steps), or move fine-grained communication out of inner loops.",
            ),
        )],
    }
}

/// The hardware-counter properties of the computation.
fn compute_strategy() -> Strategy<JobContext> {
    use Formula::*;
    use Scope::*;
    Strategy {
        name: "compute",
        roots: vec![
            Node::new(
                PropertyDef::new(
                    "cpi",
                    "cycles per instruction inside CPU bursts, per rank",
                    "cycles_per_instruction",
                    Rank,
                    cpi,
                )
                .severity(F1, 1.6, 1.0, "Guillén (2015), Table 7.12 (statistics heuristic)")
                .pmu()
                .recommend(
                    "Instructions take many cycles: the computation stalls. Its refinements \
                     llc_misses_per_instruction and branch_misses_per_instruction show whether \
                     cache misses or mispredicted branches cause it; otherwise profile the slowest \
                     phase in depth (perf, LIKWID, VTune) to find the stalling instructions.",
                ),
                vec![
                    Node::leaf(
                        PropertyDef::new(
                            "llc_misses_per_instruction",
                            "last-level cache misses per instruction inside CPU bursts, per rank",
                            "events_per_instruction",
                            Rank,
                            llc_misses_per_instruction,
                        )
                        .severity(
                            F1,
                            0.0003,
                            1.0,
                            "Guillén (2015), Table 7.12 (statistics); used as F1 (higher is worse) \
                             although Guillén (2015) prints F2 for this ratio it calls 'high is \
                             bad' (§3.3.15)",
                        )
                        .pmu()
                        .recommend(
                            "Many last-level cache misses per instruction: the working set does not \
                             fit in cache or is not reused. Improve data locality: block (tile) \
                             loops so that data is reused while cached, traverse arrays with unit \
                             stride in their storage order, use structures of arrays for streamed \
                             fields, and initialise data in the thread that uses it (first touch) \
                             on NUMA nodes.",
                        ),
                    ),
                    Node::leaf(
                        PropertyDef::new(
                            "branch_misses_per_instruction",
                            "mispredicted branches per instruction inside CPU bursts, per rank",
                            "events_per_instruction",
                            Rank,
                            branch_misses_per_instruction,
                        )
                        .severity(
                            F1,
                            0.005,
                            1.0,
                            "assumption (Guillén (2015) gives none): 0.005 mispredictions per \
                             instruction at about 20 cycles each cost about 0.1 CPI",
                        )
                        .pmu()
                        .recommend(
                            "Many mispredicted branches: the processor keeps discarding speculative \
                             work. Remove conditionals from inner loops or hoist them out, make them \
                             predictable (sort or partition the data first), use branch-free forms \
                             (min/max, masks), and try profile-guided optimisation.",
                        ),
                    ),
                ],
            ),
            Node::leaf(
                PropertyDef::new(
                    "core_frequency",
                    "cycles ÷ reference cycles × nominal frequency inside CPU bursts, per rank \
                     (no severity: all values are collected, Guillén (2015), §3.3.7)",
                    "hertz",
                    Rank,
                    core_frequency,
                )
                .pmu(),
            ),
        ],
    }
}

/// The kernel resource usage: memory and CPU time.
fn resources_strategy() -> Strategy<JobContext> {
    use Formula::*;
    use Scope::*;
    Strategy {
        name: "resources",
        roots: vec![
            Node::leaf(
                PropertyDef::new(
                    "memory_used_share",
                    "memory used by the job ÷ memory available to it on this node",
                    "ratio",
                    Job,
                    memory_used_share,
                )
                .severity(
                    F1,
                    0.5,
                    1.0,
                    "Guillén (2015), Table 7.12: 0.5 × the available memory (hardware heuristic)",
                )
                .recommend(
                    "The job uses more than half of the memory available to it on this node: risk \
                     of swapping or of the out-of-memory killer, and of fewer ranks per node than \
                     cores. Reduce the footprint: free temporaries, do not replicate global data on \
                     every rank, size buffers and halos to need. If the usage grows steadily, look \
                     for a leak (valgrind, heaptrack).",
                ),
            ),
            Node::leaf(
                PropertyDef::new(
                    "user_time_share",
                    "user-mode CPU time ÷ (wall time × the job's CPUs on this node)",
                    "ratio",
                    Job,
                    user_time_share,
                )
                .severity(
                    F2,
                    0.8,
                    1.0,
                    "Guillén (2015), Table 7.12: %user 80 % (statistics); Eq. 3.55 is F2 with \
                     p = 1",
                )
                .recommend(
                    "The job's CPUs spend little time running the application in user mode: ranks \
                     sleep (blocking MPI waits, file I/O), run in the kernel, or the job has fewer \
                     runnable threads than CPUs. See system_time_share and the I/O properties; if \
                     ranks block in MPI, see load_balance; if the job holds more CPUs than threads, \
                     use them or request fewer.",
                ),
            ),
            Node::leaf(
                PropertyDef::new(
                    "system_time_share",
                    "kernel-mode CPU time ÷ (wall time × the job's CPUs on this node)",
                    "ratio",
                    Job,
                    system_time_share,
                )
                .severity(
                    Proportional,
                    0.2,
                    1.0,
                    "Guillén (2015), Table 7.12: %system 20 % (statistics); Eq. 3.57",
                )
                .recommend(
                    "The ranks spend much time in the kernel: frequent system calls (small file I/O \
                     requests, MPI progress over TCP sockets, sched_yield polling), page faults from \
                     allocating and freeing large buffers repeatedly, or memory migration. Use \
                     larger I/O requests, check that MPI uses the high-speed fabric and not TCP, and \
                     reuse buffers instead of reallocating them.",
                ),
            ),
        ],
    }
}

/// I/O after Guillén (2015), §3.1.33–§3.1.38 and §7.7: a high bandwidth calls for an in-depth I/O
/// analysis; at or below the threshold the mean request size is checked. The bandwidth branches
/// on the threshold, so it is a replica pair (`_high`: x > t, `_low`: x ≤ t) sharing id, value
/// and severity; exactly one of them opens its subtree. Opens and closes are separate roots.
fn io_roots() -> Vec<Node<JobContext>> {
    let mut roots = io_read_roots();
    roots.extend(io_write_roots());
    roots.extend(io_metadata_roots());
    roots
}

const IO_SIZE_NOTE: &str = "Guillén (2015), Table 7.12: 2 MiB (performance heuristic: larger \
                            requests gain less than 5 %)";

/// One of the replica pair of a bandwidth property (see [`io_roots`]), `name` the replica and
/// `id` the pair.
fn io_bandwidth(
    name: &'static str,
    id: &'static str,
    what: &'static str,
    f: fn(&JobContext) -> Observation,
    note: &'static str,
    condition: Condition,
) -> PropertyDef<JobContext> {
    PropertyDef::new(name, what, "bytes_per_second", Scope::Job, f)
        .severity(Formula::F1, 1.1 * GIB, 1.0, note)
        .replica_of(id)
        .condition(condition)
}

/// The read bandwidth pair, and the read request size below the threshold.
fn io_read_roots() -> Vec<Node<JobContext>> {
    use Formula::*;
    use Scope::*;
    const BW_READ_NOTE: &str =
        "Guillén (2015), Table 7.11: 1.1 GiB/s for reads (statistics heuristic, at the GPFS level)";
    vec![
        Node::leaf(
            io_bandwidth(
                "io_read_bandwidth_high",
                "io_read_bandwidth",
                "bytes read per second (syscalls)",
                io_read_bandwidth,
                BW_READ_NOTE,
                Condition::AboveThreshold,
            )
            .recommend(
                "The job reads at a high bandwidth, so I/O may dominate its run time. Analyse the \
                 I/O in depth (e.g. Darshan), read less (read once and distribute with MPI, keep \
                 data in memory between steps), and use parallel I/O (collective MPI-IO, HDF5) \
                 instead of many independent readers.",
            ),
        ),
        Node::new(
            io_bandwidth(
                "io_read_bandwidth_low",
                "io_read_bandwidth",
                "bytes read per second (syscalls)",
                io_read_bandwidth,
                BW_READ_NOTE,
                Condition::AtOrBelowThreshold,
            ),
            vec![Node::leaf(
                PropertyDef::new(
                    "io_read_request_size",
                    "mean bytes per read request (syscalls)",
                    "bytes",
                    Job,
                    io_read_request_size,
                )
                .severity(F2, 2.0 * MIB, 1.0, IO_SIZE_NOTE)
                .recommend(
                    "Consolidate I/O requests: the mean read request is small, so per-call overhead \
                     and file-system latency dominate. Read in large blocks (2 MiB or more), buffer \
                     small reads, use collective MPI-IO (two-phase I/O aggregates the requests of \
                     many ranks) or data sieving, read binary instead of formatted data, and \
                     consider non-blocking I/O.",
                ),
            )],
        ),
    ]
}

/// The write bandwidth pair, and the write request size below the threshold.
fn io_write_roots() -> Vec<Node<JobContext>> {
    use Formula::*;
    use Scope::*;
    const BW_WRITE_NOTE: &str = "1.1 GiB/s as for reads; Guillén (2015) prints 1.1 MiB/s \
                                 (Table 7.11), which would send every writer above 1.1 MiB/s to \
                                 the in-depth branch and skip the request-size check";
    vec![
        Node::leaf(
            io_bandwidth(
                "io_write_bandwidth_high",
                "io_write_bandwidth",
                "bytes written per second (syscalls)",
                io_write_bandwidth,
                BW_WRITE_NOTE,
                Condition::AboveThreshold,
            )
            .recommend(
                "The job writes at a high bandwidth, so I/O may dominate its run time. Analyse the \
                 I/O in depth (e.g. Darshan), write less (checkpoint less often, write only what is \
                 needed, compress), and use parallel I/O (collective MPI-IO, HDF5) instead of many \
                 independent writers.",
            ),
        ),
        Node::new(
            io_bandwidth(
                "io_write_bandwidth_low",
                "io_write_bandwidth",
                "bytes written per second (syscalls)",
                io_write_bandwidth,
                BW_WRITE_NOTE,
                Condition::AtOrBelowThreshold,
            ),
            vec![Node::leaf(
                PropertyDef::new(
                    "io_write_request_size",
                    "mean bytes per write request (syscalls)",
                    "bytes",
                    Job,
                    io_write_request_size,
                )
                .severity(F2, 2.0 * MIB, 1.0, IO_SIZE_NOTE)
                .recommend(
                    "Consolidate I/O requests: the mean write request is small, so per-call overhead \
                     and file-system latency dominate. Buffer output and write in large blocks (2 MiB \
                     or more), use collective MPI-IO (two-phase I/O aggregates the requests of many \
                     ranks), write binary instead of formatted data, and consider non-blocking I/O.",
                ),
            )],
        ),
    ]
}

/// The rates of file opens and closes (metadata requests).
fn io_metadata_roots() -> Vec<Node<JobContext>> {
    use Formula::*;
    use Scope::*;
    const META_NOTE: &str = "assumption (Guillén (2015) gives none): 100 per second";
    vec![
        Node::leaf(
            PropertyDef::new(
                "io_open_rate",
                "files opened per second (syscalls)",
                "per_second",
                Job,
                io_open_rate,
            )
            .severity(F1, 100.0, 1.0, META_NOTE)
            .recommend(
                "Consolidate files: the job opens files at a high rate, and every open is a \
                     metadata request that parallel file systems serve slowly. Keep files open \
                     instead of reopening them, write fewer and larger files (one shared file \
                     through MPI-IO or HDF5 instead of one per rank or step), and avoid open or \
                     stat calls in loops.",
            ),
        ),
        Node::leaf(
            PropertyDef::new(
                "io_close_rate",
                "files closed per second (syscalls)",
                "per_second",
                Job,
                io_close_rate,
            )
            .severity(F1, 100.0, 1.0, META_NOTE)
            .recommend(
                "Consolidate files: the job closes files at a high rate, and each close can \
                     flush data and update metadata. Keep files open across steps instead of \
                     closing and reopening them, and write fewer, larger files.",
            ),
        ),
    ]
}

fn phase_strategy() -> Strategy<ClusterStats> {
    use Formula::*;
    use Scope::*;
    Strategy {
        name: "phase",
        roots: vec![
            Node::new(
                PropertyDef::new(
                    "phase_load_balance",
                    "LB_dur (the analysis's lb_duration): mean ÷ maximum over the job's ranks of \
                     each rank's time in this phase (ranks that never run it count 0)",
                    "ratio",
                    Phase,
                    phase_load_balance,
                )
                .severity(F2, 0.8, 1.0, POP_NOTE)
                .recommend(
                    "The ranks spend unequal time in this phase, and those that finish early wait in \
                     the next MPI call. phase_instruction_balance tells why: unequal instructions \
                     mean unequal work (repartition this phase's data by cost); equal instructions \
                     mean unequal speed (memory or NUMA contention, ranks sharing cores, frequency \
                     differences, OS noise).",
                ),
                vec![Node::leaf(
                    PropertyDef::new(
                        "phase_instruction_balance",
                        "mean ÷ maximum over the job's ranks of each rank's instructions in this phase",
                        "ratio",
                        Phase,
                        phase_instruction_balance,
                    )
                    .severity(F2, 0.8, 1.0, POP_NOTE)
                    .pmu()
                    .recommend(
                        "The ranks execute different numbers of instructions in this phase: its work \
                         is unevenly partitioned. Rebalance this phase's decomposition (weight the \
                         partition by the cost per element, not by the element count) or distribute \
                         its work dynamically.",
                    ),
                )],
            ),
            Node::leaf(
                PropertyDef::new(
                    "phase_ipc",
                    "instructions per cycle in this phase (Σ instructions ÷ Σ cycles)",
                    "instructions_per_cycle",
                    Phase,
                    phase_ipc,
                )
                .severity(
                    F2,
                    0.625,
                    1.0,
                    "1/1.6: the CPI threshold of Guillén (2015), Table 7.12, as IPC",
                )
                .pmu()
                .recommend(
                    "This phase retires few instructions per cycle: it stalls on memory, dependencies \
                     or mispredicted branches. Check llc_misses_per_instruction and \
                     branch_misses_per_instruction, then profile this phase's code region (its call \
                     sites) in depth.",
                ),
            ),
            Node::leaf(
                PropertyDef::new(
                    "phase_spmd_score",
                    "Cluster Sequence Score of this phase: 1 when every rank runs it at the same \
                     places of its sequence (SPMD), lower otherwise",
                    "ratio",
                    Phase,
                    phase_spmd_score,
                )
                .severity(F2, 1.0, 1.0, "1: any departure from SPMD fires, with severity 1 − score")
                .recommend(
                    "The ranks do not run this phase in the same order or equally often (non-SPMD \
                     structure): rank-dependent branches, master/worker roles, or irregular \
                     iteration counts. If that is not intended, look for rank-dependent control flow \
                     around this phase's call sites; if it is (e.g. dedicated I/O ranks), read the \
                     load balance with that in mind.",
                ),
            ),
        ],
    }
}

/// Static description of one property, for documentation, exports and dashboards.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PropertyInfo {
    pub name: &'static str,
    /// Configuration key (shared by replicas).
    pub id: &'static str,
    pub strategy: &'static str,
    pub parent: Option<&'static str>,
    pub scope: Scope,
    pub formula: Formula,
    pub condition: Condition,
    pub unit: &'static str,
    pub description: &'static str,
    pub default: Option<Setting>,
    pub threshold_note: &'static str,
    pub needs_pmu: bool,
    pub recommendation: Option<&'static str>,
}

fn infos<I>(strategy: &Strategy<I>, out: &mut Vec<PropertyInfo>) {
    for (def, parent) in strategy.nodes() {
        out.push(PropertyInfo {
            name: def.name,
            id: def.id,
            strategy: strategy.name,
            parent,
            scope: def.scope,
            formula: def.formula,
            condition: def.condition,
            unit: def.unit,
            description: def.description,
            default: def.default,
            threshold_note: def.threshold_note,
            needs_pmu: def.needs_pmu,
            recommendation: def.recommendation,
        });
    }
}

/// Every property of every strategy, parents before children.
pub fn catalogue() -> Vec<PropertyInfo> {
    let mut out = Vec::new();
    for s in job_strategies() {
        infos(&s, &mut out);
    }
    infos(&phase_strategy(), &mut out);
    out
}

/// The properties of one phase (cluster) of the job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PhaseProperties {
    /// Cluster id of an offline analysis, stable phase id in the daemon (see [`super::PhasesInput`]).
    pub phase: ClusterId,
    pub bursts: u64,
    /// The phase's share of the analysed burst time.
    pub time_share: f64,
    pub properties: Vec<PropertyResult>,
}

/// A recommendation that applies, with the property that fired it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ActiveRecommendation {
    pub property: String,
    /// The phase, for per-phase properties.
    pub phase: Option<ClusterId>,
    pub severity: f64,
    pub text: String,
}

/// All properties of one job on this node over one span.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct JobProperties {
    pub job: JobId,
    pub node: String,
    /// Ranks in the job's world (all nodes); `pop.ranks` is how many are here.
    pub world_size: u32,
    pub span: Span,
    /// Node-local POP efficiencies (see the module documentation).
    pub pop: PopEfficiencies,
    /// The mergeable aggregates for exact job-wide values across nodes.
    pub aggregates: JobAggregates,
    /// Job-level and per-rank properties of the strategies pop, ranks, structure, compute,
    /// resources and io, each in pre-order.
    pub properties: Vec<PropertyResult>,
    /// Per phase (cluster), by cluster id; empty without an analysis.
    pub phases: Vec<PhaseProperties>,
}

impl JobProperties {
    /// A job-level or per-rank property by name.
    pub fn get(&self, name: &str) -> Option<&PropertyResult> {
        self.properties.iter().find(|p| p.name == name)
    }

    /// A property of phase `cluster` by name.
    pub fn phase(&self, phase: ClusterId, name: &str) -> Option<&PropertyResult> {
        self.phases
            .iter()
            .find(|p| p.phase == phase)?
            .properties
            .iter()
            .find(|p| p.name == name)
    }

    /// Every recommendation that applies, by decreasing severity.
    pub fn recommendations(&self) -> Vec<ActiveRecommendation> {
        let active = |phase: Option<ClusterId>, p: &PropertyResult| {
            let e = p.evaluation()?;
            Some(ActiveRecommendation {
                property: p.name.clone(),
                phase,
                severity: e.severity,
                text: e.recommendation.clone()?,
            })
        };
        let mut out: Vec<ActiveRecommendation> = self
            .properties
            .iter()
            .filter_map(|p| active(None, p))
            .chain(self.phases.iter().flat_map(|ph| {
                ph.properties
                    .iter()
                    .filter_map(move |p| active(Some(ph.phase), p))
            }))
            .collect();
        out.sort_by(|a, b| b.severity.total_cmp(&a.severity));
        out
    }
}

/// The mergeable per-job aggregates (sum, count, min, max of per-rank useful, on-CPU, MPI and run
/// time, compute rate, and counters) of this node's ranks.
pub fn job_aggregates(input: &JobInput<'_>) -> JobAggregates {
    JobAggregates::from_ranks(&input.ranks)
}

/// Why the hardware-counter properties of a job are not measured; the text is the reason they
/// show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
enum MissingCounters {
    /// No rank has counters (the node has no usable PMU, or counters are off).
    #[error("{}", NO_PMU)]
    OnEveryRank,
    #[error("not measured (no PMU counters for {missing} of {ranks} ranks)")]
    OnSomeRanks { missing: usize, ranks: usize },
}

fn counter_status(ranks: &[RankSample]) -> Result<(), MissingCounters> {
    let missing = ranks.iter().filter(|r| r.pmu.is_none()).count();
    match missing {
        0 => Ok(()),
        m if m == ranks.len() => Err(MissingCounters::OnEveryRank),
        m => Err(MissingCounters::OnSomeRanks {
            missing: m,
            ranks: ranks.len(),
        }),
    }
}

/// Evaluates every strategy for one job on this node over `input.span`, with the thresholds,
/// exponents and quantiles of `config` (the daemon's [`super::config::PropertyConfig`]).
pub fn evaluate_job(input: &JobInput<'_>, config: &impl StrategySettings) -> JobProperties {
    let aggregates = job_aggregates(input);
    let pop = aggregates.pop();
    let context = JobContext {
        ranks: input.ranks.clone(),
        pop: pop.clone(),
        counters: counter_status(&input.ranks),
        nominal_hz: input.nominal_hz,
        resources: input.resources,
        io: input.io,
        analysis_filtered_share: input.phases.as_ref().map(|p| p.time_filtered_share),
    };
    let properties = job_strategies()
        .iter()
        .flat_map(|s| s.evaluate(&context, config))
        .collect();
    let phase = phase_strategy();
    let phases = input
        .phases
        .as_ref()
        .map(|p| {
            p.phases
                .iter()
                .map(|&(id, c)| PhaseProperties {
                    phase: id,
                    bursts: c.bursts,
                    time_share: c.time_share,
                    properties: phase.evaluate(c, config),
                })
                .collect()
        })
        .unwrap_or_default();
    JobProperties {
        job: input.meta.id.clone(),
        node: input.meta.node.clone(),
        world_size: input.meta.size,
        span: input.span,
        pop,
        aggregates,
        properties,
        phases,
    }
}

#[cfg(test)]
mod tests;
