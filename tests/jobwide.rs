//! The job-wide report from the recordings of several nodes, against the report of one daemon
//! that sees every rank: real BPF, real MPI. Each simulated node is a cgroup with a daemon of its
//! own (`--node`, `--cgroup`) and every rank moves into its node's cgroup before it execs the
//! program; one more daemon, without a cgroup, sees all ranks. `mpiburst report` of the nodes'
//! recordings, merged, must give the phases, SPMD score, rank groups and POP efficiencies of the
//! all-ranks recording, and `mpiburst predict` from the merged runs its prediction.

use std::{path::Path, process::Command, sync::Mutex, time::Duration};

use mpiburst_tests::*;
use serde_json::Value;

const MPI: Mpi = Mpi::OpenMpi;
const RANKS: u32 = 4;
/// The runs of `workload` that `predict` fits, and where it predicts.
const WORKLOADS: [u32; 2] = [4, 6];
const PREDICT_AT: &str = "5";

/// One split at a time: the all-ranks daemon would see the other split's jobs.
static ONE_SPLIT_AT_A_TIME: Mutex<()> = Mutex::new(());

/// The simulated nodes: one cgroup each, removed at the end (empty once the ranks exited).
struct Nodes {
    cgroups: Vec<Cgroup>,
}

impl Nodes {
    fn new(count: usize) -> Nodes {
        Nodes {
            cgroups: (0..count)
                .map(|i| Cgroup::new(&format!("mpiburst-jobwide-{i}")))
                .collect(),
        }
    }

    /// Node `i`'s cgroup as /proc/PID/cgroup names it.
    fn cgroup(&self, i: usize) -> String {
        self.cgroups[i].path.clone()
    }

    /// Runs `program args` on the job's ranks, rank r on node r mod the node count.
    fn run(&self, program: &Path, args: &[String]) {
        let dirs: Vec<String> = self
            .cgroups
            .iter()
            .map(|c| c.dir.display().to_string())
            .collect();
        let mut cmd = MPI.launcher(RANKS);
        cmd.args([
            "sh",
            "-c",
            &format!(
                "set -- \"$0\" \"$@\"; i=0; for d in {}; do \
                 [ $i -eq $((OMPI_COMM_WORLD_RANK % {})) ] && echo $$ > $d/cgroup.procs; \
                 i=$((i + 1)); done; exec \"$@\"",
                dirs.join(" "),
                dirs.len()
            ),
        ])
        .arg(program)
        .args(args);
        let st = run_with_timeout(cmd, Duration::from_secs(120));
        assert!(st.success(), "{} {args:?} failed: {st}", program.display());
    }
}

