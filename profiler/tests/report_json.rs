//! `mpiburst report --format json` and `mpiburst compare --format json` as scripts run them: the
//! built binary on recordings of synthetic jobs, standard output holding one JSON document and
//! nothing else. The report from a live daemon is tested with the real daemon (tests/phases.rs).

use std::{path::Path, process::Command};

use mpiburst::{
    analysis::synthetic::{Phase, SyntheticJob},
    export::recording::{write_synthetic, RecordingEnd, RecordingHeader, FORMAT_VERSION},
    test_support::JobMetaBuilder,
};
use serde_json::Value;

/// Writes a recording of a 2-rank job of two phases, the second one taking `ms` milliseconds.
fn record(path: &Path, id: &str, ms: f64) {
    record_iterations(path, id, ms, 30);
}

fn record_iterations(path: &Path, id: &str, ms: f64, iterations: u32) {
    let job = SyntheticJob {
        ranks: 2,
        iterations,
        phases: vec![
            Phase::new(5e6, 1.0, 0.02),
            Phase::new(ms * 2.5e6, 1.0, 0.02),
        ],
        tiny_bursts_per_phase: 1,
        outlier_share: 0.0,
        counters: false,
        seed: 3,
    };
    let bursts = job.bursts();
    let first = bursts.iter().map(|b| b.start_ns).min().unwrap();
    let last = bursts
        .iter()
        .map(|b| b.start_ns + b.duration_ns)
        .max()
        .unwrap();
    write_synthetic(
        path,
        RecordingHeader {
            version: FORMAT_VERSION,
            node: "node7".into(),
            started_ns: first,
            min_burst_ns: 1_000,
            counter_events: None,
            counters_note: "no counters".into(),
            functions: vec!["MPI_Allreduce".into(), "MPI_Isend".into()],
            rank_groups: None,
        },
        &JobMetaBuilder::new(id)
            .node("node7")
            .source("synthetic")
            .executable("/opt/app")
            .build_id("ab12")
            .first_seen_ns(first)
            .ended_ns(Some(last))
            .build(),
        &bursts,
        RecordingEnd {
            ended_ns: last,
            lost: Default::default(),
        },
    )
    .unwrap();
}

/// `mpiburst ARGS`: success, standard output, standard error.
fn mpiburst(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mpiburst"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run the built mpiburst");
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("UTF-8 on stdout"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn report_json_is_the_only_output_and_matches_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.jsonl");
    record(&path, "pmix:7", 8.0);
    let path = path.to_str().unwrap();

    let (ok, stdout, stderr) = mpiburst(&["report", path, "--phases", "--format", "json"]);
    assert!(ok, "{stderr}");
    assert_eq!(stderr, "", "nothing but the JSON, and no notes");
    let doc: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert_eq!(doc["schema"], "mpiburst-report");
    assert_eq!(doc["version"], 1);
    let jobs = doc["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(job["meta"]["id"], "pmix:7");
    assert_eq!(job["ranks"].as_array().unwrap().len(), 2);
    let clusters = job["phases"]["analysis"]["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 2, "{stdout}");
    assert_eq!(clusters[0]["bursts"], 60, "30 iterations × 2 ranks");

    // The text shows the same numbers.
    let (ok, text, stderr) = mpiburst(&["report", path, "--phases"]);
    assert!(ok, "{stderr}");
    let pop = &job["bottlenecks"]["properties"]["pop"];
    let lb = pop["load_balance"]["value"].as_f64().unwrap();
    assert!(text.contains(&format!("load balance {lb:.3}")), "{text}");
    let spmd = job["phases"]["analysis"]["global_score"].as_f64().unwrap();
    assert!(
        text.contains(&format!(
            "2 clusters over 2 ranks, global SPMD score {spmd:.3}"
        )),
        "{text}"
    );

    // Errors go to standard error with the text's message, and nothing to standard output.
    let (ok, stdout, stderr) = mpiburst(&["report", path, "--job", "pmix:8", "--format", "json"]);
    assert!(!ok);
    assert_eq!(stdout, "");
    assert!(
        stderr.contains("job pmix:8 is not in") && stderr.contains("pass one of: pmix:7"),
        "{stderr}"
    );

    // --html writes its page next to the JSON.
    let html = dir.path().join("phases.html");
    let (ok, stdout, stderr) = mpiburst(&[
        "report",
        path,
        "--html",
        html.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert_eq!(doc["jobs"][0]["phases"], Value::Null, "no --phases");
    assert!(html.exists() && stderr.contains("wrote "), "{stderr}");
}

#[test]
fn compare_json_lists_the_matched_phases() {
    let dir = tempfile::tempdir().unwrap();
    let (before, after) = (
        dir.path().join("before.jsonl"),
        dir.path().join("after.jsonl"),
    );
    record(&before, "pmix:1", 8.0);
    record(&after, "pmix:2", 12.0);
    let (ok, stdout, stderr) = mpiburst(&[
        "compare",
        before.to_str().unwrap(),
        after.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(stderr, "");
    let doc: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert_eq!(doc["schema"], "mpiburst-compare");
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["before"]["job"], "pmix:1");
    assert_eq!(doc["after"]["job"], "pmix:2");
    let phases = doc["match"]["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2, "{stdout}");
    // The phase that went from 8 ms to 12 ms is 50 % longer.
    let changes: Vec<f64> = phases
        .iter()
        .map(|p| p["trend"]["duration_mean_change"].as_f64().unwrap())
        .collect();
    assert!(
        changes.iter().any(|c| (c - 0.5).abs() < 0.05),
        "{changes:?}"
    );
}
