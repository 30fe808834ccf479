//! Shared pieces of the integration tests: they run the real daemon binary, real MPI launchers
//! and the bundled MPI programs (tests/mpi), and read what the daemon recorded.
//!
//! `cargo xtask test` builds the daemon and the programs and passes their locations in
//! MPIBURST_BIN and MPIBURST_MPI_PROGRAMS.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{mpsc, Arc, Mutex},
    thread,
    time::{Duration, Instant},
};

use mpiburst::{
    config::Config,
    export::{client::DaemonClient, recording::Recording},
    model::is_lifecycle_function,
    store::Job,
};

/// Panics with what to do unless this process can load BPF programs (root). The tests that
/// need it are `#[ignore]`d with that reason, and `cargo xtask test` runs them only as root; this
/// check makes one run by hand without root (`--include-ignored`) fail instead of pass.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert!(euid == 0, "this test loads BPF programs and needs root, not uid {euid}: run `sudo -E cargo xtask test`");
}

/// How a test that cannot run on this machine says so: `cargo xtask test` reads lines starting
/// with this from the test's output and reports the test skipped with the reason that follows.
pub const SKIPPED_AT_RUN_TIME: &str = "mpiburst-test skipped at run time: ";

/// Reports test `test` skipped because of `reason` (a test that calls this then returns). The
/// line goes to the process's standard error directly: libtest captures only `eprintln!`.
pub fn skip_at_run_time(test: &str, reason: &str) {
    use std::io::Write as _;
    let reason = reason.replace('\n', " / ");
    let _ = writeln!(std::io::stderr(), "{SKIPPED_AT_RUN_TIME}{test}: {reason}");
}

/// The CPUs this process may run on: how many ranks a machine runs without oversubscription.
pub fn online_cpus() -> u32 {
    thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

fn env_path(var: &str) -> PathBuf {
    std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        panic!("{var} is not set: run the integration tests through `cargo xtask test`")
    })
}

/// A bundled MPI program built for one implementation (`name.openmpi`, `name.mpich`).
pub fn program(name: &str, mpi: Mpi) -> PathBuf {
    let p = env_path("MPIBURST_MPI_PROGRAMS").join(format!("{name}.{}", mpi.suffix()));
    assert!(
        p.exists(),
        "{} is missing: `cargo xtask test` builds it",
        p.display()
    );
    p
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mpi {
    OpenMpi,
    Mpich,
}

impl Mpi {
    pub const ALL: [Mpi; 2] = [Mpi::OpenMpi, Mpi::Mpich];

    fn suffix(self) -> &'static str {
        match self {
            Mpi::OpenMpi => "openmpi",
            Mpi::Mpich => "mpich",
        }
    }

    /// The variable that tells a rank its rank in the world, under this implementation's own
    /// launcher.
    pub fn rank_variable(self) -> &'static str {
        match self {
            Mpi::OpenMpi => "OMPI_COMM_WORLD_RANK",
            Mpi::Mpich => "PMI_RANK",
        }
    }

    /// The launcher, set up for any number of cores (oversubscription allowed, and idle ranks
    /// yield instead of busy-polling).
    pub fn launcher(self, ranks: u32) -> Command {
        let mut cmd = match self {
            Mpi::OpenMpi => {
                let mut c = Command::new("mpirun.openmpi");
                c.args([
                    "--allow-run-as-root",
                    "--oversubscribe",
                    "--mca",
                    "mpi_yield_when_idle",
                    "1",
                ]);
                c
            }
            Mpi::Mpich => Command::new("mpirun.mpich"),
        };
        cmd.args(["-np", &ranks.to_string()]);
        cmd
    }
}

/// Runs a command to completion with a time limit, killing it on timeout.
pub fn run_with_timeout(mut cmd: Command, limit: Duration) -> ExitStatus {
    let shown = format!("{cmd:?}");
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {shown}: {e}"));
    wait_with_timeout(&mut child, limit)
        .unwrap_or_else(|| panic!("{shown} did not finish within {limit:?}"))
}

pub fn wait_with_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(st) = child.try_wait().expect("wait") {
            return Some(st);
        }
        thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// Waits up to `limit` until `done`; panics naming `what`, with the daemon's log.