/// `mpiburst ARGS` as JSON, which must succeed.
fn mpiburst_json(args: &[&str]) -> Value {
    let out = Command::new(daemon_binary())
        .args(args)
        .output()
        .expect("run mpiburst");
    assert!(
        out.status.success(),
        "mpiburst {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The report of job `id` with its phases, as JSON.
fn report(recordings: &[String], id: &str) -> Value {
    let mut args = vec!["report"];
    args.extend(recordings.iter().map(String::as_str));
    args.extend(["--job", id, "--phases", "--format", "json"]);
    let document = mpiburst_json(&args);
    document["jobs"][0].clone()
}

/// The run time `predict` gives at [`PREDICT_AT`] from one run per workload, each run's
/// recordings named by `run` (RECORDING[,RECORDING…]).
fn predicted_runtime_s(run: &str, ids: &[String]) -> f64 {
    let runs: Vec<String> = ids
        .iter()
        .zip(WORKLOADS)
        .map(|(id, n)| format!("{run}#{id}={n}"))
        .collect();
    let mut args = vec!["predict", "--at", PREDICT_AT, "--format", "json"];
    args.extend(runs.iter().map(String::as_str));
    mpiburst_json(&args)["predicted_runtime_s"]
        .as_f64()
        .unwrap()
}

fn number(v: &Value, what: &str) -> f64 {
    v.as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"))
}

/// The groups of a report: (lead, members) each.
fn rank_groups(job: &Value) -> Vec<(Value, Value)> {
    job["rank_groups"]["groups"]
        .as_array()
        .expect("rank groups")
        .iter()
        .map(|g| (g["lead"].clone(), g["members"].clone()))
        .collect()
}

/// Records one job of `phases` and two of `workload` split over `count` nodes and on a daemon
/// that sees all ranks; the merged reports and predictions must be the all-ranks ones.
fn the_job_wide_report_is_the_all_ranks_report(count: usize) {
    let _alone = ONE_SPLIT_AT_A_TIME
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let nodes = Nodes::new(count);
    let node_daemons: Vec<Daemon> = (0..count)
        .map(|i| {
            let (node, cgroup) = (format!("node-{i}"), nodes.cgroup(i));
            Daemon::start(&["--node", &node, "--cgroup", &cgroup])
        })
        .collect();
    let everything = Daemon::start(&["--node", "all-ranks"]);
    let phases = program("phases", MPI);
    let workload = program("workload", MPI);
    nodes.run(&phases, &["iters=40".into(), "ms=2,6,12".into()]);
    for n in WORKLOADS {
        nodes.run(&workload, &[format!("n={n}")]);
    }

    let dir = tempfile::tempdir().unwrap();
    let keep = |name: String| dir.path().join(name).display().to_string();
    let node_files: Vec<String> = (0..count)
        .map(|i| keep(format!("node-{i}.jsonl")))
        .collect();
    for (daemon, file) in node_daemons.into_iter().zip(&node_files) {
        daemon.stop_keeping(Some(Path::new(file)));
    }
    let all_file = keep("all-ranks.jsonl".into());
    let all = everything.stop_keeping(Some(Path::new(&all_file)));

    let id = job_of(&all, &phases).meta.id.0.clone();
    let merged = report(&node_files, &id);
    let whole = report(std::slice::from_ref(&all_file), &id);
    let what = format!("{count} nodes, job {id}");

    // The nodes and ranks each file held.
    let nodes_listed: Vec<(Value, Value)> = merged["nodes"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no nodes in the merged report"))
        .iter()
        .map(|n| (n["node"].clone(), n["ranks"].clone()))
        .collect();
    let expected: Vec<(Value, Value)> = (0..count)
        .map(|i| {
            let ranks: Vec<u32> = (0..RANKS).filter(|r| *r as usize % count == i).collect();
            (format!("node-{i}").into(), ranks.into())
        })
        .collect();
    assert_eq!(nodes_listed, expected, "{what}");
    assert_eq!(merged["ranks_here"], RANKS, "{what}");
    assert!(whole.get("nodes").is_none(), "one file has no nodes field");

    // The same phases, each with the same share of the time, and the same SPMD score.
    let (a, b) = (&merged["phases"]["analysis"], &whole["phases"]["analysis"]);
    let shares = |analysis: &Value| -> Vec<f64> {
        analysis["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| number(&c["time_share"], "time_share"))
            .collect()
    };
    let (merged_shares, whole_shares) = (shares(a), shares(b));
    eprintln!("{what}: phase time shares merged {merged_shares:?}, all ranks {whole_shares:?}");
    assert_eq!(merged_shares.len(), whole_shares.len(), "{what}: phases");
    for (m, w) in merged_shares.iter().zip(&whole_shares) {
        assert!((m - w).abs() <= 0.01, "{what}: time shares {m} and {w}");
    }
    let (spmd_merged, spmd_whole) = (
        number(&a["global_score"], "SPMD"),
        number(&b["global_score"], "SPMD"),
    );
    assert!(
        (spmd_merged - spmd_whole).abs() <= 0.02,
        "{what}: SPMD {spmd_merged} and {spmd_whole}"
    );
    assert_eq!(a["ranks"], RANKS, "{what}: the analysis is over all ranks");

    // The same rank groups with the same leads.
    assert_eq!(rank_groups(&merged), rank_groups(&whole), "{what}");

    // The same POP efficiencies.
    for efficiency in [
        "load_balance",
        "communication_efficiency",
        "parallel_efficiency",
    ] {
        let value = |job: &Value| {
            number(
                &job["bottlenecks"]["properties"]["pop"][efficiency]["value"],
                efficiency,
            )
        };
        let (m, w) = (value(&merged), value(&whole));
        assert!((m - w).abs() <= 0.001, "{what}: {efficiency} {m} and {w}");
    }

    // The same prediction from the merged runs as from the all-ranks runs.
    let mut runs = jobs_of(&all, &workload);
    runs.sort_by_key(|j| j.meta.first_seen_ns);
    let ids: Vec<String> = runs.iter().map(|j| j.meta.id.0.clone()).collect();
    assert_eq!(ids.len(), WORKLOADS.len(), "{what}: one job per workload");
    let from_nodes = predicted_runtime_s(&node_files.join(","), &ids);
    let from_all = predicted_runtime_s(&all_file, &ids);
    assert!(
        (from_nodes - from_all).abs() <= 0.02 * from_all,
        "{what}: predicted {from_nodes} s from the nodes, {from_all} s from all ranks"
    );
}

#[test]
#[ignore = "needs root (BPF) and MPI: run by `cargo xtask test`"]
fn a_job_over_two_nodes_reports_as_on_one() {
    the_job_wide_report_is_the_all_ranks_report(2);
}

#[test]
#[ignore = "needs root (BPF) and MPI: run by `cargo xtask test`"]
fn a_job_with_one_rank_per_node_reports_as_on_one() {
    the_job_wide_report_is_the_all_ranks_report(4);
}
