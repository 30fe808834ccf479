//! One MPI job over several nodes, each with its own daemon: every node's daemon names the job
//! alike and gives each of its ranks its world rank, whatever the launcher. The nodes are
//! simulated on this machine ([`SimulatedNodes`]: a cgroup, a host name and a daemon each), and
//! the launchers start their remote side through the simulation's agent: Open MPI's mpirun with
//! its rsh launcher and a hostfile, MPICH's Hydra with a bootstrap executable and a host list.
//! The launcher itself runs on the first node, which has ranks of the job too.

use std::time::Duration;

use mpiburst_tests::*;

/// Ranks of each job: two a node.
const RANKS: u32 = 4;
const NODES: [&str; 2] = ["n1", "n2"];

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn open_mpi_with_rsh_and_a_hostfile_is_one_job_on_every_node() {
    let id = one_job_over_two_nodes(Mpi::OpenMpi);
    assert!(id.starts_with("pmix:"), "{id}");
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn hydra_with_a_host_list_is_one_job_on_every_node() {
    let id = one_job_over_two_nodes(Mpi::Mpich);
    // mpiexec's control port, on the first node.
    assert!(id.starts_with(&format!("hydra:{}:", NODES[0])), "{id}");
}

/// Runs the `counts` program under `mpi`'s own launcher over two simulated nodes, checks the
/// daemons' views of it (see [`SimulatedNodes::stop_and_check_counts`]) and returns its job id.
fn one_job_over_two_nodes(mpi: Mpi) -> String {
    let nodes = SimulatedNodes::start(&NODES);
    let out = tempfile::tempdir().unwrap();
    let mut launch = nodes.launcher(mpi, RANKS, RANKS / 2);
    let program = SimulatedNodes::counts_noting_node(&mut launch, mpi, out.path());
    let status = run_with_timeout(nodes.on(NODES[0], &launch), Duration::from_secs(120));
    assert!(status.success(), "{launch:?} on {NODES:?} failed: {status}");
    let jobs = nodes.stop_and_check_counts(&[(&program, out.path())], RANKS);
    jobs[0].meta.id.0.clone()
}