pub fn wait_until(daemon: &Daemon, limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(
            Instant::now() < deadline,
            "{what} within {limit:?}; the daemon's log:\n{}",
            daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs an MPI program and asserts it succeeded.
pub fn run_mpi(mpi: Mpi, ranks: u32, program: &Path, args: &[&str]) {
    let mut cmd = mpi.launcher(ranks);
    cmd.arg(program).args(args);
    let st = run_with_timeout(cmd, Duration::from_secs(180));
    assert!(
        st.success(),
        "{} under {mpi:?} failed: {st}",
        program.display()
    );
}

/// `mpiburst aggregate`, stopped (SIGKILL) when dropped.
pub struct Aggregator {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    pub addr: String,
}

impl Aggregator {
    /// Started with `args` (`--daemon ADDR`… or `--prometheus ADDR`).
    pub fn start(args: &[&str]) -> Aggregator {
        let addr = free_loopback_addr();
        let mut command = Command::new(daemon_binary());
        command.args(["aggregate", "--listen", &addr]).args(args);
        let (child, log) = spawn_daemon(command);
        Aggregator { child, log, addr }
    }
}

impl Drop for Aggregator {
    fn drop(&mut self) {
        let log = &self.log;
        kill_daemon_left_running(&mut self.child, || log.lock().unwrap().join("\n"));
    }
}

/// The real daemon, recording to a temporary file. Stopped (SIGKILL) if the test panics.
pub struct Daemon {
    child: Child,
    pub recording: PathBuf,
    pub log: Arc<Mutex<Vec<String>>>,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts the daemon with the probe governor off: the tests compare every call count with
    /// the program's own, and the governor estimates the calls of a polling storm.
    pub fn start(extra: &[&str]) -> Daemon {
        Self::start_under(&[], extra)
    }

    /// The CPU time the daemon's process has used so far (user and system), in ns, to the
    /// kernel's clock tick.
    pub fn cpu_ns(&self) -> u64 {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap();
        // The name, in parentheses, may hold spaces; utime and stime are fields 14 and 15.
        let fields: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
        let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
        // SAFETY: sysconf has no memory-safety preconditions.
        let per_s = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
        ticks * 1_000_000_000 / per_s
    }

    /// [`Daemon::start`] through a command that execs the daemon as its last argument (such as
    /// `unshare -m sh -c '... exec "$0" "$@"'`), so that the pid it starts is the daemon's.
    pub fn start_under(wrapper: &[&str], extra: &[&str]) -> Daemon {
        Self::launch(wrapper, None, &[&["--no-governor"], extra].concat())
    }

    /// [`Daemon::start`] with the configuration file `config` (TOML text), which lives in the
    /// daemon's temporary folder for as long as the daemon.
    pub fn with_config(config: &str, extra: &[&str]) -> Daemon {
        Self::launch(&[], Some(config), &[&["--no-governor"], extra].concat())
    }

    /// [`Daemon::with_config`] with the probe governor on, as the daemon runs by default.
    pub fn governed_with_config(config: &str, extra: &[&str]) -> Daemon {
        Self::launch(&[], Some(config), extra)
    }

    fn launch(wrapper: &[&str], config: Option<&str>, extra: &[&str]) -> Daemon {
        require_root();
        let dir = tempfile::tempdir().unwrap();
        let recording = dir.path().join("recording.jsonl");
        let addr = free_loopback_addr();
        let bin = daemon_binary();
        let mut command = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        command.args(["record", "-o"]).arg(&recording);
        command.args(["--listen", &addr, "--report-interval", "0"]);
        if let Some(config) = config {
            let path = dir.path().join("mpiburst.toml");
            std::fs::write(&path, config).expect("write the daemon's configuration file");
            command.arg("--config").arg(path);
        }
        command.args(extra);
        let (child, log) = spawn_daemon(command);
        Daemon {
            child,
            recording,
            log,
            addr,
            _dir: dir,
        }
    }

    pub fn log_text(&self) -> String {
        self.log.lock().unwrap().join("\n")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// [`terminate_daemon`], and read the recording.
    pub fn stop(self) -> Recording {
        self.stop_keeping(None)
    }

    /// [`Daemon::stop`], copying the recording file to `keep` for commands that read it.
    pub fn stop_keeping(mut self, keep: Option<&Path>) -> Recording {
        // Give the last totals read a chance to see the ranks gone (stats interval is 1 s).
        thread::sleep(Duration::from_millis(1200));
        terminate_daemon(&mut self.child, &self.log);
        if let Some(keep) = keep {
            std::fs::copy(&self.recording, keep).expect("copy the recording");
        }
        Recording::read(&self.recording)
            .unwrap_or_else(|e| panic!("{e}; log:\n{}", self.log_text()))
    }

    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let log = &self.log;
        kill_daemon_left_running(&mut self.child, || log.lock().unwrap().join("\n"));
    }
}

/// The daemon binary `cargo xtask test` built.
pub fn daemon_binary() -> PathBuf {
    env_path("MPIBURST_BIN")
}

/// Starts the daemon `command` runs, collecting its standard error in the returned log, and
/// waits until it says it is ready; kills it and panics with its log if it is not within 60 s.
pub fn spawn_daemon(mut command: Command) -> (Child, Arc<Mutex<Vec<String>>>) {
    let mut child = command
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the daemon");
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let sink = log.clone();
    thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.starts_with("mpiburst ready") {
                let _ = tx.send(());
            }
            sink.lock().unwrap().push(line);
        }
    });
    if rx.recv_timeout(Duration::from_secs(60)).is_err() {
        let _ = child.kill();
        let _ = child.wait();
        panic!(
            "the daemon did not become ready; its log:\n{}",
            log.lock().unwrap().join("\n")
        );
    }
    (child, log)
}

