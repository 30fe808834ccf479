//! Bottleneck properties of real MPI jobs under the real daemon: file I/O from the syscall
//! tracepoints (request sizes and the consolidation recommendation), and a job split over two
//! daemons with distinct node identities whose job-wide load balance Prometheus computes exactly.

use std::{process::Stdio, time::Duration};

use mpiburst_tests::*;

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn io_request_sizes_and_the_small_request_recommendation() {
    let daemon = Daemon::start(&[]);
    let program = program("io", Mpi::OpenMpi);
    let dir = tempfile::tempdir().unwrap();
    let dir_arg = format!("dir={}", dir.path().display());
    // (request size, requests per rank, compute between requests): modest bandwidth, so the
    // request size is what the properties judge.
    let mut fired = Vec::new();
    let mut runs: Vec<String> = Vec::new();
    // At least 100 requests per job: fewer are too few for the request size to be judged.
    for (size, count, ms) in [(8u64 << 20, 50, 20), (64u64 << 10, 200, 10)] {
        let mut cmd = Mpi::OpenMpi.launcher(2);
        cmd.arg(&program).args([
            format!("size={size}"),
            format!("count={count}"),
            format!("ms={ms}"),
            dir_arg.clone(),
        ]);
        let out = cmd
            .stderr(Stdio::inherit())
            .output()
            .expect("run the io program");
        assert!(out.status.success(), "io program failed");
        let printed = String::from_utf8_lossy(&out.stdout).to_string();
        // Short writes are completed by the program and count as more requests: its own count
        // is the truth.
        let requests: u64 = printed
            .split_whitespace()
            .find_map(|w| w.strip_prefix("requests="))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("io printed {printed:?}"));
        let expected = (size * count as u64) as f64 / requests as f64;
        let id = job_id(&daemon.addr, &program, &runs);
        let live = ended_job_properties(&daemon.addr, &id);
        let io = &live["usage"]["io"];
        let measured = io["write_bytes"].as_f64().unwrap() / io["write_calls"].as_f64().unwrap();
        eprintln!("{size}-byte requests: mean write request {measured:.1} B (expected {expected:.1}), io {io}");
        assert!(
            (measured / expected - 1.0).abs() < 0.001,
            "mean request {measured} vs {expected}"
        );
        let request_size = property(&live["job"], "io_write_request_size");
        let value = request_size["outcome"]["value"]
            .as_f64()
            .unwrap_or_else(|| panic!("no request size: {request_size}"));
        assert!((value / expected - 1.0).abs() < 0.001, "{request_size}");
        let consolidate = live["job_recommendations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| {
                r["property"] == "io_write_request_size"
                    && r["text"].as_str().unwrap().starts_with("Consolidate I/O")
            });
        fired.push(consolidate);
        runs.push(id);
    }
    assert_eq!(
        fired,
        [false, true],
        "the small-request recommendation fires for 64 KiB requests only"
    );
    daemon.stop();
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_job_over_two_nodes_has_an_exact_job_wide_load_balance() {
    let (a, b) = (
        Cgroup::new("mpiburst-node-a"),
        Cgroup::new("mpiburst-node-b"),
    );
    let node_a = Daemon::start(&["--node", "node-a", "--cgroup", &a.path]);
    let node_b = Daemon::start(&["--node", "node-b", "--cgroup", &b.path]);
    let prometheus = Prometheus::start(&[&node_a.addr, &node_b.addr]);
    // Even ranks run in node a's cgroup, odd ranks in node b's: each rank moves itself before
    // it execs the program, so each daemon sees only its half of the job.
    let program = program("imbalance", Mpi::OpenMpi);
    let mut cmd = Mpi::OpenMpi.launcher(4);
    cmd.args([
        "sh",
        "-c",
        &format!(
            "if [ $((OMPI_COMM_WORLD_RANK % 2)) -eq 0 ]; then d={}; else d={}; fi; echo $$ > $d/cgroup.procs && exec \"$0\" \"$@\"",
            a.dir.display(),
            b.dir.display()
        ),
    ])
    .arg(&program)
    .args(["40", "20"]);
    let st = run_with_timeout(cmd, Duration::from_secs(180));
    assert!(st.success(), "imbalance over two cgroups failed: {st}");

    let id = job_id(&node_a.addr, &program, &[]);
    let mut useful = Vec::new();
    for (daemon, node, ranks) in [(&node_a, "node-a", [0, 2]), (&node_b, "node-b", [1, 3])] {
        ended_job_properties(&daemon.addr, &id);
        let detail = get_json(&daemon.addr, &format!("/api/jobs/{}", encode(&id)));
        assert_eq!(detail["meta"]["node"], node);
        let seen: Vec<u64> = detail["ranks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["rank"].as_u64().unwrap())
            .collect();
        assert_eq!(seen, ranks, "ranks seen by {node}");
        useful.extend(
            detail["ranks"]
                .as_array()
                .unwrap()
                .iter()
                .map(region_useful_seconds),
        );
    }
    let direct = assert_rules_load_balance(&prometheus, &id, &useful);
    // Rank 1 does 10× the others' work: (1 + 3 × 0.1) / 4 = 0.325, with scheduling noise.
    assert!((0.25..0.45).contains(&direct), "load balance {direct}");
    let nodes = prometheus.value(&format!(
        "count(count by (node) (mpiburst_job_local_ranks{{mpi_job=\"{id}\"}}))"
    ));
    assert_eq!(nodes, 2.0);
    drop(prometheus);
    node_a.stop();
    node_b.stop();
}
