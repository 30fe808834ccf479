use std::collections::BTreeMap;

use super::fit::{Family, DEFAULT_TOLERANCE};
use super::predict::{predict, PredictError};
use super::*;
use crate::analysis::synthetic::{Phase, SyntheticJob};
use crate::analysis::{analyse, AnalysisParams};

fn job(iterations: u32, outlier_share: f64) -> SyntheticJob {
    SyntheticJob {
        ranks: 4,
        iterations,
        phases: vec![Phase::new(1e6, 2.0, 0.03), Phase::new(2e7, 1.2, 0.03)],
        tiny_bursts_per_phase: 2,
        outlier_share,
        counters: true,
        seed: 0x5197,
    }
}

/// Each rank's region of interest: from its first burst to the end of its last one.
fn regions(bursts: &[Burst]) -> BTreeMap<u32, (u64, u64)> {
    let mut regions = BTreeMap::new();
    for b in bursts {
        let span = regions.entry(b.rank).or_insert((u64::MAX, 0));
        span.0 = span.0.min(b.start_ns);
        span.1 = span.1.max(b.start_ns + b.duration_ns);
    }
    regions
}

#[test]
fn the_phases_of_a_clean_loop_cover_its_run_and_weigh_its_iterations() {
    let bursts = job(40, 0.0).bursts();
    let analysis = analyse(&bursts, 4, &AnalysisParams::default()).unwrap();
    let s = signature(&bursts, &analysis, &regions(&bursts)).unwrap();
    assert_eq!(s.ranks, 4);
    assert_eq!(s.phases.len(), 2, "{s:#?}");
    for phase in &s.phases {
        assert_eq!(phase.weight, 40.0, "{phase:?}");
    }
    // The big phase first; its repetition includes the MPI calls and tiny bursts after it.
    assert!(s.phases[0].pet_ns > s.phases[1].pet_ns);
    // Every bit of each rank's region is in a phase except the last repetition's tail (the
    // region ends with the last burst) and the staggered starts of the ranks.
    assert!(
        s.coverage() > 0.99 && s.coverage() <= 1.0,
        "{}",
        s.coverage()
    );
    assert!((s.paet_ns() + s.other_ns - s.runtime_ns as f64).abs() < 1e-3);
}

/// The signature of a clean job, and of the same job with every 10th analysed burst of rank 0
/// made noise and, when `elsewhere`, moved to code no phase has.
fn clean_and_noisy(elsewhere: bool) -> (AppSignature, AppSignature) {
    let mut bursts = job(40, 0.0).bursts();
    let mut analysis = analyse(&bursts, 4, &AnalysisParams::default()).unwrap();
    let clean = signature(&bursts, &analysis, &regions(&bursts)).unwrap();
    let mut seen = 0;
    for (burst, label) in bursts.iter_mut().zip(analysis.labels.iter_mut()) {
        if burst.rank == 0 && label.is_some() {
            if seen % 10 == 0 {
                *label = Some(NOISE);
                if elsewhere {
                    burst.end_site = CallSite {
                        module: "elsewhere".into(),
                        offset: 1,
                    };
                }
            }
            seen += 1;
        }
    }
    let noisy = signature(&bursts, &analysis, &regions(&bursts)).unwrap();
    (clean, noisy)
}

#[test]
fn noise_of_code_no_phase_has_is_time_no_phase_covers() {
    let (clean, s) = clean_and_noisy(true);
    assert_eq!(
        s.phases.iter().map(|p| p.weight).sum::<f64>(),
        80.0 - 8.0 / 4.0
    );
    assert!(
        s.other_ns > clean.other_ns,
        "{} vs {}",
        s.other_ns,
        clean.other_ns
    );
    assert!((s.paet_ns() + s.other_ns - s.runtime_ns as f64).abs() < 1e-3);
}

#[test]
fn a_noise_burst_of_a_phases_code_is_a_perturbed_repetition_of_that_phase() {
    let (clean, s) = clean_and_noisy(false);
    let weights = |s: &AppSignature| -> Vec<(PhaseKey, Vec<ClusterId>, f64)> {
        s.phases
            .iter()
            .map(|p| (p.key.clone(), p.clusters.clone(), p.weight))
            .collect()
    };
    assert_eq!(weights(&s), weights(&clean));
    assert!((s.other_ns - clean.other_ns).abs() < 1e-3);
}

