//! POP efficiencies and the mergeable per-job aggregates they are computed from.
//!
//! Both the node-local values and the job-wide ones use [`JobAggregates::pop`]: locally over
//! this node's ranks, job-wide over the aggregates of all nodes merged with
//! [`JobAggregates::merge`] (or, equivalently, by Prometheus recording rules using `sum` and
//! `max` across instances). Because sum, count, min and max merge exactly, the job-wide values
//! are exact, not estimates.

use serde::{Deserialize, Serialize};

use super::engine::NO_PMU;
use super::inputs::RankSample;

/// A value that may be absent, saying why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Reading {
    Measured {
        value: f64,
    },
    /// The source does not exist here (e.g. "not measured (no PMU)").
    NotMeasured {
        reason: String,
    },
    /// The source exists but the span holds nothing to compute the value from.
    NoData {
        reason: String,
    },
}

impl Reading {
    pub fn value(&self) -> Option<f64> {
        match self {
            Reading::Measured { value } => Some(*value),
            _ => None,
        }
    }
    fn no_data(reason: &str) -> Reading {
        Reading::NoData {
            reason: reason.to_string(),
        }
    }
}

/// Sum, count, minimum and maximum of one per-rank quantity: exactly mergeable across nodes.
/// Empty (count 0) has sum, min and max 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Aggregate {
    pub count: u64,
    pub sum: f64,
    pub min: f64,
    pub max: f64,
}

impl Aggregate {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Aggregate {
        let mut a = Aggregate::default();
        for v in values {
            a.add(v);
        }
        a
    }

    pub fn add(&mut self, value: f64) {
        self.merge(&Aggregate {
            count: 1,
            sum: value,
            min: value,
            max: value,
        });
    }

    pub fn merge(&mut self, other: &Aggregate) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *other;
            return;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// `None` when empty.
    pub fn mean(&self) -> Option<f64> {
        (self.count > 0).then(|| self.sum / self.count as f64)
    }
}

/// The mergeable aggregates of one job on one node (or merged over nodes). Times in seconds,
/// one observation per rank. Export each field's sum, count, min and max; job-wide values are
/// then `sum(sum) / sum(count)` for means, `max(max)` and `min(min)` across instances.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobAggregates {
    /// Per-rank useful time (region of interest minus MPI time, see [`RankSample`]).
    pub useful_seconds: Aggregate,
    /// Per-rank on-CPU time inside bursts.
    pub useful_oncpu_seconds: Aggregate,
    /// Per-rank time in MPI inside the region of interest.
    pub mpi_seconds: Aggregate,
    /// Per-rank region of interest inside the span (see [`RankSample::runtime_ns`]).
    pub runtime_seconds: Aggregate,
    /// Per-rank compute rate: on-CPU seconds inside bursts per second of run time (ranks with
    /// run time only). Per node, `sum / count` is the node average whose max − min over nodes is
    /// the inter-node imbalance (Guillén (2015), Eq. 3.10, with this work metric).
    pub compute_rate: Aggregate,
    /// Per-rank instructions and cycles inside bursts: `None` unless every rank has counters.
    pub instructions: Option<Aggregate>,
    pub cycles: Option<Aggregate>,
    /// Ranks without counters (so `instructions` is `None` when this is above 0).
    pub ranks_without_counters: u64,
}

impl JobAggregates {
    /// The aggregates of the ranks whose region of interest overlaps the span: a rank that had
    /// not returned from MPI_Init, or had entered MPI_Finalize before the span, is left out.
    pub fn from_ranks(ranks: &[RankSample]) -> JobAggregates {
        let ranks: Vec<&RankSample> = ranks.iter().filter(|r| r.runtime_ns > 0).collect();
        let secs = |ns: u64| ns as f64 / 1e9;
        let counters: Option<Vec<_>> = ranks.iter().map(|r| r.pmu).collect();
        let (instructions, cycles) = match counters {
            Some(c) if !ranks.is_empty() => (
                Some(Aggregate::of(c.iter().map(|c| c.instructions as f64))),
                Some(Aggregate::of(c.iter().map(|c| c.cycles as f64))),
            ),
            _ => (None, None),
        };
        JobAggregates {
            useful_seconds: Aggregate::of(ranks.iter().map(|r| secs(r.useful_ns))),
            useful_oncpu_seconds: Aggregate::of(ranks.iter().map(|r| secs(r.useful_oncpu_ns))),
            mpi_seconds: Aggregate::of(ranks.iter().map(|r| secs(r.mpi_ns))),
            runtime_seconds: Aggregate::of(ranks.iter().map(|r| secs(r.runtime_ns))),
            compute_rate: Aggregate::of(
                ranks
                    .iter()
                    .map(|r| r.useful_oncpu_ns as f64 / r.runtime_ns as f64),
            ),
            instructions,
            cycles,
            ranks_without_counters: ranks.iter().filter(|r| r.pmu.is_none()).count() as u64,
        }
    }

