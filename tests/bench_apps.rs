//! The slowdown the daemon causes on real MPI codes (`cargo xtask bench apps`): each code of the
//! set runs with 2 ranks under Open MPI and under MPICH, without the daemon, under the floor and
//! with the daemon, in interleaved rounds, and the bench prints per code the median times and
//! the slowdowns of the floor and of the daemon, and their medians over the set. It measures and
//! prints; it asserts nothing.
//!
//! The floor is what probing every MPI call costs before any work of the daemon: empty BPF
//! programs as a uprobe + uretprobe pair at every place the daemon probes, beside the daemon's
//! kernel tracepoints and counters. It is not a lower bound for a polling code: the daemon's
//! governor stops probing the returns of a polling function, and the floor probes every call in
//! full.
//!
//! The set: tests/mpi/halo (2-D halo exchange, MPI_Isend/MPI_Irecv/MPI_Waitall and a stencil
//! each iteration), tests/mpi/solver (conjugate gradients, two MPI_Allreduce per iteration),
//! tests/mpi/poll_loop (one rank polls a pending receive with MPI_Test while its peer computes:
//! the worst case for a per-call cost), and LAMMPS (`lmp` on the PATH, Debian package lammps)
//! on tests/mpi/melt.lammps under the MPI it is linked with; without it, or under the other MPI,
//! the bench says LAMMPS was skipped and why.
//!
//! Method. Each round runs every code once without the daemon, once under the floor and once
//! with the daemon. The floor is loaded by the bench itself (`Capture::load` with the default
//! settings, then `Capture::attach_floor`, as in `cargo xtask bench overhead`) on the C
//! libraries of both MPIs, at the probe places the daemon picks (capture/placement.rs); it has
//! no thread of its own. The daemon is the release binary as its systemd unit runs it
//! (`mpiburst run`, default settings) with its own loopback port and lock file in a temporary
//! directory; it is started once per round (when it answers, its probes are attached), runs
//! through every code of the round, and is stopped by its pid. Starting it once per round rather
//! than once per run keeps the bench to about ten minutes and leaves its periodic work (statistics
//! reads, analysis windows, job-end reports) running alongside the codes, as it does in
//! production. The timed runs have main loops of 3–4 s here (`BUNDLED`, `LAMMPS_STEPS`): the
//! daemon's work at a job's start (identifying its ranks, resolving their call sites), which on
//! a node whose cores the ranks fill is taken from them, is then a small part of the run, as in
//! a real job; in a main loop of 0.5 s it made up most of the slowdown. Each setup first runs
//! every code once untimed, with shorter default arguments: a daemon looks at a file the first
//! time a process maps it (the held first open of an MPI library, the check of every mapped file
//! for PMPI interposers, tens of ms for Open MPI's components), which a daemon running on a node
//! pays once after its start and a daemon started per round would charge to the first code of
//! every round; the other setups run it too, so all find the page cache alike. The order of the
//! three setups rotates from round to round, so that over a multiple of 3 rounds (6 by default)
//! each setup runs first, second and last equally often and drift in the machine's load hits
//! all alike.
//!
//! Two times per run: the code's own timing of its main loop ("timed T s" from the bundled
//! programs, "Loop time of T" from LAMMPS), and the whole job's wall time from the launcher's
//! start to its exit, which also holds MPI start-up, where the daemon stops each process at its
//! open of the MPI library until the library's probes are attached. Per code the medians over
//! the rounds and the slowdowns under the floor and with the daemon (median / median without
//! − 1), with the least and the most slowdown of one round's pair of runs without and with the
//! daemon (how far the machine's noise reaches); last the medians of the codes' slowdowns, for
//! both times. The project's target is a median slowdown of at most 1 % with the daemon; the
//! floor's slowdown shows how much of it the probe traps themselves cost. A polling loop ends
//! when the peer's message arrives, so a slower MPI_Test shows in fewer polls rather than in its
//! wall time: for poll_loop the bench also prints the calls the program counted and the time
//! per call in each setup.
//!
//! The MPI calls the daemon saw per code (`mpiburst_job_mpi_calls_total` of the jobs whose
//! executable is the code's, read from its /metrics once they ended) show that the probes were
//! active. From the same /metrics, the daemon's estimate of what profiling cost each code
//! (`mpiburst_job_profiling_cost_seconds` over `mpiburst_job_rank_runtime_seconds{stat="sum"}`,
//! summed over the code's runs, and the part of it that was the daemon's own CPU,
//! `mpiburst_job_profiling_daemon_seconds`) is printed beside the main loop's measured slowdown,
//! with whether it is within 25 % of it or within 0.5 points of run time, whichever is larger
//! (the estimate's target). The rounds of one code spread by several points on a shared machine,
//! so the bench also prints a 90 % interval of the measured slowdown (percentiles over resamples
//! of the rounds, a round's runs kept together) and whether the estimate meets its target at all
//! of the interval's slowdowns, at none, or at some: then the rounds cannot tell, and more rounds
//! (ROUNDS) narrow the interval. Last, what the daemon measured a probe hit at when it started,
//! among work and back to back (`mpiburst_probe_hit_cost_seconds`, median of the rounds). Another
//! mpiburst daemon on the node (or another profiler's uprobes) probes the runs without this
//! bench's daemon and under the floor too: the rounds in which another process held user-space
//! probes are counted and printed.
//!
//! Usage: bench_apps [ROUNDS=6], with MPIBURST_BIN and MPIBURST_MPI_PROGRAMS as for the
//! integration tests (`cargo xtask bench apps` sets them); as root.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Child, Command},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use mpiburst::{
    analysis::synthetic::SplitMix64,
    capture::{AttachPoint, Capture},
    config::Config,
    discovery::{self, Binding},
};
use mpiburst_tests::{
    daemon_binary, free_loopback_addr, http_get, kill_daemon_left_running, program, require_root,
    spawn_daemon, terminate_daemon, Mpi,
};

