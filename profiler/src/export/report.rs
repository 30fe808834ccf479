//! The per-job text report printed while a job runs and when it ends: ranks, bursts, useful
//! time versus MPI time per rank over its region of interest, start-up and shut-down, calls,
//! time and bytes per MPI function, and what profiling cost. [`JobReport`] holds the values once, for the text and for the
//! JSON document of `mpiburst report --format json`.

use std::fmt::Write as _;

use serde::Serialize;

use crate::{
    properties::RankSample,
    store::{probe_cost::JobProbeCost, CallStats, Job, JobMeta, RankRecord, RankTotals},
};

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// `part` of `whole`, 0 when there is no whole.
fn share(part: u64, whole: u64) -> f64 {
    if whole > 0 {
        part as f64 / whole as f64
    } else {
        0.0
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Running,
    Ended,
}

/// Where a rank is in its life, as the report's last column says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RankState {
    /// Not returned from MPI_Init yet: no region of interest.
    InMpiInit,
    Running,
    Exited,
    ExitedWithoutFinalize,
}

/// One row of the rank table.
#[derive(Clone, Debug, Serialize)]
pub struct RankRow<'a> {
    pub rank: u32,
    pub pid: u32,
    pub state: RankState,
    /// The kernel's exact totals of the rank.
    pub totals: &'a RankTotals,
    /// The rank's region of interest up to the report's time: run, useful and MPI time.
    pub region: RankSample,
    /// MPI time over run time of the region (0 without run time).
    pub mpi_share: f64,
    /// On-CPU time over wall time inside bursts (0 without burst time).
    pub oncpu_share: f64,
}

/// Start-up and shut-down, which the efficiencies leave out: MPI_Init over the ranks whose
/// return from it the daemon saw, MPI_Finalize over those that entered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Lifecycle {
    pub init_ranks: usize,
    pub init_max_ns: Option<u64>,
    pub init_mean_ns: Option<u64>,
    pub finalize_ranks: usize,
    pub finalize_max_ns: Option<u64>,
}

impl Lifecycle {
    fn of(job: &Job) -> Lifecycle {
        let over = |seen: fn(&RankRecord) -> bool, value: fn(&RankRecord) -> u64| {
            let values: Vec<u64> = job.ranks.values().filter(|r| seen(r)).map(value).collect();
            let mean =
                (!values.is_empty()).then(|| values.iter().sum::<u64>() / values.len() as u64);
            (values.len(), values.iter().copied().max(), mean)
        };
        let (init_ranks, init_max_ns, init_mean_ns) =
            over(|r| r.region.init_return_ns.is_some(), RankRecord::init_ns);
        let (finalize_ranks, finalize_max_ns, _) = over(
            |r| r.region.finalize_entry_ns.is_some(),
            RankRecord::finalize_ns,
        );
        Lifecycle {
            init_ranks,
            init_max_ns,
            init_mean_ns,
            finalize_ranks,
            finalize_max_ns,
        }
    }
}

/// One MPI function summed over the job's ranks here.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionRow<'a> {
    pub function: &'a str,
    #[serde(flatten)]
    pub stats: CallStats,
}

/// What the report of one job shows, at `at_ns`.
#[derive(Clone, Debug, Serialize)]
pub struct JobReport<'a> {
    pub meta: &'a JobMeta,
    pub state: JobState,
    /// Unix ns the report is of: the time given to [`JobReport::new`].
    pub at_ns: u64,
    /// From the job's first sight to its end, or to `at_ns` while it runs.
    pub elapsed_ns: u64,
    /// The job's ranks on this node (`meta.size` is the world size).
    pub ranks_here: usize,
    /// Which counters the bursts carry, in words.
    pub counters_note: &'a str,
    /// By rank.
    pub ranks: Vec<RankRow<'a>>,
    pub lifecycle: Lifecycle,
    /// By decreasing time, then by name.
    pub functions: Vec<FunctionRow<'a>>,
    /// The ranks' totals summed.
    pub totals: RankTotals,
    /// The time the ranks lost to the probes, estimated (docs/metrics.md, "What profiling
    /// costs").
    pub probe_cost: JobProbeCost,
    /// Older bursts dropped from memory (the totals stay exact).
    pub bursts_evicted: u64,
}

