//! The daemon as the systemd unit runs it: as an unprivileged user with exactly the unit's
//! capabilities (packaging/systemd/mpiburst.service), it profiles a job another user runs with
//! exact call counts; without one of them it stops at once and names it; a second daemon on the
//! same port or lock file is refused before it touches the first one's recording; /healthz
//! answers 200 only once the probes are attached.
//!
//! The unit's settings other than the capabilities need systemd as PID 1 and are not run here;
//! docs/deploy.md says how they were checked.

use std::{
    fs,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{Mutex, MutexGuard},
    thread,
    time::{Duration, Instant},
};

use mpiburst::{
    config::Config,
    daemon::privileges::REQUIRED,
    export::{
        client::{ClientError, DaemonClient},
        recording::Recording,
    },
};
use mpiburst_tests::*;

/// The user the unprivileged daemon runs as; created (and removed again) when missing.
const TEST_USER: &str = "mpiburst-test";

/// The tests that use the test user run one at a time: they share its creation and removal.
static TEST_USER_LOCK: Mutex<()> = Mutex::new(());

/// What a test of the unit's capabilities needs: root, its turn with the test user, the unit's
/// capabilities, and the user.
fn unit_test_setup() -> (MutexGuard<'static, ()>, Vec<String>, TestUser) {
    require_root();
    let turn = TEST_USER_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let capabilities = unit_capabilities();
    (turn, capabilities, TestUser::get())
}

/// The unit's `AmbientCapabilities=`, checked equal to its `CapabilityBoundingSet=`, as
/// capability names (CAP_BPF, ...).
fn unit_capabilities() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../packaging/systemd/mpiburst.service");
    let unit = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let setting = |key: &str| -> Vec<String> {
        let line = unit
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("{} has no {key}=", path.display()));
        line.split_whitespace().map(str::to_string).collect()
    };
    let ambient = setting("AmbientCapabilities");
    assert_eq!(
        ambient,
        setting("CapabilityBoundingSet"),
        "the unit's daemon can gain no capability beyond those it holds"
    );
    ambient
}

/// The setpriv arguments that give exactly `capabilities` to the command after them.
fn capability_arguments(capabilities: &[String]) -> Vec<String> {
    let list: String = capabilities
        .iter()
        .map(|c| format!(",+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    ["--inh-caps", "--ambient-caps", "--bounding-set"]
        .iter()
        .map(|option| format!("{option}=-all{list}"))
        .collect()
}

/// The unprivileged user the daemon runs as, and what this test made for it.
struct TestUser {
    uid: u32,
    gid: u32,
    created: bool,
    /// A copy of the daemon where this user can run it (MPIBURST_BIN may be under a directory
    /// only root can enter), as a package would install it.
    bin: PathBuf,
    _bin_dir: tempfile::TempDir,
}

fn id(option: &str) -> Option<u32> {
    let out = Command::new("id")
        .args([option, TEST_USER])
        .stderr(Stdio::null())
        .output()
        .expect("run id");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().parse().ok())?
}

impl TestUser {
    fn get() -> TestUser {
        let created = id("-u").is_none();
        if created {
            let st = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                ])
                .arg(TEST_USER)
                .status()
                .expect("run useradd (Debian package passwd)");
            assert!(st.success(), "useradd {TEST_USER}: {st}");
        }
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.path().join("mpiburst");
        let installed = std::env::var_os("MPIBURST_BIN")
            .expect("MPIBURST_BIN is not set: run the tests through `cargo xtask test`");
        fs::copy(installed, &bin).unwrap();
        TestUser {
            uid: id("-u").unwrap(),
            gid: id("-g").unwrap(),
            created,
            bin,
            _bin_dir: dir,
        }
    }

    /// A directory this user may write to (for the recording).
    fn writable_dir(&self) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::chown(dir.path(), Some(self.uid), Some(self.gid)).unwrap();
        dir
    }

    /// The daemon's command, run as this user with exactly `capabilities` and no way to gain
    /// others (no_new_privs, as the unit's NoNewPrivileges=yes).
    fn daemon(&self, capabilities: &[String]) -> Command {
        let mut cmd = Command::new("setpriv");
        cmd.arg(format!("--reuid={}", self.uid))
            .arg(format!("--regid={}", self.gid))
            .args(["--init-groups", "--no-new-privs"])
            .args(capability_arguments(capabilities))
            .arg(&self.bin);
        cmd
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        if self.created {
            let st = Command::new("userdel").arg(TEST_USER).status();
            assert!(
                st.is_ok_and(|s| s.success()) || thread::panicking(),
                "userdel {TEST_USER} failed"
            );
        }
    }
}