const RANKS: u32 = 2;
const DEFAULT_ROUNDS: usize = 6;
/// The bundled programs of the set, and the arguments of their timed runs: main loops of 3–4 s
/// here, in which the daemon's work at a job's start (identifying its ranks, resolving their
/// call sites) weighs little, as in a real job; their untimed runs take their defaults
/// (0.3–0.8 s).
const BUNDLED: [(&str, &str); 3] = [
    ("halo", "20000"),
    ("solver", "16000"),
    ("poll_loop", "1000"),
];
/// LAMMPS's steps in a timed run (the input's default, 1000, in an untimed one).
const LAMMPS_STEPS: &str = "5000";
/// How many resamples of the rounds give the interval of a measured slowdown.
const RESAMPLES: usize = 2000;
/// How long the daemon may take to see every job of a round end.
const JOBS_END_LIMIT: Duration = Duration::from_secs(30);

fn mpi_name(mpi: Mpi) -> &'static str {
    match mpi {
        Mpi::OpenMpi => "Open MPI",
        Mpi::Mpich => "MPICH",
    }
}

/// One code of the set under one MPI implementation.
struct Code {
    name: &'static str,
    mpi: Mpi,
    /// Canonical, as the daemon names a job's executable.
    executable: PathBuf,
    args: Vec<String>,
    /// Added to `args` in a timed run.
    timed_args: Vec<String>,
}

impl Code {
    fn label(&self) -> String {
        format!("{} ({})", self.name, mpi_name(self.mpi))
    }

