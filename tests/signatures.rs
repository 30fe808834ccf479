//! Application signatures and run-time prediction on real MPI runs: tests/mpi/workload under the
//! real daemon, whose two phases cost n and n² and repeat 10·n times at workload n. The run time
//! compared with is the one `mpiburst report` shows (the slowest rank's region of interest), and
//! that in turn with the program's own clock.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use mpiburst::{
    analysis::{analyse, signature::signature, AnalysisParams},
    export::signature::regions,
    model::Burst,
};
use mpiburst_tests::*;

const MPI: Mpi = Mpi::OpenMpi;
const RANKS: u32 = 2;

/// What rank 0 of a workload run measured itself.
struct OwnClocks {
    /// Its region of interest, in s.
    region_s: f64,
    /// The thread CPU time of its work over the CPU time the calibration gives that work: how
    /// slowly the CPU ran the same arithmetic in this run. A virtual machine's CPU slows down
    /// when its host is busy, here by up to 14 % from one run to the next.
    slowdown: f64,
    /// The work's calibration, in units of arithmetic per ms of CPU.
    units_per_ms: f64,
}

/// Runs `workload n=N` and `more` arguments under the running daemon, with the given
/// calibration or its own; returns what rank 0 measured itself.
fn run_workload(n: u32, more: &[&str], units_per_ms: Option<f64>, dir: &Path) -> OwnClocks {
    let out = dir.join(format!("workload-{n}.out"));
    let mut cmd = MPI.launcher(RANKS);
    cmd.arg(program("workload", MPI))
        .arg(format!("n={n}"))
        .args(more)
        .args(units_per_ms.map(|u| format!("units_per_ms={u}")))
        .stdout(std::fs::File::create(&out).unwrap());
    let st = run_with_timeout(cmd, Duration::from_secs(300));
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(st.success(), "workload n={n} failed: {st}\n{text}");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("workload: "))
        .unwrap_or_else(|| panic!("no result line in the output of workload n={n}:\n{text}"));
    let value = |key: &str| -> f64 {
        line.split(' ')
            .find_map(|field| field.strip_prefix(key)?.strip_prefix('='))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in the result line of workload n={n}: {line}"))
    };
    OwnClocks {
        region_s: value("region_s"),
        slowdown: value("work_cpu_s") * 1e3 * value("units_per_ms") / value("work_units"),
        units_per_ms: value("units_per_ms"),
    }
}

fn mpiburst(args: &[&str]) -> serde_json::Value {
    let out = Command::new(std::env::var_os("MPIBURST_BIN").expect("MPIBURST_BIN"))
        .args(args)
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "mpiburst {args:?} failed");
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The run time `mpiburst report` shows for a job: its slowest rank's region of interest. Also
/// checks that the report's signature (JSON) is of that run time and covers it.
fn reported_runtime_s(recording: &Path, job: &str) -> f64 {
    let path = recording.to_string_lossy();
    let report = mpiburst(&[
        "report", &path, "--job", job, "--phases", "--format", "json",
    ]);
    let job = &report["jobs"][0];
    let runtime_s = job["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["region"]["runtime_ns"].as_f64().unwrap() / 1e9)
        .fold(0.0, f64::max);
    let signature = &job["phases"]["signature"];
    assert_eq!(signature["runtime_ns"].as_f64().unwrap() / 1e9, runtime_s);
    let coverage = signature["coverage"].as_f64().unwrap();
    assert!((0.98..=1.0).contains(&coverage), "{signature}");
    runtime_s
}

#[test]
#[ignore = "needs root (BPF) and MPI: run by `cargo xtask test`"]
fn the_signature_of_a_run_reproduces_its_run_time() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&[]);
    let own_region_s = run_workload(6, &[], None, dir.path()).region_s;
    let recording = daemon.stop();
    let job = job_of(&recording, &program("workload", MPI));
    let bursts: Vec<Burst> = job.bursts.iter().cloned().collect();
    let analysis = analyse(&bursts, job.node_ranks(), &AnalysisParams::default()).unwrap();
    let end = job.meta.ended_ns.expect("the job ended");
    let s = signature(&bursts, &analysis, &regions(job, end)).unwrap();
    let runtime_s = s.runtime_ns as f64 / 1e9;
    let paet_s = s.paet_ns() / 1e9;
    println!(
        "runtime {runtime_s:.4} s (program's own {own_region_s:.4} s), PAET {paet_s:.4} s, \
         coverage {:.4}, phases {:#?}",
        s.coverage(),
        s.phases
    );
    // The two phases of the loop, each repeated 60 times per rank, exactly.
    assert_eq!(s.phases.len(), 2, "{:#?}", s.phases);
    for phase in &s.phases {
        assert_eq!(phase.weight, 60.0, "{phase:?}");
    }
    assert!(
        (paet_s - runtime_s).abs() <= 0.02 * runtime_s,
        "PAET {paet_s} s against the run time {runtime_s} s"
    );
    // The daemon's region of interest is the program's own, up to the probes' and the clocks'
    // few milliseconds and the other rank's later end.
    assert!(
        (runtime_s - own_region_s).abs() <= 0.01 * own_region_s + 0.005,
        "run time {runtime_s} s against the program's {own_region_s} s"
    );
}

