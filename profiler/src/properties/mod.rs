//! Properties: the PerSyst property model (Guillén (2015): C. Guillén, *Knowledge-based
//! Performance Monitoring for Large Scale HPC Architectures*, PhD thesis, TU München, 2015) with
//! POP efficiencies, evaluated per job on this node and per phase (burst cluster). A pure library:
//! it reads the store's totals, the analysis and the kernel's usage counts, and returns values,
//! severities and recommendations that the exports turn into metrics.
//!
//! The submodules import one way, each only from those before it: [`error`], [`quantiles`],
//! [`window`] → [`inputs`] → [`engine`] → [`pop`] → [`mod@catalogue`] → [`config`] (validated
//! against the catalogue; the engine reads it through [`engine::StrategySettings`]) → [`live`] →
//! [`node`] (every job of the node).
//!
//! # Model ([`engine`])
//!
//! A property has a value x, a threshold t, an exponent p, a severity formula — F1 "higher is
//! worse", s = clamp((x/t − 1)^p) (Eq. 3.1); F2 "lower is worse", s = max(0, 1 − (x/t)^p)
//! (Eq. 3.2); the proportional SAR form of Guillén (2015) clamp((x/t)^p) (Eq. 3.57/3.59); or none
//! — a severity in [0, 1] and a condition (by default severity > 0). Strategies are trees: roots
//! are always evaluated, children only when the parent's condition holds; gated children are not
//! evaluated and produce no result. A property whose source is missing (no PMU, usage not
//! collected) says "not measured (…)" and so do its children, never a number. A recommendation
//! applies when the condition holds and the severity is above 0. A property that must branch on
//! saturation is duplicated into two replicas sharing id, threshold, value and severity, with
//! conditions x > t and x ≤ t (§3.2's memory-bound/compute-bound trick; used here for the I/O
//! bandwidth, §3.1.33 and §7.7). Thresholds and exponents come from TOML ([`config`]);
//! [`PropertyConfig::default_toml`] documents every default.
//!
//! # Definitions
//!
//! Per rank i over a span (the job's life up to now, or one window aligned to Unix time, see
//! [`window`]), from the store's exact kernel totals, over the rank's region of interest as the
//! POP methodology and DLB/TALP define it (from the return of MPI_Init to the entry of
//! MPI_Finalize; see [`RankSample`] and docs/metrics.md):
//! * R_i, run time: the part of the region inside the span;
//! * M_i: time inside outermost MPI calls in the region, every probed call but MPI_Init,
//!   MPI_Init_thread and MPI_Finalize, calls in progress included;
//! * U_i, useful time: R_i − M_i.
//!
//! Ranks whose region does not overlap the span (not yet returned from MPI_Init) are left out.
//!
//! POP efficiencies ([`pop`]), over the m ranks: LB = (Σ U_i / m) / max U_i,
//! CommE = max U_i / max R_i, PE = LB × CommE. With a PMU also IPC = Σ instructions ÷ Σ cycles
//! inside bursts and the instruction total; without one they read "not measured (no PMU)".
//!
//! **Other nodes.** A daemon sees only its node's ranks, so [`evaluate_job`] gives the
//! node-local view: m is the number of ranks here, and ranks elsewhere are neither counted nor
//! taken as zero. The intra-node imbalance is by definition node-local. Exact job-wide values
//! come from Prometheus recording rules over the mergeable aggregates of [`job_aggregates`]
//! (sum, count, min and max of per-rank U, on-CPU time, M, R and compute rate, plus counters),
//! exported per node:
//!
//! ```text
//! LB    = (sum by (job) (useful_sum) / sum by (job) (useful_count)) / max by (job) (useful_max)
//! CommE = max by (job) (useful_max) / max by (job) (runtime_max)
//! PE    = LB * CommE
//! IPC   = sum by (job) (instructions_sum) / sum by (job) (cycles_sum)
//! inter-node imbalance = max by (job) (compute_rate_sum / compute_rate_count)
//!                      - min by (job) (compute_rate_sum / compute_rate_count)
//! ```
//!
//! [`JobAggregates::merge`] does the same in Rust, and the tests check that merged per-node
//! aggregates give exactly the values over all ranks. Per-window job-wide values need the
//! aggregates of window samples (exported as gauges): a maximum over ranks cannot be derived from
//! rates of lifetime totals.
//!
//! # Catalogue ([`mod@catalogue`]; F = formula, t = default threshold, p = 1 everywhere)
//!
//! Strategy `pop` (job): `parallel_efficiency` (F2, 0.8, condition always) → `load_balance`
//! (F2, 0.8) → `intra_node_imbalance` (max − min over ranks of on-CPU seconds in bursts per
//! second of run time; F1, 0.5 s/s); `parallel_efficiency` → `communication_efficiency` (F2, 0.8).
//!
//! Strategy `ranks` (per rank, summarised over the ranks as quantiles): `mpi_time_fraction`
//! = M_i / R_i (F1, 0.2); `oncpu_share` = on-CPU time ÷ wall time inside bursts (F2, 0.9; low when
//! oversubscribed or descheduled).
//!
//! Strategy `structure` (job): `fragmentation` = k + (1 − k)·a, the share of useful time in bursts
//! too short to be analysed: k below the kernel's duration filter (exact totals), a the share the
//! analysis filtered out of the shipped bursts ([`crate::analysis::FilterReport`]), assuming the
//! analysed bursts represent the span (F1, 0.1).
//!
//! Strategy `compute` (per rank, PMU): `cpi` (F1, 1.6) → `llc_misses_per_instruction` (F1,
//! 0.0003), `branch_misses_per_instruction` (F1, 0.005); `core_frequency` = cycles ÷ reference
//! cycles × nominal frequency (no severity).
//!
//! Strategy `resources` (job, kernel, [`ResourceUsage`]): `memory_used_share` (F1, 0.5),
//! `user_time_share` (F2, 0.8), `system_time_share` (proportional, 0.2).
//!
//! Strategy `io` (job, syscall tracepoints, [`IoStats`]): `io_read_bandwidth_high` /
//! `io_read_bandwidth_low` (replicas of `io_read_bandwidth`, F1, 1.1 GiB/s) → under the low one
//! `io_read_request_size` (F2, 2 MiB); the same for writes; `io_open_rate`, `io_close_rate`
//! (F1, 100/s).
//!
//! Strategy `phase` (per cluster of the analysis): `phase_load_balance` = LB_dur (F2, 0.8) →
//! `phase_instruction_balance` (PMU; F2, 0.8); `phase_ipc` (PMU; F2, 0.625 = 1/1.6);
//! `phase_spmd_score` (F2, 1.0: severity 1 − score, fires whenever the score is below 1).
//!
//! Per-rank properties report, besides quantiles ([`quantiles`]: minimum, deciles, maximum by
//! default, with the percentile definition of Guillén (2015)) of values and severities, their mean
//! value and mean severity (the average severity over devices of Guillén (2015)); their condition
//! holds when it holds for at least one rank.

pub mod catalogue;
pub mod config;
pub mod engine;
pub mod error;
pub mod inputs;
pub mod live;
pub mod node;
pub mod pop;
pub mod quantiles;
pub mod window;

pub use catalogue::{
    catalogue, evaluate_job, job_aggregates, ActiveRecommendation, JobProperties, PhaseProperties,
    PropertyInfo,
};
pub use config::{PropertyConfig, PropertySetting};
pub use engine::{
    Condition, Evaluation, Formula, Observation, Outcome, PropertyResult, RankDistribution, Scope,
    Setting, NO_PMU,
};
pub use error::PropertyError;
pub use inputs::{IoStats, JobInput, PhasesInput, PmuCounters, RankSample, ResourceUsage};
pub use live::{lifetime_properties, LiveEvaluator, LiveProperties, WindowProperties};
pub use pop::{Aggregate, JobAggregates, PopEfficiencies, Reading};
pub use quantiles::{bucket_bounds, RankHistogram, Summary};
pub use window::Span;