    /// Runs the code once in `dir`, `timed` or as the shorter untimed run.
    fn run(&self, dir: &Path, timed: bool) -> Run {
        let mut cmd = self.mpi.launcher(RANKS);
        cmd.arg(&self.executable).args(&self.args).current_dir(dir);
        if timed {
            cmd.args(&self.timed_args);
        }
        let started = Instant::now();
        let out = cmd
            .output()
            .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
        let job_s = started.elapsed().as_secs_f64();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{} failed ({}):\n{stdout}\n{}",
            self.label(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let timed_s = timed_seconds(&stdout)
            .unwrap_or_else(|| panic!("{} printed no timing:\n{stdout}", self.label()));
        Run {
            timed_s,
            job_s,
            polls: polls(&stdout),
        }
    }
}

/// One run of a code.
struct Run {
    /// The code's own timing of its main loop.
    timed_s: f64,
    /// The job's wall time, from the launcher's start to its exit.
    job_s: f64,
    /// The MPI_Test calls the code counted itself, if it says.
    polls: Option<f64>,
}

/// A code's own timing of its main loop: "…, timed T s…" from the bundled programs, "Loop time
/// of T on …" from LAMMPS.
fn timed_seconds(stdout: &str) -> Option<f64> {
    stdout.lines().find_map(|line| {
        let (_, rest) = line
            .split_once(", timed ")
            .or_else(|| line.split_once("Loop time of "))?;
        rest.split(' ').next()?.parse().ok()
    })
}

/// The MPI_Test calls a polling code counted: "…, P MPI_Test calls" (tests/mpi/poll_loop).
fn polls(stdout: &str) -> Option<f64> {
    stdout.lines().find_map(|line| {
        let (head, _) = line.split_once(" MPI_Test calls")?;
        head.rsplit(' ').next()?.parse().ok()
    })
}

/// `lmp` on the PATH and the MPI implementation it is linked with, or why LAMMPS cannot run.
fn lammps() -> Result<(PathBuf, Mpi), String> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let lmp = std::env::split_paths(&path)
        .map(|dir| dir.join("lmp"))
        .find(|p| p.is_file())
        .ok_or("no `lmp` on the PATH: install the Debian package lammps (`cargo xtask bench apps` does, as root)")?;
    let lmp = lmp
        .canonicalize()
        .map_err(|e| format!("{}: {e}", lmp.display()))?;
    let deps = Command::new("ldd")
        .arg(&lmp)
        .output()
        .map_err(|e| format!("cannot run ldd on {}: {e}", lmp.display()))?;
    let deps = String::from_utf8_lossy(&deps.stdout);
    let mpi = if deps.contains("libmpi.so") {
        Mpi::OpenMpi
    } else if deps.contains("libmpich") {
        Mpi::Mpich
    } else {
        return Err(format!(
            "{} is linked with neither Open MPI's libmpi nor MPICH's libmpich",
            lmp.display()
        ));
    };
    Ok((lmp, mpi))
}

/// The codes of the set, and a line for each that cannot run here.
fn the_set() -> (Vec<Code>, Vec<String>) {
    let melt = Path::new(env!("CARGO_MANIFEST_DIR")).join("mpi/melt.lammps");
    let lammps = lammps();
    let (mut codes, mut skipped) = (Vec::new(), Vec::new());
    for mpi in Mpi::ALL {
        for (name, timed) in BUNDLED {
            codes.push(Code {
                name,
                mpi,
                executable: program(name, mpi).canonicalize().expect("a built program"),
                args: Vec::new(),
                timed_args: vec![timed.to_string()],
            });
        }
        match &lammps {
            Ok((lmp, linked)) if *linked == mpi => codes.push(Code {
                name: "LAMMPS melt",
                mpi,
                executable: lmp.clone(),
                args: ["-in", &melt.display().to_string(), "-log", "none"]
                    .map(String::from)
                    .to_vec(),
                timed_args: ["-var", "steps", LAMMPS_STEPS].map(String::from).to_vec(),
            }),
            Ok((lmp, linked)) => skipped.push(format!(
                "LAMMPS ({}): skipped: {} is linked with {} only",
                mpi_name(mpi),
                lmp.display(),
                mpi_name(*linked)
            )),
            Err(reason) => skipped.push(format!("LAMMPS ({}): skipped: {reason}", mpi_name(mpi))),
        }
    }
    (codes, skipped)
}

/// What runs beside the codes in one part of a round.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Setup {
    Without,
    Floor,
    With,
}

impl Setup {
    const ALL: [Setup; 3] = [Setup::Without, Setup::Floor, Setup::With];

    fn describe(self) -> &'static str {
        match self {
            Setup::Without => "without the daemon",
            Setup::Floor => "under the floor (empty uprobe + uretprobe programs)",
            Setup::With => "with the daemon",
        }
    }
}

/// Where the floor's programs go: the places the daemon probes in the C libraries of the
/// installed MPIs, by library. A library whose places cannot be read is left out, as the daemon
/// leaves it out, and said.
fn floor_points() -> Vec<(PathBuf, Vec<AttachPoint>)> {
    let functions = Config::default().mpi.function_names();
    let libraries = discovery::discover_libraries(&[]).expect("find the MPI libraries");
    libraries
        .iter()
        .filter(|l| l.binding == Binding::C)
        .filter_map(
            |library| match discovery::probe_points(library, &functions) {
                Ok(found) => Some((
                    library.path.clone(),
                    found.points.iter().map(AttachPoint::floor).collect(),
                )),
                Err(e) => {
                    eprintln!(
                        "bench apps: {} left out of the floor: {e}",
                        library.path.display()
                    );
                    None
                }
            },
        )
        .collect()
}

