//! End-to-end oracles after the evaluation of González García (2013), chapters 4–6, on synthetic
//! SPMD jobs: E1 distinct phases give perfect clusters, E2 an imbalanced rank joins its phase, E3
//! a phase alternating with the iteration's parity gives two alternating clusters (Table 4.4), E5
//! a too small Eps scores lower (Table 5.1).

use super::synthetic::{Phase, SplitMix64, SyntheticJob};
use super::*;
use crate::model::{CallSite, HwCounters, Name};

/// E1's loop ([`SyntheticJob::three_phases`]) for 50 iterations, with three tiny bursts after
/// each phase and a seed of its own for each number of ranks.
fn e1_job(ranks: u32, counters: bool) -> SyntheticJob {
    SyntheticJob {
        tiny_bursts_per_phase: 3,
        seed: 0x5eed ^ u64::from(ranks),
        ..SyntheticJob::three_phases(ranks, 50, counters)
    }
}

fn analyse_job(job: &SyntheticJob) -> (Vec<Burst>, Analysis) {
    let bursts = job.bursts();
    let analysis =
        analyse(&bursts, job.ranks, &AnalysisParams::default()).expect("analysis succeeds");
    (bursts, analysis)
}

/// ACR without the resolution floor on Eps.
fn thesis_acr() -> AnalysisParams {
    AnalysisParams {
        clustering: ClusteringMethod::Acr {
            steps: 10,
            min_points: None,
            resolution: 0.0,
        },
        ..AnalysisParams::default()
    }
}

/// The phase (index into the job's phases) of a cluster, from the region its bursts run: phase k
/// starts at the collective at offset 0x1000·k.
fn phases_of(cluster: &ClusterStats) -> Vec<u64> {
    let mut phases: Vec<u64> = cluster
        .regions
        .iter()
        .map(|r| r.start.offset / 0x1000)
        .collect();
    phases.sort_unstable();
    phases.dedup();
    phases
}

fn assert_perfect_phases(analysis: &Analysis, expected_phases_by_id: &[u64], context: &str) {
    let phases: Vec<Vec<u64>> = analysis.clusters.iter().map(phases_of).collect();
    let expected: Vec<Vec<u64>> = expected_phases_by_id.iter().map(|&p| vec![p]).collect();
    assert_eq!(phases, expected, "{context}: phases of clusters 1, 2, …");
    for cluster in &analysis.clusters {
        assert_eq!(cluster.spmd_score, 1.0, "{context}: cluster {}", cluster.id);
    }
    assert!(
        analysis.noise.is_none(),
        "{context}: noise {:?}",
        analysis.noise
    );
    assert!(
        (analysis.global_score - 1.0).abs() < 1e-9,
        "{context}: global {}",
        analysis.global_score
    );
    assert!(
        analysis
            .clusters
            .windows(2)
            .all(|w| w[0].time_ns >= w[1].time_ns),
        "{context}: numbered by time"
    );
}

#[test]
fn e1_three_phases_give_three_perfect_clusters() {
    for counters in [true, false] {
        for ranks in [2, 4, 8] {
            let (_, analysis) = analyse_job(&e1_job(ranks, counters));
            let context = format!("{ranks} ranks, counters {counters}");
            let expected_set = if counters {
                FeatureSet::InstructionsIpc
            } else {
                FeatureSet::OnCpuTimePerRegion
            };
            assert_eq!(analysis.features.used, expected_set, "{context}");
            // Phase 2 (2·10⁷ instructions) holds the most time, then phase 1, then phase 0.
            assert_perfect_phases(&analysis, &[2, 1, 0], &context);
            for cluster in &analysis.clusters {
                assert_eq!(
                    cluster.bursts,
                    50 * u64::from(ranks),
                    "{context}: cluster {}",
                    cluster.id
                );
                assert!(
                    cluster.lb_duration > 0.95,
                    "{context}: cluster {} LB {}",
                    cluster.id,
                    cluster.lb_duration
                );
                assert_eq!(cluster.ipc.is_some(), counters, "{context}");
            }
            // The tiny bursts are filtered, and they hold well under 1 % of the time.
            assert_eq!(
                analysis.filter.bursts_kept,
                150 * u64::from(ranks),
                "{context}"
            );
            assert!(analysis.filter.time_filtered_share < 0.01, "{context}");
        }
    }
}

