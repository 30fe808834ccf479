//! What the properties are computed from: per-rank totals over a span (from the store's exact
//! kernel totals), optional per-rank hardware counters, and the kernel's per-job resource usage
//! and I/O counts. The daemon fills [`ResourceUsage`], [`IoStats`] and [`PmuCounters`] from
//! capture (see [`super::live`]); where one is not collected it is `None` and the properties over
//! it say "not measured".

use serde::{Deserialize, Serialize};

use super::error::PropertyError;
use super::window::Span;
use crate::analysis::{online::WindowView, Analysis, ClusterStats};
use crate::capture::usage::IoCounts;
use crate::store::{Job, JobMeta, RankRecord};

/// Hardware counter totals of one rank over a span, counted inside its CPU bursts (useful
/// computation, see docs/architecture.md). Present only where a PMU delivered them. The optional events are
/// `None` where the PMU (or the perf generic event) does not have them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PmuCounters {
    pub instructions: u64,
    pub cycles: u64,
    /// Reference cycles (constant rate, nominal frequency): for the core frequency.
    pub ref_cycles: Option<u64>,
    /// Last-level cache misses (perf generic `cache-misses`).
    pub llc_misses: Option<u64>,
    /// Mispredicted branches (perf generic `branch-misses`).
    pub branch_misses: Option<u64>,
}

impl PmuCounters {
    /// Counts between two snapshots of the same rank. An optional event present in only one of
    /// the two is absent from the result.
    pub fn delta(&self, before: &PmuCounters, rank: u32) -> Result<PmuCounters, PropertyError> {
        let sub = |name: &'static str, after: u64, before: u64| {
            after.checked_sub(before).ok_or(PropertyError::Snapshot {
                rank,
                detail: format!("counter {name} went backwards ({before} → {after})"),
            })
        };
        let opt =
            |name: &'static str, after: Option<u64>, before: Option<u64>| match (after, before) {
                (Some(a), Some(b)) => sub(name, a, b).map(Some),
                _ => Ok(None),
            };
        Ok(PmuCounters {
            instructions: sub("instructions", self.instructions, before.instructions)?,
            cycles: sub("cycles", self.cycles, before.cycles)?,
            ref_cycles: opt("ref_cycles", self.ref_cycles, before.ref_cycles)?,
            llc_misses: opt("llc_misses", self.llc_misses, before.llc_misses)?,
            branch_misses: opt("branch_misses", self.branch_misses, before.branch_misses)?,
        })
    }
}

/// One rank over one span (its whole life so far, or one window). Times are those of the
/// rank's region of interest inside the span (POP methodology, as DLB/TALP measure it): from the
/// return of MPI_Init/MPI_Init_thread to the entry of MPI_Finalize (see
/// [`RankRecord::region_span`]); start-up and shut-down are left out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSample {
    pub rank: u32,
    /// Wall time of the rank's region of interest inside the span; 0 when the two do not
    /// overlap (the rank had not returned from MPI_Init, or had entered MPI_Finalize).
    pub runtime_ns: u64,
    /// Useful time: `runtime_ns` minus `mpi_ns`.
    pub useful_ns: u64,
    /// On-CPU time inside the CPU bursts.
    pub useful_oncpu_ns: u64,
    /// Time in bursts shorter than the kernel's duration filter.
    pub filtered_ns: u64,
    /// Time inside outermost MPI calls in the region: every probed call (blocking,
    /// non-blocking, polling and local ones) but MPI_Init/MPI_Init_thread/MPI_Finalize.
    pub mpi_ns: u64,
    pub mpi_calls: u64,
    /// Bytes of the MPI calls whose datatype size was known.
    pub mpi_bytes: u64,
    pub pmu: Option<PmuCounters>,
}