/// The floor: its empty programs at `points`, with the daemon's kernel tracepoints and
/// counters (the default capture settings). Detached when dropped.
fn load_floor(points: &[(PathBuf, Vec<AttachPoint>)]) -> Capture {
    let mut capture = Capture::load(&Config::default().capture).expect("load the BPF programs");
    for (library, points) in points {
        capture
            .attach_floor(library, points)
            .expect("attach the floor programs");
    }
    capture
}

/// The daemon binary as a service runs it, with its own port and lock file; stopped by pid.
struct Profiler {
    child: Child,
    log: Arc<Mutex<Vec<String>>>,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Profiler {
    fn start() -> Profiler {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let config = dir.path().join("mpiburst.toml");
        let lock = dir.path().join("mpiburst.lock");
        std::fs::write(
            &config,
            format!("[daemon]\nlock_file = {:?}\n", lock.display().to_string()),
        )
        .expect("write the daemon's config");
        let addr = free_loopback_addr();
        let mut command = Command::new(daemon_binary());
        command
            .args(["run", "--listen", &addr, "--config"])
            .arg(&config);
        let (child, log) = spawn_daemon(command);
        Profiler {
            child,
            log,
            addr,
            _dir: dir,
        }
    }

    /// What the daemon measured a probe hit at when it started, in µs, by `probe` label.
    fn hit_costs(&self) -> Vec<(String, f64)> {
        let family = "mpiburst_probe_hit_cost_seconds{";
        http_get(&self.addr, "/metrics")
            .lines()
            .filter(|l| l.starts_with(family))
            .filter_map(|l| {
                let probe = label(l, "probe")?.to_string();
                Some((probe, l.rsplit(' ').next()?.parse::<f64>().ok()? * 1e6))
            })
            .collect()
    }

    /// The calls per MPI function of each code's jobs, once the daemon has seen all `runs` jobs
    /// of the codes end (their final counts).
    fn calls_when_ended(&self, codes: &[Code], runs: usize) -> BTreeMap<PathBuf, SeenCalls> {
        let deadline = Instant::now() + JOBS_END_LIMIT;
        loop {
            let mut seen = seen_calls(&http_get(&self.addr, "/metrics"));
            seen.retain(|exe, _| codes.iter().any(|c| &c.executable == exe));
            let jobs: usize = seen.values().map(|s| s.jobs).sum();
            let running: usize = seen.values().map(|s| s.running).sum();
            if (jobs >= runs && running == 0) || Instant::now() > deadline {
                if running > 0 || jobs < runs {
                    eprintln!("bench apps: the daemon saw {jobs} of {runs} jobs, {running} still running, after {JOBS_END_LIMIT:?}");
                }
                return seen;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn stop(mut self) {
        terminate_daemon(&mut self.child, &self.log);
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        let log = &self.log;
        kill_daemon_left_running(&mut self.child, || log.lock().unwrap().join("\n"));
    }
}

/// What the daemon's /metrics says of the jobs of one executable.
#[derive(Default)]
struct SeenCalls {
    jobs: usize,
    running: usize,
    calls: BTreeMap<String, f64>,
    /// The daemon's estimate of the time the ranks lost to profiling, the part of it that was the
    /// daemon's own CPU, and the ranks' run time (regions of interest), summed over the jobs.
    cost_s: f64,
    daemon_s: f64,
    runtime_s: f64,
}

impl SeenCalls {
    fn add(&mut self, other: SeenCalls) {
        self.jobs += other.jobs;
        self.running += other.running;
        for (function, calls) in other.calls {
            *self.calls.entry(function).or_default() += calls;
        }
        self.cost_s += other.cost_s;
        self.daemon_s += other.daemon_s;
        self.runtime_s += other.runtime_s;
    }

    /// The daemon's estimate of what profiling cost, and the part of it that was the daemon's
    /// CPU, as % of the ranks' run time.
    fn cost_and_daemon_percent(&self) -> Option<(f64, f64)> {
        (self.runtime_s > 0.0).then(|| {
            (
                100.0 * self.cost_s / self.runtime_s,
                100.0 * self.daemon_s / self.runtime_s,
            )
        })
    }

    /// "N per run (R/s per rank), most FUNCTION M" for runs whose main loop took `loop_s`.
    fn describe(&self, loop_s: f64) -> String {
        let runs = self.jobs.max(1) as f64;
        let per_run = self.calls.values().sum::<f64>() / runs;
        let top = self.calls.iter().max_by(|a, b| a.1.total_cmp(b.1));
        format!(
            "{per_run:.0} per run ({:.0}/s per rank){}",
            per_run / f64::from(RANKS) / loop_s,
            top.map_or(String::new(), |(f, c)| format!(
                ", most {f} {:.0}",
                c / runs
            ))
        )
    }
}

/// The value of label `key` in an exposition line.
fn label<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let labels = line.split_once('{')?.1.rsplit_once('}')?.0;
    labels
        .split("\",")
        .find_map(|pair| pair.strip_prefix(key)?.strip_prefix("=\""))
        .map(|value| value.trim_end_matches('"'))
}

/// Per executable, its jobs, how many still run and their MPI calls, from one exposition.
fn seen_calls(exposition: &str) -> BTreeMap<PathBuf, SeenCalls> {
    let samples = |family: &str| {
        let prefix = format!("{family}{{");
        exposition
            .lines()
            .filter(move |l| l.starts_with(&prefix))
            .filter_map(|l| Some((l, l.rsplit(' ').next()?.parse::<f64>().ok()?)))
            .collect::<Vec<_>>()
    };
    let executable_of: BTreeMap<&str, PathBuf> = samples("mpiburst_job_info")
        .into_iter()
        .filter_map(|(l, _)| Some((label(l, "mpi_job")?, label(l, "executable")?.into())))
        .collect();
    let mut seen: BTreeMap<PathBuf, SeenCalls> = BTreeMap::new();
    for exe in executable_of.values() {
        seen.entry(exe.clone()).or_default().jobs += 1;
    }
    let of_job = |l: &str| label(l, "mpi_job").and_then(|job| executable_of.get(job));
    for (line, value) in samples("mpiburst_job_running") {
        if let Some(exe) = of_job(line) {
            seen.get_mut(exe).unwrap().running += usize::from(value > 0.0);
        }
    }
    for (line, value) in samples("mpiburst_job_mpi_calls_total") {
        if let (Some(exe), Some(function)) = (of_job(line), label(line, "function")) {
            *seen
                .get_mut(exe)
                .unwrap()
                .calls
                .entry(function.to_string())
                .or_default() += value;
        }
    }
    for (line, value) in samples("mpiburst_job_profiling_cost_seconds") {
        if let Some(exe) = of_job(line) {
            seen.get_mut(exe).unwrap().cost_s += value;
        }
    }
    for (line, value) in samples("mpiburst_job_profiling_daemon_seconds") {
        if let Some(exe) = of_job(line) {
            seen.get_mut(exe).unwrap().daemon_s += value;
        }
    }
    for (line, value) in samples("mpiburst_job_rank_runtime_seconds") {
        if let (Some(exe), Some("sum")) = (of_job(line), label(line, "stat")) {
            seen.get_mut(exe).unwrap().runtime_s += value;
        }
    }
    seen
}

/// Processes other than `own` that hold user-space probes (a BPF link of type uprobe_multi or
/// uretprobe_multi, as the daemon attaches them): another mpiburst daemon, in its own binary or
/// inside a test or benchmark, or another profiler. Probes on the MPI library slow down this
/// bench's runs without its daemon too. Each as "PID (COMMAND)".
fn other_uprobe_holders(own: Option<u32>) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| Some(pid) != own && holds_uprobes(pid))
        .map(|pid| {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            format!("{pid} ({})", comm.trim())
        })
        .collect()
}

fn holds_uprobes(pid: u32) -> bool {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|fd| {
        std::fs::read_link(fd.path())
            .is_ok_and(|target| target.as_os_str() == "anon_inode:bpf_link")
            && std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .is_ok_and(|info| {
                info.lines()
                    .any(|l| l.starts_with("link_type:") && l.contains("uprobe_multi"))
            })
    })
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

fn slowdown_percent(without: f64, with: f64) -> f64 {
    100.0 * (with / without - 1.0)
}

/// Whether an estimated slowdown meets its target against a measured one: within 25 % of it, or
/// within 0.5 points of run time, whichever is larger (both in %).
fn estimate_within(estimate: f64, measured: f64) -> bool {
    (estimate - measured).abs() <= (0.25 * measured.abs()).max(0.5)
}

/// Whether an estimate meets its target at every measured slowdown from `low` to `high`, at none
/// or at some. The slowdowns it meets form one interval around the estimate, so the ends of
/// `low..high` and the side the estimate lies on decide.
fn estimate_within_interval(estimate: f64, (low, high): (f64, f64)) -> &'static str {
    let (at_low, at_high) = (
        estimate_within(estimate, low),
        estimate_within(estimate, high),
    );
    if at_low && at_high {
        "all"
    } else if (estimate < low && !at_low) || (estimate > high && !at_high) {
        "none"
    } else {
        "some"
    }
}