#[test]
fn e1_cluster_statistics_match_the_phases() {
    let (_, analysis) = analyse_job(&e1_job(4, true));
    let top = &analysis.clusters[0];
    let ipc = top.ipc.expect("counters");
    assert!((ipc - 1.2).abs() < 0.01, "IPC {ipc}");
    let instructions = top.instructions_mean.expect("counters");
    assert!(
        (instructions / 2e7 - 1.0).abs() < 0.01,
        "instructions {instructions}"
    );
    // 2·10⁷ / 1.2 / 2.5 GHz = 6.67 ms, jitter ±6 %.
    assert!(
        top.duration.p50_ns > 6_300_000 && top.duration.p50_ns < 7_000_000,
        "{:?}",
        top.duration
    );
    assert!(
        top.duration.p10_ns <= top.duration.p50_ns && top.duration.p99_ns <= top.duration.max_ns
    );
    assert_eq!(top.regions.len(), 1);
    assert_eq!(top.regions[0].bursts, 200);
    let shares: f64 = analysis.clusters.iter().map(|c| c.time_share).sum::<f64>()
        + analysis.filter.time_filtered_share;
    assert!((shares - 1.0).abs() < 1e-9, "shares add up to {shares}");
}

#[test]
fn e2_imbalanced_rank_joins_its_phase_cluster() {
    for counters in [true, false] {
        for ranks in [2u32, 4, 8] {
            let mut job = e1_job(ranks, counters);
            job.phases[1].imbalance = Some((0, 1.5));
            let (_, analysis) = analyse_job(&job);
            let context = format!("{ranks} ranks, counters {counters}");
            // Rank 0's phase-1 bursts are ln 1.5 away from the others', far beyond every Eps of
            // the list, so DBSCAN keeps them apart at every step: a majority cluster in m − 1
            // ranks and rank 0's own cluster (sometimes two, when density splits its 50
            // instances), in the same aligned columns.
            // * m ≥ 4: the majority holds more than half of each such column, so column-majority
            //   absorption moves rank 0's instances into it at the first step, and the phase is
            //   frozen as one perfect cluster.
            // * m = 2: one rank against one is no majority; both clusters score 1/2 through all
            //   steps, and the final sequence-based merge joins them (rank 0's cluster appears
            //   only in the other one's columns).
            // * Without counters, the two clusters are one code region split along rank lines,
            //   which the step's rank-split merge joins at once, before any absorption.
            assert_perfect_phases(&analysis, &[2, 1, 0], &context);
            let phase = &analysis.clusters[1];
            let merges = &analysis.clustering.sequence_merges;
            if !counters {
                assert!(merges.is_empty(), "{context}: {merges:?}");
                assert!(
                    analysis.clustering.region_variants_merged >= 1,
                    "{context}: {:?}",
                    analysis.clustering
                );
            } else if ranks == 2 {
                assert_eq!(merges.len(), 1, "{context}");
                assert_eq!(merges[0].cluster, phase.id, "{context}");
                assert!(merges[0].parts >= 2, "{context}");
                let last = analysis.clustering.steps.last().expect("steps ran");
                assert_eq!(
                    (last.clusters, last.perfect_clusters),
                    (2 + merges[0].parts, 2),
                    "{context}"
                );
            } else {
                assert!(merges.is_empty(), "{context}: {merges:?}");
                assert!(analysis.clustering.absorbed_by_column >= 50, "{context}");
            }
            let m = f64::from(ranks);
            let expected = (1.0 + 0.5 / m) / 1.5;
            assert!(
                (phase.lb_duration - expected).abs() <= 0.03,
                "{context}: LB_dur {} vs {expected}",
                phase.lb_duration
            );
            if counters {
                let lb_inst = phase.lb_instructions.expect("counters");
                assert!(
                    (lb_inst - expected).abs() <= 0.03,
                    "{context}: LB_inst {lb_inst}"
                );
            }
        }
    }
}

#[test]
fn a_phase_split_along_rank_lines_is_one_phase_with_its_imbalance() {
    // Half the ranks share cores and evict each other's caches: phase 1 takes 1.5 times longer
    // on them, the same instructions at a lower IPC. Without counters its bursts fall into one
    // cluster per half, each on its own ranks in the same columns: one phase, imbalanced.
    for ranks in [2u32, 4, 8] {
        let mut job = e1_job(ranks, false);
        job.phases[1].slow_ranks_from = Some((ranks / 2, 1.5));
        let (_, analysis) = analyse_job(&job);
        let context = format!("{ranks} ranks");
        assert_perfect_phases(&analysis, &[2, 1, 0], &context);
        let lb = analysis.clusters[1].lb_duration;
        let expected = 1.25 / 1.5;
        assert!((lb - expected).abs() <= 0.03, "{context}: LB_dur {lb}");
        assert!(analysis.global_score > 0.99, "{context}");
    }
}