/// The status of GET /healthz, or `None` while nothing listens.
fn healthz(addr: &str) -> Option<u16> {
    let client = DaemonClient::parse(addr, Config::default().daemon.listen.port())
        .unwrap()
        .unwrap();
    match client.get("/healthz") {
        Ok(_) => Some(200),
        Err(ClientError::Status { status, .. }) => Some(status),
        Err(_) => None,
    }
}

/// A daemon this test started, its standard error in a file; killed if the test panics.
struct Started {
    child: Child,
    addr: String,
    log: PathBuf,
    /// The /healthz statuses seen while it started, in order (one per status change).
    healthz: Vec<u16>,
}

impl Started {
    /// Spawns `cmd` (the daemon, before its arguments) recording to `recording`, and polls
    /// /healthz until it answers 200.
    fn start(mut cmd: Command, recording: &Path, log_dir: &Path, extra: &[&str]) -> Started {
        let addr = free_loopback_addr();
        let log = log_dir.join("daemon.log");
        let child = cmd
            .args(["record", "-o"])
            .arg(recording)
            .args(["--listen", &addr, "--report-interval", "0"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("start the daemon");
        let mut started = Started {
            child,
            addr,
            log,
            healthz: Vec::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while started.healthz.last() != Some(&200) {
            assert!(
                Instant::now() < deadline,
                "/healthz did not answer 200 within 60 s; the daemon's log:\n{}",
                started.log_text()
            );
            if let Some(st) = started.child.try_wait().unwrap() {
                panic!(
                    "the daemon exited ({st}) while starting:\n{}",
                    started.log_text()
                );
            }
            match healthz(&started.addr) {
                Some(status) if started.healthz.last() != Some(&status) => {
                    started.healthz.push(status)
                }
                _ => thread::sleep(Duration::from_millis(5)),
            }
        }
        started
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM, as systemd stops it, and its exit status.
    fn stop(mut self) -> ExitStatus {
        // Let the last totals read see the ranks gone (stats interval is 1 s).
        thread::sleep(Duration::from_millis(1200));
        // SAFETY: kill with a pid this test spawned and has not reaped.
        assert_eq!(
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) },
            0
        );
        wait_with_timeout(&mut self.child, Duration::from_secs(60)).unwrap_or_else(|| {
            panic!(
                "the daemon did not stop within 60 s of SIGTERM:\n{}",
                self.log_text()
            )
        })
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        let log = &self.log;
        kill_daemon_left_running(&mut self.child, || {
            fs::read_to_string(log).unwrap_or_default()
        });
    }
}

/// Runs the `counts` program with 3 ranks (as root, another user than the daemon's) and returns
/// it with what each rank counted itself.
fn run_counts(mpi: Mpi) -> (PathBuf, Vec<serde_json::Value>) {
    let out = tempfile::tempdir().unwrap();
    let program = program("counts", mpi);
    run_mpi(mpi, 3, &program, &[out.path().to_str().unwrap()]);
    (program, rank_outputs(out.path(), "counts", 3))
}

#[test]
#[ignore = "needs root to create a user and load BPF programs: run `sudo -E cargo xtask test`"]
fn with_the_units_capabilities_an_unprivileged_daemon_counts_another_users_job_exactly() {
    let (_turn, capabilities, user) = unit_test_setup();
    let mut required: Vec<&str> = REQUIRED.iter().map(|c| c.name).collect();
    let mut granted: Vec<&str> = capabilities.iter().map(String::as_str).collect();
    required.sort_unstable();
    granted.sort_unstable();
    assert_eq!(
        granted, required,
        "the unit grants what the daemon checks for"
    );

    let dir = user.writable_dir();
    let recording = dir.path().join("recording.jsonl");
    let daemon = Started::start(
        user.daemon(&capabilities),
        &recording,
        dir.path(),
        // Exact counts, compared with the programs' own: no polling loop may be demoted.
        &["--min-burst-us", "0", "--no-governor"],
    );
    let runs: Vec<_> = Mpi::ALL
        .into_iter()
        .map(|mpi| (mpi, run_counts(mpi)))
        .collect();
    let log = daemon.log_text();
    let st = daemon.stop();
    assert!(st.success(), "daemon exit {st}; log:\n{log}");
    let recording = Recording::read(&recording).unwrap_or_else(|e| panic!("{e}; log:\n{log}"));
    for (mpi, (program, outputs)) in &runs {
        let what = format!("counts under {mpi:?}, daemon as {TEST_USER}");
        let job = job_of(&recording, program);
        // The program and its ranks are root's: reading their /proc entries took the capabilities.
        assert_eq!(
            job.meta.size, 3,
            "{what}: job size from the launcher's environment"
        );
        assert!(job.meta.ended_ns.is_some(), "{what}: job seen to end");
        assert_calls_exact(job, outputs, &what);
        for out in outputs {
            let rank = out["rank"].as_u64().unwrap() as u32;
            assert_eq!(job.ranks[&rank].pid as u64, out["pid"].as_u64().unwrap());
        }
    }
}

#[test]
#[ignore = "needs root to create a user: run `sudo -E cargo xtask test`"]
fn without_one_of_the_units_capabilities_the_daemon_stops_at_once_and_names_it() {
    let (_turn, capabilities, user) = unit_test_setup();
    for missing in &capabilities {
        let rest: Vec<String> = capabilities
            .iter()
            .filter(|c| *c != missing)
            .cloned()
            .collect();
        let dir = user.writable_dir();
        let recording = dir.path().join("recording.jsonl");
        let mut cmd = user.daemon(&rest);
        cmd.args(["record", "-o"])
            .arg(&recording)
            .args(["--listen", &free_loopback_addr()])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let began = Instant::now();
        let mut child = cmd.spawn().expect("start the daemon");
        // Before it loads anything: a loaded daemon attaches probes for a second or more.
        let st = wait_with_timeout(&mut child, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("without {missing} the daemon still ran after 10 s"));
        let took = began.elapsed();
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert!(!st.success(), "without {missing}: exit {st}; {stderr}");
        let line = stderr
            .lines()
            .find(|l| l.trim_start().starts_with(missing.as_str()))
            .unwrap_or_else(|| {
                panic!("without {missing}, the message does not name it:\n{stderr}")
            });
        assert!(line.contains("needed to"), "{line}");
        for other in &rest {
            assert!(
                !stderr.contains(other.as_str()),
                "names {other}, which it has:\n{stderr}"
            );
        }
        assert!(stderr.contains("docs/deploy.md"), "{stderr}");
        assert!(
            !recording.exists(),
            "without {missing} the daemon created its recording"
        );
        eprintln!("without {missing}: {st} after {took:?}");
    }
}

#[test]
#[ignore = "needs root to load BPF programs: run `sudo -E cargo xtask test`"]
fn a_second_daemon_is_refused_and_leaves_the_first_ones_recording_intact() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let recording = dir.path().join("recording.jsonl");
    let lock = dir.path().join("mpiburst.lock");
    let config = dir.path().join("mpiburst.toml");
    fs::write(
        &config,
        format!("[daemon]\nlock_file = {:?}\n", lock.display().to_string()),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let bin = std::env::var_os("MPIBURST_BIN")
        .expect("MPIBURST_BIN is not set: run the tests through `cargo xtask test`");
    let first = Started::start(
        Command::new(&bin),
        &recording,
        dir.path(),
        &["--config", config, "--min-burst-us", "0"],
    );
    // The server listens before the BPF programs are loaded, and says it is not ready yet.
    assert_eq!(
        first.healthz,
        [503, 200],
        "/healthz while the daemon started"
    );
    let first_pid = first.child.id().to_string();
    assert_eq!(fs::read_to_string(&lock).unwrap().trim(), first_pid);
    let (program, outputs) = run_counts(Mpi::OpenMpi);
    // Let the first daemon write the job's bursts out.
    thread::sleep(Duration::from_millis(1500));
    let before = fs::read(&recording).unwrap();
    assert!(!before.is_empty());

    // A second daemon writing to the same recording: its standard error.
    let second = |listen: &str| {
        let out = Command::new(&bin)
            .args(["record", "-o"])
            .arg(&recording)
            .args(["--config", config, "--listen", listen])
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .output()
            .expect("start a second daemon");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "the second daemon ran: {stderr}");
        let now = fs::read(&recording).unwrap();
        assert!(
            now.starts_with(&before),
            "the first daemon's recording changed under the second (listen {listen})"
        );
        stderr.into_owned()
    };
    let same_port = second(&first.addr);
    assert!(
        same_port.contains(&format!("cannot serve HTTP on {}", first.addr))
            && same_port.contains("the port is in use"),
        "{same_port}"
    );
    let same_lock = second(&free_loopback_addr());
    assert!(
        same_lock.contains(&format!("already running (pid {first_pid})")),
        "{same_lock}"
    );
    assert_eq!(
        healthz(&first.addr),
        Some(200),
        "the first daemon still serves"
    );

    let log = first.log_text();
    let st = first.stop();
    assert!(st.success(), "daemon exit {st}; log:\n{log}");
    let recording = Recording::read(&recording).unwrap_or_else(|e| panic!("{e}; log:\n{log}"));
    assert!(recording.end.is_some(), "the recording ends cleanly");
    assert_calls_exact(
        job_of(&recording, &program),
        &outputs,
        "counts after a refused second daemon",
    );
    assert_eq!(
        fs::read_to_string(&lock).unwrap(),
        "",
        "a stopped daemon leaves no pid in its lock file"
    );
}