/// A code's runs in each setup.
#[derive(Default)]
struct Runs {
    without: Vec<Run>,
    floor: Vec<Run>,
    with: Vec<Run>,
}

/// Median times (s) of a code in each setup.
struct Medians {
    without: f64,
    floor: f64,
    with: f64,
}

impl Medians {
    /// Slowdown % under the floor and with the daemon.
    fn slowdowns(&self) -> (f64, f64) {
        (
            slowdown_percent(self.without, self.floor),
            slowdown_percent(self.without, self.with),
        )
    }
}

impl std::fmt::Display for Medians {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (floor, daemon) = self.slowdowns();
        write!(
            f,
            "{:>7.3} {:>7.3} {:>7.3} {floor:>+6.1}% {daemon:>+6.1}%",
            self.without, self.floor, self.with
        )
    }
}

impl Runs {
    fn of(&mut self, setup: Setup) -> &mut Vec<Run> {
        match setup {
            Setup::Without => &mut self.without,
            Setup::Floor => &mut self.floor,
            Setup::With => &mut self.with,
        }
    }

    /// The median of the time `pick` takes from a run, in each setup.
    fn medians(&self, pick: fn(&Run) -> f64) -> Medians {
        let of = |runs: &[Run]| median(&runs.iter().map(pick).collect::<Vec<_>>());
        Medians {
            without: of(&self.without),
            floor: of(&self.floor),
            with: of(&self.with),
        }
    }

