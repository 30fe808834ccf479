//! Clustering cost on one thread: DBSCAN with one Eps and full ACR (k-dist, every DBSCAN step,
//! every Cluster Sequence Score, merges) on 10⁴, 10⁵ and 10⁶ bursts with [ln instructions, IPC]
//! features. The design budget is 10⁵ bursts in ≤ 1 s for ACR.
//!
//! The bursts come from a synthetic SPMD loop on 32 ranks: seven phases with tight and dispersed
//! clouds, one alternating with the iteration parity, one with an imbalanced rank, one run by a
//! quarter of the ranks only (so one cluster never scores 1 and ACR runs all its steps), and 1 %
//! outliers. Every burst is analysed (no duration filter); each rank's sequence holds about
//! n / 32 bursts.
//!
//! Run: `cargo run --release -p profiler --example bench_cluster`

use std::time::{Duration, Instant};

use mpiburst::analysis::synthetic::{Phase, SyntheticJob};
use mpiburst::analysis::{
    acr, dbscan, default_min_points, epsilon_steps, k_distances, kdist_neighbours, prepare,
    AnalysisParams, DurationFilter,
};

const RANKS: u32 = 32;
const ACR_STEPS: usize = 10;

fn job(bursts: usize) -> SyntheticJob {
    let phases = vec![
        Phase::new(2e6, 1.8, 0.02),
        Phase::new(8e6, 0.7, 0.05),
        Phase {
            odd_iteration_factor: 1.2,
            ..Phase::new(3e7, 1.2, 0.02)
        },
        Phase::new(5e5, 2.2, 0.03),
        Phase::new(1.2e8, 0.5, 0.25),
        Phase {
            imbalance: Some((3, 1.4)),
            ..Phase::new(4e6, 1.0, 0.03)
        },
        Phase {
            run_by: Some(RANKS / 4),
            ..Phase::new(6e6, 0.4, 0.1)
        },
    ];
    let bursts_per_iteration: usize = phases
        .iter()
        .map(|p| p.run_by.unwrap_or(RANKS) as usize)
        .sum();
    let iterations = (bursts / bursts_per_iteration) as u32;
    SyntheticJob {
        ranks: RANKS,
        iterations,
        phases,
        tiny_bursts_per_phase: 0,
        outlier_share: 0.01,
        counters: true,
        seed: 2024,
    }
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let start = Instant::now();
    let out = f();
    (out, start.elapsed())
}

fn main() {
    println!(
        "{RANKS} ranks, [ln instructions, IPC], MinPoints {}, ACR with {ACR_STEPS} Eps steps",
        default_min_points(RANKS as usize)
    );
    println!();
    println!(
        "| bursts    | DBSCAN (largest Eps) | ACR (full)  | ACR steps | clusters | global CSS |"
    );
    println!(
        "|-----------|----------------------|-------------|-----------|----------|------------|"
    );
    for size in [10_000, 100_000, 1_000_000] {
        let bursts = job(size).bursts();
        let params = AnalysisParams {
            duration_filter: DurationFilter::MinDurationNs(0),
            ..AnalysisParams::default()
        };
        let prepared = prepare(&bursts, RANKS, &params).expect("synthetic bursts are valid");
        let points = &prepared.features.points;
        let min_points = default_min_points(RANKS as usize);

        // The DBSCAN row uses the largest Eps ACR would try: the largest neighbourhoods.
        let eps = epsilon_steps(
            &k_distances(points, kdist_neighbours(min_points, points.len())),
            ACR_STEPS,
        );
        let largest_eps = *eps.last().expect("non-empty point set");
        let (_, dbscan_time) = timed(|| dbscan(points, largest_eps, min_points));
        // No Eps floor: the benchmark times the k-dist Eps list itself.
        let (outcome, acr_time) =
            timed(|| acr(points, &prepared.sequences, ACR_STEPS, min_points, 0.0));

        let clusters = outcome
            .score
            .symbols()
            .filter(|&id| id != mpiburst::analysis::NOISE)
            .count();
        println!(
            "| {:>9} | {:>17.1} ms | {:>8.1} ms | {:>9} | {:>8} | {:>10.4} |",
            points.len(),
            dbscan_time.as_secs_f64() * 1e3,
            acr_time.as_secs_f64() * 1e3,
            outcome.report.steps.len(),
            clusters,
            outcome.score.global(),
        );
    }
}