    /// Merges another node's aggregates of the same job (and span).
    pub fn merge(&mut self, other: &JobAggregates) {
        let empty = self.useful_seconds.count == 0;
        self.useful_seconds.merge(&other.useful_seconds);
        self.useful_oncpu_seconds.merge(&other.useful_oncpu_seconds);
        self.mpi_seconds.merge(&other.mpi_seconds);
        self.runtime_seconds.merge(&other.runtime_seconds);
        self.compute_rate.merge(&other.compute_rate);
        let merge_counters =
            |mine: Option<Aggregate>, theirs: Option<Aggregate>, their_count: u64| {
                match (empty, mine, theirs) {
                    (true, _, theirs) => theirs,
                    (false, Some(mut m), Some(t)) => {
                        m.merge(&t);
                        Some(m)
                    }
                    // Ranks without counters on either side: not measured for the job.
                    (false, Some(m), None) if their_count == 0 => Some(m),
                    _ => None,
                }
            };
        let their_count = other.useful_seconds.count;
        self.instructions = merge_counters(self.instructions, other.instructions, their_count);
        self.cycles = merge_counters(self.cycles, other.cycles, their_count);
        self.ranks_without_counters += other.ranks_without_counters;
    }

    /// The POP efficiencies of these aggregates.
    pub fn pop(&self) -> PopEfficiencies {
        let ranks = self.useful_seconds.count;
        let useful_mean = self.useful_seconds.mean();
        let useful_max = self.useful_seconds.max;
        let runtime = self.runtime_seconds.max;
        let (load_balance, communication_efficiency, parallel_efficiency) = match useful_mean {
            None => {
                let r = Reading::no_data("no ranks in the span");
                (r.clone(), r.clone(), r)
            }
            Some(_) if useful_max <= 0.0 => {
                let r = Reading::no_data("no useful computation in the span");
                (r.clone(), r.clone(), r)
            }
            Some(mean) => {
                let lb = mean / useful_max;
                // runtime ≥ useful time of every rank by construction, so runtime > 0 here.
                let ce = useful_max / runtime;
                (
                    Reading::Measured { value: lb },
                    Reading::Measured { value: ce },
                    Reading::Measured { value: lb * ce },
                )
            }
        };
        let (instructions, ipc) = match (&self.instructions, &self.cycles) {
            (Some(i), Some(c)) => (
                Reading::Measured { value: i.sum },
                if c.sum > 0.0 {
                    Reading::Measured {
                        value: i.sum / c.sum,
                    }
                } else {
                    Reading::no_data("no cycles counted in the span")
                },
            ),
            _ => {
                let reason = if ranks == 0 {
                    Reading::no_data("no ranks in the span")
                } else if self.ranks_without_counters == ranks {
                    Reading::NotMeasured {
                        reason: NO_PMU.to_string(),
                    }
                } else {
                    Reading::NotMeasured {
                        reason: format!(
                            "not measured (no PMU counters for {} of {ranks} ranks)",
                            self.ranks_without_counters
                        ),
                    }
                };
                (reason.clone(), reason)
            }
        };
        PopEfficiencies {
            ranks,
            runtime_seconds: runtime,
            useful_mean_seconds: useful_mean.unwrap_or(0.0),
            useful_max_seconds: useful_max,
            load_balance,
            communication_efficiency,
            parallel_efficiency,
            instructions,
            ipc,
        }
    }
}

