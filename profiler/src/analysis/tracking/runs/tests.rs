use super::*;
use crate::analysis::synthetic::{Phase, SyntheticJob};
use crate::analysis::tracking::EdgeSource;
use crate::analysis::{analyse, AnalysisParams};

/// E1's loop ([`SyntheticJob::three_phases`]): 10⁶, 5·10⁶ and 2·10⁷ instructions at IPC 2.0,
/// 0.6, 1.2.
fn job(ranks: u32, phases: &[(f64, f64)], seed: u64) -> SyntheticJob {
    SyntheticJob {
        ranks,
        iterations: 50,
        phases: phases
            .iter()
            .map(|&(instructions, ipc)| Phase::new(instructions, ipc, 0.03))
            .collect(),
        tiny_bursts_per_phase: 2,
        outlier_share: 0.0,
        counters: true,
        seed,
    }
}

const E1: [(f64, f64); 3] = [(1e6, 2.0), (5e6, 0.6), (2e7, 1.2)];

fn app() -> AppIdentity {
    AppIdentity {
        build_id: Some("0123456789abcdef".into()),
        executable: "/opt/app/bin/solver".into(),
    }
}

fn signature(job: &SyntheticJob) -> RunSignature {
    let bursts = job.bursts();
    let analysis = analyse(&bursts, job.ranks, &AnalysisParams::default()).unwrap();
    RunSignature::from_analysis(app(), "run", &analysis, &bursts, &TrackingParams::default())
        .unwrap()
}

/// The synthetic phase of a cluster: phase k starts at the collective at offset 0x1000·k.
fn phase(frame: &Frame, id: u32) -> u64 {
    frame.cluster(id).unwrap().regions[0].start.offset / 0x1000
}

/// Asserts every phase of both runs is matched 1:1 with the same phase, and nothing else.
fn assert_phase_for_phase(a: &RunSignature, b: &RunSignature, m: &RunMatch, phases: usize) {
    assert_eq!(m.phases.len(), phases, "{m:#?}");
    assert!(
        m.unmatched_a.is_empty() && m.unmatched_b.is_empty(),
        "{m:#?}"
    );
    for p in &m.phases {
        assert_eq!(p.kind, MatchKind::OneToOne, "{p:#?}");
        assert_eq!(phase(&a.frame, p.a[0]), phase(&b.frame, p.b[0]), "{p:#?}");
    }
    assert_eq!(m.coverage, 1.0);
    assert!(m.call_sites_compared && m.same_application);
}

#[test]
fn two_and_four_ranks_of_one_program_match_phase_for_phase() {
    let a = signature(&job(2, &E1, 1));
    let b = signature(&job(4, &E1, 2));
    assert_eq!((a.frame.ranks, b.frame.ranks), (2, 4));
    let m = match_runs(&a, &b, &TrackingParams::default());
    assert_phase_for_phase(&a, &b, &m, 3);
    // Same work per rank (weak scaling): no instruction scaling, and flat trends.
    assert_eq!(m.scaling, InstructionScaling::None);
    let (plain, scaled) = m.scaling_evidence.unwrap();
    assert!(plain < scaled);
    for p in &m.phases {
        let t = &p.trend;
        assert!(t.duration_mean_change.abs() < 0.03, "{t:#?}");
        assert!(t.instructions_change.unwrap().abs() < 0.03, "{t:#?}");
        assert!(t.ipc_change.unwrap().abs() < 0.03, "{t:#?}");
        assert!(
            (t.instructions_scaled_change.unwrap() - 1.0).abs() < 0.06,
            "{t:#?}"
        );
        assert!(t.time_share_change.abs() < 0.02, "{t:#?}");
        assert_eq!((t.a.bursts, t.b.bursts), (100, 200));
        assert!(p.moved.unwrap() < 0.05);
        // Evidence: displacement in both directions and shared code.
        assert!(p
            .edges
            .iter()
            .all(|e| e.displacement_ab > 0.9 && e.code == Some(1.0)));
    }
    // And the other way round.
    let back = match_runs(&b, &a, &TrackingParams::default());
    assert_phase_for_phase(&b, &a, &back, 3);
}

