//! MPI libraries found at run time, end to end with the real daemon, real BPF and real MPI: a
//! library copied outside the loader cache, a daemon that starts knowing no MPI library, a job
//! in its own mount namespace (a container's view of the files), a PMPI interposer, and a library
//! on a file system that does not answer (a FUSE mount whose reads block). Each run's counts
//! program says what it called; the daemon must agree exactly, MPI_Init included.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use mpiburst::{discovery, export::recording::Recording, model::CallSite};
use mpiburst_tests::*;

const RANKS: u32 = 3;

/// The real file of each MPI's C library, as the loader cache names it.
fn system_library(mpi: Mpi) -> PathBuf {
    let soname = match mpi {
        Mpi::OpenMpi => "libmpi.so.40",
        Mpi::Mpich => "libmpich.so.12",
    };
    std::fs::canonicalize(Path::new("/usr/lib/x86_64-linux-gnu").join(soname))
        .unwrap_or_else(|e| panic!("{soname}: {e} (install libopenmpi-dev and libmpich-dev)"))
}

/// A copy of the MPI's C library, under its soname, in a new directory that the loader cache
/// does not know.
fn copied_library(mpi: Mpi) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let real = system_library(mpi);
    let soname = match mpi {
        Mpi::OpenMpi => "libmpi.so.40",
        Mpi::Mpich => "libmpich.so.12",
    };
    let copy = dir.path().join(soname);
    std::fs::copy(&real, &copy).unwrap();
    (dir, copy)
}

/// A shell script `name` in `dir` that runs its arguments as its child (not `exec "$@"`, which
/// would make the command the script's own process) and exits with its status.
fn parent_script(dir: &Path, name: &str) -> PathBuf {
    let script = dir.join(name);
    std::fs::write(&script, "#!/bin/sh\n\"$@\"\nexit $?\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

/// The launcher for `program`, passing `env` to the ranks only (not to the launcher itself).
fn launch(mpi: Mpi, program: &Path, env: &[(&str, &str)], out: &Path) -> Command {
    let mut cmd = mpi.launcher(RANKS);
    for (name, value) in env {
        match mpi {
            Mpi::OpenMpi => cmd.args(["-x", &format!("{name}={value}")]),
            Mpi::Mpich => cmd.args(["-genv", name, value]),
        };
    }
    cmd.arg(program).arg(out);
    cmd
}

fn run(cmd: Command, what: &str) {
    let st = run_with_timeout(cmd, Duration::from_secs(180));
    assert!(st.success(), "{what}: {st}");
}

/// The library `program` loads under `LD_LIBRARY_PATH=dir`, as ldd finds it.
fn loaded_from(program: &Path, dir: &Path, soname: &str) -> String {
    let out = Command::new("ldd")
        .arg(program)
        .env("LD_LIBRARY_PATH", dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            (name == soname).then(|| rest.split_whitespace().next().unwrap_or("").to_string())
        })
        .unwrap_or_else(|| panic!("ldd {} lists no {soname}:\n{text}", program.display()))
}

/// The job of `program` whose ranks ran with `outputs`' pids.
fn job_with_outputs<'a>(
    recording: &'a Recording,
    program: &Path,
    outputs: &[serde_json::Value],
) -> &'a mpiburst::store::Job {
    let pid = outputs[0]["pid"].as_u64().unwrap() as u32;
    jobs_of(recording, program)
        .into_iter()
        .find(|j| j.ranks.values().any(|r| r.pid == pid))
        .unwrap_or_else(|| panic!("no job of {} has pid {pid}", program.display()))
}

/// Runs counts on the library copied to `dir` (LD_LIBRARY_PATH) under a running daemon and
/// returns the ranks' own counts.
fn run_counts_on_copy(mpi: Mpi, dir: &Path) -> Vec<serde_json::Value> {
    run_counts_on_copy_under(mpi, dir, None)
}