/// Stops a daemon with SIGTERM (how a service manager stops it) and waits for its clean
/// shutdown; panics with its log if it does not stop within 60 s or fails. Not SIGINT: the daemon
/// listens for SIGINT only while it waits, so one that arrives while it drains on a busy machine
/// is lost.
pub fn terminate_daemon(child: &mut Child, log: &Mutex<Vec<String>>) {
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let log_text = || log.lock().unwrap().join("\n");
    let st = wait_with_timeout(child, Duration::from_secs(60)).unwrap_or_else(|| {
        panic!(
            "the daemon did not stop within 60 s of SIGTERM; its log:\n{}",
            log_text()
        )
    });
    assert!(st.success(), "daemon exit {st}; log:\n{}", log_text());
}

/// Kills a daemon a test leaves running (it panicked), and shows what the daemon said: a failed
/// request may be a daemon-side error.
pub fn kill_daemon_left_running(child: &mut Child, log: impl FnOnce() -> String) {
    if let Ok(None) = child.try_wait() {
        let _ = child.kill();
        let _ = child.wait();
    }
    if thread::panicking() {
        eprintln!("the daemon's log:\n{}", log());
    }
}

/// A cgroup of the cgroup2 hierarchy, removed on drop: a simulated node's, or part of a job's
/// ranks. Its name ends in this test process's pid.
pub struct Cgroup {
    pub dir: PathBuf,
    /// The path as /proc/PID/cgroup shows it.
    pub path: String,
}

