//! What profiling cost a job: the time its ranks lost to probe hits, estimated from each rank's
//! calls, what a probe hit costs on the rank's node (measured at the daemon's start:
//! `Capture::measure_probe_cost`) and how long the rank's own probe runs took, and the time they
//! lost to the daemon's CPU.
//!
//! A call probed in full delays its rank by one hit of entry and return. What a hit costs depends
//! on the code: its computation between two calls evicts the trap path, the programs and their
//! maps from the core's caches, and the more it evicts, the dearer the hit (on the development
//! VM, 1 µs back to back, 2.2 µs among a halo exchange's stencil, 4 µs among a solver's sweeps
//! over vectors larger than the core's cache). The probes time one run in [`TIMED_RUN_ONE_IN`],
//! at the rank's outermost calls and in the node's measurement back to back alike; the same work
//! evicts the trap path and the programs, so a rank whose runs take k times as long pays k times
//! a hit back to back per call. The calls of a polling function the governor demoted (counted at
//! entry only, or sampled) were made in a polling storm, a thread calling back to back while it
//! waits: the waiting absorbs their hits, which show as fewer polls rather than a longer run, so
//! they are counted apart (CPU the probes took, not time the rank lost). The time the daemon's
//! own threads took the CPU from a rank mid-burst is time lost too: the scheduler program
//! measures it (`BurstTotals::daemon_delay_ns`). Each rank keeps the costs of its own node, so
//! that the ranks of a job recorded on several nodes sum exactly.
//!
//! [`TIMED_RUN_ONE_IN`]: profiler_common::TIMED_RUN_ONE_IN

use serde::{Deserialize, Serialize};

use crate::{
    capture::{ProbeCost, TimedRuns},
    store::{CallStats, Job},
};

/// A rank's probe hits by kind, what a hit cost on its node, and the daemon's CPU it lost.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankProbeCost {
    /// Calls probed in full (entry and return).
    pub full_calls: u64,
    /// Calls of polling functions while the governor had them counted at entry only or sampled.
    pub storm_calls: u64,
    /// What a hit cost the rank, in ns: entry and return, at its node's cost back to back scaled
    /// by its timed runs (or among work without them), and entry only back to back, as in a
    /// storm (`None` without uprobe sessions, where no call is counted at its entry only).
    pub full_hit_ns: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_hit_ns: Option<f64>,
    /// The probe runs the programs timed on the rank, and their mean time in ns (`None` with
    /// fewer than `MIN_TIMED_RUNS`).
    #[serde(default)]
    pub timed_runs: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_ns: Option<f64>,
    /// The time the daemon's threads ran on the rank's CPU after taking it from the rank
    /// mid-burst, in ns, as the scheduler program measured it: time the rank lost, as a rank the
    /// daemon delays while it computes holds up the others at their next exchange.
    #[serde(default)]
    pub daemon_ns: u64,
}

/// Timed probe runs below which a rank's hits are costed at the node's cost among work.
const MIN_TIMED_RUNS: u64 = 32;

impl RankProbeCost {
    /// The hits of `functions`, at the node's cost of a hit `hit` scaled by the rank's timed
    /// probe runs `runs`.
    pub fn of<'a>(
        functions: impl IntoIterator<Item = &'a CallStats>,
        hit: ProbeCost,
        runs: TimedRuns,
    ) -> RankProbeCost {
        let run_ns = (runs.runs >= MIN_TIMED_RUNS)
            .then(|| runs.mean_ns())
            .flatten();
        let mut cost = RankProbeCost {
            full_hit_ns: run_ns
                .and_then(|run| hit_among(&hit, run))
                .unwrap_or(hit.full_among_work_ns),
            entry_hit_ns: hit.count_only_ns,
            timed_runs: runs.runs,
            run_ns,
            ..RankProbeCost::default()
        };
        for s in functions {
            if s.count_only || s.sampled {
                cost.storm_calls += s.calls;
            } else {
                cost.full_calls += s.calls;
            }
        }
        cost
    }

    /// The time the rank lost to the probes, in ns.
    pub fn lost_ns(&self) -> f64 {
        self.full_calls as f64 * self.full_hit_ns
    }

    /// The CPU the hits of polling storms took, in ns (inside waiting: not lost).
    pub fn storm_ns(&self) -> f64 {
        self.storm_calls as f64 * self.entry_hit_ns.unwrap_or(0.0)
    }
}

/// What a hit in full costs a rank whose timed probe runs took `run_ns` on average, on a node
/// where a hit back to back costs `hit.full_ns`, its programs' run `hit.run_back_to_back_ns`:
/// the rest of the hit is the trap, which the same work evicts as it evicts the programs, so
/// both slow alike and the whole hit scales by the runs' ratio. `None` without runs back to
/// back to compare with.
fn hit_among(hit: &ProbeCost, run_ns: f64) -> Option<f64> {
    let reference = hit.run_back_to_back_ns.filter(|&r| r > 0.0)?;
    Some(hit.full_ns * run_ns / reference)
}

/// What profiling cost a job's ranks, summed over those with an estimate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct JobProbeCost {
    /// Ranks with an estimate, and ranks without one (recorded by a daemon whose governor was off,
    /// which measures no probe cost).
    pub ranks: usize,
    pub ranks_unestimated: usize,
    pub full_calls: u64,
    pub storm_calls: u64,
    /// The time the ranks lost to probe hits, summed.
    pub lost_ns: u64,
    /// The time they lost to the daemon's CPU on their nodes, summed.
    pub daemon_ns: u64,
    /// The CPU the hits of polling storms took, summed.
    pub storm_ns: u64,
    /// The same ranks' regions of interest, summed: the run time the loss is a share of.
    pub runtime_ns: u64,
    /// `lost_ns` and `daemon_ns` over `runtime_ns`; `None` without an estimate or run time.
    pub share: Option<f64>,
}

