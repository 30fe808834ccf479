use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::analysis::{self, synthetic, AnalysisParams};
use crate::capture::usage::IoCounts;
use crate::properties::config::PropertyConfig;
use crate::properties::engine::Outcome;
use crate::properties::inputs::PmuCounters;
use crate::properties::pop::Aggregate;
use crate::store::{CallStats, Job, RankRecord, RankTotals};
use crate::test_support::JobMetaBuilder;

const S: u64 = 1_000_000_000;

fn default_setting(id: &str) -> Setting {
    catalogue()
        .into_iter()
        .find(|i| i.id == id)
        .and_then(|i| i.default)
        .unwrap()
}

fn rank_record(rank: u32, burst_ns: u64, mpi_ns: u64) -> RankRecord {
    let mut functions = BTreeMap::new();
    functions.insert(
        "MPI_Barrier".to_string(),
        CallStats {
            calls: 1000,
            time_ns: mpi_ns,
            bytes: 0,
            sized_calls: 0,
            ..Default::default()
        },
    );
    RankRecord {
        call_sites: Vec::new(),
        rank,
        pid: 100 + rank,
        first_seen_ns: 0,
        ended_ns: None,
        totals: RankTotals {
            bursts: 1000,
            burst_ns,
            burst_oncpu_ns: burst_ns,
            ..Default::default()
        },
        functions,
        region: Default::default(),
        probe_cost: None,
    }
}

