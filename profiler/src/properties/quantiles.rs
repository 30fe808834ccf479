//! Quantiles over devices (ranks) with the percentile definition of Guillén (2015), §5.1, in this
//! precise form: with the N values sorted as x(1) ≤ … ≤ x(N), the k-th of n quantiles sits at
//! position h = N·k/n of the cdf; P_0 = x(1); if h < 1, P = x(1); else, with f = ⌊h⌋,
//! P = x(f) + (h − f)·(x(f+1) − x(f)) and x(N+1) := x(N). So P_n = x(N), the maximum. With n = 10
//! these are the 11 values of Guillén (2015) (minimum, deciles 1–9, maximum); together with the
//! average and the count they are its 13 numbers per property, job and interval.
//!
//! h is computed in integers (N·k, divided by n with remainder), so positions such as 1.6 are
//! exact.
//!
//! Quantiles of two nodes' ranks do not give those of all ranks. A [`RankHistogram`] does: counts
//! below fixed bounds, the same on every node for a unit ([`bucket_bounds`]), add up across
//! nodes, and the job-wide quantiles are interpolated from their sum (Prometheus's
//! `histogram_quantile`).

use serde::{Deserialize, Serialize};

/// The k-th of n quantiles of `sorted` (ascending, non-empty, k ≤ n).
pub fn quantile_of_sorted(sorted: &[f64], k: u32, n: u32) -> f64 {
    assert!(
        !sorted.is_empty() && n > 0 && k <= n,
        "quantile {k}/{n} of {} values",
        sorted.len()
    );
    let len = sorted.len() as u64;
    let position = len * k as u64;
    let f = (position / n as u64) as usize;
    let remainder = position % n as u64;
    if f == 0 {
        return sorted[0];
    }
    let low = sorted[f - 1];
    if remainder == 0 {
        return low;
    }
    let high = sorted[f.min(sorted.len() - 1)];
    low + (remainder as f64 / n as f64) * (high - low)
}

/// The n + 1 quantiles 0/n … n/n of `values` (any order). Empty input gives an empty vector.
pub fn quantiles(values: &[f64], n: u32) -> Vec<f64> {
    if values.is_empty() {
        return Vec::new();
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    (0..=n).map(|k| quantile_of_sorted(&sorted, k, n)).collect()
}

/// A distribution over devices: n + 1 quantiles (the first is the minimum, the last the
/// maximum), average, sum and count. Averages, sums and counts merge exactly across nodes;
/// quantiles do not (Guillén (2015), §5.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: u64,
    pub sum: f64,
    pub avg: f64,
    pub quantiles: Vec<f64>,
}

impl Summary {
    /// `None` for no values.
    pub fn of(values: &[f64], n: u32) -> Option<Summary> {
        if values.is_empty() {
            return None;
        }
        let sum: f64 = values.iter().sum();
        Some(Summary {
            count: values.len() as u64,
            sum,
            avg: sum / values.len() as f64,
            quantiles: quantiles(values, n),
        })
    }

    pub fn min(&self) -> f64 {
        self.quantiles[0]
    }

    pub fn max(&self) -> f64 {
        self.quantiles[self.quantiles.len() - 1]
    }
}

/// Upper bounds of the buckets of a unit's [`RankHistogram`]s: the same on every node, so that the
/// counts add up; `None` for units without one. Ratios in steps of 0.05, so quantiles
/// interpolated from the counts are within 0.05; counter ratios and frequencies over their usual
/// ranges.
pub fn bucket_bounds(unit: &str) -> Option<&'static [f64]> {
    match unit {
        "ratio" => Some(&[
            0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8,
            0.85, 0.9, 0.95, 1.0,
        ]),
        "cycles_per_instruction" => Some(&[
            0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 7.5, 10.0,
        ]),
        "events_per_instruction" => Some(&[
            1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1,
        ]),
        "hertz" => Some(&[
            1.0e9, 1.5e9, 2.0e9, 2.25e9, 2.5e9, 2.75e9, 3.0e9, 3.25e9, 3.5e9, 3.75e9, 4.0e9, 4.5e9,
            5.0e9,
        ]),
        _ => None,
    }
}