#[test]
fn e3_parity_alternating_phase_gives_two_alternating_perfect_clusters() {
    for counters in [true, false] {
        let mut job = e1_job(4, counters);
        job.phases[1].odd_iteration_factor = 1.25;
        let (bursts, analysis) = analyse_job(&job);
        let context = format!("counters {counters}");
        assert_eq!(analysis.clusters.len(), 4, "{context}");
        for cluster in &analysis.clusters {
            assert_eq!(cluster.spmd_score, 1.0, "{context}: cluster {}", cluster.id);
        }
        let phase_one: Vec<ClusterId> = analysis
            .clusters
            .iter()
            .filter(|c| phases_of(c) == [1])
            .map(|c| c.id)
            .collect();
        assert_eq!(phase_one.len(), 2, "{context}");
        assert_alternate(&bursts, &analysis, &phase_one, (4, 50), &context);
    }
}

/// Phase `phase` of a job of `ranks` and `iterations` is two clusters, one per iteration parity,
/// that alternate on every rank.
fn assert_two_alternating_clusters(
    bursts: &[Burst],
    analysis: &Analysis,
    phase: u64,
    (ranks, iterations): (u32, usize),
    context: &str,
) {
    let clusters: Vec<&ClusterStats> = analysis
        .clusters
        .iter()
        .filter(|c| phases_of(c) == [phase])
        .collect();
    assert_eq!(clusters.len(), 2, "{context}");
    for cluster in &clusters {
        let half = u64::from(ranks) * iterations as u64 / 2;
        assert_eq!(cluster.bursts, half, "{context}: cluster {}", cluster.id);
    }
    let ids: Vec<ClusterId> = clusters.iter().map(|c| c.id).collect();
    assert_alternate(bursts, analysis, &ids, (ranks, iterations), context);
}

/// Along the time-line of each of `ranks`, one burst of a phase in each of `iterations`
/// alternates between the clusters `ids`.
fn assert_alternate(
    bursts: &[Burst],
    analysis: &Analysis,
    ids: &[ClusterId],
    (ranks, iterations): (u32, usize),
    context: &str,
) {
    for rank in 0..ranks {
        let sequence: Vec<ClusterId> = bursts
            .iter()
            .zip(&analysis.labels)
            .filter(|(b, label)| b.rank == rank && label.is_some_and(|l| ids.contains(&l)))
            .map(|(_, label)| label.unwrap())
            .collect();
        assert_eq!(sequence.len(), iterations, "{context}: rank {rank}");
        assert!(
            sequence.windows(2).all(|w| w[0] != w[1]),
            "{context}: rank {rank} {sequence:?}"
        );
    }
}

#[test]
fn iterations_slowed_on_every_rank_in_an_alternating_phase_join_the_short_cluster() {
    // Phase 1 doubles on odd iterations. Every rank runs it 1.25 times slower in iteration 38, an
    // even one: a one-column cluster nearer the short cluster than the long one, which holds one
    // burst more per rank. Or 1.6 times slower: beyond the midpoint (√2), nearer the long
    // cluster, but between two long bursts, in the short one's place. Or 1.5 times slower in
    // iterations 20, 22 and 24: nearer the long cluster, but a stretch of time of the short one
    // only. Each way it joins the short one, and the phase still alternates.
    let slowdowns = [
        vec![(38, 1.25)],
        vec![(38, 1.6)],
        vec![(20, 1.5), (22, 1.5), (24, 1.5)],
    ];
    for (counters, slowed) in [false, true]
        .into_iter()
        .flat_map(|c| slowdowns.iter().map(move |s| (c, s.clone())))
    {
        let mut job = e1_job(4, counters);
        job.phases[1].odd_iteration_factor = 2.0;
        job.phases[1].slowed = slowed.clone();
        let (bursts, analysis) = analyse_job(&job);
        let context = format!(
            "counters {counters}, slowed {slowed:?}: {:?}",
            analysis.clustering
        );
        if !counters {
            assert!(analysis.clustering.same_region_joined > 0, "{context}");
        }
        assert_two_alternating_clusters(&bursts, &analysis, 1, (4, 50), &context);
    }
}

