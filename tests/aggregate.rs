//! The job-wide view, live: a job's ranks split over simulated nodes (a cgroup and a daemon
//! each), merged by `mpiburst aggregate`, against one more daemon that sees all ranks.

use std::{process::Command, thread, time::Duration};

use mpiburst_tests::*;

/// Short windows, so that a run of a few seconds closes several.
const WINDOWS: &str = "[analysis]\nwindow_s = 2.0\nlateness_s = 0.5\n";

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

/// The live signature of a phases answer: its ranks, run time so far, phases (W, PET in ns) and
/// PAET in ns.
fn signature(phases: &serde_json::Value) -> (u64, u64, Vec<(f64, f64)>, f64) {
    let s = &phases["signature"];
    assert!(s.is_object(), "no signature: {s}");
    let phases: Vec<(f64, f64)> = s["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["weight"].as_f64().unwrap(), p["pet_ns"].as_f64().unwrap()))
        .collect();
    let paet = phases.iter().map(|(w, pet)| w * pet).sum();
    (
        s["ranks"].as_u64().unwrap(),
        s["runtime_ns"].as_u64().unwrap(),
        phases,
        paet,
    )
}

/// `mpiburst report ADDR --job ID --format json`'s job report.
fn report_of(addr: &str, id: &str) -> serde_json::Value {
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
    doc["jobs"][0].clone()
}

/// The groups of a `/ranks` answer as (lead, members).
fn groups(ranks: &serde_json::Value) -> Vec<(u64, Vec<u64>)> {
    ranks["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let members = g["members"].as_array().unwrap();
            (
                g["lead"].as_u64().unwrap(),
                members.iter().map(|m| m.as_u64().unwrap()).collect(),
            )
        })
        .collect()
}

/// `count` simulated nodes: cgroups NAME-0, NAME-1, … with a daemon each.
fn simulated_nodes(name: &str, count: usize) -> (Vec<Cgroup>, Vec<Daemon>) {
    let cgroups: Vec<Cgroup> = (0..count)
        .map(|i| Cgroup::new(&format!("{name}-{i}")))
        .collect();
    let nodes = cgroups
        .iter()
        .enumerate()
        .map(|(i, c)| node_daemon(i, c))
        .collect();
    (cgroups, nodes)
}

/// Node `i`'s daemon: it sees only the processes of `cgroup`.
fn node_daemon(i: usize, cgroup: &Cgroup) -> Daemon {
    Daemon::with_config(
        WINDOWS,
        &["--node", &format!("node-{i}"), "--cgroup", &cgroup.path],
    )
}

/// mpirun of `phases iters=ITERS` on 4 ranks, rank r on the node of `cgroups[r mod count]`.
fn phases_over(cgroups: &[Cgroup], iters: u32) -> Command {
    program_over(cgroups, "phases", &[&format!("iters={iters}")])
}

/// mpirun of `NAME ARGS…` on 4 ranks, rank r on the node of `cgroups[r mod count]`: each rank
/// moves itself into its node's cgroup before it execs the program.
fn program_over(cgroups: &[Cgroup], name: &str, args: &[&str]) -> Command {
    let dirs: Vec<String> = cgroups
        .iter()
        .map(|c| c.dir.display().to_string())
        .collect();
    let mut cmd = Mpi::OpenMpi.launcher(4);
    cmd.args([
        "sh",
        "-c",
        &format!(
            "d=$(echo {} | cut -d' ' -f$((OMPI_COMM_WORLD_RANK % {} + 1))); echo $$ > $d/cgroup.procs && exec \"$PROGRAM\" \"$@\"",
            dirs.join(" "),
            cgroups.len()
        ),
        "sh",
    ])
    .args(args)
    .env("PROGRAM", program(name, Mpi::OpenMpi));
    cmd
}

/// Runs `phases` on 4 ranks split over `count` simulated nodes (rank r on node r mod count), each
/// a cgroup with its own daemon, beside one daemon that sees all ranks, and compares the
/// aggregator's job-wide answers with that daemon's. Returns the node daemons, the all-ranks one
/// and the job id, for more checks.
fn split_over(count: usize) -> (Vec<Daemon>, Daemon, String, Vec<Cgroup>) {
    let (cgroups, nodes) = simulated_nodes("mpiburst-agg", count);
    let all = Daemon::with_config(WINDOWS, &["--node", "all"]);
    let program = program("phases", Mpi::OpenMpi);
    let cmd = phases_over(&cgroups, 120);
    let st = run_with_timeout(cmd, Duration::from_secs(180));
    assert!(st.success(), "phases over {count} cgroups failed: {st}");
    let id = job_id(&all.addr, &program, &[]);
    // Every daemon has read the ranks' final totals: what is compared is the ended job.
    for daemon in nodes.iter().chain([&all]) {
        ended_job_properties(&daemon.addr, &id);
    }
    (nodes, all, id, cgroups)
}