impl Cgroup {
    pub fn new(name: &str) -> Cgroup {
        require_root();
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        let root = mounts
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.get(2) == Some(&"cgroup2"))
            .map(|f| PathBuf::from(f[1]))
            .expect("a cgroup2 hierarchy (mount -t cgroup2 none /sys/fs/cgroup/unified)");
        let path = format!("/{name}-{}", std::process::id());
        let dir = root.join(&path[1..]);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Cgroup { dir, path }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty once the ranks have exited; a cgroup with processes cannot be removed.
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Nodes of a cluster simulated on this machine, for a job over several nodes. Each node is a
/// cgroup with a daemon of its own (`--node NAME --cgroup PATH`). A command runs on a node
/// through the launchers' remote-start agent, [`SimulatedNodes::agent`]: a script called as ssh
/// is (`[-x] HOST command…`, the command one shell text) that moves itself into HOST's cgroup and
/// runs the command under host name HOST, in a UTS namespace of its own. Its mount namespace
/// sees an /etc/hosts in which every node's name is a loopback address of its own, as Hydra
/// needs (its proxies reach mpiexec, and MPICH's ranks each other, by host name); Open MPI's
/// daemons reach mpirun by address, and take names that are this machine's own addresses for
/// this machine.
pub struct SimulatedNodes {
    pub nodes: Vec<SimulatedNode>,
    pub agent: PathBuf,
    dir: tempfile::TempDir,
}

pub struct SimulatedNode {
    pub name: String,
    /// The node's loopback address, which its name resolves to on the simulated nodes.
    pub address: String,
    pub cgroup: Cgroup,
    pub daemon: Daemon,
}

impl SimulatedNodes {
    /// The nodes `names`, each with its daemon running.
    pub fn start(names: &[&str]) -> SimulatedNodes {
        let dir = tempfile::tempdir().unwrap();
        let nodes: Vec<SimulatedNode> = names
            .iter()
            .enumerate()
            .map(|(n, &name)| {
                let cgroup = Cgroup::new(&format!("mpiburst-node-{name}"));
                let daemon = Daemon::start(&["--node", name, "--cgroup", &cgroup.path]);
                SimulatedNode {
                    name: name.to_string(),
                    address: format!("127.0.2.{}", n + 1),
                    cgroup,
                    daemon,
                }
            })
            .collect();
        let mut hosts = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
        let mut cgroups = String::new();
        for node in &nodes {
            hosts += &format!("{} {}\n", node.address, node.name);
            cgroups += &format!("  {}) cgroup={} ;;\n", node.name, node.cgroup.dir.display());
        }
        let hosts_file = dir.path().join("hosts");
        std::fs::write(&hosts_file, hosts).unwrap();
        let agent = dir.path().join("agent");
        std::fs::write(
            &agent,
            format!(
                "#!/bin/sh\n\
                 # Runs a command on a simulated node; called as ssh is: [-x] HOST command...\n\
                 [ \"$1\" = -x ] && shift\n\
                 host=$1; shift\n\
                 case $host in\n{cgroups}  *) echo \"no simulated node $host\" >&2; exit 255 ;;\nesac\n\
                 echo $$ > \"$cgroup/cgroup.procs\" || exit 255\n\
                 exec unshare --mount --uts sh -c 'mount --bind \"$0\" /etc/hosts && hostname \"$1\" && exec sh -c \"$2\"' {} \"$host\" \"$*\"\n",
                hosts_file.display()
            ),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
        SimulatedNodes { nodes, agent, dir }
    }

    /// `command` run on node `node` through the agent, which execs it: the pid of the returned
    /// command's process is `command`'s, to stop it by.
    pub fn on(&self, node: &str, command: &Command) -> Command {
        let mut on = Command::new(&self.agent);
        on.arg(node).arg(format!("exec {}", shell_text(command)));
        on
    }

    /// `mpi`'s launcher for `ranks` ranks over all the nodes, `slots` ranks a node at most,
    /// starting its remote side through the agent.
    pub fn launcher(&self, mpi: Mpi, ranks: u32, slots: u32) -> Command {
        let mut cmd = mpi.launcher(ranks);
        let agent = self.agent.display().to_string();
        match mpi {
            Mpi::OpenMpi => {
                let hostfile = self.dir.path().join("hostfile");
                let lines: String = self
                    .nodes
                    .iter()
                    .map(|node| format!("{} slots={slots}\n", node.name))
                    .collect();
                std::fs::write(&hostfile, lines).unwrap();
                cmd.args(["--mca", "plm", "rsh", "--mca", "plm_rsh_agent", &agent]);
                cmd.arg("--hostfile").arg(hostfile);
            }
            Mpi::Mpich => {
                let hosts: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|node| format!("{}:{slots}", node.name))
                    .collect();
                cmd.args(["-bootstrap-exec", &agent, "-hosts", &hosts.join(",")]);
            }
        }
        cmd
    }

    /// Adds to `launch` (`mpi`'s launcher) the `counts` program, writing to `out`: each rank
    /// first notes the node it runs on in `out/node.<rank>`, the placement against which
    /// [`SimulatedNodes::stop_and_check_counts`] checks what each node's daemon saw. Returns the
    /// program.
    pub fn counts_noting_node(launch: &mut Command, mpi: Mpi, out: &Path) -> PathBuf {
        let program = program("counts", mpi);
        let rank = mpi.rank_variable();
        launch
            .args([
                "sh",
                "-c",
                &format!("hostname > \"$0/node.${rank}\" && exec \"$1\" \"$0\""),
            ])
            .arg(out)
            .arg(&program);
        program
    }