#[test]
fn the_last_burst_of_a_run_stays_out_of_the_phase_it_follows() {
    // After the last iteration every rank runs a short burst to MPI_Finalize, alike on all ranks:
    // a one-column cluster where phase 0 would come next. It follows what phase 0 follows but
    // ends at another call, so it is not phase 0 in a perturbed iteration.
    for counters in [false, true] {
        let job = e1_job(4, counters);
        let mut bursts = job.bursts();
        let finalize = CallSite {
            module: Name::new("synthetic"),
            offset: 0xf000,
        };
        for rank in 0..job.ranks {
            let last = bursts.iter().rfind(|b| b.rank == rank).unwrap();
            let duration_ns = 150_000;
            let finalize_burst = Burst {
                start_ns: last.start_ns + last.duration_ns + 5_000,
                duration_ns,
                oncpu_ns: duration_ns,
                counters: counters.then_some(HwCounters {
                    instructions: 300_000,
                    cycles: 375_000,
                }),
                start_func: last.end_func,
                start_site: last.end_site.clone(),
                end_func: Name::new("MPI_Finalize"),
                end_site: finalize.clone(),
                ..last.clone()
            };
            bursts.push(finalize_burst);
        }
        let analysis = analyse(&bursts, job.ranks, &AnalysisParams::default()).unwrap();
        let context = format!("counters {counters}: {:?}", analysis.clustering);
        let ends_of = |cluster: &ClusterStats| -> BTreeSet<CallSite> {
            cluster.regions.iter().map(|r| r.end.clone()).collect()
        };
        let last: Vec<&ClusterStats> = analysis
            .clusters
            .iter()
            .filter(|c| ends_of(c).contains(&finalize))
            .collect();
        assert_eq!(last.len(), 1, "{context}");
        assert_eq!(
            ends_of(last[0]),
            BTreeSet::from([finalize.clone()]),
            "{context}"
        );
        assert_eq!(last[0].bursts, u64::from(job.ranks), "{context}");
        let phases: Vec<Vec<u64>> = analysis
            .clusters
            .iter()
            .filter(|c| c.bursts >= 50 * 4)
            .map(phases_of)
            .collect();
        assert_eq!(phases, [[2], [1], [0]], "{context}");
    }
}

#[test]
fn e5_a_too_small_eps_scores_lower_than_acr() {
    let mut job = e1_job(8, true);
    job.phases[1].jitter = 0.3;
    let bursts = job.bursts();
    // ACR as González García (2013) runs it, from the smallest k-dist Eps.
    let refined = analyse(&bursts, 8, &thesis_acr()).unwrap();
    let smallest_eps = refined.clustering.steps[0].eps;
    let params = AnalysisParams {
        clustering: ClusteringMethod::Dbscan {
            eps: smallest_eps / 4.0,
            min_points: None,
        },
        ..AnalysisParams::default()
    };
    let fine = analyse(&bursts, 8, &params).unwrap();
    assert!(
        fine.global_score < refined.global_score - 0.1,
        "Eps {}: {} vs ACR {}",
        smallest_eps / 4.0,
        fine.global_score,
        refined.global_score
    );
    assert!(fine.clusters.len() > refined.clusters.len());
    // ACR's scores rise over its steps while the clusters merge.
    let steps = &refined.clustering.steps;
    assert!(steps.first().unwrap().global_score < steps.last().unwrap().global_score);
    assert!(steps.first().unwrap().clusters > steps.last().unwrap().clusters);
}

#[test]
fn a_phase_of_a_rank_subgroup_scores_its_share_of_ranks() {
    // Two of eight ranks run an extra phase (I/O aggregators, say): its cluster scores 2/8 in
    // every column, stays below 1 through all steps, and lowers the global score by 3/4 of its
    // time share.
    let mut job = e1_job(8, true);
    job.phases.push(Phase {
        run_by: Some(2),
        ..Phase::new(4e7, 0.4, 0.03)
    });
    // All ten Eps values of González García (2013) run: none is raised to the resolution.
    let analysis = analyse(&job.bursts(), job.ranks, &thesis_acr()).unwrap();
    assert_eq!(analysis.clusters.len(), 4);
    let subgroup: Vec<&ClusterStats> = analysis
        .clusters
        .iter()
        .filter(|c| phases_of(c) == [3])
        .collect();
    assert_eq!(subgroup.len(), 1);
    assert_eq!(subgroup[0].spmd_score, 0.25);
    assert!((subgroup[0].lb_duration - 0.25).abs() < 0.01);
    assert_eq!(analysis.clustering.steps.len(), 10);
    let expected = 1.0 - 0.75 * subgroup[0].time_ns as f64 / analysis.filter.time_kept_ns as f64;
    assert!(
        (analysis.global_score - expected).abs() < 1e-9,
        "{} vs {expected}",
        analysis.global_score
    );
}

