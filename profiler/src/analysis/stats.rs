//! Per-cluster statistics (the characterisation tables 4.2 and 9.x of González García (2013)).

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use super::css::{RankSequences, SequenceScore};
use super::points::Coords;
use super::{ClusterId, NOISE};
use crate::model::{Burst, CallSite};

/// Burst duration quantiles, from an HDR histogram with 3 significant digits (the maximum is
/// exact).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DurationQuantiles {
    pub p10_ns: u64,
    pub p50_ns: u64,
    pub p90_ns: u64,
    pub p99_ns: u64,
    pub max_ns: u64,
}

/// A code region (the call sites around a burst) and how many of a cluster's bursts ran it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionCount {
    pub start: CallSite,
    pub end: CallSite,
    pub bursts: u64,
}

/// One cluster (or the noise, id 0).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterStats {
    pub id: ClusterId,
    pub bursts: u64,
    pub time_ns: u64,
    /// Share of all burst time given to the analysis, filtered bursts included, so that the
    /// clusters, the noise and the filter's share add up to 1.
    pub time_share: f64,
    pub duration: DurationQuantiles,
    /// Counter statistics only when every burst of the cluster carries counters.
    pub instructions_mean: Option<f64>,
    /// Σ instructions ÷ Σ cycles (not the mean of per-burst IPCs, which short bursts would skew).
    pub ipc: Option<f64>,
    /// Load balance of the cluster's time: mean over the job's ranks of each rank's total time in
    /// the cluster, divided by the largest such total. Ranks that never run the cluster count as
    /// 0 in the mean, so a phase run by half of the ranks has at most 0.5. 1 when the cluster has
    /// no time at all. Wall time, as in González García (2013) and in the job's POP load balance:
    /// a rank descheduled inside the phase makes the others wait just as slower work would; the
    /// on-CPU share property tells the two apart.
    pub lb_duration: f64,
    /// The same over instructions.
    pub lb_instructions: Option<f64>,
    /// Mean raw feature values (before normalisation, logs applied), in the order of the
    /// feature report's ranges.
    pub centroid: Vec<f64>,
    /// Code regions, by decreasing burst count.
    pub regions: Vec<RegionCount>,
    /// Cluster Sequence Score. For the noise it is reported but never enters the global score.
    pub spmd_score: f64,
}

/// What the statistics are computed from: point i is burst `burst_of[i]`.
pub(crate) struct StatsInput<'a> {
    pub bursts: &'a [Burst],
    pub burst_of: &'a [usize],
    pub labels: &'a [ClusterId],
    pub raw: &'a [Coords],
    pub dims: usize,
    pub sequences: &'a RankSequences,
    pub score: &'a SequenceScore,
    pub time_in_ns: u64,
}

/// Statistics of every cluster (ascending id) and of the noise, if any.
pub(crate) fn cluster_stats(input: &StatsInput<'_>) -> (Vec<ClusterStats>, Option<ClusterStats>) {
    let mut members: BTreeMap<ClusterId, Vec<usize>> = BTreeMap::new();
    for (point, &label) in input.labels.iter().enumerate() {
        members.entry(label).or_default().push(point);
    }
    let mut noise = None;
    let mut clusters = Vec::new();
    for (id, points) in members {
        let stats = one_cluster(input, id, &points);
        if id == NOISE {
            noise = Some(stats);
        } else {
            clusters.push(stats);
        }
    }
    (clusters, noise)
}

fn one_cluster(input: &StatsInput<'_>, id: ClusterId, points: &[usize]) -> ClusterStats {
    let burst = |p: usize| &input.bursts[input.burst_of[p]];
    let ranks = input.sequences.ranks();

    let mut histogram = Histogram::<u64>::new(3).expect("3 significant digits is valid");
    let mut time_ns = 0u64;
    let mut max_ns = 0u64;
    let mut time_per_rank = vec![0u64; ranks];
    for &p in points {
        let d = burst(p).duration_ns;
        histogram
            .record(d)
            .expect("auto-resizing histogram accepts any u64");
        time_ns += d;
        max_ns = max_ns.max(d);
        time_per_rank[input.sequences.rank_of(p) as usize] += d;
    }

    let counters: Option<Vec<_>> = points.iter().map(|&p| burst(p).counters).collect();
    let (instructions_mean, ipc, lb_instructions) = match counters {
        Some(counters) => {
            let instructions: u64 = counters.iter().map(|c| c.instructions).sum();
            let cycles: u64 = counters.iter().map(|c| c.cycles).sum();
            let mut instructions_per_rank = vec![0u64; ranks];
            for (&p, c) in points.iter().zip(&counters) {
                instructions_per_rank[input.sequences.rank_of(p) as usize] += c.instructions;
            }
            (
                Some(instructions as f64 / points.len() as f64),
                (cycles > 0).then(|| instructions as f64 / cycles as f64),
                Some(load_balance(&instructions_per_rank)),
            )
        }
        None => (None, None, None),
    };

    let mut regions: BTreeMap<(&CallSite, &CallSite), u64> = BTreeMap::new();
    for &p in points {
        *regions.entry(burst(p).region()).or_default() += 1;
    }
    let mut regions: Vec<RegionCount> = regions
        .into_iter()
        .map(|((start, end), bursts)| RegionCount {
            start: start.clone(),
            end: end.clone(),
            bursts,
        })
        .collect();
    regions.sort_by_key(|r| std::cmp::Reverse(r.bursts));

    let centroid = (0..input.dims)
        .map(|d| points.iter().map(|&p| input.raw[p][d]).sum::<f64>() / points.len() as f64)
        .collect();

    ClusterStats {
        id,
        bursts: points.len() as u64,
        time_ns,
        time_share: if input.time_in_ns == 0 {
            0.0
        } else {
            time_ns as f64 / input.time_in_ns as f64
        },
        duration: DurationQuantiles {
            p10_ns: histogram.value_at_quantile(0.10),
            p50_ns: histogram.value_at_quantile(0.50),
            p90_ns: histogram.value_at_quantile(0.90),
            p99_ns: histogram.value_at_quantile(0.99),
            max_ns,
        },
        instructions_mean,
        ipc,
        lb_duration: load_balance(&time_per_rank),
        lb_instructions,
        centroid,
        regions,
        spmd_score: input.score.score(id).unwrap_or(0.0),
    }
}

/// mean ÷ max over ranks; 1 when every total is 0.
fn load_balance(per_rank: &[u64]) -> f64 {
    let max = per_rank.iter().copied().max().unwrap_or(0);
    if max == 0 {
        return 1.0;
    }
    per_rank.iter().map(|&x| x as f64).sum::<f64>() / per_rank.len() as f64 / max as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_balance_counts_absent_ranks_as_zero() {
        assert_eq!(load_balance(&[10, 10, 10, 10]), 1.0);
        assert_eq!(load_balance(&[15, 10, 10, 10]), 45.0 / 4.0 / 15.0);
        assert_eq!(load_balance(&[10, 10, 0, 0]), 0.5);
        assert_eq!(load_balance(&[0, 0]), 1.0);
    }
}