    /// Stops the nodes' daemons and asserts, for each run of `counts` that
    /// [`SimulatedNodes::counts_noting_node`] made (its program and output folder, `ranks` ranks),
    /// that all daemons name the job alike, that each saw exactly the ranks that ran on its node,
    /// that these are together the ranks 0..`ranks` of a world of `ranks`, and that each counted
    /// its ranks' calls exactly. Returns each run's job as the first node recorded it.
    pub fn stop_and_check_counts(self, runs: &[(&Path, &Path)], ranks: u32) -> Vec<Job> {
        let recordings: Vec<(String, Recording)> = self
            .nodes
            .into_iter()
            .map(|node| (node.name, node.daemon.stop()))
            .collect();
        runs.iter()
            .map(|&(program, out)| {
                let outputs = rank_outputs(out, "counts", ranks);
                let node_of = |rank: u32| {
                    let path = out.join(format!("node.{rank}"));
                    let text = std::fs::read_to_string(&path)
                        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
                    text.trim().to_string()
                };
                let mut ids = std::collections::BTreeSet::new();
                let mut seen = Vec::new();
                for (node, recording) in &recordings {
                    let job = job_of(recording, program);
                    let what = format!("{} on node {node}", program.display());
                    let here: Vec<u32> = job.ranks.keys().copied().collect();
                    let placed: Vec<u32> = (0..ranks).filter(|&r| node_of(r) == *node).collect();
                    assert_eq!(here, placed, "{what}: ranks seen against those run there");
                    assert_eq!(job.meta.size, ranks, "{what}: world size");
                    assert_eq!(&job.meta.node, node, "{what}: node");
                    let own: Vec<serde_json::Value> = outputs
                        .iter()
                        .filter(|out| placed.contains(&(out["rank"].as_u64().unwrap() as u32)))
                        .cloned()
                        .collect();
                    assert_calls_exact(job, &own, &what);
                    eprintln!(
                        "{what}: job {} ({}), ranks {here:?}",
                        job.meta.id, job.meta.source
                    );
                    ids.insert(job.meta.id.clone());
                    seen.extend(here);
                }
                assert_eq!(
                    ids.len(),
                    1,
                    "{}: one job id on all nodes: {ids:?}",
                    program.display()
                );
                seen.sort_unstable();
                assert_eq!(seen, (0..ranks).collect::<Vec<_>>(), "ranks over all nodes");
                job_of(&recordings[0].1, program).clone()
            })
            .collect()
    }
}

/// The words of `command` as one shell text, each quoted: what ssh, and an agent called as ssh
/// is, run.
pub fn shell_text(command: &Command) -> String {
    let quote =
        |word: &std::ffi::OsStr| format!("'{}'", word.to_string_lossy().replace('\'', r"'\''"));
    let words: Vec<String> = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(quote)
        .collect();
    words.join(" ")
}

/// Every rank's calls per MPI function, as the daemon recorded them, equal the program's own.
pub fn assert_calls_exact(job: &Job, outputs: &[serde_json::Value], what: &str) {
    assert_eq!(job.ranks.len(), outputs.len(), "{what}: ranks seen");
    for out in outputs {
        let rank = out["rank"].as_u64().unwrap() as u32;
        let own: BTreeMap<String, u64> = serde_json::from_value(out["calls"].clone()).unwrap();
        let recorded: BTreeMap<String, u64> = job.ranks[&rank]
            .functions
            .iter()
            .map(|(function, stats)| (function.clone(), stats.calls))
            .collect();
        assert_eq!(recorded, own, "{what}: calls per function of rank {rank}");
    }
}

/// Asserts that every call of a function the program sized was sized in kernel, and that the
/// bytes per function of each rank of `job` equal the program's own (its `bytes` object).
pub fn assert_bytes_exact(job: &Job, outputs: &[serde_json::Value], what: &str) {
    for out in outputs {
        let rank = out["rank"].as_u64().unwrap() as u32;
        let own: BTreeMap<String, u64> = serde_json::from_value(out["bytes"].clone()).unwrap();
        for (function, bytes) in own {
            let stats = &job.ranks[&rank].functions[&function];
            assert_eq!(
                (stats.sized_calls, stats.bytes),
                (stats.calls, bytes),
                "{what}: rank {rank} {function}: (sized calls, bytes) against (calls, the \
                 program's bytes)"
            );
        }
    }
}

/// The recorded jobs whose executable is `program`.
pub fn jobs_of<'a>(recording: &'a Recording, program: &Path) -> Vec<&'a Job> {
    let exe = program.canonicalize().unwrap();
    recording
        .jobs
        .values()
        .filter(|j| Path::new(&j.meta.executable) == exe)
        .collect()
}

/// The one recorded job whose executable is `program`.
pub fn job_of<'a>(recording: &'a Recording, program: &Path) -> &'a Job {
    let jobs = jobs_of(recording, program);
    assert_eq!(
        jobs.len(),
        1,
        "expected one job running {}, found {:?}",
        program.display(),
        recording
            .jobs
            .values()
            .map(|j| (&j.meta.id, &j.meta.executable))
            .collect::<Vec<_>>()
    );
    jobs[0]
}