#[test]
#[ignore = "needs root (BPF) and MPI: run by `cargo xtask test`"]
fn runs_at_four_sizes_predict_a_fifth_within_five_percent() {
    // The weights are the loop's iteration counts, exactly linear in n.
    let prediction = predict_the_run_at_7(&[]);
    for phase in prediction["phases"].as_array().unwrap() {
        assert_eq!(phase["weight"]["family"], "linear", "{phase}");
        assert!((phase["weight"]["predicted"].as_f64().unwrap() - 70.0).abs() < 1e-6);
    }
}

#[test]
#[ignore = "needs root (BPF) and MPI: run by `cargo xtask test`"]
fn runs_that_stop_at_an_iteration_cap_predict_a_fifth_within_five_percent() {
    // 10 iterations per unit of n up to 75: the runs at 8 and 10 stop at the cap, the one at 7
    // does not.
    let prediction = predict_the_run_at_7(&["max_iterations=75"]);
    for phase in prediction["phases"].as_array().unwrap() {
        assert_eq!(phase["weight"]["family"], "capped_linear", "{phase}");
        assert!((phase["weight"]["predicted"].as_f64().unwrap() - 70.0).abs() < 1e-6);
    }
}

/// Runs the workload with `more` arguments at n = 4, 10, 7, 6 and 8 under one daemon, predicts
/// the run at 7 from the four others, and checks the prediction within 5 % of the run's time;
/// returns the prediction. The same prediction from the daemon's live signatures of the ended
/// jobs, with no recording, directly and through the aggregator, must agree within 2 %.
fn predict_the_run_at_7(more: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let kept: PathBuf = dir.path().join("runs.jsonl");
    // Windows of 2 s, so that the window in which each job ended closes soon after it.
    let daemon = Daemon::with_config("[analysis]\nwindow_s = 2.0\nlateness_s = 0.5\n", &[]);
    // The run predicted in the middle, so that a change of the machine's load over the test
    // weighs on both sides. Every run does the same work per unit of n: the first run's
    // calibration is passed on.
    let sizes = [4, 10, 7, 6, 8];
    let first = run_workload(sizes[0], more, None, dir.path());
    let calibration = Some(first.units_per_ms);
    let mut own = vec![first];
    own.extend(
        sizes[1..]
            .iter()
            .map(|&n| run_workload(n, more, calibration, dir.path())),
    );
    let (live, aggregated) = predicted_live(&daemon, &sizes);
    let recording = daemon.stop_keeping(Some(&kept));
    let mut jobs = jobs_of(&recording, &program("workload", MPI));
    assert_eq!(jobs.len(), sizes.len(), "one job per run");
    jobs.sort_by_key(|j| j.meta.first_seen_ns);
    let arg = |i: usize| format!("{}#{}={}", kept.display(), jobs[i].meta.id, sizes[i]);
    let fitted = [0, 1, 3, 4];
    let args: Vec<String> = fitted.map(arg).into();
    let mut command = vec!["predict", "--at", "7", "--format", "json"];
    command.extend(args.iter().map(String::as_str));
    let prediction = mpiburst(&command);
    let predicted = prediction["predicted_runtime_s"].as_f64().unwrap();
    let measured = reported_runtime_s(&kept, &jobs[2].meta.id.0);
    // A prediction from other runs cannot know how fast the CPU will run the predicted one. The
    // run at 7 is compared at the fitted runs' mean CPU speed, by the program's own clocks; on a
    // steady machine the slowdowns are equal and this changes nothing. Sharing the cores with
    // other work is left in: it slows each run by what its burst lengths give, which the phases'
    // times carry into the prediction.
    let fitted_slowdown = fitted.iter().map(|&i| own[i].slowdown).sum::<f64>() / 4.0;
    let at_fitted_speed = measured * fitted_slowdown / own[2].slowdown;
    let slowdowns: Vec<String> = own.iter().map(|o| format!("{:.3}", o.slowdown)).collect();
    println!(
        "predicted {predicted:.4} s, measured {measured:.4} s, {at_fitted_speed:.4} s at the \
         fitted runs' CPU speed (CPU slowdowns by run, n = {sizes:?}: {})\n{}",
        slowdowns.join(", "),
        serde_json::to_string_pretty(&prediction).unwrap()
    );
    assert!(
        (predicted - at_fitted_speed).abs() <= 0.05 * at_fitted_speed,
        "predicted {predicted} s, the run at 7 took {measured} s, {at_fitted_speed} s at the \
         fitted runs' CPU speed"
    );
    println!(
        "predicted from the daemon's live signatures: {live:.4} s, through the aggregator: \
         {aggregated:.4} s"
    );
    for (source, value) in [("the daemon", live), ("the aggregator", aggregated)] {
        assert!(
            (value - predicted).abs() <= 0.02 * predicted,
            "predicted {value} s from the live signatures of {source}, {predicted} s from the \
             recording"
        );
    }
    prediction
}

