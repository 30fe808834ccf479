//! Rank groups on real MPI runs under the real daemon: a distributor, workers and a collector;
//! 2-D stencils on 3 × 3 and 4 × 4 ranks, and on 3 × 3 split by relative peers; ranks that swap
//! roles half-way. The groups are
//! checked as sets of ranks, from the daemon's API and from `mpiburst report` on the recording,
//! which replays the daemon's readings to the same groups and changes.

use std::{
    collections::BTreeSet,
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use mpiburst_tests::*;

/// The groups of `/api/jobs/{id}/ranks` once the daemon has seen the job end: (lead, members).
fn ended_job_groups(addr: &str, id: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let detail = get_json(addr, &format!("/api/jobs/{}", encode(id)));
        if !detail["meta"]["ended_ns"].is_null() {
            return get_json(addr, &format!("/api/jobs/{}/ranks", encode(id)));
        }
        assert!(Instant::now() < deadline, "job {id} did not end: {detail}");
        thread::sleep(Duration::from_millis(300));
    }
}

/// Each group as (lead, members); every group has exactly one lead, among its members.
fn memberships(view: &serde_json::Value) -> Vec<(u64, BTreeSet<u64>)> {
    view["groups"]
        .as_array()
        .unwrap_or_else(|| panic!("no groups in {view}"))
        .iter()
        .map(|g| {
            let lead = g["lead"].as_u64().unwrap();
            let members: BTreeSet<u64> = g["members"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m.as_u64().unwrap())
                .collect();
            assert!(members.contains(&lead), "lead {lead} outside its group {g}");
            (lead, members)
        })
        .collect()
}

fn set(ranks: impl IntoIterator<Item = u64>) -> BTreeSet<u64> {
    ranks.into_iter().collect()
}

/// `mpiburst report REC --job ID --format json`: the job's rank groups as the report replays
/// them from the recording.
fn reported_groups(recording: &Path, id: &str) -> serde_json::Value {
    let out = Command::new(std::env::var_os("MPIBURST_BIN").expect("MPIBURST_BIN"))
        .arg("report")
        .arg(recording)
        .args(["--job", id, "--format", "json"])
        .stderr(Stdio::inherit())
        .output()
        .unwrap();
    assert!(out.status.success(), "mpiburst report failed");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    report["jobs"][0]["rank_groups"].clone()
}