impl<'a> JobReport<'a> {
    /// The report of `job` at `now_ns` (Unix), which gives the elapsed time of a running job.
    pub fn new(job: &'a Job, now_ns: u64, counters_note: &'a str) -> JobReport<'a> {
        let m = &job.meta;
        let end = m.ended_ns.unwrap_or(now_ns);
        let ranks = job
            .ranks
            .values()
            .map(|r| {
                let sample = RankSample::lifetime(r, end);
                let state = match (r.region_span(end), r.ended_ns) {
                    (None, _) => RankState::InMpiInit,
                    (Some(_), Some(_)) if r.region.finalize_entry_ns.is_none() => {
                        RankState::ExitedWithoutFinalize
                    }
                    (Some(_), Some(_)) => RankState::Exited,
                    (Some(_), None) => RankState::Running,
                };
                RankRow {
                    rank: r.rank,
                    pid: r.pid,
                    state,
                    totals: &r.totals,
                    mpi_share: share(sample.mpi_ns, sample.runtime_ns),
                    oncpu_share: share(r.totals.burst_oncpu_ns, r.totals.burst_ns),
                    region: sample,
                }
            })
            .collect();
        let mut functions: Vec<FunctionRow> = job
            .functions()
            .into_iter()
            .map(|(function, stats)| FunctionRow { function, stats })
            .collect();
        functions.sort_by(|a, b| {
            b.stats
                .time_ns
                .cmp(&a.stats.time_ns)
                .then(a.function.cmp(b.function))
        });
        JobReport {
            meta: m,
            state: if m.ended_ns.is_some() {
                JobState::Ended
            } else {
                JobState::Running
            },
            at_ns: now_ns,
            elapsed_ns: end.saturating_sub(m.first_seen_ns),
            ranks_here: job.ranks.len(),
            counters_note,
            ranks,
            lifecycle: Lifecycle::of(job),
            functions,
            totals: job.totals(),
            probe_cost: JobProbeCost::of(job, end),
            bursts_evicted: job.bursts_evicted,
        }
    }

    /// The report as text.
    pub fn text(&self) -> String {
        let m = self.meta;
        let state = match self.state {
            JobState::Running => "running",
            JobState::Ended => "ended",
        };
        let mut out = String::new();
        let _ = writeln!(
            out,
            "== job {} on {}: {} of {} ranks here, {state}, {:.1} s, {}",
            m.id,
            m.node,
            self.ranks_here,
            m.size,
            secs(self.elapsed_ns),
            m.executable
        );
        let _ = writeln!(out, "   identity from {}; {}", m.source, self.counters_note);
        let _ = writeln!(
            out,
            "   {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>8}",
            "rank",
            "pid",
            "bursts",
            "filtered",
            "region s",
            "useful s",
            "MPI s",
            "MPI %",
            "on-CPU %"
        );
        for r in &self.ranks {
            let state = match r.state {
                RankState::InMpiInit => "  (in MPI_Init)",
                RankState::ExitedWithoutFinalize => "  (exited without MPI_Finalize)",
                RankState::Exited => "  (exited)",
                RankState::Running => "",
            };
            let _ = writeln!(
                out,
                "   {:>5} {:>8} {:>9} {:>9} {:>9.3} {:>9.3} {:>9.3} {:>6.1}% {:>7.1}%{state}",
                r.rank,
                r.pid,
                r.totals.bursts,
                r.totals.filtered_bursts,
                secs(r.region.runtime_ns),
                secs(r.region.useful_ns),
                secs(r.region.mpi_ns),
                100.0 * r.mpi_share,
                100.0 * r.oncpu_share,
            );
        }
        if let Some(line) = self.lifecycle_line() {
            let _ = writeln!(out, "   {line}");
        }
        if !self.functions.is_empty() {
            let _ = writeln!(
                out,
                "   {:<24} {:>10} {:>10} {:>12}",
                "MPI function", "calls", "time s", "bytes"
            );
            for FunctionRow { function, stats: s } in &self.functions {
                let b = if s.sized_calls > 0 {
                    bytes(s.bytes)
                } else {
                    "-".into()
                };
                let _ = writeln!(
                    out,
                    "   {:<24} {:>10} {:>10.3} {:>12}",
                    function,
                    s.calls,
                    secs(s.time_ns),
                    b
                );
            }
            for FunctionRow { function, stats: s } in &self.functions {
                if s.sampled {
                    let _ = writeln!(
                        out,
                        "   {function}: sampled by the probe governor (a polling storm): only the \
                         calls in its sampling windows are counted, a lower bound"
                    );
                } else if s.count_only {
                    let _ = writeln!(
                        out,
                        "   {function}: counted at entry only for a while by the probe governor (a \
                         polling storm): its time covers only the calls probed in full"
                    );
                }
            }
        }
        let _ = writeln!(out, "   {}", self.probe_cost_line());
        if self.totals.dropped_bursts > 0 || self.bursts_evicted > 0 {
            let _ = writeln!(
                out,
                "   {} bursts lost (ring buffer full), {} older bursts evicted from memory (totals stay exact)",
                self.totals.dropped_bursts, self.bursts_evicted
            );
        }
        out
    }

    /// What profiling cost the ranks: the time lost to probe hits and to the daemon's CPU and its
    /// share of their run time, and the hits of polling storms apart.
    fn probe_cost_line(&self) -> String {
        let c = &self.probe_cost;
        if c.ranks == 0 {
            return "profiling cost: not estimated (the daemon measured no probe cost: its probe \
                    governor was off)"
                .into();
        }
        let mut line = format!(
            "profiling cost: about {:.3} s of the ranks' {:.3} s of run time ({:.1} %)",
            secs(c.lost_ns + c.daemon_ns),
            secs(c.runtime_ns),
            100.0 * c.share.unwrap_or(0.0)
        );
        if let Some(hit) = c.full_hit_ns() {
            let _ = write!(
                line,
                ", {} calls probed in full at {:.2} µs a call",
                c.full_calls,
                hit / 1e3
            );
        }
        if c.daemon_ns > 0 {
            let _ = write!(
                line,
                ", {:.3} s the daemon's CPU taken from them",
                secs(c.daemon_ns)
            );
        }
        if c.storm_calls > 0 {
            let _ = write!(
                line,
                "; {} polling calls in storms, counted at entry only or sampled: their {:.3} s of \
                 probes fell in waiting",
                c.storm_calls,
                secs(c.storm_ns)
            );
        }
        if c.ranks_unestimated > 0 {
            let _ = write!(
                line,
                " ({} ranks without an estimate: their daemon measured no probe cost)",
                c.ranks_unestimated
            );
        }
        line
    }

    /// The start-up and shut-down line; none while no rank has left MPI_Init.
    fn lifecycle_line(&self) -> Option<String> {
        let l = &self.lifecycle;
        let startup = match (l.init_max_ns, l.init_mean_ns) {
            (Some(max), Some(mean)) => format!(
                "startup: MPI_Init {:.3} s max, {:.3} s mean",
                secs(max),
                secs(mean)
            ),
            _ if self.ranks.iter().any(|r| r.state != RankState::InMpiInit) => {
                "startup: MPI_Init not seen (the daemon attached after it; regions start when it saw the ranks)".to_string()
            }
            _ => return None,
        };
        let shutdown = match (l.finalize_ranks, l.finalize_max_ns) {
            (n, Some(max)) => format!(
                "; shutdown: MPI_Finalize {:.3} s max over {n} ranks",
                secs(max)
            ),
            _ => String::new(),
        };
        Some(format!(
            "{startup}{shutdown} (outside the region of interest the efficiencies use)"
        ))
    }
}