    /// The least and the most slowdown % of the time `pick` takes from a run, each round's run
    /// with the daemon against the same round's run without: how far the noise of the machine
    /// reaches.
    fn round_slowdowns(&self, pick: fn(&Run) -> f64) -> (f64, f64) {
        self.without
            .iter()
            .zip(&self.with)
            .map(|(without, with)| slowdown_percent(pick(without), pick(with)))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(least, most), s| {
                (least.min(s), most.max(s))
            })
    }

    /// A 90 % interval of the slowdown with the daemon of the time `pick` takes from a run
    /// (median with / median without − 1): its 5th and 95th percentiles over RESAMPLES resamples
    /// of the rounds, drawn with replacement, a round's runs kept together. How far the rounds'
    /// noise leaves the median slowdown in doubt.
    fn slowdown_interval(&self, pick: fn(&Run) -> f64) -> (f64, f64) {
        let rounds = self.without.len().min(self.with.len());
        let mut random = SplitMix64(0x5107_d0e5);
        let mut slowdowns: Vec<f64> = (0..RESAMPLES)
            .map(|_| {
                let drawn: Vec<usize> = (0..rounds)
                    .map(|_| (random.next_u64() % rounds as u64) as usize)
                    .collect();
                let median_of = |runs: &[Run]| {
                    median(&drawn.iter().map(|&i| pick(&runs[i])).collect::<Vec<_>>())
                };
                slowdown_percent(median_of(&self.without), median_of(&self.with))
            })
            .collect();
        slowdowns.sort_by(f64::total_cmp);
        (
            slowdowns[RESAMPLES * 5 / 100],
            slowdowns[RESAMPLES * 95 / 100 - 1],
        )
    }

    /// For a code that counts its MPI_Test calls: the calls per run and the main loop's time per
    /// call in each setup (medians), which shows a per-call cost that the wall
    /// time of a polling loop can hide (it ends when the peer's message arrives).
    fn polling(&self) -> Option<String> {
        let per_call_ns = |runs: &[Run]| -> Option<(f64, f64)> {
            let polls: Vec<f64> = runs.iter().map(|r| r.polls).collect::<Option<_>>()?;
            let ns: Vec<f64> = runs
                .iter()
                .zip(&polls)
                .map(|(r, p)| 1e9 * r.timed_s / p)
                .collect();
            Some((median(&polls), median(&ns)))
        };
        let (polls_without, ns_without) = per_call_ns(&self.without)?;
        let (polls_floor, ns_floor) = per_call_ns(&self.floor)?;
        let (polls_with, ns_with) = per_call_ns(&self.with)?;
        Some(format!(
            "MPI_Test calls per run as the program counted them, median {polls_without:.0} without the daemon, {polls_floor:.0} under the floor and {polls_with:.0} with the daemon: one poll every {ns_without:.0} ns without, {ns_floor:.0} ns under the floor, {ns_with:.0} ns with"
        ))
    }
}