/// Reads `<dir>/<prefix>.<rank>.json` for every rank.
pub fn rank_outputs(dir: &Path, prefix: &str, ranks: u32) -> Vec<serde_json::Value> {
    (0..ranks)
        .map(|r| {
            let p = dir.join(format!("{prefix}.{r}.json"));
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        })
        .collect()
}

/// Asserts that a behaviour change's window, as the kernel readings that delimit it
/// (`start_ns`–`end_ns`), holds each rank's switch: between the return of its last call of the
/// old role and that of its first call of the new one, by its own clock (`role_switch`'s
/// outputs, `last_old_ns` and `first_new_ns`).
pub fn assert_change_holds_each_switch(change: &serde_json::Value, outputs: &[serde_json::Value]) {
    let (start, end) = (
        change["start_ns"].as_u64().unwrap(),
        change["end_ns"].as_u64().unwrap(),
    );
    for out in outputs {
        let (last_old, first_new) = (
            out["last_old_ns"].as_u64().unwrap(),
            out["first_new_ns"].as_u64().unwrap(),
        );
        assert!(
            last_old <= end && first_new >= start,
            "rank {}: switch between {last_old} and {first_new} ns, change reported in \
             {start}–{end} ns",
            out["rank"]
        );
    }
}

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-pointer.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
}

/// CLOCK_REALTIME minus CLOCK_MONOTONIC now, in ns: maps the programs' monotonic timestamps to
/// the Unix times the daemon records.
pub fn unix_minus_monotonic_ns() -> i128 {
    clock_ns(libc::CLOCK_REALTIME) - clock_ns(libc::CLOCK_MONOTONIC)
}

/// A client for the HTTP server at `addr` (HOST:PORT): the daemon's own, with its timeouts.
fn client(addr: &str) -> DaemonClient {
    DaemonClient::parse(addr, Config::default().daemon.listen.port())
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("{addr} is not a HOST:PORT address"))
}

/// The body of a GET that must answer 200 (`path` percent-encoded already).
pub fn http_get(addr: &str, path: &str) -> String {
    let body = client(addr).get(path).unwrap_or_else(|e| panic!("{e}"));
    String::from_utf8(body).unwrap_or_else(|e| panic!("GET {path}: not UTF-8: {e}"))
}

/// GET a JSON document from a daemon.
/// The value of a series of the daemon's metrics: `name` with its labels as /metrics writes
/// them (`mpiburst_x{a="b"}`), or alone for an unlabelled metric.
pub fn metric(addr: &str, name: &str) -> f64 {
    let text = http_get(addr, "/metrics");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("/metrics has no {name}:\n{text}"))
}

pub fn get_json(addr: &str, path: &str) -> serde_json::Value {
    serde_json::from_str(&http_get(addr, path)).unwrap_or_else(|e| panic!("GET {path}: {e}"))
}

/// The id of the one job on the daemon whose executable is `program`, other than `earlier`.
pub fn job_id(addr: &str, program: &Path, earlier: &[String]) -> String {
    let exe = program.canonicalize().unwrap().display().to_string();
    let jobs = get_json(addr, "/api/jobs");
    let ids: Vec<&str> = jobs
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["meta"]["executable"] == exe.as_str())
        .map(|j| j["meta"]["id"].as_str().unwrap())
        .filter(|id| !earlier.iter().any(|e| e == id))
        .collect();
    assert_eq!(ids.len(), 1, "jobs running {exe}: {jobs}");
    ids[0].to_string()
}

/// A free loopback address (bind to port 0, note it, release it).
pub fn free_loopback_addr() -> String {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string()
}

/// The Prometheus rule files and their unit tests.
pub fn rules_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards/rules")
}