impl JobProbeCost {
    /// The cost of `job`'s ranks up to `now_ns` (Unix ns).
    pub fn of(job: &Job, now_ns: u64) -> JobProbeCost {
        let mut out = JobProbeCost::default();
        for r in job.ranks.values() {
            let Some(cost) = &r.probe_cost else {
                out.ranks_unestimated += 1;
                continue;
            };
            out.ranks += 1;
            out.full_calls += cost.full_calls;
            out.storm_calls += cost.storm_calls;
            out.lost_ns += cost.lost_ns().round() as u64;
            out.daemon_ns += cost.daemon_ns;
            out.storm_ns += cost.storm_ns().round() as u64;
            out.runtime_ns += r.region_span(now_ns).map_or(0, |(s, e)| e - s);
        }
        out.share = (out.ranks > 0 && out.runtime_ns > 0)
            .then(|| (out.lost_ns + out.daemon_ns) as f64 / out.runtime_ns as f64);
        out
    }

    /// What a hit of a call probed in full cost, averaged over the calls (the ranks' nodes may
    /// differ); `None` without such calls.
    pub fn full_hit_ns(&self) -> Option<f64> {
        (self.full_calls > 0).then(|| self.lost_ns as f64 / self.full_calls as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        store::{RankRecord, RegionMarks},
        test_support::JobMetaBuilder,
    };

    fn stats(calls: u64, count_only: bool, sampled: bool) -> CallStats {
        CallStats {
            calls,
            count_only,
            sampled,
            ..CallStats::default()
        }
    }

    fn node_cost() -> ProbeCost {
        ProbeCost {
            full_ns: 1_000.0,
            count_only_ns: Some(900.0),
            full_among_work_ns: 2_000.0,
            work_bytes: 1 << 20,
            run_back_to_back_ns: Some(80.0),
            run_among_work_ns: Some(150.0),
        }
    }

    fn functions() -> [CallStats; 4] {
        [
            stats(1_000, false, false),
            stats(500, false, false),
            stats(10_000, true, false),
            stats(300, false, true),
        ]
    }

    #[test]
    fn calls_in_full_cost_a_hit_scaled_by_how_slow_the_rank_s_probes_ran_and_storms_one_back_to_back(
    ) {
        // The rank's probes ran 3 times as long as back to back: among its work, the trap path
        // and the programs ran cold.
        let runs = TimedRuns {
            runs: 100,
            ns: 24_000,
        };
        let cost = RankProbeCost::of(&functions(), node_cost(), runs);
        assert_eq!((cost.full_calls, cost.storm_calls), (1_500, 10_300));
        assert_eq!(cost.run_ns, Some(240.0));
        assert_eq!(cost.full_hit_ns, 3_000.0);
        assert_eq!(cost.lost_ns(), 4_500_000.0);
        assert_eq!(cost.storm_ns(), 9_270_000.0);
    }

    #[test]
    fn a_rank_with_few_timed_runs_costs_a_hit_among_the_node_s_work() {
        let few = TimedRuns {
            runs: MIN_TIMED_RUNS - 1,
            ns: 1_000_000,
        };
        let cost = RankProbeCost::of(&functions(), node_cost(), few);
        assert_eq!((cost.run_ns, cost.full_hit_ns), (None, 2_000.0));
        let unmeasured = ProbeCost {
            run_back_to_back_ns: None,
            ..node_cost()
        };
        let runs = TimedRuns {
            runs: 100,
            ns: 24_000,
        };
        let cost = RankProbeCost::of(&functions(), unmeasured, runs);
        assert_eq!(cost.full_hit_ns, 2_000.0);
    }

    #[test]
    fn a_job_sums_its_ranks_costs_over_their_run_time_and_names_the_ranks_without() {
        let mut job = crate::store::Job::new(JobMetaBuilder::new("pmix:1").size(3).build());
        for (rank, cost) in [
            (0, Some((1_000, 2_000.0))),
            (1, Some((3_000, 1_000.0))),
            (2, None),
        ] {
            job.ranks.insert(
                rank,
                RankRecord {
                    rank,
                    pid: 10 + rank,
                    first_seen_ns: 0,
                    ended_ns: Some(2_000_000_000),
                    totals: Default::default(),
                    functions: Default::default(),
                    call_sites: Vec::new(),
                    region: RegionMarks {
                        init_return_ns: Some(500_000_000),
                        finalize_entry_ns: Some(1_500_000_000),
                        ..RegionMarks::default()
                    },
                    probe_cost: cost.map(|(calls, hit)| RankProbeCost {
                        full_calls: calls,
                        full_hit_ns: hit,
                        entry_hit_ns: Some(hit / 2.0),
                        daemon_ns: 2_500_000,
                        ..RankProbeCost::default()
                    }),
                },
            );
        }
        let cost = JobProbeCost::of(&job, 3_000_000_000);
        assert_eq!((cost.ranks, cost.ranks_unestimated), (2, 1));
        assert_eq!((cost.lost_ns, cost.daemon_ns), (5_000_000, 5_000_000));
        assert_eq!(cost.runtime_ns, 2_000_000_000);
        assert_eq!(cost.share, Some(0.005));
        assert_eq!(cost.full_hit_ns(), Some(1_250.0));
    }
}
