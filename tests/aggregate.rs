//! The job-wide view, live: a job's ranks split over simulated nodes (a cgroup and a daemon
//! each), merged by `mpiburst aggregate`, against one more daemon that sees all ranks.

use std::{
    process::{Child, Command},
    sync::{Arc, Mutex},
    thread,
    time::Duration,
};

use mpiburst_tests::*;

/// Short windows, so that a run of a few seconds closes several.
const WINDOWS: &str = "[analysis]\nwindow_s = 2.0\nlateness_s = 0.5\n";

/// `mpiburst aggregate` over `daemons`, stopped (SIGKILL) when dropped.
struct Aggregator {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    addr: String,
}

impl Aggregator {
    fn start(daemons: &[&str]) -> Aggregator {
        let addr = free_loopback_addr();
        let mut command = Command::new(daemon_binary());
        command.args(["aggregate", "--listen", &addr]);
        for daemon in daemons {
            command.args(["--daemon", daemon]);
        }
        let (child, log) = spawn_daemon(command);
        Aggregator { child, log, addr }
    }
}

impl Drop for Aggregator {
    fn drop(&mut self) {
        let log = &self.log;
        kill_daemon_left_running(&mut self.child, || log.lock().unwrap().join("\n"));
    }
}

/// Each phase's time share by the analysis's time order, and the window's SPMD score.
fn last_window(phases: &serde_json::Value) -> (u64, Vec<f64>, f64) {
    let last = &phases["last_window"];
    let mut views: Vec<&serde_json::Value> = last["phases"].as_array().unwrap().iter().collect();
    views.sort_by_key(|p| p["time_rank"].as_u64().unwrap());
    (
        last["window"].as_u64().unwrap(),
        views
            .iter()
            .map(|p| p["stats"]["time_share"].as_f64().unwrap())
            .collect(),
        last["spmd_score"].as_f64().unwrap(),
    )
}

/// `mpiburst report ADDR --job ID --format json`'s POP efficiencies.
fn pop_of(addr: &str, id: &str) -> serde_json::Value {
    let out = Command::new(daemon_binary())
        .args([
            "report",
            &format!("http://{addr}"),
            "--job",
            id,
            "--format",
            "json",
        ])
        .output()
        .expect("run mpiburst report");
    assert!(
        out.status.success(),
        "report of {addr}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    doc["jobs"][0]["bottlenecks"]["properties"]["pop"].clone()
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn the_aggregator_merges_two_nodes_into_what_a_daemon_seeing_all_ranks_finds() {
    let (a, b) = (Cgroup::new("mpiburst-agg-a"), Cgroup::new("mpiburst-agg-b"));
    let node_a = Daemon::with_config(WINDOWS, &["--node", "node-a", "--cgroup", &a.path]);
    let node_b = Daemon::with_config(WINDOWS, &["--node", "node-b", "--cgroup", &b.path]);
    let all = Daemon::with_config(WINDOWS, &["--node", "all"]);
    let program = program("phases", Mpi::OpenMpi);
    let mut cmd = Mpi::OpenMpi.launcher(4);
    cmd.args([
        "sh",
        "-c",
        &format!(
            "if [ $OMPI_COMM_WORLD_RANK -lt 2 ]; then d={}; else d={}; fi; echo $$ > $d/cgroup.procs && exec \"$0\" \"$@\"",
            a.dir.display(),
            b.dir.display()
        ),
    ])
    .arg(&program)
    .arg("iters=120");
    let st = run_with_timeout(cmd, Duration::from_secs(180));
    assert!(st.success(), "phases over two cgroups failed: {st}");
    let id = job_id(&all.addr, &program, &[]);
    let phases_path = format!("/api/jobs/{}/phases", encode(&id));

    let aggregator = Aggregator::start(&[&node_a.addr, &node_b.addr]);
    // Until every daemon has closed the job's last window (2 s windows, 0.5 s late, 1 s ticks).
    let mut merged = serde_json::Value::Null;
    let mut whole = serde_json::Value::Null;
    for _ in 0..30 {
        merged = get_json(&aggregator.addr, &phases_path);
        whole = get_json(&all.addr, &phases_path);
        let closed_everywhere = whole["open_window"]["window"].as_u64()
            > whole["last_window"]["window"].as_u64().map(|w| w + 1);
        if closed_everywhere && merged["last_window"]["window"] == whole["last_window"]["window"] {
            break;
        }
        thread::sleep(Duration::from_millis(500));
    }
    let coverage = &merged["job_wide"];
    eprintln!("job-wide coverage: {coverage}");
    assert_eq!(
        coverage["missing_ranks"],
        serde_json::json!([]),
        "{coverage}"
    );
    assert_eq!(coverage["unreachable"], serde_json::json!([]), "{coverage}");
    let (window, shares, spmd) = last_window(&merged);
    let (expected_window, expected_shares, expected_spmd) = last_window(&whole);
    eprintln!("merged: window {window} {shares:?} SPMD {spmd:.3}");
    eprintln!("all ranks: window {expected_window} {expected_shares:?} SPMD {expected_spmd:.3}");
    assert_eq!(window, expected_window);
    assert_eq!(shares.len(), expected_shares.len(), "phases");
    for (got, want) in shares.iter().zip(&expected_shares) {
        assert!(
            (got - want).abs() <= 0.01,
            "time shares {shares:?} vs {expected_shares:?}"
        );
    }
    assert!(
        (spmd - expected_spmd).abs() <= 0.02,
        "SPMD {spmd} vs {expected_spmd}"
    );

    // The job with all ranks: POP over the whole job, as the daemon seeing all ranks has it.
    let job = get_json(&aggregator.addr, &format!("/api/jobs/{}", encode(&id)));
    assert_eq!(
        job["ranks"].as_array().unwrap().len(),
        4,
        "{}",
        job["job_wide"]
    );
    assert_eq!(job["meta"]["node"], "node-a,node-b");
    let (pop, expected_pop) = (pop_of(&aggregator.addr, &id), pop_of(&all.addr, &id));
    eprintln!("POP merged {pop}\nPOP all ranks {expected_pop}");
    for name in [
        "load_balance",
        "communication_efficiency",
        "parallel_efficiency",
    ] {
        let value = |pop: &serde_json::Value| pop[name]["value"].as_f64().unwrap();
        let (got, want) = (value(&pop), value(&expected_pop));
        assert!((got - want).abs() <= 0.001, "{name}: {got} vs {want}");
    }

    // A node that is down is named, and its ranks are missing, never silently left out.
    let down = node_b.addr.clone();
    node_b.stop();
    let partial = get_json(&aggregator.addr, &format!("/api/jobs/{}", encode(&id)));
    let coverage = &partial["job_wide"];
    assert_eq!(
        coverage["missing_ranks"],
        serde_json::json!([2, 3]),
        "{coverage}"
    );
    assert_eq!(
        coverage["unreachable"][0]["node"],
        down.as_str(),
        "{coverage}"
    );
    drop(aggregator);
    node_a.stop();
    all.stop();
}