pub fn promtool(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(rules_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; `cargo xtask test` installs it)");
    if let Some(input) = stdin {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

/// Prometheus, scraping daemons every second and evaluating every rule file in dashboards/rules;
/// stopped on drop.
pub struct Prometheus {
    child: Child,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn start(targets: &[&str]) -> Prometheus {
        Self::scraping(1, 1, &Self::targets(targets), "", Duration::from_secs(30))
    }

    /// [`Prometheus::start`], writing every sample it stores, the rules' too, to `remote` (a
    /// remote-write URL).
    pub fn writing_to(targets: &[&str], remote: &str) -> Prometheus {
        let remote_write = format!("remote_write:\n  - url: {remote}\n");
        Self::scraping(
            1,
            1,
            &Self::targets(targets),
            &remote_write,
            Duration::from_secs(30),
        )
    }

    /// The scrape configuration of `targets`.
    fn targets(targets: &[&str]) -> String {
        let targets = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        format!("  - job_name: mpiburst\n    static_configs:\n      - targets: [{targets}]\n")
    }

    /// Prometheus scraping every `scrape_s` and evaluating the rules every `evaluate_s` seconds,
    /// with `scrape_configs` (the YAML list under `scrape_configs:`) and `more` (further
    /// top-level sections), ready within `ready_within`.
    pub fn scraping(
        scrape_s: u32,
        evaluate_s: u32,
        scrape_configs: &str,
        more: &str,
        ready_within: Duration,
    ) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        // Every rule file (recording and alerting) is loaded, as an operator would.
        let mut rules: Vec<String> = std::fs::read_dir(rules_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".rules.yml"))
            .map(|p| format!("  - {}\n", p.canonicalize().unwrap().display()))
            .collect();
        rules.sort();
        let config = format!(
            "global:\n  scrape_interval: {scrape_s}s\n  scrape_timeout: {scrape_s}s\n  evaluation_interval: {evaluate_s}s\nrule_files:\n{}scrape_configs:\n{scrape_configs}{more}",
            rules.concat()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let addr = free_loopback_addr();
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package; `cargo xtask test` installs it)");
        let p = Prometheus {
            child,
            addr,
            _dir: dir,
        };
        let deadline = Instant::now() + ready_within;
        // Listening is not enough: until its storage and rules are loaded, queries answer 503.
        while !p.ready() {
            assert!(
                Instant::now() < deadline,
                "prometheus did not become ready within {} s",
                ready_within.as_secs()
            );
            thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// GET /-/ready answers 200.
    fn ready(&self) -> bool {
        client(&self.addr).get("/-/ready").is_ok()
    }

    /// The single value of an instant query, once it has one (bounded wait).
    pub fn value(&self, query: &str) -> f64 {
        instant_value(&self.addr, "/api/v1/query", query)
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// VictoriaMetrics (Debian's victoria-metrics) on a loopback port, storing in a temporary folder;
/// stopped on drop. Prometheus writes to it at [`VictoriaMetrics::write_url`], and it answers
/// Prometheus's query API below `/prometheus` as well as at its root.
pub struct VictoriaMetrics {
    child: Child,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl VictoriaMetrics {
    pub fn start() -> VictoriaMetrics {
        let dir = tempfile::tempdir().unwrap();
        let addr = free_loopback_addr();
        let child = Command::new("victoria-metrics")
            .arg(format!("-httpListenAddr={addr}"))
            .arg(format!("-storageDataPath={}", dir.path().display()))
            // Queries see samples as soon as they are written, not 30 s later.
            .arg("-search.latencyOffset=0s")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("victoria-metrics (Debian package; `cargo xtask test` installs it)");
        let vm = VictoriaMetrics {
            child,
            addr,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while client(&vm.addr).get("/health").is_err() {
            assert!(
                Instant::now() < deadline,
                "victoria-metrics did not answer /health within 30 s"
            );
            thread::sleep(Duration::from_millis(200));
        }
        vm
    }

    /// Where Prometheus's remote write sends its samples.
    pub fn write_url(&self) -> String {
        format!("http://{}/api/v1/write", self.addr)
    }

    /// The single value of an instant query, once it has one (bounded wait).
    pub fn value(&self, query: &str) -> f64 {
        instant_value(&self.addr, "/prometheus/api/v1/query", query)
    }
}

/// The single value of an instant query to the query API at `api` of `addr`, once it has one
/// (bounded wait).
fn instant_value(addr: &str, api: &str, query: &str) -> f64 {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let body = http_get(addr, &format!("{api}?query={}", encode(query)));
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if let Some(sample) = v["data"]["result"].as_array().and_then(|r| r.first()) {
            return sample["value"][1].as_str().unwrap().parse().unwrap();
        }
        assert!(Instant::now() < deadline, "no result for {query}: {body}");
        thread::sleep(Duration::from_millis(500));
    }
}

impl Drop for VictoriaMetrics {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The load balance (mean over max) of per-rank useful seconds, after checking that the
/// recording rules give exactly the same for job `id` once Prometheus has scraped the final
/// values and evaluated the rules on them.
pub fn assert_rules_load_balance(prometheus: &Prometheus, id: &str, useful: &[f64]) -> f64 {
    let direct = useful.iter().sum::<f64>()
        / useful.len() as f64
        / useful.iter().cloned().fold(0.0, f64::max);
    thread::sleep(Duration::from_secs(3));
    let from_rules = prometheus.value(&format!(
        "mpi_job:mpiburst_load_balance:ratio{{mpi_job=\"{id}\"}}"
    ));
    eprintln!(
        "load balance: {from_rules} from the recording rules, {direct} from all {} ranks directly",
        useful.len()
    );
    assert!(
        (from_rules - direct).abs() < 1e-9,
        "rules {from_rules} vs direct {direct}"
    );
    direct
}

/// A job-level or per-rank property of a span in `/api/jobs/{id}/properties`.
pub fn property<'a>(span: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    span["properties"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no property {name} in {span}"))
}

/// The value of property `name` over the job's life, in a `/properties` answer.
pub fn job_property_value(properties: &serde_json::Value, name: &str) -> f64 {
    let p = property(&properties["job"], name);
    p["outcome"]["value"]
        .as_f64()
        .unwrap_or_else(|| panic!("{name} has no value: {p}"))
}

/// The job's properties, once the daemon has evaluated them after the job ended (bounded wait).
pub fn ended_job_properties(addr: &str, id: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let detail = get_json(addr, &format!("/api/jobs/{}", encode(id)));
        if !detail["meta"]["ended_ns"].is_null() {
            // One more stats update evaluates the job with its final totals.
            thread::sleep(Duration::from_millis(1500));
            return get_json(addr, &format!("/api/jobs/{}/properties", encode(id)));
        }
        assert!(Instant::now() < deadline, "job {id} did not end: {detail}");
        thread::sleep(Duration::from_millis(300));
    }
}

/// Load balance and communication efficiency, as the POP methodology defines them, of the ranks'
/// own accounts (each rank's output with its `region_s` and `mpi_s`): what the daemon's must
/// equal.
pub fn own_pop_efficiencies(outputs: &[serde_json::Value]) -> (f64, f64) {
    let seconds = |output: &serde_json::Value, field: &str| {
        output[field]
            .as_f64()
            .unwrap_or_else(|| panic!("no {field} in {output}"))
    };
    let useful: Vec<f64> = outputs
        .iter()
        .map(|o| seconds(o, "region_s") - seconds(o, "mpi_s"))
        .collect();
    let max_useful = useful.iter().cloned().fold(0.0, f64::max);
    let elapsed = outputs
        .iter()
        .map(|o| seconds(o, "region_s"))
        .fold(0.0, f64::max);
    (
        useful.iter().sum::<f64>() / useful.len() as f64 / max_useful,
        max_useful / elapsed,
    )
}

/// A rank's useful time in seconds from its record in `/api/jobs/{id}` (the POP definition,
/// recomputed here as an oracle): its region of interest, from the return of MPI_Init to the
/// entry of MPI_Finalize, minus the time inside every other MPI call. Only for ended ranks that
/// went through both.
pub fn region_useful_seconds(rank: &serde_json::Value) -> f64 {
    let region = &rank["region"];
    let (start, end) = (
        region["init_return_ns"].as_u64(),
        region["finalize_entry_ns"].as_u64(),
    );
    let (Some(start), Some(end)) = (start, end) else {
        panic!("no complete region of interest in {rank}")
    };
    let mpi: u64 = rank["functions"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| !is_lifecycle_function(name))
        .map(|(_, f)| f["time_ns"].as_u64().unwrap())
        .sum();
    (end - start - mpi) as f64 / 1e9
}

/// Busy loops, one process per core, that compete with the ranks for the CPUs; killed (by pid)
/// when dropped.
pub struct CpuHogs(Vec<Child>);

impl CpuHogs {
    pub fn start() -> CpuHogs {
        let cores = thread::available_parallelism().map_or(1, |n| n.get());
        CpuHogs(
            (0..cores)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("start a busy loop (sh)")
                })
                .collect(),
        )
    }
}

impl Drop for CpuHogs {
    fn drop(&mut self) {
        for hog in &mut self.0 {
            let _ = hog.kill();
            let _ = hog.wait();
        }
    }
}