/// The run at 7 predicted from the daemon's live signatures of the other runs' ended jobs (the
/// workload's jobs in the order they started, of the sizes `sizes`), once the window in which the
/// last one ended has closed: from the daemon, and from an aggregator of it.
fn predicted_live(daemon: &Daemon, sizes: &[u32]) -> (f64, f64) {
    let exe = program("workload", MPI).canonicalize().unwrap();
    let mut jobs: Vec<serde_json::Value> = get_json(&daemon.addr, "/api/jobs")
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["meta"].clone())
        .filter(|meta| meta["executable"].as_str() == exe.to_str())
        .collect();
    jobs.sort_by_key(|meta| meta["first_seen_ns"].as_u64());
    assert_eq!(jobs.len(), sizes.len(), "one job per run: {jobs:?}");
    let ids: Vec<&str> = jobs.iter().map(|m| m["id"].as_str().unwrap()).collect();
    // Each job's signature covers it once the window in which it ended (2 s, plus 0.5 s of
    // lateness) has closed; a bounded wait.
    for id in &ids {
        let mut seen = (None, None);
        let covered = (0..40).any(|_| {
            let phases = get_json(&daemon.addr, &format!("/api/jobs/{}/phases", encode(id)));
            let job = get_json(&daemon.addr, &format!("/api/jobs/{}", encode(id)));
            // The run ends at the last rank's MPI_Finalize entry.
            let finalized = job["ranks"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["region"]["finalize_entry_ns"].as_u64())
                .collect::<Option<Vec<u64>>>()
                .and_then(|ends| ends.into_iter().max());
            seen = (finalized, phases["signature"]["up_to_ns"].as_u64());
            let done = matches!(seen, (Some(ended), Some(up_to)) if up_to >= ended);
            if !done {
                std::thread::sleep(Duration::from_millis(250));
            }
            done
        });
        assert!(
            covered,
            "job {id}: its live signature never covered its end: (finalized, up_to_ns) {seen:?}"
        );
    }
    let predict = |addr: &str| {
        let args: Vec<String> = [0, 1, 3, 4]
            .map(|i| format!("http://{addr}#{}={}", ids[i], sizes[i]))
            .into();
        let mut command = vec!["predict", "--at", "7", "--format", "json"];
        command.extend(args.iter().map(String::as_str));
        mpiburst(&command)["predicted_runtime_s"].as_f64().unwrap()
    };
    let aggregator = Aggregator::start(&["--daemon", &daemon.addr]);
    (predict(&daemon.addr), predict(&aggregator.addr))
}