/// `mpiburst report TARGET --job ID EXTRA…` (a recording or `http://` a daemon): its text.
fn report_text(target: &Path, id: &str, extra: &[&str]) -> String {
    let out = Command::new(std::env::var_os("MPIBURST_BIN").expect("MPIBURST_BIN"))
        .arg("report")
        .arg(target)
        .args(["--job", id])
        .args(extra)
        .output()
        .unwrap();
    assert!(out.status.success(), "mpiburst report failed");
    String::from_utf8(out.stdout).unwrap()
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn distributor_workers_and_collector_are_three_groups_with_a_lead_each() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(&[]);
    let program = program("distributor", Mpi::OpenMpi);
    run_mpi(Mpi::OpenMpi, 6, &program, &["100", "1"]);
    let id = job_id(&daemon.addr, &program, &[]);
    let live = ended_job_groups(&daemon.addr, &id);
    let groups = memberships(&live);
    assert_eq!(
        groups,
        vec![(0, set([0])), (1, set(1..=4)), (5, set([5]))],
        "distributor, workers, collector: {live}"
    );
    assert_eq!(live["changes"], serde_json::json!([]), "{live}");
    // The workers' signature: every one received and sent its 100 tasks.
    let workers = &live["groups"][1]["signature"]["functions"];
    assert_eq!(workers["MPI_Recv"]["calls"], 100, "{live}");
    assert_eq!(workers["MPI_Send"]["calls"], 100, "{live}");
    let metrics = http_get(&daemon.addr, "/metrics");
    let series = format!("mpi_job=\"{id}\"");
    let groups_metric = metrics
        .lines()
        .find(|l| l.starts_with("mpiburst_job_rank_groups{") && l.contains(&series))
        .unwrap_or_else(|| panic!("no mpiburst_job_rank_groups for {id}:\n{metrics}"));
    assert!(groups_metric.ends_with(" 3"), "{groups_metric}");
    // The daemon's report shows the same groups as the recording's below.
    let from_daemon = report_text(Path::new(&format!("http://{}", daemon.addr)), &id, &[]);
    assert!(
        from_daemon.contains("lead 1, 4 ranks [1-4]"),
        "{from_daemon}"
    );
    let keep = dir.path().join("distributor.jsonl");
    daemon.stop_keeping(Some(&keep));
    let replayed = reported_groups(&keep, &id);
    assert_eq!(
        replayed["groups"], live["groups"],
        "report from the recording"
    );
    let text = report_text(&keep, &id, &[]);
    assert!(text.contains("rank groups: 3"), "{text}");
    assert!(text.contains("lead 1, 4 ranks [1-4]"), "{text}");
    // The HTML timeline's rows go group by group: 0, then the workers, then the collector.
    let html = dir.path().join("distributor.html");
    report_text(&keep, &id, &["--html", html.to_str().unwrap()]);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("Rows by rank group: group 1 [0], group 2 [1-4], group 3 [5]."),
        "{page}"
    );
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn stencils_on_3x3_and_4x4_ranks_give_corner_edge_and_interior_groups() {
    let daemon = Daemon::start(&[]);
    let mut seen = Vec::new();
    for (mpi, px, expected) in [
        (
            Mpi::OpenMpi,
            3u32,
            vec![
                (0, set([0, 2, 6, 8])),
                (1, set([1, 3, 5, 7])),
                (4, set([4])),
            ],
        ),
        (
            Mpi::Mpich,
            4,
            vec![
                (0, set([0, 3, 12, 15])),
                (1, set([1, 2, 4, 7, 8, 11, 13, 14])),
                (5, set([5, 6, 9, 10])),
            ],
        ),
    ] {
        let program = program("stencil", mpi);
        let p = px.to_string();
        run_mpi(mpi, px * px, &program, &[&p, &p, "200", "0.5"]);
        let id = job_id(&daemon.addr, &program, &seen);
        let live = ended_job_groups(&daemon.addr, &id);
        assert_eq!(
            memberships(&live),
            expected,
            "{px}×{px} under {mpi:?}: corners, edges, interior: {live}"
        );
        // One call path: the three groups differ in their message counts (2, 3, 4 per
        // iteration) only.
        for (g, per_iteration) in live["groups"].as_array().unwrap().iter().zip([2, 3, 4]) {
            assert_eq!(g["signature"]["main_group"], 1, "{g}");
            assert_eq!(
                g["signature"]["functions"]["MPI_Isend"]["calls"],
                200 * per_iteration,
                "{g}"
            );
        }
        seen.push(id);
    }
    daemon.stop();
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn with_split_by_peers_a_3x3_stencil_has_nine_groups_with_their_exact_relative_peers() {
    let daemon = Daemon::with_config("[groups]\nsplit_by_peers = true\n", &[]);
    let mut seen = Vec::new();
    for mpi in [Mpi::OpenMpi, Mpi::Mpich] {
        let program = program("stencil", mpi);
        run_mpi(mpi, 9, &program, &["3", "3", "100", "0.2"]);
        let id = job_id(&daemon.addr, &program, &seen);
        let live = ended_job_groups(&daemon.addr, &id);
        let groups = live["groups"].as_array().unwrap();
        assert_eq!(
            memberships(&live),
            (0..9).map(|r| (r, set([r]))).collect::<Vec<_>>(),
            "{mpi:?}: nine SRC/DEST patterns: {live}"
        );
        // The program's own layout: rank r at (r mod 3, r / 3) exchanges with its west, east,
        // north and south neighbours where they exist, from one Isend and one Irecv site, 100
        // times; the mean neighbour less r is each site's relative peer.
        for (r, g) in (0..9i64).zip(groups) {
            let (x, y) = (r % 3, r / 3);
            let offsets: Vec<i64> = [(x > 0, -1), (x < 2, 1), (y > 0, -3), (y < 2, 3)]
                .into_iter()
                .filter_map(|(exists, d)| exists.then_some(d))
                .collect();
            let mean = offsets.iter().sum::<i64>() as f64 / offsets.len() as f64;
            for function in ["MPI_Isend", "MPI_Irecv"] {
                let steps: Vec<&serde_json::Value> = g["signature"]["call_sites"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|s| s["function"] == function)
                    .collect();
                assert_eq!(steps.len(), 1, "{mpi:?} rank {r}: one {function} site: {g}");
                assert_eq!(steps[0]["calls"], 100 * offsets.len() as u64, "{g}");
                let peer = steps[0]["relative_peer"].as_f64().unwrap();
                assert!(
                    (peer - mean).abs() < 1e-9,
                    "{mpi:?} rank {r} {function}: {peer} vs {mean}"
                );
            }
            // Allreduce has no peer.
            assert!(g["signature"]["call_sites"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|s| s["function"] == "MPI_Allreduce")
                .all(|s| s.get("relative_peer").is_none()));
        }
        seen.push(id);
    }
    daemon.stop();
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn ranks_that_switch_roles_half_way_are_one_behaviour_change() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::with_config("[analysis]\nwindow_s = 2.0\nlateness_s = 0.5\n", &[]);
    let program = program("role_switch", Mpi::OpenMpi);
    let out = dir.path().to_str().unwrap();
    run_mpi(Mpi::OpenMpi, 4, &program, &[out, "7", "2"]);
    let id = job_id(&daemon.addr, &program, &[]);
    let live = ended_job_groups(&daemon.addr, &id);
    let changes = live["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "one behaviour change: {live}");
    let change = &changes[0];
    assert_eq!(change["ranks"], serde_json::json!([0, 1, 2, 3]), "{change}");
    // The window reported holds each rank's switch.
    assert_change_holds_each_switch(change, &rank_outputs(dir.path(), "role_switch", 4));
    // After the switch the odd ranks send and the even ones receive.
    assert_eq!(
        memberships(&live),
        vec![(0, set([0, 2])), (1, set([1, 3]))],
        "{live}"
    );
    // Each call path step is a function at one call site of the program.
    let call_paths: Vec<Vec<String>> = live["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            let steps = g["signature"]["call_path"].as_array().unwrap();
            steps
                .iter()
                .map(|s| {
                    let (function, site) = s.as_str().unwrap().split_once('@').unwrap();
                    assert!(site.contains("+0x"), "{s}");
                    function.to_string()
                })
                .collect()
        })
        .collect();
    assert_eq!(
        call_paths,
        [["MPI_Allreduce", "MPI_Recv"], ["MPI_Allreduce", "MPI_Send"]]
    );
    let keep = dir.path().join("switch.jsonl");
    daemon.stop_keeping(Some(&keep));
    let replayed = reported_groups(&keep, &id);
    assert_eq!(
        replayed["changes"], live["changes"],
        "report from the recording"
    );
    assert_eq!(
        replayed["groups"], live["groups"],
        "report from the recording"
    );
    let text = report_text(&keep, &id, &[]);
    assert!(text.contains("behaviour change between"), "{text}");
    assert!(
        text.contains("ranks [0-3] took another call path"),
        "{text}"
    );
}