/// POP efficiencies over a set of ranks (one node's, or the whole job's after merging):
/// U_i = useful time of rank i, R_i = its run time, m = number of ranks,
/// LB = (Σ U_i / m) / max U_i, CommE = max U_i / max R_i, PE = LB × CommE = mean U / max R.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PopEfficiencies {
    pub ranks: u64,
    /// max R_i: the run time of the set of ranks.
    pub runtime_seconds: f64,
    pub useful_mean_seconds: f64,
    pub useful_max_seconds: f64,
    pub load_balance: Reading,
    pub communication_efficiency: Reading,
    pub parallel_efficiency: Reading,
    /// Σ instructions inside bursts (with a PMU).
    pub instructions: Reading,
    /// Σ instructions ÷ Σ cycles inside bursts (with a PMU).
    pub ipc: Reading,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::properties::inputs::PmuCounters;

    const S: u64 = 1_000_000_000;

    fn rank(rank: u32, useful: u64, mpi: u64, runtime: u64) -> RankSample {
        RankSample {
            rank,
            runtime_ns: runtime,
            useful_ns: useful,
            useful_oncpu_ns: useful,
            mpi_ns: mpi,
            ..RankSample::default()
        }
    }

    #[test]
    fn pop_definitions() {
        let ranks = [rank(0, S, 9 * S, 10 * S), rank(1, 10 * S, 0, 10 * S)];
        let pop = JobAggregates::from_ranks(&ranks).pop();
        assert!((pop.load_balance.value().unwrap() - 0.55).abs() < 1e-12);
        assert_eq!(pop.communication_efficiency.value(), Some(1.0));
        assert!((pop.parallel_efficiency.value().unwrap() - 0.55).abs() < 1e-12);
        assert_eq!(
            pop.ipc,
            Reading::NotMeasured {
                reason: NO_PMU.into()
            }
        );
        assert_eq!(pop.instructions.value(), None);

        // Everybody waits half of the time: balanced, CommE 0.5.
        let pop = JobAggregates::from_ranks(&[
            rank(0, 5 * S, 5 * S, 10 * S),
            rank(1, 5 * S, 5 * S, 10 * S),
        ])
        .pop();
        assert_eq!(pop.load_balance.value(), Some(1.0));
        assert_eq!(pop.communication_efficiency.value(), Some(0.5));

        assert!(matches!(
            JobAggregates::from_ranks(&[]).pop().load_balance,
            Reading::NoData { .. }
        ));
        assert!(matches!(
            JobAggregates::from_ranks(&[rank(0, 0, S, S)])
                .pop()
                .parallel_efficiency,
            Reading::NoData { .. }
        ));
    }

    /// Merging per-node aggregates gives exactly the values over all ranks: what the Prometheus
    /// recording rules compute with sum/max across instances.
    #[test]
    fn merged_node_aggregates_equal_the_job_wide_values() {
        let pmu = |i: u64| {
            Some(PmuCounters {
                instructions: 1000 * i,
                cycles: 700 * i,
                ..Default::default()
            })
        };
        let all: Vec<RankSample> = (0..6u32)
            .map(|i| RankSample {
                pmu: pmu(i as u64 + 1),
                ..rank(i, (i as u64 + 1) * S, 2 * S, 9 * S + i as u64 * S / 4)
            })
            .collect();
        let whole = JobAggregates::from_ranks(&all);
        let mut merged = JobAggregates::from_ranks(&all[..2]);
        merged.merge(&JobAggregates::from_ranks(&all[2..5]));
        merged.merge(&JobAggregates::from_ranks(&all[5..]));
        assert_eq!(merged.useful_seconds.count, 6);
        let (a, b) = (whole.pop(), merged.pop());
        for (x, y) in [
            (&a.load_balance, &b.load_balance),
            (&a.communication_efficiency, &b.communication_efficiency),
            (&a.parallel_efficiency, &b.parallel_efficiency),
            (&a.ipc, &b.ipc),
            (&a.instructions, &b.instructions),
        ] {
            assert!(
                (x.value().unwrap() - y.value().unwrap()).abs() < 1e-12,
                "{x:?} vs {y:?}"
            );
        }
        // A node without counters makes the job-wide IPC not measured, never a partial number.
        let mut partial = JobAggregates::from_ranks(&all[..2]);
        partial.merge(&JobAggregates::from_ranks(&[rank(9, S, S, 2 * S)]));
        assert!(matches!(partial.pop().ipc, Reading::NotMeasured { .. }));
        assert!(partial.pop().load_balance.value().is_some());
    }

    #[test]
    fn aggregates_merge_exactly_and_ignore_empty_sides() {
        let mut a = Aggregate::of([1.0, 5.0]);
        a.merge(&Aggregate::default());
        a.merge(&Aggregate::of([3.0]));
        assert_eq!(
            a,
            Aggregate {
                count: 3,
                sum: 9.0,
                min: 1.0,
                max: 5.0
            }
        );
        let mut empty = Aggregate::default();
        empty.merge(&a);
        assert_eq!(empty, a);
        assert_eq!(Aggregate::default().mean(), None);
    }
}