#[test]
fn pipeline_stages_give_one_phase_per_computation() {
    // Every rank opens every phase at a call site of its own (a wavefront without a collective in
    // the loop): without counters each phase falls into one cluster per rank at first, which the
    // region-variant merge joins.
    for counters in [false, true] {
        for ranks in [2u32, 4, 8] {
            let mut job = e1_job(ranks, counters);
            for phase in &mut job.phases {
                phase.per_rank_sites = true;
            }
            let (_, analysis) = analyse_job(&job);
            let context = format!("{ranks} ranks, counters {counters}");
            assert_perfect_phases(&analysis, &[2, 1, 0], &context);
            let merged = analysis.clustering.region_variants_merged;
            // With counters DBSCAN sees all regions at once: nothing to merge.
            assert_eq!(merged > 0, !counters, "{context}: {merged} variants merged");
        }
    }
}

#[test]
fn equal_work_at_different_places_in_the_iteration_stays_two_phases() {
    // Phases 0 and 2 do the same work in different code, on pipeline sites: they are candidates
    // for the region-variant merge (close features, and the rank-0 variant of one shares no rank
    // with the rank-1 variant of the other), but they never share an aligned column.
    for ranks in [4u32, 8] {
        let mut job = e1_job(ranks, false);
        job.phases.insert(2, Phase::new(1e6, 2.0, 0.03));
        for phase in &mut job.phases {
            phase.per_rank_sites = true;
        }
        let (_, analysis) = analyse_job(&job);
        let context = format!("{ranks} ranks");
        // Time: phase 3 (2·10⁷), phase 1 (5·10⁶), then phases 0 and 2 (10⁶ each, either order).
        let phases: Vec<Vec<u64>> = analysis.clusters.iter().map(phases_of).collect();
        assert_eq!(phases.len(), 4, "{context}: {phases:?}");
        assert_eq!(&phases[..2], &[vec![3], vec![1]], "{context}");
        let mut small: Vec<Vec<u64>> = phases[2..].to_vec();
        small.sort();
        assert_eq!(small, vec![vec![0], vec![2]], "{context}");
        for cluster in &analysis.clusters {
            assert_eq!(cluster.spmd_score, 1.0, "{context}: cluster {}", cluster.id);
        }
    }
}

#[test]
fn iterations_slowed_on_every_rank_join_their_phases() {
    // A slow first iteration (3×), and two iterations in which the hypervisor slowed every rank:
    // each gives a perfectly SPMD one-column cluster at a small Eps, frozen before it could join
    // its phase. Without counters it joins the cluster of its code region as a stretch of time;
    // with counters, as a rare cluster in its phase's place in the sequences.
    for counters in [false, true] {
        for ranks in [2u32, 4, 8] {
            let mut job = e1_job(ranks, counters);
            for phase in &mut job.phases {
                phase.slowed = vec![(0, 3.0), (17, 1.15)];
            }
            job.phases[2].slowed.push((31, 1.3));
            let (_, analysis) = analyse_job(&job);
            let context = format!("{ranks} ranks, counters {counters}");
            assert_perfect_phases(&analysis, &[2, 1, 0], &context);
            let joined = if counters {
                analysis.clustering.rare_clusters_joined
            } else {
                analysis.clustering.same_region_joined
            };
            assert!(joined > 0, "{context}: {:?}", analysis.clustering);
        }
    }
}

#[test]
fn a_rare_phase_in_a_place_of_its_own_stays_a_phase() {
    // A checkpoint every 10th iteration between phases 2 and 0: rare, but no frequent cluster
    // sits between those two, so it takes no one's place.
    for counters in [false, true] {
        let mut job = e1_job(4, counters);
        job.phases.push(Phase {
            every: 10,
            ..Phase::new(5e7, 1.0, 0.03)
        });
        let (_, analysis) = analyse_job(&job);
        let context = format!("counters {counters}");
        let checkpoint: Vec<&ClusterStats> = analysis
            .clusters
            .iter()
            .filter(|c| phases_of(c) == [3])
            .collect();
        assert_eq!(analysis.clusters.len(), 4, "{context}");
        assert_eq!(checkpoint.len(), 1, "{context}");
        assert_eq!(checkpoint[0].bursts, 5 * 4, "{context}");
        assert_eq!(checkpoint[0].spmd_score, 1.0, "{context}");
        assert_eq!(analysis.clustering.rare_clusters_joined, 0, "{context}");
    }
}