/// The intra-node imbalance experiment of Guillén (2015), §7.6.5 (APART Test Suite), on two ranks:
/// rank 0 does 10 % of rank 1's work, then both meet in MPI_Barrier; 10 s of run time.
fn ats_job() -> Job {
    let mut job = Job::new(JobMetaBuilder::new("job-1").build());
    job.ranks.insert(0, rank_record(0, S, 9 * S));
    job.ranks.insert(1, rank_record(1, 10 * S, 0));
    job
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn catalogue_is_consistent() {
    let infos = catalogue();
    let names: BTreeSet<_> = infos.iter().map(|i| i.name).collect();
    assert_eq!(names.len(), infos.len(), "property names are unique");
    let mut by_id: BTreeMap<&str, Vec<&PropertyInfo>> = BTreeMap::new();
    for i in &infos {
        by_id.entry(i.id).or_default().push(i);
        assert_eq!(
            i.formula == Formula::Informational,
            i.default.is_none(),
            "{}",
            i.name
        );
        if let Some(d) = i.default {
            assert!(d.threshold > 0.0 && d.exponent > 0.0, "{}", i.name);
        }
        if let Some(parent) = i.parent {
            assert!(
                infos
                    .iter()
                    .any(|p| p.name == parent && p.strategy == i.strategy),
                "{}",
                i.name
            );
        }
        let replica = matches!(
            i.condition,
            Condition::AboveThreshold | Condition::AtOrBelowThreshold
        );
        assert_eq!(
            replica,
            i.id != i.name,
            "{}: replicas and only replicas have their own id",
            i.name
        );
        // Every property that can fire says what to do, except the low replicas, which only
        // branch (their severity is 0 whenever their condition holds).
        let can_fire =
            i.formula != Formula::Informational && i.condition != Condition::AtOrBelowThreshold;
        assert_eq!(i.recommendation.is_some(), can_fire, "{}", i.name);
        assert!(
            !i.threshold_note.is_empty() || i.default.is_none(),
            "{}",
            i.name
        );
    }
    for (id, group) in by_id {
        if group.len() > 1 {
            assert_eq!(group.len(), 2, "{id}");
            let conditions: BTreeSet<_> =
                group.iter().map(|i| format!("{:?}", i.condition)).collect();
            assert_eq!(conditions.len(), 2, "{id}: one replica per side");
            assert_eq!(
                group[0].default, group[1].default,
                "{id}: replicas share the threshold"
            );
            assert_eq!(group[0].formula, group[1].formula, "{id}");
            assert_eq!(group[0].strategy, group[1].strategy, "{id}");
        }
    }
}

#[test]
fn two_ranks_one_doing_a_tenth_of_the_work() {
    let job = ats_job();
    let input = JobInput::lifetime(&job, 10 * S);
    let props = evaluate_job(&input, &PropertyConfig::default());

    // POP: LB = (1 + 10)/2 / 10 = 0.55, CommE = 10/10 = 1, PE = 0.55.
    assert!(close(props.pop.load_balance.value().unwrap(), 0.55));
    assert!(close(
        props.pop.communication_efficiency.value().unwrap(),
        1.0
    ));
    assert!(close(props.pop.parallel_efficiency.value().unwrap(), 0.55));
    assert_eq!(props.pop.ranks, 2);
    assert_eq!(props.world_size, 2);

    // The imbalance property fires with the F2 severity of 0.55 at the default threshold.
    let lb = props.get("load_balance").unwrap();
    let d = default_setting("load_balance");
    let expected = 1.0 - (0.55 / d.threshold).powf(d.exponent);
    assert!(close(lb.severity().unwrap(), expected));
    assert!(
        close(expected, 1.0 - 0.55 / 0.8),
        "defaults t = 0.8, p = 1: 0.3125"
    );
    assert!(lb.fires());
    assert!(lb.recommendation().unwrap().contains("Balance the work"));

    // Its refinement: compute rates 0.1 and 1.0 s/s, max − min = 0.9; F1 at t = 0.5 gives 0.8
    // (the expected outcome).
    let imbalance = props.get("intra_node_imbalance").unwrap();
    assert_eq!(imbalance.parent.as_deref(), Some("load_balance"));
    assert!(close(imbalance.value().unwrap(), 0.9));
    let d = default_setting("intra_node_imbalance");
    assert!(close(
        imbalance.severity().unwrap(),
        (0.9 / d.threshold - 1.0).powf(d.exponent)
    ));
    assert!(close(imbalance.severity().unwrap(), 0.8));
    assert!(imbalance.fires());

    // Communication is not the problem.
    let comm = props.get("communication_efficiency").unwrap();
    assert_eq!(comm.severity(), Some(0.0));
    assert!(!comm.fires());

    // MPI time fraction per rank: rank 0 ≈ 0.9, rank 1 = 0; the maximum of the distribution is
    // rank 0's value.
    let sample0 = input.ranks.iter().find(|r| r.rank == 0).unwrap();
    assert!(close(
        sample0.mpi_ns as f64 / sample0.runtime_ns as f64,
        0.9
    ));
    let mpi = props
        .get("mpi_time_fraction")
        .unwrap()
        .evaluation()
        .unwrap();
    let ranks = mpi.ranks.as_ref().unwrap();
    assert_eq!(ranks.count, 2);
    assert!(close(ranks.values.max(), 0.9));
    assert_eq!(ranks.values.min(), 0.0);
    assert_eq!(ranks.values.quantiles.len(), 11);
    assert_eq!(ranks.condition_count, 1);
    // Rank severities 1 (0.9/0.2 − 1 > 1) and 0: mean 0.5.
    assert!(close(mpi.severity, 0.5));

    // The ranks compute on the CPU the whole time.
    let oncpu = props.get("oncpu_share").unwrap();
    assert_eq!(oncpu.value(), Some(1.0));
    assert!(!oncpu.fires());

    let recs = props.recommendations();
    let fired: Vec<&str> = recs.iter().map(|r| r.property.as_str()).collect();
    assert!(
        fired.contains(&"load_balance") && fired.contains(&"intra_node_imbalance"),
        "{fired:?}"
    );
    assert!(!fired.contains(&"communication_efficiency"));
    assert!(recs.windows(2).all(|w| w[0].severity >= w[1].severity));

    // Mergeable aggregates of this node.
    let agg = job_aggregates(&input);
    assert_eq!(
        agg.useful_seconds,
        Aggregate {
            count: 2,
            sum: 11.0,
            min: 1.0,
            max: 10.0
        }
    );
    assert_eq!(agg.mpi_seconds.sum, 9.0);
    assert_eq!(agg.runtime_seconds.max, 10.0);
    assert_eq!(props.aggregates, agg);
}

#[test]
fn balanced_job_gates_the_imbalance_refinement() {
    let mut job = Job::new(JobMetaBuilder::new("job-1").build());
    job.ranks.insert(0, rank_record(0, 9 * S, S));
    job.ranks.insert(1, rank_record(1, 9 * S, S));
    let props = evaluate_job(
        &JobInput::lifetime(&job, 10 * S),
        &PropertyConfig::default(),
    );
    assert_eq!(props.get("load_balance").unwrap().severity(), Some(0.0));
    assert!(
        props.get("intra_node_imbalance").is_none(),
        "not evaluated when load_balance holds no bottleneck"
    );
    assert!(
        props
            .get("parallel_efficiency")
            .unwrap()
            .evaluation()
            .unwrap()
            .condition,
        "always"
    );
    assert!(
        props.recommendations().is_empty(),
        "{:?}",
        props.recommendations()
    );
}

fn io_input<'a>(job: &'a Job, io: IoStats) -> JobInput<'a> {
    JobInput {
        io: Some(io),
        ..JobInput::lifetime(job, 10 * S)
    }
}