impl RankSample {
    /// The rank's whole life up to `now_ns` (or its end). No counters: set `pmu` when the
    /// capture side provides them.
    pub fn lifetime(record: &RankRecord, now_ns: u64) -> RankSample {
        let t = &record.totals;
        let runtime_ns = record
            .region_span(now_ns)
            .map_or(0, |(start, end)| end - start);
        let mpi_ns = record.region_mpi_ns(now_ns).min(runtime_ns);
        RankSample {
            rank: record.rank,
            runtime_ns,
            useful_ns: runtime_ns - mpi_ns,
            useful_oncpu_ns: t.burst_oncpu_ns,
            filtered_ns: t.filtered_ns,
            mpi_ns,
            mpi_calls: record.calls(),
            mpi_bytes: record.functions.values().map(|f| f.bytes).sum(),
            pmu: None,
        }
    }

    /// The rank inside `window`, from two snapshots of its record taken at the window's start
    /// (`None` when the rank appeared during the window) and at its end. The totals are the
    /// differences; the run time is the overlap of the rank's region of interest with the
    /// window. Fails when the snapshots are not of the same process or a total went backwards.
    pub fn window(
        before: Option<&RankRecord>,
        after: &RankRecord,
        window: Span,
    ) -> Result<RankSample, PropertyError> {
        let rank = after.rank;
        if let Some(b) = before {
            if (b.rank, b.pid) != (after.rank, after.pid) {
                return Err(PropertyError::Snapshot {
                    rank,
                    detail: format!(
                        "snapshots of different processes (rank {} pid {} before, rank {} pid {} after)",
                        b.rank, b.pid, after.rank, after.pid
                    ),
                });
            }
        }
        let sub = |name: &'static str, after: u64, before: u64| {
            after.checked_sub(before).ok_or(PropertyError::Snapshot {
                rank,
                detail: format!("{name} went backwards ({before} → {after})"),
            })
        };
        let zero = RankSample::default();
        let b = before
            .map(|r| RankSample::lifetime(r, window.start_ns))
            .unwrap_or(zero);
        let a = RankSample::lifetime(after, window.end_ns);
        let runtime_ns = after
            .region_span(window.end_ns)
            .map_or(0, |(start, end)| window.overlap_ns(start, end));
        // An MPI call in progress at the first snapshot counts up to the window start there and
        // in full once it completed, so the difference does not go backwards.
        let mpi_ns = a.mpi_ns.saturating_sub(b.mpi_ns).min(runtime_ns);
        Ok(RankSample {
            rank,
            runtime_ns,
            useful_ns: runtime_ns - mpi_ns,
            useful_oncpu_ns: sub("on-CPU time", a.useful_oncpu_ns, b.useful_oncpu_ns)?,
            filtered_ns: sub("filtered time", a.filtered_ns, b.filtered_ns)?,
            mpi_ns,
            mpi_calls: sub("MPI calls", a.mpi_calls, b.mpi_calls)?,
            mpi_bytes: sub("MPI bytes", a.mpi_bytes, b.mpi_bytes)?,
            pmu: None,
        })
    }
}

/// Kernel resource usage of one job on this node over `seconds` of wall time (no PMU needed).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResourceUsage {
    /// Wall seconds the times below cover.
    pub seconds: f64,
    /// Memory the job's processes use at the end of the span (resident set, or the job's cgroup
    /// memory.current).
    pub memory_used_bytes: u64,
    /// Memory the job may use on this node: its cgroup limit if it has one, else the node's
    /// MemTotal.
    pub memory_available_bytes: u64,
    /// CPU time of the job's processes in user and in kernel mode during the span.
    pub user_seconds: f64,
    pub system_seconds: f64,
    /// CPUs the job may use on this node: its cpuset size, or its local ranks × threads per rank
    /// when it has no cpuset.
    pub cpus: f64,
}

/// The job's file I/O on this node over `seconds`: the difference of two readings of the
/// cumulative [`IoCounts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct IoStats {
    pub seconds: f64,
    #[serde(flatten)]
    pub counts: IoCounts,
}

