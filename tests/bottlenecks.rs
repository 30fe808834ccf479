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

/// Runs of the daemon's file write program (`io_write_exit`), from its BPF statistics, once
/// the daemon has read them.
fn write_program_runs(daemon: &Daemon) -> u64 {
    let mut runs = None;
    wait_until(daemon, Duration::from_secs(10), "BPF statistics", || {
        let metrics = http_get(&daemon.addr, "/metrics");
        runs = metrics
            .lines()
            .find(|l| l.starts_with(r#"mpiburst_bpf_runs_total{program="io_write_exit"}"#))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok());
        runs.is_some()
    });
    runs.unwrap() as u64
}

/// `n` 1-byte writes of this process (which the daemon does not track) to a file.
fn untracked_writes(file: &std::fs::File, n: u64) {
    use std::os::unix::fs::FileExt;
    for i in 0..n {
        file.write_at(b"x", i).expect("write to the temporary file");
    }
}

/// Whether `n` untracked writes leave the write program's runs as they were, read again after
/// two statistics intervals (1 s each by default).
fn writes_run_no_program(daemon: &Daemon, file: &std::fs::File, n: u64) -> bool {
    let before = write_program_runs(daemon);
    untracked_writes(file, n);
    std::thread::sleep(Duration::from_millis(2500));
    write_program_runs(daemon) == before
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn the_file_io_programs_run_only_while_an_mpi_process_is_tracked() {
    // The system call tracepoints make every file call on the node build a record before the
    // program sees that its process is not tracked: a node without MPI processes must not pay.
    let daemon = Daemon::with_config("[capture]\nbpf_stats = true\n", &[]);
    let file = tempfile::tempfile().unwrap();
    assert!(
        writes_run_no_program(&daemon, &file, 1000),
        "writes ran the file I/O program with no MPI process on the node"
    );

    let program = program("io", Mpi::OpenMpi);
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = Mpi::OpenMpi.launcher(2);
    cmd.arg(&program).args([
        "size=4096".into(),
        "count=400".into(),
        "ms=20".into(),
        format!("dir={}", dir.path().display()),
    ]);
    let mut job = cmd
        .stdout(Stdio::null())
        .spawn()
        .expect("start the io program");
    // Tracked once the daemon identified the ranks: from then on every write on the node runs
    // the program, this process's included.
    let start = write_program_runs(&daemon);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let ran = loop {
        untracked_writes(&file, 1000);
        if write_program_runs(&daemon) >= start + 1000 {
            break true;
        }
        if std::time::Instant::now() > deadline || job.try_wait().unwrap().is_some() {
            break false;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let status = wait_with_timeout(&mut job, Duration::from_secs(120));
    assert!(
        ran,
        "writes ran no file I/O program while io's ranks ran; the daemon's log:\n{}",
        daemon.log_text()
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "io program: {status:?}"
    );
    let id = job_id(&daemon.addr, &program, &[]);
    ended_job_properties(&daemon.addr, &id);
    // Detached 10 s after the daemon forgot the ended ranks (jobs often follow each other).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !writes_run_no_program(&daemon, &file, 1000) {
        assert!(
            std::time::Instant::now() < deadline,
            "writes still run the file I/O program 30 s after the job ended; the daemon's \
             log:\n{}",
            daemon.log_text()
        );
    }
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