#[test]
fn a_run_without_a_region_or_phases_has_no_signature() {
    let bursts = job(10, 0.0).bursts();
    let analysis = analyse(&bursts, 4, &AnalysisParams::default()).unwrap();
    assert_eq!(
        signature(&bursts, &analysis, &BTreeMap::new()),
        Err(SignatureError::NoRegion)
    );
    let elsewhere: BTreeMap<u32, (u64, u64)> = [(9, (1, 2))].into();
    assert_eq!(
        signature(&bursts, &analysis, &elsewhere),
        Err(SignatureError::NoPhase)
    );
}

fn site(offset: u64) -> CallSite {
    CallSite {
        module: "app".into(),
        offset,
    }
}

/// The run at workload n of an application with a phase of cost n and one of cost n², both
/// repeated 10·n times, plus a fixed start.
fn run_at(n: f64) -> AppSignature {
    let phase = |offset, pet_ns| PhaseSignature {
        key: PhaseKey {
            start: site(offset),
            end: site(offset + 1),
        },
        clusters: vec![1],
        weight: 10.0 * n,
        pet_ns,
    };
    let phases = vec![phase(0x10, 1e5 * n), phase(0x20, 3e4 * n * n)];
    let paet: f64 = phases.iter().map(PhaseSignature::time_ns).sum();
    AppSignature {
        ranks: 2,
        runtime_ns: (paet + 2e6) as u64,
        phases,
        other_ns: 2e6,
    }
}

#[test]
fn a_linear_and_a_quadratic_phase_predict_a_new_workload() {
    let runs: Vec<(f64, AppSignature)> = [4.0, 6.0, 8.0, 10.0].map(|n| (n, run_at(n))).into();
    let refs: Vec<(f64, &AppSignature)> = runs.iter().map(|(x, s)| (*x, s)).collect();
    let p = predict(&refs, 7.0, DEFAULT_TOLERANCE, false).unwrap();
    let truth = run_at(7.0).runtime_ns as f64;
    assert!(
        (p.runtime_ns - truth).abs() / truth < 1e-6,
        "{} vs {truth}",
        p.runtime_ns
    );
    let families: Vec<(Family, Family)> = p
        .phases
        .iter()
        .map(|m| (m.weight_fit.family, m.pet_fit.family))
        .collect();
    assert_eq!(
        families,
        [
            (Family::Linear, Family::Quadratic),
            (Family::Linear, Family::Linear)
        ]
    );
    assert_eq!(p.other_fit.family, Family::Constant);
    assert!(!p.extrapolated);
}

#[test]
fn a_phase_missing_from_a_run_weighs_nothing_there() {
    let mut runs: Vec<(f64, AppSignature)> = [4.0, 6.0, 8.0].map(|n| (n, run_at(n))).into();
    runs[0].1.phases.retain(|p| p.key.start != site(0x10));
    let refs: Vec<(f64, &AppSignature)> = runs.iter().map(|(x, s)| (*x, s)).collect();
    let p = predict(&refs, 5.0, DEFAULT_TOLERANCE, false).unwrap();
    let cheap = p.phases.iter().find(|m| m.key.start == site(0x10)).unwrap();
    assert_eq!(cheap.weights[0], (4.0, 0.0));
    assert_eq!(cheap.pets_ns.len(), 2);
}

#[test]
fn predictions_outside_the_measured_workloads_need_consent() {
    let runs: Vec<(f64, AppSignature)> = [4.0, 6.0].map(|n| (n, run_at(n))).into();
    let refs: Vec<(f64, &AppSignature)> = runs.iter().map(|(x, s)| (*x, s)).collect();
    assert_eq!(
        predict(&refs, 12.0, DEFAULT_TOLERANCE, false),
        Err(PredictError::Extrapolation {
            at: 12.0,
            low: 4.0,
            high: 6.0
        })
    );
    assert!(
        predict(&refs, 12.0, DEFAULT_TOLERANCE, true)
            .unwrap()
            .extrapolated
    );
    assert_eq!(
        predict(&refs[..1], 4.0, DEFAULT_TOLERANCE, false),
        Err(PredictError::TooFewWorkloads(1))
    );
    assert!(matches!(
        predict(&refs, f64::NAN, DEFAULT_TOLERANCE, false),
        Err(PredictError::NotFinite(x)) if x.is_nan()
    ));
}