/// The phases the per-phase properties are evaluated on: the clusters of an offline analysis
/// (ids are cluster ids) or the phases of the daemon's last closed window (ids are the stable
/// phase ids, the `phase` label of the metrics).
#[derive(Clone, Debug)]
pub struct PhasesInput<'a> {
    /// Share of the analysed span's burst time the analysis's duration filter left out.
    pub time_filtered_share: f64,
    pub phases: Vec<(u32, &'a ClusterStats)>,
}

impl<'a> From<&'a Analysis> for PhasesInput<'a> {
    fn from(a: &'a Analysis) -> Self {
        PhasesInput {
            time_filtered_share: a.filter.time_filtered_share,
            phases: a.clusters.iter().map(|c| (c.id, c)).collect(),
        }
    }
}

impl<'a> From<&'a WindowView> for PhasesInput<'a> {
    fn from(w: &'a WindowView) -> Self {
        PhasesInput {
            time_filtered_share: w.time_filtered_share,
            phases: w.phases.iter().map(|p| (p.id, &p.stats)).collect(),
        }
    }
}

/// Everything the catalogue evaluates for one job on this node over one span.
#[derive(Clone, Debug)]
pub struct JobInput<'a> {
    pub meta: &'a JobMeta,
    pub span: Span,
    /// The job's ranks on this node (other nodes' ranks are not here: see the module
    /// documentation for the job-wide values).
    pub ranks: Vec<RankSample>,
    /// Nominal (reference-cycle) frequency of the CPUs in Hz, for the core frequency.
    pub nominal_hz: Option<f64>,
    pub resources: Option<ResourceUsage>,
    pub io: Option<IoStats>,
    /// The phases of the same job; `None` skips the per-phase properties.
    pub phases: Option<PhasesInput<'a>>,
}