/// The aggregator's phases, groups and POP equal the all-ranks daemon's (to the issue's
/// tolerances: time shares within 1 point, SPMD within 0.02, POP within 0.001, identical groups).
fn assert_job_wide_equal(aggregator: &str, all: &str, id: &str, count: usize) {
    let phases_path = format!("/api/jobs/{}/phases", encode(id));
    let mut merged = serde_json::Value::Null;
    let mut whole = serde_json::Value::Null;
    // Until every daemon has closed the job's last window (2 s windows, 0.5 s late, 1 s ticks).
    for _ in 0..30 {
        merged = get_json(aggregator, &phases_path);
        whole = get_json(all, &phases_path);
        let closed = whole["open_window"]["window"].as_u64()
            > whole["last_window"]["window"].as_u64().map(|w| w + 1);
        if closed && merged["last_window"]["window"] == whole["last_window"]["window"] {
            break;
        }
        thread::sleep(Duration::from_millis(500));
    }
    let coverage = &merged["job_wide"];
    eprintln!("{count} nodes, job-wide coverage: {coverage}");
    assert_eq!(
        coverage["missing_ranks"],
        serde_json::json!([]),
        "{coverage}"
    );
    assert_eq!(coverage["unreachable"], serde_json::json!([]), "{coverage}");
    assert_eq!(coverage["nodes"].as_array().unwrap().len(), count);
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
    let (signature, expected_signature) = (signature(&merged), signature(&whole));
    eprintln!("signature merged {signature:?}\nsignature all ranks {expected_signature:?}");
    assert_eq!(signature.0, 4, "ranks of the signature");
    assert_eq!(signature.0, expected_signature.0);
    // Each daemon moves the kernel's clock to Unix time by its own reading: microseconds apart.
    assert!(
        (signature.1 as f64 / expected_signature.1 as f64 - 1.0).abs() <= 0.001,
        "the signature's run time"
    );
    // A burst that starts within those microseconds of the window's end may count on one side.
    let weights = |s: &[(f64, f64)]| {
        let mut w: Vec<f64> = s.iter().map(|p| p.0).collect();
        w.sort_by(f64::total_cmp);
        w
    };
    assert_eq!(signature.2.len(), expected_signature.2.len(), "phases");
    for (got, want) in weights(&signature.2)
        .iter()
        .zip(weights(&expected_signature.2))
    {
        assert!(
            (got - want).abs() <= 0.5,
            "the phases' repetitions per rank: {signature:?} vs {expected_signature:?}"
        );
    }
    assert!(
        (signature.3 / expected_signature.3 - 1.0).abs() <= 0.02,
        "PAET {} vs {}",
        signature.3,
        expected_signature.3
    );

    let job = get_json(aggregator, &format!("/api/jobs/{}", encode(id)));
    assert_eq!(
        job["ranks"].as_array().unwrap().len(),
        4,
        "{}",
        job["job_wide"]
    );
    let whole_job = get_json(all, &format!("/api/jobs/{}", encode(id)));
    for (what, detail) in [("merged", &job), ("all ranks", &whole_job)] {
        for rank in detail["ranks"].as_array().unwrap() {
            eprintln!(
                "{what}: rank {} pid {} seen {} ended {} region {}",
                rank["rank"], rank["pid"], rank["first_seen_ns"], rank["ended_ns"], rank["region"]
            );
        }
    }
    assert_eq!(
        job["counters"], whole_job["counters"],
        "the counters the bursts carry"
    );
    let (report, expected_report) = (report_of(aggregator, id), report_of(all, id));
    assert_eq!(
        report["counters_note"], expected_report["counters_note"],
        "the report's counters line"
    );
    let pop_of = |report: &serde_json::Value| report["bottlenecks"]["properties"]["pop"].clone();
    let (pop, expected_pop) = (pop_of(&report), pop_of(&expected_report));
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

    let ranks_path = format!("/api/jobs/{}/ranks", encode(id));
    let (merged_groups, expected_groups) = (
        groups(&get_json(aggregator, &ranks_path)),
        groups(&get_json(all, &ranks_path)),
    );
    eprintln!("groups merged {merged_groups:?}, all ranks {expected_groups:?}");
    assert_eq!(merged_groups, expected_groups, "rank groups and lead ranks");
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn the_aggregator_merges_two_nodes_into_what_a_daemon_seeing_all_ranks_finds() {
    let (mut nodes, all, id, _cgroups) = split_over(2);
    let addrs: Vec<&str> = nodes.iter().map(|d| d.addr.as_str()).collect();
    let aggregator = Aggregator::start(&["--daemon", addrs[0], "--daemon", addrs[1]]);
    assert_job_wide_equal(&aggregator.addr, &all.addr, &id, 2);

    // The same, finding the nodes through the Prometheus server that scrapes them.
    let victoria = VictoriaMetrics::start();
    let prometheus = Prometheus::writing_to(&addrs, &victoria.write_url());
    let info = format!("count(mpiburst_job_info{{mpi_job=\"{id}\"}}) == 2");
    prometheus.value(&info);
    let scraped = Aggregator::start(&["--prometheus", &prometheus.addr]);
    assert_job_wide_equal(&scraped.addr, &all.addr, &id, 2);

    // And through VictoriaMetrics, where Prometheus remote-writes every sample: the job-wide
    // numbers of the recording rules are there, and the aggregator finds the nodes through its
    // query API, below the path prefix /prometheus.
    victoria.value(&info);
    let load_balance = format!("mpi_job:mpiburst_load_balance:ratio{{mpi_job=\"{id}\"}}");
    let (written_value, value) = (
        victoria.value(&load_balance),
        prometheus.value(&load_balance),
    );
    // VictoriaMetrics keeps 12 significant digits of a float.
    assert!(
        (written_value - value).abs() <= 1e-9 * value.abs(),
        "the job-wide load balance, remote-written: {written_value} vs {value}"
    );
    let written = Aggregator::start(&[
        "--prometheus",
        &format!("http://{}/prometheus", victoria.addr),
    ]);
    assert_job_wide_equal(&written.addr, &all.addr, &id, 2);
    drop(written);

    // A restarted aggregator answers the same: it kept nothing of its own.
    let before = get_json(
        &aggregator.addr,
        &format!("/api/jobs/{}/phases", encode(&id)),
    );
    drop(aggregator);
    let aggregator = Aggregator::start(&["--daemon", addrs[0], "--daemon", addrs[1]]);
    let after = get_json(
        &aggregator.addr,
        &format!("/api/jobs/{}/phases", encode(&id)),
    );
    assert_eq!(last_window(&after), last_window(&before), "after a restart");

    // A frozen node is named once its answer is late; the others are merged.
    let frozen = nodes[0].pid().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &frozen])
        .status()
        .unwrap()
        .success());
    let late = get_json(&aggregator.addr, &format!("/api/jobs/{}", encode(&id)));
    assert!(Command::new("kill")
        .args(["-CONT", &frozen])
        .status()
        .unwrap()
        .success());
    let coverage = &late["job_wide"];
    assert_eq!(
        coverage["missing_ranks"],
        serde_json::json!([0, 2]),
        "{coverage}"
    );
    assert_eq!(coverage["unreachable"][0]["node"], addrs[0], "{coverage}");

    // A node that is down is named, and its ranks are missing, never silently left out.
    let down = nodes[1].addr.clone();
    nodes.pop().unwrap().stop();
    let partial = get_json(&aggregator.addr, &format!("/api/jobs/{}", encode(&id)));
    let coverage = &partial["job_wide"];
    assert_eq!(
        coverage["missing_ranks"],
        serde_json::json!([1, 3]),
        "{coverage}"
    );
    assert_eq!(
        coverage["unreachable"][0]["node"],
        down.as_str(),
        "{coverage}"
    );
    drop((aggregator, scraped, prometheus, victoria));
    for node in nodes {
        node.stop();
    }
    all.stop();
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn the_aggregator_merges_four_nodes_into_what_a_daemon_seeing_all_ranks_finds() {
    let (nodes, all, id, _cgroups) = split_over(4);
    let mut args = Vec::new();
    for node in &nodes {
        args.extend(["--daemon", node.addr.as_str()]);
    }
    let aggregator = Aggregator::start(&args);
    assert_job_wide_equal(&aggregator.addr, &all.addr, &id, 4);
    drop(aggregator);
    for node in nodes {
        node.stop();
    }
    all.stop();
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_node_daemon_restarted_while_the_job_runs_rejoins_with_its_ranks_flagged() {
    let (cgroups, mut nodes) = simulated_nodes("mpiburst-agg-restart", 2);
    let mut cmd = phases_over(&cgroups, 200);
    let mut job = cmd.spawn().expect("start mpirun");
    let id = {
        let mut found = None;
        for _ in 0..100 {
            let jobs = get_json(&nodes[1].addr, "/api/jobs");
            if let Some(first) = jobs.as_array().unwrap().first() {
                found = Some(first["meta"]["id"].as_str().unwrap().to_string());
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        found.expect("node 1's daemon saw the job")
    };
    // Node 1's daemon dies and a new one takes its place while the job runs.
    thread::sleep(Duration::from_secs(2));
    nodes[1].kill9();
    nodes[1] = node_daemon(1, &cgroups[1]);
    let st = wait_with_timeout(&mut job, Duration::from_secs(180)).expect("the job ends");
    assert!(st.success(), "phases failed: {st}");
    for node in &nodes {
        ended_job_properties(&node.addr, &id);
    }
    let aggregator = Aggregator::start(&["--daemon", &nodes[0].addr, "--daemon", &nodes[1].addr]);
    let merged = get_json(&aggregator.addr, &format!("/api/jobs/{}", encode(&id)));
    let coverage = &merged["job_wide"];
    assert_eq!(
        coverage["missing_ranks"],
        serde_json::json!([]),
        "{coverage}"
    );
    assert_eq!(coverage["unreachable"], serde_json::json!([]), "{coverage}");
    assert_eq!(
        coverage["ranks_seen_late"],
        serde_json::json!([1, 3]),
        "{coverage}"
    );
    drop(aggregator);
    for node in nodes {
        node.stop();
    }
}

/// Ranks that switch roles half-way, over 2 nodes: the aggregator's rank groups and behaviour
/// change are those of the daemon that sees all ranks, the change seen on both nodes.
#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_behaviour_change_on_two_nodes_is_the_job_s_one_change() {
    let (cgroups, nodes) = simulated_nodes("mpiburst-agg-switch", 2);
    let all = Daemon::with_config(WINDOWS, &["--node", "all"]);
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let cmd = program_over(&cgroups, "role_switch", &[out, "7", "2"]);
    let st = run_with_timeout(cmd, Duration::from_secs(180));
    assert!(st.success(), "role_switch over 2 cgroups failed: {st}");
    let id = job_id(&all.addr, &program("role_switch", Mpi::OpenMpi), &[]);
    for daemon in nodes.iter().chain([&all]) {
        ended_job_properties(&daemon.addr, &id);
    }
    let aggregator = Aggregator::start(&["--daemon", &nodes[0].addr, "--daemon", &nodes[1].addr]);
    let ranks_path = format!("/api/jobs/{}/ranks", encode(&id));
    let (merged, expected) = (
        get_json(&aggregator.addr, &ranks_path),
        get_json(&all.addr, &ranks_path),
    );
    eprintln!("merged {merged}\nall ranks {expected}");
    assert_eq!(
        groups(&merged),
        groups(&expected),
        "rank groups and lead ranks"
    );
    // After the switch the odd ranks send and the even ones receive.
    assert_eq!(groups(&merged), [(0, vec![0, 2]), (1, vec![1, 3])]);
    let (changes, expected_changes) = (
        merged["changes"].as_array().unwrap(),
        expected["changes"].as_array().unwrap(),
    );
    assert_eq!(changes.len(), 1, "{merged}");
    assert_eq!(expected_changes.len(), 1, "{expected}");
    for field in ["ranks", "groups_before", "groups_after"] {
        assert_eq!(changes[0][field], expected_changes[0][field], "{field}");
    }
    // Each daemon delimits its windows by its own kernel readings, a few hundred ms after each
    // boundary on a loaded machine: a switch between two daemons' readings of one boundary is
    // in adjacent windows on each, and each window holds the switch.
    let outputs = rank_outputs(dir.path(), "role_switch", 4);
    for change in [&changes[0], &expected_changes[0]] {
        assert_change_holds_each_switch(change, &outputs);
    }
    let (window, expected_window) = (
        changes[0]["window"].as_u64().unwrap(),
        expected_changes[0]["window"].as_u64().unwrap(),
    );
    assert!(
        window.abs_diff(expected_window) <= 1,
        "the job's change in window {window}, the daemon of all ranks' in {expected_window}"
    );
    assert_eq!(
        changes[0]["nodes"],
        serde_json::json!(["node-0", "node-1"]),
        "{merged}"
    );
    assert!(merged.get("longer_spans").is_none(), "{merged}");
    assert_eq!(merged["job_wide"]["missing_ranks"], serde_json::json!([]));
    // The report reads the same from the aggregator.
    let report = Command::new(daemon_binary())
        .args([
            "report",
            &format!("http://{}", aggregator.addr),
            "--job",
            &id,
        ])
        .output()
        .expect("run mpiburst report");
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.contains("took another call path") && text.contains("(seen on node-0, node-1)"),
        "{text}"
    );
    drop(aggregator);
    for node in nodes {
        node.stop();
    }
    all.stop();
}