#[test]
fn results_are_deterministic_and_independent_of_input_order() {
    let mut job = e1_job(4, true);
    job.outlier_share = 0.02;
    job.phases[1].jitter = 0.2;
    let bursts = job.bursts();
    let params = AnalysisParams::default();
    let first = serde_json::to_string(&analyse(&bursts, 4, &params).unwrap()).unwrap();
    let second = serde_json::to_string(&analyse(&bursts, 4, &params).unwrap()).unwrap();
    assert_eq!(first, second);

    let reversed: Vec<Burst> = bursts.iter().rev().cloned().collect();
    let mut from_reversed = analyse(&reversed, 4, &params).unwrap();
    from_reversed.labels.reverse();
    assert_eq!(serde_json::to_string(&from_reversed).unwrap(), first);

    // serde_json's default float parser may miss the last bit, so compare what is exact.
    let parsed: Analysis = serde_json::from_str(&first).unwrap();
    assert_eq!(parsed.labels, from_reversed.labels);
    assert_eq!(parsed.clusters.len(), from_reversed.clusters.len());
}

#[test]
fn duration_filter_keeps_the_share_and_stops_at_a_gap() {
    let job = e1_job(2, true);
    let bursts = job.bursts();
    let (kept, report) = features::duration_filter(&bursts, DurationFilter::default()).unwrap();
    // 99 % of the time is reached inside the shortest phase (2 % of the time); the threshold then
    // drops to that phase's shortest burst, above the 2 µs tiny bursts.
    let shortest_phase = bursts
        .iter()
        .filter(|b| b.start_site.offset == 0)
        .map(|b| b.duration_ns)
        .min()
        .unwrap();
    assert!(report.criterion_threshold_ns > shortest_phase);
    assert_eq!(report.threshold_ns, shortest_phase);
    assert_eq!(kept.len(), 300);
    assert!(report.time_filtered_share > 0.0 && report.time_filtered_share < 0.01);

    let (kept, report) =
        features::duration_filter(&bursts, DurationFilter::MinDurationNs(1_000_000)).unwrap();
    assert_eq!((kept.len(), report.threshold_ns), (200, 1_000_000));
    assert!(features::duration_filter(&bursts, DurationFilter::KeepTimeShare(1.5)).is_err());
}

#[test]
fn duration_filter_ignores_preemption() {
    // On a busy node a burst's wall time is its on-CPU time plus whole time slices: every other
    // burst of the shortest phase waits 8 ms, and every third tiny burst 3 ms. On wall time the
    // tiny bursts would fill the gap below the phases and the threshold would cut phase 0.
    let mut bursts = e1_job(2, false).bursts();
    for (k, b) in bursts.iter_mut().enumerate() {
        if b.oncpu_ns < 100_000 && k % 3 == 0 {
            b.duration_ns += 3_000_000;
        } else if b.start_site.offset == 0 && k % 2 == 0 {
            b.duration_ns += 8_000_000;
        }
    }
    // One preempted burst of phase 0 (0.2 ms) whose on-CPU clock stopped after 0.05 ms.
    let stopped = bursts
        .iter()
        .position(|b| b.start_site.offset == 0 && b.duration_ns > 8_000_000)
        .unwrap();
    bursts[stopped].oncpu_ns = 50_000;
    let (kept, report) = features::duration_filter(&bursts, DurationFilter::default()).unwrap();
    assert_eq!(kept.len(), 300, "{report:?}");
    assert_eq!(report.kept_for_region, 1, "{report:?}");
    assert!(kept.iter().all(|&i| bursts[i].oncpu_ns >= 50_000));
    // The time shares stay in wall time, like the clusters' shares.
    let wall = |i: &usize| bursts[*i].duration_ns;
    assert_eq!(
        report.time_in_ns,
        (0..bursts.len()).map(|i| wall(&i)).sum::<u64>()
    );
    assert_eq!(report.time_kept_ns, kept.iter().map(wall).sum::<u64>());
}