#[test]
fn small_io_requests_get_the_consolidation_recommendation() {
    let job = ats_job();
    let requests = 100u64;
    let run = |size: u64| {
        let io = IoStats {
            seconds: 10.0,
            counts: IoCounts {
                read_bytes: requests * size,
                read_calls: requests,
                write_bytes: requests * size,
                write_calls: requests,
                opens: 2,
                closes: 2,
            },
        };
        evaluate_job(&io_input(&job, io), &PropertyConfig::default())
    };

    let large = run(8 * 1024 * 1024);
    for name in ["io_read_request_size", "io_write_request_size"] {
        let p = large.get(name).unwrap();
        assert_eq!(p.value(), Some(8.0 * 1024.0 * 1024.0));
        assert_eq!(p.severity(), Some(0.0));
        assert!(!p.fires() && p.recommendation().is_none(), "{name}");
    }

    let small = run(64 * 1024);
    for name in ["io_read_request_size", "io_write_request_size"] {
        let p = small.get(name).unwrap();
        assert_eq!(
            p.parent.as_deref(),
            Some(if name.contains("read") {
                "io_read_bandwidth_low"
            } else {
                "io_write_bandwidth_low"
            })
        );
        assert!(
            close(p.severity().unwrap(), 0.96875),
            "64 KiB: F2, t = 2 MiB"
        );
        assert!(p.fires());
        assert!(p
            .recommendation()
            .unwrap()
            .starts_with("Consolidate I/O requests"));
    }
    let consolidate: Vec<_> = small
        .recommendations()
        .into_iter()
        .filter(|r| r.text.starts_with("Consolidate I/O"))
        .collect();
    assert_eq!(consolidate.len(), 2);
    assert!(large
        .recommendations()
        .iter()
        .all(|r| !r.text.starts_with("Consolidate I/O")));

    // Opens and closes: 2 in 10 s.
    assert_eq!(small.get("io_open_rate").unwrap().value(), Some(0.2));
    assert!(!small.get("io_open_rate").unwrap().fires());
}

#[test]
fn a_few_small_requests_do_not_make_a_job_look_io_bound() {
    // Start-up reads of configuration and library files: 36 small reads in 10 s.
    let io = IoStats {
        seconds: 10.0,
        counts: IoCounts {
            read_bytes: 36 * 832,
            read_calls: 36,
            ..IoCounts::default()
        },
    };
    let props = evaluate_job(&io_input(&ats_job(), io), &PropertyConfig::default());
    let size = props.get("io_read_request_size").unwrap();
    assert!(
        matches!(&size.outcome, Outcome::NoData { reason } if reason.contains("too few")),
        "{size:?}"
    );
    assert!(props
        .recommendations()
        .iter()
        .all(|r| !r.text.starts_with("Consolidate I/O")));
}

#[test]
fn high_io_bandwidth_takes_the_other_branch() {
    let job = ats_job();
    let io = IoStats {
        seconds: 1.0,
        counts: IoCounts {
            read_bytes: 3 * 1024 * 1024 * 1024,
            read_calls: 3 * 16 * 1024,
            ..IoCounts::default()
        },
    };
    let props = evaluate_job(&io_input(&job, io), &PropertyConfig::default());
    let high = props.get("io_read_bandwidth_high").unwrap();
    let low = props.get("io_read_bandwidth_low").unwrap();
    assert_eq!(high.id, "io_read_bandwidth");
    assert_eq!(low.id, "io_read_bandwidth");
    assert!(high.evaluation().unwrap().condition && !low.evaluation().unwrap().condition);
    assert_eq!(
        high.severity(),
        Some(1.0),
        "3 GiB/s is beyond 2 × 1.1 GiB/s"
    );
    assert!(high.recommendation().unwrap().contains("Darshan"));
    assert!(
        props.get("io_read_request_size").is_none(),
        "64 KiB requests, but the high branch was taken"
    );
    // No writes: the low write replica holds and the request size has no data.
    let write_size = props.get("io_write_request_size").unwrap();
    assert!(
        matches!(&write_size.outcome, Outcome::NoData { reason } if reason.contains("no write requests"))
    );
}

