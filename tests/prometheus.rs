//! The daemon's metrics with a real Prometheus (Debian's `prometheus` and `promtool`): the
//! exposition passes promtool's checks, the recording rules pass their unit tests, and the
//! job-wide load balance Prometheus computes from a live daemon equals the one computed directly
//! from every rank.

use std::{thread, time::Duration};

use mpiburst_tests::*;

#[test]
fn recording_rules_pass_promtool_checks_and_unit_tests() {
    promtool(&["check", "rules", "mpiburst.rules.yml"], None);
    promtool(&["test", "rules", "mpiburst.rules.test.yml"], None);
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn job_load_balance_from_the_rules_equals_the_direct_value() {
    let daemon = Daemon::start(&[]);
    let prometheus = Prometheus::start(&[&daemon.addr]);
    // Rank 0 does a tenth of rank 1's work per iteration: load balance about (0.1 + 1) / 2 = 0.55.
    let program = program("imbalance", Mpi::OpenMpi);
    run_mpi(Mpi::OpenMpi, 2, &program, &["40", "20"]);
    thread::sleep(Duration::from_millis(1500));
    // The exposition of a real job passes promtool's linter, and its label values are
    // identifiers: recommendations and reasons are in the API, not in labels.
    let exposition = http_get(&daemon.addr, "/metrics");
    promtool(&["check", "metrics"], Some(&exposition));
    let series: Vec<&str> = exposition.lines().filter(|l| !l.starts_with('#')).collect();
    assert!(
        series
            .iter()
            .any(|l| l.starts_with("mpiburst_recommendation_severity{")),
        "the imbalanced job fires a recommendation: {exposition}"
    );
    for line in series {
        assert_eq!(
            mpiburst::export::prometheus::free_text_label(line),
            None,
            "free text in a label: {line}"
        );
    }
    // Other MPI jobs may run on this machine: this one is known by its executable.
    let id = job_id(&daemon.addr, &program, &[]);
    let detail = get_json(&daemon.addr, &format!("/api/jobs/{}", encode(&id)));
    let useful: Vec<f64> = detail["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["totals"]["burst_ns"].as_f64().unwrap() / 1e9)
        .collect();
    assert_eq!(useful.len(), 2);
    let direct = assert_rules_load_balance(&prometheus, &id, &useful);
    assert!(
        (0.5..0.62).contains(&direct),
        "load balance {direct}, expected about 0.55"
    );

    // The load-balance property fires with its F2 severity 1 − LB / 0.8 (threshold 0.8, exponent
    // 1), in the JSON API and in Prometheus alike.
    let props = get_json(
        &daemon.addr,
        &format!("/api/jobs/{}/properties", encode(&id)),
    );
    let lb = property(&props["job"], "load_balance");
    let (value, severity) = (
        lb["outcome"]["value"].as_f64().unwrap(),
        lb["outcome"]["severity"].as_f64().unwrap(),
    );
    assert!(
        (value - direct).abs() < 1e-9,
        "property {value} vs direct {direct}"
    );
    assert!(
        (severity - (1.0 - value / 0.8)).abs() < 1e-12,
        "severity {severity} for load balance {value}"
    );
    assert!(
        lb["outcome"]["condition"].as_bool().unwrap() && severity > 0.25,
        "{lb}"
    );
    let in_prometheus = prometheus.value(&format!(
        "mpiburst_property_severity{{mpi_job=\"{id}\",span=\"job\",property=\"load_balance\"}}"
    ));
    assert!(
        (in_prometheus - severity).abs() < 1e-12,
        "Prometheus {in_prometheus} vs API {severity}"
    );
    let recommended = prometheus.value(&format!(
        "count(mpiburst_recommendation_severity{{mpi_job=\"{id}\",span=\"job\",property=\"load_balance\"}})"
    ));
    assert_eq!(recommended, 1.0);
    // With a recommendation and not-measured properties in it, the exposition's label values are
    // still identifiers: the texts are in the API, not in labels.
    let exposition = http_get(&daemon.addr, "/metrics");
    for line in exposition.lines().filter(|l| !l.starts_with('#')) {
        assert_eq!(
            mpiburst::export::prometheus::free_text_label(line),
            None,
            "free text in a label: {line}"
        );
    }
    // Per-rank MPI time fractions, as quantiles over the ranks: the largest is rank 0's.
    let fraction = property(&props["job"], "mpi_time_fraction");
    let highest = fraction["outcome"]["ranks"]["values"]["quantiles"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .as_f64()
        .unwrap();
    eprintln!("load balance property {value:.4}, severity {severity:.4}; largest MPI time fraction {highest:.3}");
    assert!(
        (0.8..0.95).contains(&highest),
        "MPI time fraction of rank 0: {highest}"
    );
    let recording = daemon.stop();
    let job = job_of(&recording, &program);
    // Rank 0 waits for rank 1 most of each iteration: its MPI fraction is about 0.9.
    let r0 = &job.ranks[&0];
    let fraction = r0.mpi_ns() as f64 / (r0.mpi_ns() + r0.totals.burst_ns) as f64;
    eprintln!("MPI fraction of rank 0: {fraction:.3}");
    assert!(
        (0.8..0.95).contains(&fraction),
        "MPI fraction of rank 0: {fraction}"
    );
}