/// `run_counts_on_copy` with the launcher started by the script `parent` (`parent_script`), if
/// any.
fn run_counts_on_copy_under(mpi: Mpi, dir: &Path, parent: Option<&Path>) -> Vec<serde_json::Value> {
    let program = program("counts", mpi);
    let out = tempfile::tempdir().unwrap();
    let dir = dir.to_str().unwrap();
    let job = launch(mpi, &program, &[("LD_LIBRARY_PATH", dir)], out.path());
    let cmd = match parent {
        Some(parent) => {
            let mut cmd = Command::new(parent);
            cmd.arg(job.get_program()).args(job.get_args());
            cmd
        }
        None => job,
    };
    run(cmd, &format!("counts under {mpi:?} on a copied library"));
    rank_outputs(out.path(), "counts", RANKS)
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_library_outside_the_loader_cache_is_attached_before_the_process_uses_it() {
    let copies: Vec<_> = Mpi::ALL.map(copied_library).into();
    let daemon = Daemon::start(&["--min-burst-us", "0"]);
    let mut runs = Vec::new();
    for (mpi, (dir, copy)) in Mpi::ALL.into_iter().zip(&copies) {
        let soname = copy.file_name().unwrap().to_str().unwrap();
        let program = program("counts", mpi);
        assert_eq!(
            Path::new(&loaded_from(&program, dir.path(), soname)),
            copy,
            "{mpi:?}: the program must load the copy"
        );
        runs.push((mpi, program, run_counts_on_copy(mpi, dir.path())));
    }
    // Both copies were attached while a process was held (ldd's, or the first rank's).
    let attached = wait_for_metric(&daemon.addr, "mpiburst_library_opens_attached_total", 2.0);
    let held = metric(&daemon.addr, "mpiburst_library_opens_held_total");
    assert!(
        held >= attached,
        "{held} processes held for {attached} libraries"
    );
    stop_and_check_copies(daemon, &copies, &runs);
}

/// A run of counts: the MPI, the program, the ranks' own counts.
type CountsRun = (Mpi, PathBuf, Vec<serde_json::Value>);

/// Stops the daemon and checks that it attached each copied library while a process was held at
/// its open, and counted exactly the calls of each run.
fn stop_and_check_copies(
    daemon: Daemon,
    copies: &[(tempfile::TempDir, PathBuf)],
    runs: &[CountsRun],
) {
    let log = daemon.log_text();
    show_holds(&log);
    let recording = daemon.stop();
    for (_, copy) in copies {
        assert!(
            log.contains(&format!("opened MPI library {}", copy.display())),
            "the daemon did not attach {} while a process was held; its log:\n{log}",
            copy.display()
        );
    }
    for (mpi, program, outputs) in runs {
        let job = job_with_outputs(&recording, program, outputs);
        assert_calls_exact(job, outputs, &format!("counts under {mpi:?} on a copy"));
    }
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn between_jobs_the_library_watch_is_detached_and_a_launchers_child_attaches_it_first() {
    // While attached, the watch on library opens makes every system call on the node take the
    // kernel's traced path: between jobs it is detached, and the exec of a process a launcher
    // started (a rank, a proxy) holds that process until it is attached again, so that the
    // ranks' opens of a library at a new path are still held.
    //
    // A statistics update that finds a launcher running attaches the watch as well, and mpirun
    // takes hundreds of ms to start its ranks on a loaded machine: the job starts under a
    // listed launcher that starts mpirun at once (as slurmstepd starts a step's ranks), with
    // the updates 2 s apart, so that it is the exec of the launcher's child that finds the
    // watch detached.
    let watch = r#"mpiburst_on_demand_programs_attached{programs="library_watch"}"#;
    // Copied first: reading a file named like an MPI library holds this process too.
    let copies: Vec<_> = Mpi::ALL.map(copied_library).into();
    let launcher_dir = tempfile::tempdir().unwrap();
    let launcher = parent_script(launcher_dir.path(), "jobstep");
    let mut launchers = mpiburst::config::Config::default().mpi.launchers;
    launchers.push("jobstep".into());
    let daemon = Daemon::with_config(
        &format!(
            "[capture]\nstats_interval_ms = 2000\ndetach_idle_after_s = 0\n[mpi]\nlaunchers = {launchers:?}\n"
        ),
        &["--min-burst-us", "0"],
    );
    let mut runs = Vec::new();
    for (mpi, (dir, _)) in Mpi::ALL.into_iter().zip(&copies) {
        wait_until(
            &daemon,
            Duration::from_secs(30),
            "the library watch detached with no launcher and no MPI process on the node",
            || metric(&daemon.addr, watch) == 0.0,
        );
        let launched = metric(&daemon.addr, "mpiburst_launched_held_total");
        let attached = metric(&daemon.addr, "mpiburst_library_opens_attached_total");
        let program = program("counts", mpi);
        let outputs = run_counts_on_copy_under(mpi, dir.path(), Some(&launcher));
        runs.push((mpi, program, outputs));
        wait_for_metric(&daemon.addr, "mpiburst_launched_held_total", launched + 1.0);
        wait_for_metric(
            &daemon.addr,
            "mpiburst_library_opens_attached_total",
            attached + 1.0,
        );
    }
    stop_and_check_copies(daemon, &copies, &runs);
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_rank_that_no_listed_launcher_started_names_its_parent_once() {
    // Between jobs only the processes a listed launcher starts are held. Ranks that a wrapper
    // script starts (`mpirun rankwrap.sh program`) are not held at their first call (the wrapper
    // is, at its exec, so their libraries are attached in time): the daemon names the wrapper
    // once, for mpi.launchers, under both MPIs; ranks the launchers start themselves name
    // nothing.
    let dir = tempfile::tempdir().unwrap();
    let wrapper = parent_script(dir.path(), "rankwrap.sh");
    let daemon = Daemon::start(&["--min-burst-us", "0"]);
    let mut runs = Vec::new();
    for mpi in Mpi::ALL {
        let program = program("counts", mpi);
        for wrapped in [true, false] {
            let out = tempfile::tempdir().unwrap();
            let mut cmd = mpi.launcher(RANKS);
            if wrapped {
                cmd.arg(&wrapper);
            }
            cmd.arg(&program).arg(out.path());
            run(cmd, &format!("counts under {mpi:?}, wrapped {wrapped}"));
            runs.push((mpi, wrapped, rank_outputs(out.path(), "counts", RANKS)));
        }
    }
    let log = daemon.log_text();
    let recording = daemon.stop();
    let named: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("which is not in mpi.launchers"))
        .collect();
    assert_eq!(
        named.len(),
        1,
        "one parent named, once: {named:#?}\nthe daemon's log:\n{log}"
    );
    eprintln!("{}", named[0]);
    assert!(
        named[0].contains("(rankwrap.sh), which an MPI launcher started")
            && named[0].contains("add \"rankwrap.sh\" (its command name"),
        "{}",
        named[0]
    );
    // The wrapped ranks lose no call.
    for (mpi, wrapped, outputs) in &runs {
        let what = format!("counts under {mpi:?}, wrapped {wrapped}");
        assert_calls_exact(
            job_with_outputs(&recording, &program("counts", *mpi), outputs),
            outputs,
            &what,
        );
    }
}

/// Shows how long the daemon held each process (its log lines that say so).
fn show_holds(log: &str) {
    for line in log.lines().filter(|l| l.contains(" held ")) {
        eprintln!("{line}");
    }
}

/// Waits (the metrics follow the daemon's stats interval, 1 s) until a metric reaches `at_least`;
/// its value then.
fn wait_for_metric(addr: &str, name: &str, at_least: f64) -> f64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let value = metric(addr, name);
        if value >= at_least || std::time::Instant::now() > deadline {
            assert!(
                value >= at_least,
                "{name} is {value}, not at least {at_least}"
            );
            return value;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Stops the daemon and checks that it attached `copy` while a process was held at its open,
/// and counted exactly the calls of the run of `program` whose ranks wrote `outputs`; the
/// recording.
fn stop_after_run_on_copy(
    daemon: Daemon,
    copy: &Path,
    program: &Path,
    outputs: &[serde_json::Value],
    what: &str,
) -> Recording {
    let log = daemon.log_text();
    show_holds(&log);
    let recording = daemon.stop();
    assert!(
        log.contains(&format!("opened MPI library {}", copy.display())),
        "{what}: the copy was not attached at its open; the daemon's log:\n{log}"
    );
    let job = job_with_outputs(&recording, program, outputs);
    assert_calls_exact(job, outputs, what);
    recording
}

/// A shell command that runs its arguments in a new mount namespace, where each
/// `(source, target)` is bind-mounted first.
fn in_mount_namespace(binds: &[(&Path, &Path)]) -> Vec<String> {
    let mounts: String = binds
        .iter()
        .map(|(source, target)| {
            format!(
                "mount --bind '{}' '{}' && ",
                source.display(),
                target.display()
            )
        })
        .collect();
    [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        &format!("{mounts}exec \"$0\" \"$@\""),
    ]
    .map(str::to_string)
    .into()
}

/// Whether this machine lets a test make a mount namespace and bind-mount in it.
fn mount_namespaces_work() -> Result<(), String> {
    let file = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new("unshare")
        .args(["-m", "--propagation", "private", "mount", "--bind"])
        .arg(file.path())
        .arg(file.path())
        .output()
        .map_err(|e| format!("unshare: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`unshare -m mount --bind` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_daemon_that_knows_no_mpi_library_attaches_when_a_job_opens_one() {
    const TEST: &str = "a_daemon_that_knows_no_mpi_library_attaches_when_a_job_opens_one";
    require_root();
    if let Err(reason) = mount_namespaces_work() {
        return skip_at_run_time(TEST, &reason);
    }
    // The daemon's view of the node has an empty loader cache: no MPI library is listed there.
    let empty_cache = tempfile::NamedTempFile::new().unwrap();
    let wrapper = in_mount_namespace(&[(empty_cache.path(), Path::new("/etc/ld.so.cache"))]);
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let (dir, copy) = copied_library(Mpi::OpenMpi);
    let daemon = Daemon::start_under(&wrapper, &[]);
    let started = daemon.log_text();
    if !started.contains("no MPI library known yet") {
        // Processes of other users mapped an MPI library while the daemon started: it knew
        // their libraries, which this test is not about.
        drop(daemon);
        return skip_at_run_time(
            TEST,
            "MPI processes were running when the daemon started, so it knew their libraries",
        );
    }
    // Ready and healthy with no probe attached.
    http_get(&daemon.addr, "/healthz");
    let program = program("counts", Mpi::OpenMpi);
    let outputs = run_counts_on_copy(Mpi::OpenMpi, dir.path());
    let what = "counts on a library the daemon did not know";
    let recording = stop_after_run_on_copy(daemon, &copy, &program, &outputs, what);
    let job = job_with_outputs(&recording, &program, &outputs);
    // Bytes too: where Open MPI keeps a datatype's size is learnt from the library at its open.
    assert_bytes_exact(job, &outputs, what);
}

/// One run of counts in a mount namespace of its own, on a copy of the MPI library in a
/// directory that, on the host, is empty: only the job's namespace has the copy there.
struct ContainerRun {
    program: PathBuf,
    /// The library's path as the job sees it.
    inside: PathBuf,
    outputs: Vec<serde_json::Value>,
}

fn run_counts_in_mount_namespace(mpi: Mpi) -> ContainerRun {
    let (dir, copy) = copied_library(mpi);
    let mount_point = tempfile::tempdir().unwrap();
    let program = program("counts", mpi);
    let out = tempfile::tempdir().unwrap();
    let wrapper = in_mount_namespace(&[(dir.path(), mount_point.path())]);
    let launcher = launch(
        mpi,
        &program,
        &[("LD_LIBRARY_PATH", mount_point.path().to_str().unwrap())],
        out.path(),
    );
    let mut cmd = Command::new(&wrapper[0]);
    cmd.args(&wrapper[1..])
        .arg(launcher.get_program())
        .args(launcher.get_args());
    run(cmd, &format!("counts under {mpi:?} in a mount namespace"));
    let inside = mount_point.path().join(copy.file_name().unwrap());
    assert!(
        !inside.exists(),
        "{} exists on the host: the test would not show a container's view",
        inside.display()
    );
    ContainerRun {
        program,
        inside,
        outputs: rank_outputs(out.path(), "counts", RANKS),
    }
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_library_inside_a_jobs_own_mount_namespace_is_attached_through_the_process() {
    const TEST: &str =
        "a_library_inside_a_jobs_own_mount_namespace_is_attached_through_the_process";
    require_root();
    if let Err(reason) = mount_namespaces_work() {
        return skip_at_run_time(TEST, &reason);
    }
    let daemon = Daemon::start(&[]);
    let runs = Mpi::ALL.map(run_counts_in_mount_namespace);
    let log = daemon.log_text();
    show_holds(&log);
    let recording = daemon.stop();
    for (mpi, run) in Mpi::ALL.iter().zip(&runs) {
        assert!(
            log.contains(&format!("opened MPI library {}", run.inside.display())),
            "{mpi:?}: {} was not attached at its open; the daemon's log:\n{log}",
            run.inside.display()
        );
        let job = job_with_outputs(&recording, &run.program, &run.outputs);
        assert_calls_exact(
            job,
            &run.outputs,
            &format!("counts under {mpi:?} in a container"),
        );
    }
}

/// Without holding, the scan of the maps after exec finds the container's library and attaches
/// it through the process's root. That scan can come after the first calls, so only the calls at
/// the end of the run are compared.
#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn without_holding_a_containers_library_is_attached_through_the_process_root() {
    const TEST: &str = "without_holding_a_containers_library_is_attached_through_the_process_root";
    require_root();
    if let Err(reason) = mount_namespaces_work() {
        return skip_at_run_time(TEST, &reason);
    }
    let daemon = Daemon::with_config("[mpi]\nhold_new_libraries = false\n", &[]);
    let run = run_counts_in_mount_namespace(Mpi::OpenMpi);
    let held = metric(&daemon.addr, "mpiburst_library_opens_held_total");
    let log = daemon.log_text();
    let recording = daemon.stop();
    assert!(
        log.contains("mpi.hold_new_libraries is off"),
        "the daemon did not say that early calls can be missed; its log:\n{log}"
    );
    assert_eq!(
        held, 0.0,
        "processes were held with holding off; the daemon's log:\n{log}"
    );
    let root_path = |pid: u64| format!("/proc/{pid}/root{}", run.inside.display());
    let attached = run.outputs.iter().any(|o| {
        log.contains(&format!(
            "entry points of {}",
            root_path(o["pid"].as_u64().unwrap())
        ))
    });
    assert!(
        attached,
        "{} was not attached through a rank's root; the daemon's log:\n{log}",
        run.inside.display()
    );
    let job = job_with_outputs(&recording, &run.program, &run.outputs);
    for out in &run.outputs {
        let rank = out["rank"].as_u64().unwrap() as u32;
        let finalize = job.ranks[&rank]
            .functions
            .get("MPI_Finalize")
            .map(|f| f.calls);
        assert_eq!(finalize, Some(1), "rank {rank}: MPI_Finalize calls");
    }
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_pmpi_interposer_keeps_counts_exact_and_call_sites_in_the_application() {
    let daemon = Daemon::start(&["--min-burst-us", "0"]);
    let mut runs = Vec::new();
    // The second interposer only jumps to each PMPI function: the PMPI call runs at the stack
    // pointer of the application's call, nested in it all the same.
    let interposers = ["interposer", "interposer_tail"];
    for mpi in Mpi::ALL {
        let program = program("counts", mpi);
        for name in interposers {
            let interposer = program_path_of_interposer(name, mpi);
            // The MPI library is known from the start, so nothing holds the first process: the
            // daemon finds the interposer by the scan after its exec, and the first calls of
            // that process may return into the interposer. The second run is covered from its
            // start.
            for attempt in ["first", "second"] {
                let out = tempfile::tempdir().unwrap();
                run(
                    launch(mpi, &program, &[("LD_PRELOAD", &interposer)], out.path()),
                    &format!("counts under {mpi:?} with {name} ({attempt} run)"),
                );
                runs.push((
                    mpi,
                    name,
                    attempt,
                    program.clone(),
                    rank_outputs(out.path(), "counts", RANKS),
                ));
            }
        }
    }
    let log = daemon.log_text();
    show_holds(&log);
    let recording = daemon.stop();
    for (mpi, name) in Mpi::ALL
        .into_iter()
        .flat_map(|m| interposers.map(|n| (m, n)))
    {
        let interposer = program_path_of_interposer(name, mpi);
        assert!(
            log.contains(&format!("maps PMPI interposer {interposer}")),
            "{mpi:?}: {name} was not found; the daemon's log:\n{log}"
        );
    }
    for (mpi, name, attempt, program, outputs) in &runs {
        let what = format!("counts under {mpi:?} with {name}, {attempt} run");
        let job = job_with_outputs(&recording, program, outputs);
        assert_calls_exact(job, outputs, &what);
        let application = discovery::build_id(program)
            .unwrap()
            .expect("the test programs carry a build-id");
        // A site whose process was gone before the daemon read its maps stays unresolved (module
        // "?", offset = the address); by its address it is still in the executable, which the
        // kernel maps far below the shared libraries (0x55… or 0x56… for a PIE, 0x7f… for
        // libraries).
        let in_application = |site: &&CallSite| match &*site.module {
            "?" => site.offset < LIBRARIES_MAPPED_FROM,
            module => module == application,
        };
        let elsewhere: Vec<_> = job
            .bursts
            .iter()
            .flat_map(|b| [&b.start_site, &b.end_site])
            .filter(|site| !in_application(site))
            .collect();
        assert!(!job.bursts.is_empty(), "{what}: no burst recorded");
        eprintln!(
            "{what}: {} of {} call sites outside the application",
            elsewhere.len(),
            2 * job.bursts.len()
        );
        if *attempt == "second" {
            assert!(
                elsewhere.is_empty(),
                "{what}: {} of {} call sites are outside the application ({application}): {:?}",
                elsewhere.len(),
                2 * job.bursts.len(),
                &elsewhere[..elsewhere.len().min(5)]
            );
        }
    }
}

/// Shared libraries are mapped from here up (the mmap base of x86_64, below 0x7fff…), a PIE
/// executable below it.
const LIBRARIES_MAPPED_FROM: u64 = 0x7000_0000_0000;

/// The interposer built for `mpi`, as a path for LD_PRELOAD.
fn program_path_of_interposer(name: &str, mpi: Mpi) -> String {
    let path = program(name, mpi);
    std::fs::canonicalize(path)
        .unwrap()
        .to_str()
        .unwrap()
        .to_string()
}

/// A FUSE mount of files named like MPI libraries whose reads block until released: the file
/// system of a hung NFS or FUSE mount (tests/fuse/hung_library.py). Dropping it releases the
/// reads, unmounts, and stops the server (by pid).
struct HungMount {
    server: std::process::Child,
    dir: tempfile::TempDir,
    mount_point: PathBuf,
    names: Vec<String>,
}

/// The Python with the FUSE bindings (Debian's, where python3-fusepy installs them).
const FUSE_PYTHON: &str = "/usr/bin/python3";

impl HungMount {
    /// Mounts it with files `names`, or says why this machine cannot.
    fn mount(names: &[&str]) -> Result<HungMount, String> {
        if !Path::new("/dev/fuse").exists() {
            return Err("no /dev/fuse (the fuse kernel module is not loaded)".into());
        }
        let bindings = Command::new(FUSE_PYTHON)
            .args(["-c", "import fusepy"])
            .output()
            .map_err(|e| format!("{FUSE_PYTHON}: {e}"))?;
        if !bindings.status.success() {
            return Err(format!(
                "{FUSE_PYTHON} has no fusepy (install python3-fusepy and fuse3; `cargo xtask \
                 test` does)"
            ));
        }
        let dir = tempfile::tempdir().unwrap();
        let mount_point = dir.path().join("mnt");
        std::fs::create_dir(&mount_point).unwrap();
        let server = Command::new(FUSE_PYTHON)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("fuse/hung_library.py"))
            .arg(&mount_point)
            .arg(dir.path().join("read-started"))
            .arg(dir.path().join("release"))
            .args(names)
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("{FUSE_PYTHON}: {e}"))?;
        let mount = HungMount {
            server,
            dir,
            mount_point,
            names: names.iter().map(|n| n.to_string()).collect(),
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while !mount.file(names[0]).exists() {
            if std::time::Instant::now() > deadline {
                return Err("the FUSE server did not mount within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(mount)
    }

    fn file(&self, name: &str) -> PathBuf {
        self.mount_point.join(name)
    }

    /// A reader is blocked in the file system.
    fn read_started(&self) -> bool {
        self.dir.path().join("read-started").exists()
    }

    /// Lets every read of file `name`, blocked or later, return.
    fn release(&self, name: &str) {
        std::fs::write(self.dir.path().join(format!("release-{name}")), b"").unwrap();
    }
}

impl Drop for HungMount {
    fn drop(&mut self) {
        for name in &self.names {
            self.release(name);
        }
        let unmounted = Command::new("fusermount")
            .args(["-u", "-z"])
            .arg(&self.mount_point)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.mount_point)
                .status();
        }
        if wait_with_timeout(&mut self.server, Duration::from_secs(10)).is_none() {
            eprintln!("the FUSE server did not exit after the unmount: killed");
        }
    }
}

/// A process killed (by pid) when dropped, unless it has exited.
struct Started(std::process::Child);

impl Drop for Started {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

impl Started {
    /// Starts `command` with its standard output piped.
    fn piped(command: &mut Command) -> Started {
        let child = command
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{command:?}: {e}"));
        Started(child)
    }
}

/// The daemon's log line that contains `text`, once it has one.
fn wait_for_log_line(daemon: &Daemon, text: &str) -> String {
    let find = || {
        daemon
            .log_text()
            .lines()
            .find(|l| l.contains(text))
            .map(str::to_string)
    };
    wait_until(
        daemon,
        Duration::from_secs(30),
        &format!("no `{text}…`"),
        || find().is_some(),
    );
    find().unwrap()
}

/// How long the hung-file test's daemon waits for a library file.
const READ_TIMEOUT_MS: u64 = 4000;

/// Opens its argument read-only, as the dynamic loader does, timing its own open (a hold is part
/// of it).
const TIMED_OPEN: &str = "import json, os, sys, time\n\
    t = time.monotonic(); fd = os.open(sys.argv[1], os.O_RDONLY)\n\
    held = time.monotonic() - t; os.close(fd)\n\
    print(json.dumps({'pid': os.getpid(), 'open_s': held}))";

/// Starts a process that opens `library` as the dynamic loader does, timing its own open.
fn timed_open(library: &Path) -> Started {
    Started::piped(
        Command::new(FUSE_PYTHON)
            .args(["-c", TIMED_OPEN])
            .arg(library),
    )
}

/// The pid of a [`timed_open`] process and how long its open took, in s, once it exits (within
/// 60 s: it was resumed).
fn open_report(opener: &mut Started, daemon: &Daemon) -> (u32, f64) {
    let opened = wait_with_timeout(&mut opener.0, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("the opener was not resumed; log:\n{}", daemon.log_text()));
    assert!(opened.success(), "the opener failed: {opened}");
    let mut report = String::new();
    std::io::Read::read_to_string(opener.0.stdout.as_mut().unwrap(), &mut report).unwrap();
    let report: serde_json::Value = serde_json::from_str(&report).unwrap();
    (
        report["pid"].as_u64().unwrap() as u32,
        report["open_s"].as_f64().unwrap(),
    )
}

/// Builds tests/fuse/map_file.c (a process that maps a file and waits) into `dir`.
fn build_mapper(dir: &Path) -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuse/map_file.c");
    let mapper = dir.join("map_file");
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-Werror", "-o"])
        .arg(&mapper)
        .arg(&source)
        .status()
        .unwrap_or_else(|e| panic!("cc: {e} (install gcc; `cargo xtask test` does)"));
    assert!(st.success(), "cc {}: {st}", source.display());
    mapper
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_library_on_a_hung_file_system_neither_stops_the_daemon_nor_keeps_its_process_held() {
    const TEST: &str =
        "a_library_on_a_hung_file_system_neither_stops_the_daemon_nor_keeps_its_process_held";
    require_root();
    let hung = match HungMount::mount(&["libmpi.so.40", "libmpich.so.12"]) {
        Ok(mount) => mount,
        Err(reason) => return skip_at_run_time(TEST, &reason),
    };
    let (opened_file, mapped_file) = (hung.file("libmpi.so.40"), hung.file("libmpich.so.12"));
    // The hold limit above the read timeout: the daemon's deadline resumes the opener, not the
    // hold guard.
    let daemon = Daemon::with_config(
        &format!("[mpi]\nlibrary_read_timeout_ms = {READ_TIMEOUT_MS}\nhold_limit_s = 30\n"),
        &[],
    );
    let mut opener = timed_open(&opened_file);
    wait_until(
        &daemon,
        Duration::from_secs(30),
        "the daemon did not read the opened file",
        || hung.read_started(),
    );
    // While the daemon's read is blocked: a job on a library the daemon does not know yet is
    // held, attached and resumed, and counted exactly.
    let (copy_dir, copy) = copied_library(Mpi::OpenMpi);
    let program = program("counts", Mpi::OpenMpi);
    let outputs = run_counts_on_copy(Mpi::OpenMpi, copy_dir.path());
    let (pid, held_s) = open_report(&mut opener, &daemon);
    let timeout_s = READ_TIMEOUT_MS as f64 / 1e3;
    eprintln!(
        "the opener's open of the hung file took {held_s:.3} s (the read timeout is {timeout_s} s)"
    );
    // Held from before the daemon's read started until its deadline, then resumed at once (the
    // margin is for a loaded machine).
    assert!(
        held_s >= timeout_s && held_s < timeout_s + 5.0,
        "the opener's open took {held_s} s for a read timeout of {timeout_s} s"
    );
    let warning = format!(
        "reading {} for pid {pid} did not return",
        opened_file.display()
    );
    eprintln!("{}", wait_for_log_line(&daemon, &warning));
    // A process that maps a file of the hung mount: the scan after its exec reads it, and gives
    // up at the deadline too.
    let mapper = build_mapper(copy_dir.path());
    let mut mapper = Started::piped(Command::new(mapper).arg(&mapped_file));
    let mut mapper_pid = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(mapper.0.stdout.as_mut().unwrap()),
        &mut mapper_pid,
    )
    .unwrap();
    let warning = format!(
        "reading {}, mapped by pid {}, did not return",
        mapped_file.display(),
        mapper_pid.trim()
    );
    eprintln!("{}", wait_for_log_line(&daemon, &warning));
    assert_eq!(
        wait_for_metric(&daemon.addr, "mpiburst_library_reads_timed_out_total", 2.0),
        2.0
    );
    assert_eq!(metric(&daemon.addr, "mpiburst_library_reads_stuck"), 2.0);
    // The opened file answers again: its stuck read returns and is said so.
    hung.release("libmpi.so.40");
    let returned = format!(
        "the stuck read of {} (pid {pid}) returned",
        opened_file.display()
    );
    wait_for_log_line(&daemon, &returned);
    wait_until(
        &daemon,
        Duration::from_secs(10),
        "the returned read is still counted stuck",
        || metric(&daemon.addr, "mpiburst_library_reads_stuck") == 1.0,
    );
    drop(mapper);
    // The daemon stops (SIGTERM, clean exit) while the read of the mapped file is still stuck.
    let what = "counts while a library read was stuck";
    let stopping = std::time::Instant::now();
    stop_after_run_on_copy(daemon, &copy, &program, &outputs, what);
    eprintln!(
        "the daemon stopped in {:.1} s (1.2 s of it the harness's wait) with a read stuck",
        stopping.elapsed().as_secs_f64()
    );
    drop(hung);
}

/// `mpi.hold_limit_s` by default.
const HOLD_LIMIT_S: f64 = 2.0;

/// The state letter of process `pid` (/proc/PID/stat: R, S, T for stopped, Z...); `None` once it
/// is gone.
fn process_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name, in parentheses, may hold spaces: the state follows its closing one.
    stat.rsplit_once(") ")?.1.chars().next()
}

/// Process `pid` runs (or sleeps): neither gone nor a zombie.
fn is_alive(pid: u32) -> bool {
    !matches!(process_state(pid), None | Some('Z' | 'X'))
}

/// Sends `signal` (STOP, CONT) to process `pid`.
fn send_signal(pid: u32, signal: &str) {
    let st = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(st.success(), "kill -{signal} {pid}: {st}");
}

/// The pid of the daemon's hold guard, as its log names it.
fn hold_guard_pid(daemon: &Daemon) -> u32 {
    const NAMED: &str = "the hold guard (pid ";
    let line = wait_for_log_line(daemon, NAMED);
    let pid = line.split_once(NAMED).unwrap().1;
    pid[..pid.find(')').unwrap()].parse().unwrap()
}

/// Waits until process `pid` is gone (or a zombie).
fn wait_until_gone(daemon: &Daemon, pid: u32, what: &str) {
    wait_until(daemon, Duration::from_secs(10), what, || !is_alive(pid));
}

/// Freezes the daemon while a process opens `copy` (a library at a new path), thaws it once the
/// open returned, and checks that the hold guard resumed the process at the hold limit. Returns
/// the process's pid.
fn guard_resumes_the_hold_of_a_frozen_daemon(daemon: &Daemon, copy: &Path) -> u32 {
    send_signal(daemon.pid(), "STOP");
    let mut opener = timed_open(copy);
    let (pid, open_s) = open_report(&mut opener, daemon);
    send_signal(daemon.pid(), "CONT");
    eprintln!("the open took {open_s:.3} s with the daemon frozen (hold limit {HOLD_LIMIT_S} s)");
    // Held until the limit, then resumed by the guard within its look interval (the margin is
    // for a loaded machine).
    assert!(
        (HOLD_LIMIT_S..HOLD_LIMIT_S + 3.0).contains(&open_s),
        "the open took {open_s} s for a hold limit of {HOLD_LIMIT_S} s"
    );
    eprintln!(
        "{}",
        wait_for_log_line(daemon, &format!("hold guard: resumed pid {pid}, held"))
    );
    pid
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_frozen_daemon_holds_a_process_no_longer_than_the_hold_limit() {
    let (_dir, copy) = copied_library(Mpi::OpenMpi);
    let daemon = Daemon::start(&[]);
    let guard = hold_guard_pid(&daemon);
    let pid = guard_resumes_the_hold_of_a_frozen_daemon(&daemon, &copy);
    // The daemon, thawed, handles the report and finds the process resumed already, and counts
    // it.
    wait_for_log_line(
        &daemon,
        &format!("pid {pid} had been resumed by the hold guard"),
    );
    wait_for_metric(
        &daemon.addr,
        "mpiburst_library_opens_resumed_by_guard_total",
        1.0,
    );
    daemon.stop();
    assert!(
        !is_alive(guard),
        "the hold guard (pid {guard}) outlived the daemon's stop"
    );
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_killed_daemon_leaves_no_process_held_and_a_new_daemon_holds_again() {
    let copies = [copied_library(Mpi::OpenMpi), copied_library(Mpi::OpenMpi)];
    // A limit far above the waits here: the processes run on because the daemon died.
    let mut daemon = Daemon::with_config("[mpi]\nhold_limit_s = 60\n", &[]);
    let old_guard = hold_guard_pid(&daemon);
    send_signal(daemon.pid(), "STOP");
    let mut openers = copies.each_ref().map(|(_, copy)| timed_open(copy));
    wait_until(
        &daemon,
        Duration::from_secs(30),
        "both openers held (stopped)",
        || openers.iter().all(|o| process_state(o.0.id()) == Some('T')),
    );
    daemon.kill9();
    for opener in &mut openers {
        let (pid, open_s) = open_report(opener, &daemon);
        eprintln!("pid {pid}: the open took {open_s:.3} s, its daemon killed while it was held");
        assert!(open_s < 30.0, "pid {pid} was held {open_s} s");
        wait_for_log_line(&daemon, &format!("hold guard: resumed pid {pid}, held"));
    }
    assert!(daemon
        .log_text()
        .contains("the daemon exited while holding it"));
    wait_until_gone(&daemon, old_guard, "the old daemon's hold guard exited");
    // A new daemon starts a guard of its own, and holds and resumes as before.
    let daemon = Daemon::start(&[]);
    let guard = hold_guard_pid(&daemon);
    assert_ne!(guard, old_guard);
    assert!(
        !is_alive(old_guard),
        "the old hold guard (pid {old_guard}) runs again"
    );
    let (_dir, copy) = copied_library(Mpi::OpenMpi);
    let mut opener = timed_open(&copy);
    let (pid, open_s) = open_report(&mut opener, &daemon);
    eprintln!(
        "{} (the opener timed {open_s:.3} s)",
        wait_for_log_line(&daemon, &format!("pid {pid} held "))
    );
    let log = daemon.log_text();
    assert!(
        !log.contains(&format!("hold guard: resumed pid {pid},")),
        "the new daemon did not resume pid {pid} itself:\n{log}"
    );
    daemon.stop();
    assert!(
        !is_alive(guard),
        "the hold guard (pid {guard}) outlived the daemon's stop"
    );
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_hold_guard_that_dies_is_started_again_and_guards_as_before() {
    let (_dir, copy) = copied_library(Mpi::OpenMpi);
    let daemon = Daemon::start(&[]);
    let killed = hold_guard_pid(&daemon);
    send_signal(killed, "KILL");
    // The daemon notices at its next stats update and starts a new guard.
    let line = wait_for_log_line(&daemon, "started it again as pid ");
    eprintln!("{line}");
    let guard: u32 = line
        .split_once("started it again as pid ")
        .unwrap()
        .1
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(guard, killed);
    assert!(
        is_alive(guard),
        "the new hold guard (pid {guard}) is not running"
    );
    wait_for_metric(&daemon.addr, "mpiburst_hold_guard_restarts_total", 1.0);
    // The new guard resumes a process the frozen daemon holds, as the first would have.
    guard_resumes_the_hold_of_a_frozen_daemon(&daemon, &copy);
    daemon.stop();
    assert!(
        !is_alive(guard),
        "the hold guard (pid {guard}) outlived the daemon's stop"
    );
}