#[test]
fn absent_pmu_is_not_measured_never_a_number() {
    let job = ats_job();
    let props = evaluate_job(
        &JobInput::lifetime(&job, 10 * S),
        &PropertyConfig::default(),
    );
    for name in [
        "cpi",
        "llc_misses_per_instruction",
        "branch_misses_per_instruction",
        "core_frequency",
    ] {
        let p = props.get(name).unwrap_or_else(|| panic!("{name} reported"));
        assert_eq!(
            p.outcome,
            Outcome::NotMeasured {
                reason: NO_PMU.to_string()
            },
            "{name}"
        );
        assert_eq!(p.value(), None);
        assert_eq!(p.severity(), None);
        assert!(!p.fires());
    }
    assert_eq!(
        props.pop.ipc,
        Reading::NotMeasured {
            reason: NO_PMU.to_string()
        }
    );
    assert_eq!(
        props.pop.instructions,
        Reading::NotMeasured {
            reason: NO_PMU.to_string()
        }
    );

    let json = serde_json::to_value(&props).unwrap();
    let cpi = json["properties"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "cpi")
        .unwrap();
    assert_eq!(
        cpi["outcome"],
        serde_json::json!({"status": "not_measured", "reason": "not measured (no PMU)"})
    );
    assert_eq!(
        json["pop"]["ipc"],
        serde_json::json!({"status": "not_measured", "reason": "not measured (no PMU)"})
    );

    // Resource usage and I/O that were not collected say so too.
    for name in ["memory_used_share", "user_time_share", "system_time_share"] {
        assert!(
            props
                .get(name)
                .unwrap()
                .reason()
                .unwrap()
                .starts_with("not measured"),
            "{name}"
        );
    }
    for name in [
        "io_read_bandwidth_high",
        "io_read_bandwidth_low",
        "io_read_request_size",
        "io_open_rate",
    ] {
        assert!(
            props
                .get(name)
                .unwrap()
                .reason()
                .unwrap()
                .starts_with("not measured"),
            "{name}"
        );
    }

    // Results round-trip.
    let back: JobProperties = serde_json::from_value(json).unwrap();
    assert_eq!(back, props);
}

#[test]
fn pmu_properties_with_counters() {
    let job = ats_job();
    let mut input = JobInput::lifetime(&job, 10 * S);
    let counters = |instructions: u64, cycles: u64| PmuCounters {
        instructions,
        cycles,
        ref_cycles: Some(cycles / 2),
        llc_misses: Some(instructions / 1000),
        branch_misses: Some(instructions / 100),
    };
    input.ranks[0].pmu = Some(counters(1_000_000, 3_000_000));
    input.ranks[1].pmu = Some(counters(10_000_000, 10_000_000));
    input.nominal_hz = Some(2.0e9);
    let props = evaluate_job(&input, &PropertyConfig::default());

    let cpi = props.get("cpi").unwrap().evaluation().unwrap();
    let ranks = cpi.ranks.as_ref().unwrap();
    assert_eq!((ranks.values.min(), ranks.values.max()), (1.0, 3.0));
    // Severities: F1 at 1.6: 0 and (3/1.6 − 1) = 0.875; mean 0.4375.
    assert!(close(cpi.severity, 0.875 / 2.0));
    // The refinements are evaluated because CPI fired.
    let llc = props.get("llc_misses_per_instruction").unwrap();
    assert!(close(llc.value().unwrap(), 0.001));
    assert_eq!(llc.severity(), Some(1.0), "0.001 is beyond 2 × 0.0003");
    let branch = props.get("branch_misses_per_instruction").unwrap();
    assert!(close(branch.value().unwrap(), 0.01));
    assert_eq!(branch.severity(), Some(1.0));
    let freq = props.get("core_frequency").unwrap();
    assert_eq!(freq.value(), Some(4.0e9));
    assert_eq!(freq.severity(), Some(0.0));
    assert!(!freq.fires());

    assert!(close(props.pop.ipc.value().unwrap(), 11.0 / 13.0));
    assert_eq!(props.pop.instructions.value(), Some(11_000_000.0));

    // One rank without counters: not measured for the job, saying how many lack them.
    input.ranks[1].pmu = None;
    let partial = evaluate_job(&input, &PropertyConfig::default());
    let reason = partial.get("cpi").unwrap().reason().unwrap().to_string();
    assert_eq!(reason, "not measured (no PMU counters for 1 of 2 ranks)");
    assert!(partial.get("cpi").unwrap().value().is_none());

    // A PMU without the LLC event: that property alone is not measured.
    input.ranks[1].pmu = Some(PmuCounters {
        llc_misses: None,
        ..counters(10_000_000, 10_000_000)
    });
    let no_llc = evaluate_job(&input, &PropertyConfig::default());
    assert!(no_llc
        .get("llc_misses_per_instruction")
        .unwrap()
        .reason()
        .unwrap()
        .contains("last-level cache"));
    assert!(no_llc
        .get("branch_misses_per_instruction")
        .unwrap()
        .value()
        .is_some());
}