#[test]
fn strong_scaling_is_recognised_and_trends_show_it() {
    // Four ranks doing half the work each: instructions ÷ 2 per burst.
    let halved: Vec<(f64, f64)> = E1.iter().map(|&(i, ipc)| (i / 2.0, ipc)).collect();
    let a = signature(&job(2, &E1, 3));
    let b = signature(&job(4, &halved, 4));
    let m = match_runs(&a, &b, &TrackingParams::default());
    assert_phase_for_phase(&a, &b, &m, 3);
    assert_eq!(m.scaling, InstructionScaling::ByRanks);
    for p in &m.phases {
        let t = &p.trend;
        assert!(
            (t.instructions_change.unwrap() + 0.5).abs() < 0.03,
            "{t:#?}"
        );
        assert!(t.instructions_scaled_change.unwrap().abs() < 0.03, "{t:#?}");
        assert!((t.duration_mean_change + 0.5).abs() < 0.03, "{t:#?}");
        assert!(t.ipc_change.unwrap().abs() < 0.03, "{t:#?}");
    }
}

#[test]
fn a_long_move_is_resolved_by_call_sites_and_sequence() {
    // A compiler change (Llort et al. (2013), §4.1): phase 0 now retires 16× the instructions
    // at half the IPC, which puts it next to phase 2 and far from where it was. Displacement
    // alone relates it to phase 2; pruning by call site removes that, and the rescue by shared
    // code and sequence position finds it.
    let moved = [(1.6e7, 1.0), (5e6, 0.6), (2e7, 1.2)];
    let a = signature(&job(4, &E1, 5));
    let b = signature(&job(4, &moved, 6));
    assert_eq!(
        b.frame.clusters.len(),
        3,
        "the moved phase stays a cluster of its own"
    );
    let m = match_runs(&a, &b, &TrackingParams::default());
    assert_phase_for_phase(&a, &b, &m, 3);
    let p0 = m
        .phases
        .iter()
        .find(|p| phase(&a.frame, p.a[0]) == 0)
        .unwrap();
    assert_eq!(p0.edges.len(), 1);
    assert_eq!(p0.edges[0].source, EdgeSource::CodeAndSequence);
    assert_eq!(p0.edges[0].sequence, Some(1.0));
    assert!(p0.moved.unwrap() > 2.0);
    let t = &p0.trend;
    assert!(
        (t.instructions_change.unwrap() - 15.0).abs() < 0.5,
        "{t:#?}"
    );
    assert!((t.ipc_change.unwrap() + 0.5).abs() < 0.03, "{t:#?}");
}

#[test]
fn a_different_build_matches_on_behaviour_alone() {
    // Another build: every call site differs, so nothing prunes; the phases, distinct in
    // behaviour, still match by displacement.
    let a = signature(&job(2, &E1, 7));
    let mut b = signature(&job(2, &E1, 8));
    b.app.build_id = Some("fedcba".into());
    for c in &mut b.frame.clusters {
        for r in &mut c.regions {
            r.start.offset += 0x10;
            r.end.offset += 0x10;
        }
    }
    let m = match_runs(&a, &b, &TrackingParams::default());
    assert!(!m.call_sites_compared && !m.same_application);
    assert_eq!(m.phases.len(), 3);
    assert!(m.phases.iter().all(|p| p.kind == MatchKind::OneToOne));
    assert!(m.phases.iter().all(|p| p.edges[0].code.is_none()));
}

#[test]
fn signatures_round_trip_and_stay_small() {
    let s = signature(&job(4, &E1, 9));
    let json = serde_json::to_string(&s).unwrap();
    assert!(json.len() < 64 * 1024, "{} bytes", json.len());
    let parsed: RunSignature = serde_json::from_str(&json).unwrap();
    assert_eq!(parsed.frame.clusters.len(), 3);
    assert_eq!(parsed.frame.sequences, s.frame.sequences);
    let m = match_runs(&s, &parsed, &TrackingParams::default());
    assert_phase_for_phase(&s, &parsed, &m, 3);
}

#[test]
fn coverage_counts_relations_over_relevant_objects() {
    // A split lowers coverage: 2 relations for max(2, 3) objects.
    let a = signature(&job(4, &E1[..2], 10));
    let mut bimodal = job(4, &E1[..2], 11);
    bimodal.phases[1].odd_iteration_factor = 1.3;
    let b = signature(&bimodal);
    assert_eq!((a.frame.clusters.len(), b.frame.clusters.len()), (2, 3));
    let m = match_runs(&a, &b, &TrackingParams::default());
    assert_eq!(m.phases.len(), 2);
    let split = m
        .phases
        .iter()
        .find(|p| p.kind == MatchKind::Split)
        .unwrap();
    assert_eq!(split.b.len(), 2);
    assert!((m.coverage - 2.0 / 3.0).abs() < 1e-12);
}
