//! One MPI job over several nodes, each with its own daemon: every node's daemon names the job
//! alike and gives each of its ranks its world rank, whatever the launcher. The nodes are
//! simulated on this machine ([`SimulatedNodes`]: a cgroup, a host name and a daemon each), and
//! the launchers start their remote side through the simulation's agent: Open MPI's mpirun with
//! its rsh launcher and a hostfile, MPICH's Hydra with a bootstrap executable and a host list.
//! The launcher itself runs on the first node, which has ranks of the job too.

use std::{collections::BTreeSet, time::Duration};

use mpiburst_tests::*;

/// Ranks of each job: two a node.
const RANKS: u32 = 4;
const NODES: [&str; 2] = ["n1", "n2"];

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn open_mpi_with_rsh_and_a_hostfile_is_one_job_on_every_node() {
    let id = one_job_over_two_nodes(Mpi::OpenMpi, "OMPI_COMM_WORLD_RANK");
    assert!(id.starts_with("pmix:"), "{id}");
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn hydra_with_a_host_list_is_one_job_on_every_node() {
    let id = one_job_over_two_nodes(Mpi::Mpich, "PMI_RANK");
    // mpiexec's control port, on the first node.
    assert!(id.starts_with(&format!("hydra:{}:", NODES[0])), "{id}");
}

/// Runs the `counts` program under `mpi` over two simulated nodes, and asserts that the two
/// daemons name the job alike, that each saw exactly the ranks that ran on its node, that these
/// are together the ranks 0..RANKS of a world of RANKS, and that each counted its ranks' calls
/// exactly. `rank_variable` is the variable that tells a rank its rank under `mpi`. Returns the
/// job id.
fn one_job_over_two_nodes(mpi: Mpi, rank_variable: &str) -> String {
    let nodes = SimulatedNodes::start(&NODES);
    let program = program("counts", mpi);
    let out = tempfile::tempdir().unwrap();
    let mut launch = nodes.launcher(mpi, RANKS, RANKS / 2);
    // Each rank notes the node it runs on before it becomes the program: the placement that the
    // daemons' views are checked against.
    launch
        .args([
            "sh",
            "-c",
            &format!("hostname > \"$0/node.${rank_variable}\" && exec \"$1\" \"$0\"",),
        ])
        .arg(out.path())
        .arg(&program);
    let status = run_with_timeout(nodes.on(NODES[0], &launch), Duration::from_secs(120));
    assert!(status.success(), "{launch:?} on {NODES:?} failed: {status}");
    let outputs = rank_outputs(out.path(), "counts", RANKS);
    let node_of = |rank: u32| {
        let path = out.path().join(format!("node.{rank}"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        text.trim().to_string()
    };

    let mut ids = BTreeSet::new();
    let mut seen = Vec::new();
    for node in nodes.nodes {
        let recording = node.daemon.stop();
        let job = job_of(&recording, &program);
        let what = format!("counts under {mpi:?} on node {}", node.name);
        let ranks: BTreeSet<u32> = job.ranks.keys().copied().collect();
        let placed: BTreeSet<u32> = (0..RANKS).filter(|&r| node_of(r) == node.name).collect();
        assert_eq!(ranks, placed, "{what}: ranks seen against those run there");
        assert_eq!(job.meta.size, RANKS, "{what}: world size");
        assert_eq!(job.meta.node, node.name, "{what}: node");
        let own: Vec<serde_json::Value> = outputs
            .iter()
            .filter(|out| placed.contains(&(out["rank"].as_u64().unwrap() as u32)))
            .cloned()
            .collect();
        assert_calls_exact(job, &own, &what);
        eprintln!(
            "{what}: job {} ({}), ranks {ranks:?}",
            job.meta.id, job.meta.source
        );
        ids.insert(job.meta.id.0.clone());
        seen.extend(ranks);
    }
    assert_eq!(ids.len(), 1, "one job id on all nodes: {ids:?}");
    seen.sort_unstable();
    assert_eq!(seen, (0..RANKS).collect::<Vec<_>>(), "ranks over all nodes");
    ids.pop_first().unwrap()
}