#[test]
fn resource_usage_properties() {
    let job = ats_job();
    let usage = ResourceUsage {
        seconds: 10.0,
        memory_used_bytes: 6 << 30,
        memory_available_bytes: 8 << 30,
        user_seconds: 8.0,
        system_seconds: 6.0,
        cpus: 2.0,
    };
    let input = JobInput {
        resources: Some(usage),
        ..JobInput::lifetime(&job, 10 * S)
    };
    let props = evaluate_job(&input, &PropertyConfig::default());
    let memory = props.get("memory_used_share").unwrap();
    assert_eq!(memory.value(), Some(0.75));
    assert!(close(memory.severity().unwrap(), 0.5));
    // User 8 s of 20 CPU-seconds = 0.4 → 1 − 0.4/0.8 = 0.5; system 0.3 → min(0.3/0.2, 1) = 1.
    assert!(close(
        props.get("user_time_share").unwrap().severity().unwrap(),
        0.5
    ));
    assert_eq!(
        props.get("system_time_share").unwrap().severity(),
        Some(1.0)
    );
    assert!(props.get("system_time_share").unwrap().fires());
}

#[test]
fn fragmentation_combines_kernel_and_analysis_filters() {
    let mut job = ats_job();
    for r in job.ranks.values_mut() {
        r.totals.filtered_ns = r.totals.burst_ns / 5;
    }
    let props = evaluate_job(
        &JobInput::lifetime(&job, 10 * S),
        &PropertyConfig::default(),
    );
    let f = props.get("fragmentation").unwrap();
    assert!(close(f.value().unwrap(), 0.2));
    assert_eq!(f.severity(), Some(1.0), "0.2 = 2t saturates F1");
    let mut context = JobContext {
        ranks: JobInput::lifetime(&job, 10 * S).ranks,
        pop: props.pop.clone(),
        counters: Ok(()),
        nominal_hz: None,
        resources: None,
        io: None,
        analysis_filtered_share: Some(0.01),
    };
    assert_eq!(
        fragmentation(&context),
        Observation::Scalar(0.2 + 0.8 * 0.01)
    );
    context.ranks.iter_mut().for_each(|r| r.useful_ns = 0);
    assert!(matches!(fragmentation(&context), Observation::NoData(_)));
}

fn synthetic_analysis(counters: bool) -> analysis::Analysis {
    let mut imbalanced = synthetic::Phase::new(2.0e6, 1.0, 0.02);
    imbalanced.imbalance = Some((0, 3.0));
    let synthetic_job = synthetic::SyntheticJob {
        ranks: 4,
        iterations: 20,
        phases: vec![imbalanced, synthetic::Phase::new(5.0e5, 2.0, 0.02)],
        tiny_bursts_per_phase: 2,
        outlier_share: 0.0,
        counters,
        seed: 7,
    };
    analysis::analyse(&synthetic_job.bursts(), 4, &AnalysisParams::default()).unwrap()
}

/// A real cluster with the fields the phase properties read set as given (built from an
/// analysis rather than a literal, so that new fields of ClusterStats do not break the test).
fn cluster(
    lb_duration: f64,
    lb_instructions: Option<f64>,
    ipc: Option<f64>,
    spmd_score: f64,
) -> ClusterStats {
    let mut c = synthetic_analysis(false).clusters[0].clone();
    c.lb_duration = lb_duration;
    c.lb_instructions = lb_instructions;
    c.ipc = ipc;
    c.instructions_mean = ipc.map(|_| 1e6);
    c.spmd_score = spmd_score;
    c
}

