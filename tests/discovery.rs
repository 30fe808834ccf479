//! Discovery, end to end: concurrent jobs of both MPI implementations are told apart, and a job
//! using an MPI library the daemon did not know at start-up is still seen.

use std::{collections::BTreeSet, os::unix::fs::symlink, time::Duration};

use mpiburst_tests::*;

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn two_concurrent_jobs_are_two_jobs_with_their_ranks() {
    let daemon = Daemon::start(&[]);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (pa, pb) = (
        program("burst_timing", Mpi::OpenMpi),
        program("burst_timing", Mpi::Mpich),
    );
    let mut ja = Mpi::OpenMpi.launcher(2);
    ja.arg(&pa)
        .args([a.path().to_str().unwrap(), "30", "2000", "5000"]);
    let mut jb = Mpi::Mpich.launcher(3);
    jb.arg(&pb)
        .args([b.path().to_str().unwrap(), "30", "2000", "5000"]);
    let (mut ca, mut cb) = (ja.spawn().unwrap(), jb.spawn().unwrap());
    for (child, what) in [(&mut ca, "Open MPI job"), (&mut cb, "MPICH job")] {
        let st = wait_with_timeout(child, Duration::from_secs(180))
            .unwrap_or_else(|| panic!("{what} hung"));
        assert!(st.success(), "{what}: {st}");
    }
    let recording = daemon.stop();
    let (job_a, job_b) = (job_of(&recording, &pa), job_of(&recording, &pb));
    assert_ne!(job_a.meta.id, job_b.meta.id);
    for (job, dir, size) in [(job_a, a.path(), 2u32), (job_b, b.path(), 3)] {
        assert_eq!(job.meta.size, size, "{}: size", job.meta.id);
        assert_eq!(
            job.ranks.keys().copied().collect::<BTreeSet<_>>(),
            (0..size).collect(),
            "{}: ranks",
            job.meta.id
        );
        // Each rank's pid is the one the program itself reported for that rank.
        for out in rank_outputs(dir, "timing", size) {
            let rank = out["rank"].as_u64().unwrap() as u32;
            assert_eq!(
                job.ranks[&rank].pid as u64,
                out["pid"].as_u64().unwrap(),
                "{}: rank {rank}",
                job.meta.id
            );
            assert_eq!(job.ranks[&rank].functions["MPI_Barrier"].calls, 60);
        }
    }
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_job_on_a_library_unknown_at_start_up_is_seen() {
    let daemon = Daemon::start(&[]);
    // A copy of MPICH's library is a new file (new inode) that no cache or process names: only
    // the exec tracepoint and the new process's maps lead the daemon to it.
    let libdir = tempfile::tempdir().unwrap();
    let original = std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libmpich.so.12").unwrap();
    let copy = libdir.path().join("libmpich.so.12.2.2");
    std::fs::copy(&original, &copy).unwrap();
    symlink(&copy, libdir.path().join("libmpich.so.12")).unwrap();
    let out = tempfile::tempdir().unwrap();
    let program = program("burst_timing", Mpi::Mpich);
    let mut cmd = Mpi::Mpich.launcher(2);
    cmd.env("LD_LIBRARY_PATH", libdir.path())
        .arg(&program)
        .args([out.path().to_str().unwrap(), "150", "2000", "5000"]);
    let st = run_with_timeout(cmd, Duration::from_secs(180));
    assert!(st.success());
    let log = daemon.log_text();
    let recording = daemon.stop();
    assert!(
        log.contains(copy.to_str().unwrap()),
        "the daemon never attached the copy; log:\n{log}"
    );
    let job = job_of(&recording, &program);
    assert_eq!(job.ranks.len(), 2);
    // Calls made before the attach (MPI_Init at least) are missed: the exec notification waits
    // for the next drain. The rest of the job is seen.
    let barriers: u64 = job
        .ranks
        .values()
        .map(|r| r.functions.get("MPI_Barrier").map_or(0, |f| f.calls))
        .sum();
    eprintln!("{barriers} of 600 barriers seen");
    assert!(barriers >= 450, "only {barriers} of 600 barriers seen");
    assert!(job.bursts.len() >= 450);
}