fn main() {
    require_root();
    let rounds: usize = match std::env::args().nth(1) {
        Some(n) => n
            .parse()
            .ok()
            .filter(|&n| n > 0)
            .expect("usage: bench_apps [ROUNDS >= 1]"),
        None => DEFAULT_ROUNDS,
    };
    let (codes, skipped) = the_set();
    let floor_places = floor_points();
    if !rounds.is_multiple_of(Setup::ALL.len()) {
        eprintln!("bench apps: {rounds} rounds is not a multiple of 3: the three setups do not each run first, second and last equally often");
    }
    for line in &skipped {
        eprintln!("bench apps: {line}");
    }
    let work_dir = tempfile::tempdir().expect("a temporary directory");
    let mut runs: Vec<Runs> = codes.iter().map(|_| Runs::default()).collect();
    let mut seen: BTreeMap<PathBuf, SeenCalls> = BTreeMap::new();
    // Per `probe` label, what the daemon measured a hit at in each round, in µs.
    let mut hit_costs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut disturbed_rounds = 0;
    let started = Instant::now();
    for round in 0..rounds {
        let mut others = Vec::new();
        for k in 0..Setup::ALL.len() {
            let setup = Setup::ALL[(round + k) % Setup::ALL.len()];
            eprintln!(
                "bench apps: round {}/{rounds}, {}",
                round + 1,
                setup.describe()
            );
            let floor = (setup == Setup::Floor).then(|| load_floor(&floor_places));
            let profiler = (setup == Setup::With).then(Profiler::start);
            let own = match (&profiler, &floor) {
                (Some(p), _) => Some(p.child.id()),
                (_, Some(_)) => Some(std::process::id()),
                _ => None,
            };
            others.extend(other_uprobe_holders(own));
            for code in &codes {
                code.run(work_dir.path(), false);
            }
            for (code, runs) in codes.iter().zip(&mut runs) {
                let run = code.run(work_dir.path(), true);
                eprintln!(
                    "  {:<24} timed {:>7.3} s, job {:>7.3} s",
                    code.label(),
                    run.timed_s,
                    run.job_s
                );
                runs.of(setup).push(run);
            }
            others.extend(other_uprobe_holders(own));
            if let Some(profiler) = profiler {
                for (exe, calls) in profiler.calls_when_ended(&codes, 2 * codes.len()) {
                    seen.entry(exe).or_default().add(calls);
                }
                for (probe, us) in profiler.hit_costs() {
                    hit_costs.entry(probe).or_default().push(us);
                }
                profiler.stop();
            }
        }
        others.sort_unstable();
        others.dedup();
        if !others.is_empty() {
            disturbed_rounds += 1;
            eprintln!("bench apps: other processes held user-space probes during round {}: {}; they may have probed the runs without this bench's daemon and under the floor too", round + 1, others.join(", "));
        }
    }

    println!(
        "bench apps: {} codes, {RANKS} ranks each, {rounds} rounds rotating without the daemon / under the floor / with the daemon, {:.0} s",
        codes.len(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "{:<24} {:>51}  {:>39}  MPI calls the daemon saw (its /metrics)",
        "", "main loop: median s, slowdown, daemon's per round", "whole job: median s, slowdown"
    );
    println!(
        "{:<24} {:>7} {:>7} {:>7} {:>7} {:>7} {:>11}  {:>7} {:>7} {:>7} {:>7} {:>7}",
        "code",
        "without",
        "floor",
        "with",
        "floor%",
        "daemon%",
        "rounds",
        "without",
        "floor",
        "with",
        "floor%",
        "daemon%"
    );
    let (mut loop_slowdowns, mut job_slowdowns) = (Vec::new(), Vec::new());
    for (code, runs) in codes.iter().zip(&runs) {
        let looped = runs.medians(|r| r.timed_s);
        let job = runs.medians(|r| r.job_s);
        let (least, most) = runs.round_slowdowns(|r| r.timed_s);
        let rounds = format!("{least:+.0}..{most:+.0}%");
        loop_slowdowns.push(looped.slowdowns());
        job_slowdowns.push(job.slowdowns());
        let calls = seen
            .get(&code.executable)
            .map_or("none".to_string(), |s| s.describe(looped.without));
        println!("{:<24} {looped} {rounds:>11}  {job}  {calls}", code.label());
    }
    println!(
        "what profiling cost, the daemon's estimate (docs/metrics.md) beside the main loop's measured slowdown; it meets its target when within 25 % of the slowdown or within 0.5 points of run time, whichever is larger (within: at the measured median); 90 % interval: of the measured slowdown, over {RESAMPLES} resamples of the rounds (a round's runs kept together); over it: whether the estimate meets its target at all, none or only some of the interval's slowdowns (some: the rounds' noise cannot tell); daemon%: the part of the estimate that is the daemon's CPU taken from the ranks:"
    );
    println!(
        "{:<24} {:>9} {:>9} {:>17} {:>6} {:>7} {:>8}",
        "code", "estimate%", "measured%", "90 % interval", "within", "over it", "daemon%"
    );
    for (code, runs) in codes.iter().zip(&runs) {
        let measured = runs.medians(|r| r.timed_s).slowdowns().1;
        let interval = runs.slowdown_interval(|r| r.timed_s);
        let shown = format!("{:+.2}..{:+.2}%", interval.0, interval.1);
        match seen
            .get(&code.executable)
            .and_then(SeenCalls::cost_and_daemon_percent)
        {
            Some((estimate, daemon)) => println!(
                "{:<24} {estimate:>+8.2}% {measured:>+8.2}% {shown:>17} {:>6} {:>7} {daemon:>7.2}%",
                code.label(),
                if estimate_within(estimate, measured) {
                    "yes"
                } else {
                    "no"
                },
                estimate_within_interval(estimate, interval),
            ),
            None => println!(
                "{:<24} {:>9} {measured:>+8.2}% {shown:>17} {:>6}",
                code.label(),
                "none",
                "-"
            ),
        }
    }
    let hits: Vec<String> = hit_costs
        .iter()
        .map(|(probe, us)| format!("{probe} {:.2} µs", median(us)))
        .collect();
    println!(
        "what a probe hit cost as the daemon measured it at each start (mpiburst_probe_hit_cost_seconds, median of the rounds): {}; the estimate counts each call probed in full at the cost back to back (full), scaled by how much longer the code's timed probe runs took than those back to back (mpiburst_probe_program_run_seconds)",
        hits.join(", ")
    );
    for (code, runs) in codes.iter().zip(&runs) {
        if let Some(note) = runs.polling() {
            println!("{}: {note}", code.label());
        }
    }
    for line in &skipped {
        println!("{line}");
    }
    let median_of = |slowdowns: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| {
        median(&slowdowns.iter().map(pick).collect::<Vec<_>>())
    };
    println!(
        "median slowdown over the {} codes: main loop {:+.1} % with the daemon, {:+.1} % under the floor; whole job {:+.1} % with the daemon, {:+.1} % under the floor (target: at most 1 % with the daemon)",
        codes.len(),
        median_of(&loop_slowdowns, |s| s.1),
        median_of(&loop_slowdowns, |s| s.0),
        median_of(&job_slowdowns, |s| s.1),
        median_of(&job_slowdowns, |s| s.0),
    );
    println!(
        "rounds in which another process on the node held user-space probes (another mpiburst daemon or profiler, which may probe the runs without the daemon and under the floor too): {disturbed_rounds} of {rounds}"
    );
}