#[test]
fn errors_name_the_cause() {
    let mut bursts = e1_job(2, true).bursts();
    bursts[0].counters = None;
    let forced = AnalysisParams {
        features: FeatureSelection::Fixed(FeatureSet::InstructionsIpc),
        ..Default::default()
    };
    assert!(matches!(
        analyse(&bursts, 2, &forced),
        Err(AnalysisError::MissingCounters { missing: 1, .. })
    ));
    // Automatic selection falls back instead.
    assert_eq!(
        analyse(&bursts, 2, &AnalysisParams::default())
            .unwrap()
            .features
            .used,
        FeatureSet::OnCpuTimePerRegion
    );
    assert!(matches!(
        analyse(&bursts, 1, &AnalysisParams::default()),
        Err(AnalysisError::TooManyRanks { seen: 2, ranks: 1 })
    ));
}

#[test]
fn empty_input_gives_an_empty_analysis() {
    let analysis = analyse(&[], 0, &AnalysisParams::default()).unwrap();
    assert!(analysis.clusters.is_empty() && analysis.noise.is_none() && analysis.labels.is_empty());
    assert_eq!(analysis.global_score, 0.0);
    serde_json::from_str::<Analysis>(&serde_json::to_string(&analysis).unwrap()).unwrap();
}

#[test]
fn a_phase_that_drifts_by_one_percent_stays_one_phase() {
    // Quiet phases (0.1 % jitter) with phase 1 running 1 % slower in the second half of the
    // window: the k-dist Eps values lie below 1 %, so ACR from them freezes both halves as two
    // perfectly SPMD clusters; the 5 % resolution keeps one phase.
    let mut job = e1_job(4, false);
    for phase in &mut job.phases {
        phase.jitter = 0.001;
    }
    job.phases[1].slowed = (25..50).map(|iteration| (iteration, 1.01)).collect();
    let bursts = job.bursts();
    let thesis = analyse(&bursts, job.ranks, &thesis_acr()).unwrap();
    // From those Eps alone the halves stay two clusters, until the second half joins the first
    // as a stretch of time of its code region.
    assert_perfect_phases(&thesis, &[2, 1, 0], "thesis ACR");
    assert_eq!(
        thesis.clustering.same_region_joined, 1,
        "{:?}",
        thesis.clustering
    );
    let (_, analysis) = analyse_job(&job);
    assert_perfect_phases(&analysis, &[2, 1, 0], "one phase per computation");
    assert_eq!(
        analysis.clustering.same_region_joined, 0,
        "the resolution did it"
    );
}

#[test]
fn a_stretch_of_slower_iterations_on_every_rank_joins_its_phases() {
    // Every computation runs 1.5 times longer on every rank for 12 of 50 iterations, as when
    // ranks that share cores evict each other's data for a while: at the start (the first
    // iterations of a run), and in the middle. Too frequent to be rare, perfectly SPMD, and
    // still one phase per computation.
    for stretch in [0..12, 20..32] {
        for ranks in [2u32, 4, 8] {
            let mut job = e1_job(ranks, false);
            for phase in &mut job.phases {
                phase.jitter = 0.01;
                phase.slowed = stretch.clone().map(|iteration| (iteration, 1.5)).collect();
            }
            let context = format!("{ranks} ranks, iterations {stretch:?} slower");
            assert_phases_joined_within_their_regions(&job, &context);
        }
    }
}

/// The job's three phases come out perfectly SPMD, with clusters of one code region joined.
fn assert_phases_joined_within_their_regions(job: &SyntheticJob, context: &str) {
    let (_, analysis) = analyse_job(job);
    assert_perfect_phases(&analysis, &[2, 1, 0], context);
    assert!(
        analysis.clustering.same_region_joined > 0,
        "{context}: {:?}",
        analysis.clustering
    );
}

#[test]
fn ranks_slowed_at_different_times_join_their_phases() {
    // Ranks that share cores in turns, as seen on 4 ranks over 2 cores: ranks 1 and 3 run every
    // computation 1.5 times longer for the first 15 iterations, ranks 0 and 2 for the first 5 and
    // now and then after. Each code region falls into a slow and a fast cluster that no rank
    // and no stretch of time separates, but that share aligned columns: one phase each.
    for ranks in [4u32, 8] {
        let mut job = e1_job(ranks, false);
        let mut slowed_on = Vec::new();
        for rank in 0..ranks {
            let iterations: Vec<u32> = if rank % 2 == 1 {
                (0..15).collect()
            } else {
                (0..5).chain([6, 9, 11, 23, 41]).collect()
            };
            slowed_on.extend(iterations.into_iter().map(|it| (rank, it, 1.5)));
        }
        for phase in &mut job.phases {
            phase.jitter = 0.01;
            phase.slowed_on = slowed_on.clone();
        }
        assert_phases_joined_within_their_regions(&job, &format!("{ranks} ranks"));
    }
}