#[test]
fn phase_properties() {
    let config = PropertyConfig::default();
    let phase = phase_strategy();

    // Imbalanced phase with equal instructions: the refinement is evaluated and does not fire.
    let results = phase.evaluate(&cluster(0.5, Some(0.98), Some(0.5), 1.0), &config);
    let get = |name: &str| results.iter().find(|r| r.name == name).unwrap();
    assert!(close(
        get("phase_load_balance").severity().unwrap(),
        1.0 - 0.5 / 0.8
    ));
    assert_eq!(get("phase_instruction_balance").severity(), Some(0.0));
    assert!(close(
        get("phase_ipc").severity().unwrap(),
        1.0 - 0.5 / 0.625
    ));
    assert_eq!(get("phase_spmd_score").severity(), Some(0.0));
    assert!(!get("phase_spmd_score").fires());

    // Balanced, non-SPMD, no PMU.
    let results = phase.evaluate(&cluster(0.95, None, None, 0.75), &config);
    let get = |name: &str| results.iter().find(|r| r.name == name);
    assert!(
        get("phase_instruction_balance").is_none(),
        "gated by a balanced phase"
    );
    assert_eq!(
        get("phase_ipc").unwrap().outcome,
        Outcome::NotMeasured {
            reason: NO_PMU.into()
        }
    );
    let spmd = get("phase_spmd_score").unwrap();
    assert!(close(spmd.severity().unwrap(), 0.25));
    assert!(spmd.fires());

    // Imbalanced without a PMU: the refinement says not measured.
    let results = phase.evaluate(&cluster(0.5, None, None, 1.0), &config);
    let ib = results
        .iter()
        .find(|r| r.name == "phase_instruction_balance")
        .unwrap();
    assert_eq!(
        ib.outcome,
        Outcome::NotMeasured {
            reason: NO_PMU.into()
        }
    );
}

#[test]
fn phases_of_a_real_analysis() {
    let analysis = synthetic_analysis(true);
    assert!(analysis.clusters.len() >= 2);

    let mut job = Job::new(JobMetaBuilder::new("job-1").size(4).build());
    for rank in 0..4 {
        job.ranks.insert(rank, rank_record(rank, 5 * S, 5 * S));
    }
    let input = JobInput {
        phases: Some((&analysis).into()),
        ..JobInput::lifetime(&job, 10 * S)
    };
    let props = evaluate_job(&input, &PropertyConfig::default());
    assert_eq!(props.phases.len(), analysis.clusters.len());
    let worst = props
        .phases
        .iter()
        .filter_map(|p| {
            Some((
                p.phase,
                p.properties
                    .iter()
                    .find(|r| r.name == "phase_load_balance")?
                    .value()?,
            ))
        })
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    // Rank 0 does 3× the work: LB ≈ (3 + 1 + 1 + 1)/4/3 = 0.5.
    assert!((worst.1 - 0.5).abs() < 0.05, "{worst:?}");
    let ib = props.phase(worst.0, "phase_instruction_balance").unwrap();
    assert!(ib.fires(), "unequal work: {ib:?}");
    assert!(props.phase(worst.0, "phase_ipc").unwrap().value().is_some());
    assert!(props
        .recommendations()
        .iter()
        .any(|r| r.phase == Some(worst.0) && r.property == "phase_load_balance"));
}

#[test]
fn configured_thresholds_change_the_severity() {
    let job = ats_job();
    let config =
        PropertyConfig::from_toml_str("[property.load_balance]\nthreshold = 0.6\nexponent = 2.0\n")
            .unwrap();
    let props = evaluate_job(&JobInput::lifetime(&job, 10 * S), &config);
    let lb = props.get("load_balance").unwrap();
    assert_eq!(
        lb.setting,
        Some(Setting {
            threshold: 0.6,
            exponent: 2.0
        })
    );
    assert!(close(lb.severity().unwrap(), 1.0 - (0.55f64 / 0.6).powi(2)));
    // Quantile count from the configuration.
    let config = PropertyConfig::from_toml_str("quantiles = 4\n").unwrap();
    let props = evaluate_job(&JobInput::lifetime(&job, 10 * S), &config);
    let mpi = props
        .get("mpi_time_fraction")
        .unwrap()
        .evaluation()
        .unwrap();
    assert_eq!(mpi.ranks.as_ref().unwrap().values.quantiles.len(), 5);
}