/// Renders the report of one job. `now_ns` (Unix) gives the elapsed time of a running job.
pub fn render(job: &Job, now_ns: u64, counters_note: &str) -> String {
    JobReport::new(job, now_ns, counters_note).text()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        store::{probe_cost::RankProbeCost, RegionMarks},
        test_support::JobMetaBuilder,
    };

    #[test]
    fn report_shows_ranks_and_functions() {
        let mut job = Job::new(
            JobMetaBuilder::new("pmix:x")
                .ended_ns(Some(2_000_000_000))
                .build(),
        );
        let mut functions = std::collections::BTreeMap::new();
        functions.insert(
            "MPI_Send".to_string(),
            CallStats {
                calls: 3,
                time_ns: 500_000_000,
                bytes: 3 << 20,
                sized_calls: 3,
                ..Default::default()
            },
        );
        functions.insert(
            "MPI_Init".to_string(),
            CallStats {
                calls: 1,
                time_ns: 300_000_000,
                ..Default::default()
            },
        );
        functions.insert(
            "MPI_Finalize".to_string(),
            CallStats {
                calls: 1,
                time_ns: 100_000_000,
                ..Default::default()
            },
        );
        job.ranks.insert(
            0,
            RankRecord {
                call_sites: Vec::new(),
                rank: 0,
                pid: 42,
                first_seen_ns: 0,
                ended_ns: Some(2_100_000_000),
                totals: RankTotals {
                    bursts: 4,
                    burst_ns: 1_500_000_000,
                    burst_oncpu_ns: 750_000_000,
                    ..Default::default()
                },
                functions,
                region: RegionMarks {
                    init_return_ns: Some(0),
                    finalize_entry_ns: Some(2_000_000_000),
                    ..Default::default()
                },
                probe_cost: Some(RankProbeCost {
                    full_calls: 5,
                    storm_calls: 0,
                    full_hit_ns: 2_000_000.0,
                    entry_hit_ns: Some(1_000_000.0),
                    daemon_ns: 4_000_000,
                    ..RankProbeCost::default()
                }),
            },
        );
        let text = render(&job, 0, "no counters");
        assert!(
            text.contains(
                "profiling cost: about 0.014 s of the ranks' 2.000 s of run time (0.7 %), 5 calls \
                 probed in full at 2000.00 µs a call, 0.004 s the daemon's CPU taken from them"
            ),
            "{text}"
        );
        assert!(text.contains("ended, 2.0 s"), "{text}");
        assert!(
            text.contains("25.0%"),
            "MPI share 0.5 s of the 2 s region: {text}"
        );
        assert!(
            text.contains("startup: MPI_Init 0.300 s max")
                && text.contains("MPI_Finalize 0.100 s max over 1 ranks"),
            "{text}"
        );
        assert!(text.contains("50.0%"), "on-CPU share: {text}");
        assert!(
            text.contains("MPI_Send") && text.contains("3.0 MiB"),
            "{text}"
        );
        // The values behind the text, unformatted.
        let json: serde_json::Value =
            serde_json::from_str(&serde_json::to_string(&JobReport::new(&job, 0, "")).unwrap())
                .unwrap();
        assert_eq!(json["elapsed_ns"], 2_000_000_000);
        let rank = &json["ranks"][0];
        assert_eq!(rank["state"], "exited");
        assert_eq!(rank["mpi_share"], 0.25);
        assert_eq!(rank["oncpu_share"], 0.5);
        assert_eq!(rank["region"]["runtime_ns"], 2_000_000_000);
        assert_eq!(rank["region"]["mpi_ns"], 500_000_000);
        assert_eq!(json["lifecycle"]["init_max_ns"], 300_000_000);
        assert_eq!(json["lifecycle"]["finalize_max_ns"], 100_000_000);
        assert_eq!(json["functions"][0]["function"], "MPI_Send");
        assert_eq!(json["functions"][0]["bytes"], 3 << 20);
        assert_eq!(json["probe_cost"]["lost_ns"], 10_000_000);
        assert_eq!(json["probe_cost"]["runtime_ns"], 2_000_000_000);
        assert_eq!(json["probe_cost"]["daemon_ns"], 4_000_000);
        assert_eq!(json["probe_cost"]["share"], 0.007);
    }
}