impl<'a> JobInput<'a> {
    /// The job's whole life on this node up to `now_ns` (or its end), from the store's totals;
    /// no counters, resource usage, I/O or analysis (set them when available).
    pub fn lifetime(job: &'a Job, now_ns: u64) -> JobInput<'a> {
        let end = job.meta.ended_ns.unwrap_or(now_ns);
        JobInput {
            meta: &job.meta,
            span: Span::new(job.meta.first_seen_ns, end),
            ranks: job
                .ranks
                .values()
                .map(|r| RankSample::lifetime(r, now_ns))
                .collect(),
            nominal_hz: None,
            resources: None,
            io: None,
            phases: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::store::{CallStats, RankTotals};

    const S: u64 = 1_000_000_000;

    fn record(first_seen_ns: u64, ended_ns: Option<u64>, burst_ns: u64, mpi_ns: u64) -> RankRecord {
        let mut functions = BTreeMap::new();
        functions.insert(
            "MPI_Barrier".to_string(),
            CallStats {
                calls: 10,
                time_ns: mpi_ns,
                bytes: 0,
                sized_calls: 0,
                ..Default::default()
            },
        );
        RankRecord {
            call_sites: Vec::new(),
            rank: 3,
            pid: 42,
            first_seen_ns,
            ended_ns,
            totals: RankTotals {
                bursts: 10,
                burst_ns,
                burst_oncpu_ns: burst_ns / 2,
                ..Default::default()
            },
            functions,
            region: Default::default(),
            probe_cost: None,
        }
    }

    /// A rank that returned from MPI_Init at `init_return_ns`.
    fn initialised(
        first_seen_ns: u64,
        init_return_ns: u64,
        ended_ns: Option<u64>,
        burst_ns: u64,
        mpi_ns: u64,
    ) -> RankRecord {
        let mut r = record(first_seen_ns, ended_ns, burst_ns, mpi_ns);
        r.functions.insert(
            "MPI_Init".to_string(),
            CallStats {
                calls: 1,
                time_ns: S,
                bytes: 0,
                sized_calls: 0,
                ..Default::default()
            },
        );
        r.region.init_return_ns = Some(init_return_ns);
        r
    }

    #[test]
    fn lifetime_is_the_region_of_interest() {
        // From MPI_Init's return to now; MPI_Init's own time is not MPI time of the region.
        let r = RankSample::lifetime(&initialised(10 * S, 12 * S, None, 3 * S, 2 * S), 20 * S);
        assert_eq!(
            (r.runtime_ns, r.useful_ns, r.mpi_ns, r.mpi_calls),
            (8 * S, 6 * S, 2 * S, 11)
        );
        // To MPI_Finalize's entry.
        let mut finalized = initialised(10 * S, 12 * S, Some(19 * S), 3 * S, 2 * S);
        finalized.region.finalize_entry_ns = Some(18 * S);
        finalized.functions.insert(
            "MPI_Finalize".to_string(),
            CallStats {
                calls: 1,
                time_ns: S / 2,
                ..Default::default()
            },
        );
        let f = RankSample::lifetime(&finalized, 20 * S);
        assert_eq!((f.runtime_ns, f.useful_ns, f.mpi_ns), (6 * S, 4 * S, 2 * S));
        // Exited without MPI_Finalize: to its exit.
        let exited = RankSample::lifetime(
            &initialised(10 * S, 12 * S, Some(15 * S), 3 * S, 2 * S),
            20 * S,
        );
        assert_eq!((exited.runtime_ns, exited.useful_ns), (3 * S, S));
        // A call in progress counts as MPI time up to now.
        let mut waiting = initialised(10 * S, 12 * S, None, 3 * S, 2 * S);
        waiting.region.open_calls_since_ns = vec![19 * S];
        let w = RankSample::lifetime(&waiting, 20 * S);
        assert_eq!((w.mpi_ns, w.useful_ns), (3 * S, 5 * S));
        // Not returned from MPI_Init yet: no region.
        let mut starting = record(10 * S, None, 0, 0);
        starting.totals.bursts = 0;
        starting.functions.clear();
        starting
            .functions
            .insert("MPI_Init".to_string(), CallStats::default());
        assert_eq!(RankSample::lifetime(&starting, 20 * S).runtime_ns, 0);
        // Initialised before the daemon saw it: from then.
        let late = RankSample::lifetime(&record(10 * S, None, 3 * S, 2 * S), 20 * S);
        assert_eq!((late.runtime_ns, late.useful_ns), (10 * S, 8 * S));
    }

    #[test]
    fn window_samples_are_differences_within_the_region() {
        let before = initialised(5 * S, 6 * S, None, 3 * S, 2 * S);
        let after = initialised(5 * S, 6 * S, None, 8 * S, 4 * S);
        let w = Span::new(10 * S, 20 * S);
        let r = RankSample::window(Some(&before), &after, w).unwrap();
        assert_eq!(
            (r.runtime_ns, r.useful_ns, r.mpi_ns, r.mpi_calls),
            (10 * S, 8 * S, 2 * S, 0)
        );
        // Appeared during the window: from its MPI_Init's return.
        let new = RankSample::window(None, &initialised(15 * S, 16 * S, None, S, S), w).unwrap();
        assert_eq!((new.runtime_ns, new.useful_ns), (4 * S, 3 * S));
        // A counter going backwards or another process is an error naming the rank.
        let err = RankSample::window(Some(&after), &before, w).unwrap_err();
        assert!(err.to_string().contains("rank 3"), "{err}");
        let mut other = after.clone();
        other.pid = 43;
        assert!(RankSample::window(Some(&before), &other, w).is_err());
    }

    #[test]
    fn counter_deltas() {
        let before = PmuCounters {
            instructions: 10,
            cycles: 20,
            ref_cycles: Some(5),
            llc_misses: None,
            branch_misses: Some(1),
        };
        let after = PmuCounters {
            instructions: 110,
            cycles: 220,
            ref_cycles: Some(105),
            llc_misses: Some(3),
            branch_misses: Some(2),
        };
        let d = after.delta(&before, 0).unwrap();
        assert_eq!(
            d,
            PmuCounters {
                instructions: 100,
                cycles: 200,
                ref_cycles: Some(100),
                llc_misses: None,
                branch_misses: Some(1)
            }
        );
        assert!(before.delta(&after, 0).is_err());
    }
}