/// How many values lie at or below each of fixed upper bounds (cumulative, as Prometheus's
/// histogram buckets; the values above the last bound count only in the total, which is the
/// [`Summary`]'s count). Mergeable: the counts of several nodes' ranks add up to those of all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankHistogram {
    pub upper_bounds: Vec<f64>,
    pub cumulative_counts: Vec<u64>,
}

impl RankHistogram {
    pub fn of(values: &[f64], upper_bounds: &[f64]) -> RankHistogram {
        RankHistogram {
            upper_bounds: upper_bounds.to_vec(),
            cumulative_counts: upper_bounds
                .iter()
                .map(|&le| values.iter().filter(|&&v| v <= le).count() as u64)
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close_all(a: &[f64], b: &[f64]) -> bool {
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
    }

    /// Worked examples of the decile definition: five 1s and five 10s split at the median, and the
    /// ramp 1..16.
    #[test]
    fn v2_decile_definition() {
        let split: Vec<f64> = [1.0; 5].into_iter().chain([10.0; 5]).collect();
        assert_eq!(
            quantiles(&split, 10),
            [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 10.0, 10.0, 10.0, 10.0, 10.0]
        );
        let ramp: Vec<f64> = (1..=16).map(f64::from).collect();
        let deciles = quantiles(&ramp, 10);
        assert!(
            close_all(
                &deciles,
                &[1.0, 1.6, 3.2, 4.8, 6.4, 8.0, 9.6, 11.2, 12.8, 14.4, 16.0]
            ),
            "{deciles:?}"
        );
        // Order of the input does not matter.
        let reversed: Vec<f64> = ramp.iter().rev().copied().collect();
        assert_eq!(quantiles(&reversed, 10), deciles);
    }

    #[test]
    fn endpoints_are_min_and_max_for_any_count() {
        for n in [1u32, 4, 5, 10, 100] {
            for len in 1..40usize {
                let values: Vec<f64> = (0..len).map(|i| ((i * 7919) % 31) as f64).collect();
                let q = quantiles(&values, n);
                assert_eq!(q.len(), n as usize + 1);
                assert_eq!(q[0], values.iter().copied().fold(f64::INFINITY, f64::min));
                assert_eq!(
                    q[n as usize],
                    values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
                );
                assert!(q.windows(2).all(|w| w[0] <= w[1]), "monotone: {q:?}");
            }
        }
    }

    #[test]
    fn positions_below_one_take_the_minimum() {
        // N = 3, deciles: h = 0.3, 0.6, 0.9 → x(1); h = 1.2 → x(1) + 0.2·(x(2) − x(1)).
        let q = quantiles(&[10.0, 20.0, 30.0], 10);
        assert_eq!(&q[..4], &[10.0, 10.0, 10.0, 10.0]);
        assert!((q[4] - 12.0).abs() < 1e-12);
        assert_eq!(q[10], 30.0);
    }

    #[test]
    fn summary_of_values() {
        let s = Summary::of(&[2.0, 4.0], 10).unwrap();
        assert_eq!(
            (s.count, s.sum, s.avg, s.min(), s.max()),
            (2, 6.0, 3.0, 2.0, 4.0)
        );
        assert!(Summary::of(&[], 10).is_none());
    }

    #[test]
    fn histograms_of_two_nodes_add_up_to_the_histogram_of_all_ranks() {
        let bounds = bucket_bounds("ratio").unwrap();
        let (a, b) = ([0.1, 0.12, 0.97], [0.5, 1.0, 0.05, 0.3]);
        let all: Vec<f64> = a.iter().chain(&b).copied().collect();
        let (a, b, all) = (
            RankHistogram::of(&a, bounds),
            RankHistogram::of(&b, bounds),
            RankHistogram::of(&all, bounds),
        );
        let summed: Vec<u64> = a
            .cumulative_counts
            .iter()
            .zip(&b.cumulative_counts)
            .map(|(x, y)| x + y)
            .collect();
        assert_eq!(summed, all.cumulative_counts);
        // Cumulative: at most 0.05 one value, up to 1 all seven.
        assert_eq!(all.cumulative_counts.first(), Some(&1));
        assert_eq!(all.cumulative_counts.last(), Some(&7));
        assert!(bucket_bounds("bytes").is_none());
    }
}