#[test]
fn slower_stretches_that_come_back_often_stay_apart() {
    // Phase 1 runs 1.5 times longer in 3 stretches of 5 iterations on every rank: a pattern of
    // its own rather than one passing slowdown, which stays a cluster of its own.
    let mut job = e1_job(4, false);
    for phase in &mut job.phases {
        phase.jitter = 0.01;
    }
    job.phases[1].slowed = [5..10, 20..25, 35..40]
        .into_iter()
        .flatten()
        .map(|iteration| (iteration, 1.5))
        .collect();
    let (_, analysis) = analyse_job(&job);
    let phase1: Vec<&ClusterStats> = analysis
        .clusters
        .iter()
        .filter(|c| phases_of(c) == [1])
        .collect();
    assert_eq!(phase1.len(), 2, "{:?}", analysis.clustering);
    assert_eq!(analysis.clustering.same_region_joined, 0);
}

#[test]
fn an_alternating_phase_keeps_its_two_clusters_under_slowdowns_the_machine_makes() {
    // The `phases` program of the integration tests (2 ranks, 40 iterations of 2, 6 and 12 ms,
    // the last phase twice as long on odd iterations), slowed as a shared virtual machine slows
    // it: one iteration on every rank or on one rank, up to 1.95 times (beyond the midpoint of 12
    // and 24 ms), or a stretch of 2 to 5 iterations on every rank, up to 1.7 times. Each way the
    // phase keeps one cluster per parity, with every burst of it.
    let mut random = SplitMix64(0xa17e);
    for case in 0..300 {
        let mut job = SyntheticJob {
            tiny_bursts_per_phase: 0,
            seed: case,
            ..SyntheticJob::three_phases(2, 40, false)
        };
        for (phase, ms) in job.phases.iter_mut().zip([2.0, 6.0, 12.0]) {
            // 2.5 instructions per ns at IPC 1: ms milliseconds.
            *phase = Phase::new(ms * 2.5e6, 1.0, 0.01);
        }
        let phase = &mut job.phases[2];
        phase.odd_iteration_factor = 2.0;
        let iteration = random.uniform(0.0, 40.0) as u32;
        match case % 3 {
            0 => phase.slowed = vec![(iteration, random.uniform(1.1, 1.95))],
            1 => {
                let rank = random.uniform(0.0, 2.0) as u32;
                phase.slowed_on = vec![(rank, iteration, random.uniform(1.1, 1.95))];
            }
            _ => {
                let length = random.uniform(2.0, 6.0) as u32;
                let factor = random.uniform(1.1, 1.7);
                phase.slowed = (iteration..(iteration + length).min(40))
                    .map(|it| (it, factor))
                    .collect();
            }
        }
        let context = format!("{:?} {:?}", phase.slowed, phase.slowed_on);
        let (bursts, analysis) = analyse_job(&job);
        let context = format!("{context}: {:?}", analysis.clustering);
        assert_two_alternating_clusters(&bursts, &analysis, 2, (2, 40), &context);
    }
}

#[test]
fn a_phase_that_takes_another_path_every_sixth_iteration_keeps_both_clusters() {
    // Every sixth iteration phase 1 runs three times as long, in the same code region: a path
    // the code takes on purpose (not rare: 9 of 50 iterations), which keeps a cluster of its own
    // although its bursts sit where the usual ones do.
    let mut job = e1_job(4, false);
    job.phases[1].slowed = (0..50).step_by(6).map(|it| (it, 3.0)).collect();
    let (_, analysis) = analyse_job(&job);
    let context = format!("{:?}", analysis.clustering);
    let mut sizes: Vec<u64> = analysis
        .clusters
        .iter()
        .filter(|c| phases_of(c) == [1])
        .map(|c| c.bursts)
        .collect();
    sizes.sort_unstable();
    assert_eq!(sizes, [9 * 4, 41 * 4], "{context}");
}
