//! `cargo xtask`: set-up, build, run, demo, test and benchmarks for mpiburst. Every command
//! installs what it needs (Debian packages, the pinned nightly's rust-src, bpf-linker), and does
//! nothing when it is already there.

use std::{
    env,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::{value_parser, Args, Parser, Subcommand};

mod fuzz;
mod install;

/// Pinned with the nightly in profiler-ebpf/rust-toolchain.toml: newer bpf-linker releases need
/// a newer LLVM than that toolchain has.
const BPF_LINKER_VERSION: &str = "0.10.4";
/// Debian packages: MPI implementations and compilers for the bundled MPI programs, the
/// Prometheus server and promtool for the metric tests, VictoriaMetrics for the remote-write
/// test, perf to tell whether there is a PMU, Slurm with its accounting for the Slurm tests.
const APT_PACKAGES: &[&str] = &[
    "openmpi-bin",
    "libopenmpi-dev",
    "mpich",
    "libmpich-dev",
    "gfortran",
    "gcc",
    "g++",
    "prometheus",
    "victoria-metrics",
    "binutils",
    "curl",
    "linux-perf",
    "slurmctld",
    "slurmd",
    "slurm-client",
    "munge",
    // Accounting for the epilog's test: slurmdbd and its database.
    "slurmdbd",
    "mariadb-server",
    // The hung file system of tests/hung_fs.rs: a FUSE server in Python.
    "python3-fusepy",
    "fuse3",
];

/// `cargo xtask`'s command line.
#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "Set-up, build, run, demo, test and benchmarks for mpiburst"
)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand, Debug, PartialEq)]
enum Task {
    /// Build the BPF object and the daemon (release by default)
    Build {
        #[command(flatten)]
        profile: ProfileArg,
    },
    /// Build, then run `mpiburst ARGS` (as root)
    Run {
        #[command(flatten)]
        profile: ProfileArg,
        /// The daemon's arguments, after `--`: `cargo xtask run -- record -o job.jsonl`
        #[arg(last = true, value_name = "ARGS")]
        args: Vec<String>,
    },
    /// Run the bundled MPI demo under the daemon and print its reports
    Demo {
        /// MPI ranks of the demo, 2 to 4
        #[arg(long, value_name = "N", default_value_t = 2, value_parser = value_parser!(u32).range(2..=4))]
        ranks: u32,
        /// How long the demo runs, in seconds
        #[arg(long, value_name = "S", default_value_t = 20)]
        seconds: u32,
    },
    /// Run every test binary, each fuzz target for a few seconds, and the lint gate
    ///
    /// Runs every test binary (unit tests, static checks, and as root the BPF + MPI tests;
    /// without root those are reported skipped), each even when another fails, and each fuzz
    /// target for a few seconds. The whole suite is gated by `cargo fmt --check`, clippy and
    /// rustdoc with warnings as errors; a run with cargo test arguments runs only the tests they
    /// choose, without the fuzz targets and the lint gate.
    Test {
        /// Run the test binaries while one busy loop per online CPU competes for every core
        #[arg(long)]
        under_load: bool,
        /// Arguments of `cargo test`, after `--`; after a second `--`, arguments of the test
        /// binaries
        #[arg(last = true, value_name = "CARGO TEST ARGS [-- TEST BINARY ARGS]")]
        args: Vec<String>,
    },
    /// Measure probe cost, clustering speed, the daemon's own cost, or application slowdown
    Bench {
        #[command(subcommand)]
        bench: Bench,
    },
    /// Run the cargo-fuzz targets of fuzz/ with the pinned nightly; installs cargo-fuzz
    Fuzz {
        /// Targets to run, one after another (all of them when none is named)
        #[arg(value_name = "TARGET")]
        targets: Vec<String>,
        /// How long each target runs
        #[arg(long, value_name = "N", default_value_t = fuzz::DEFAULT_SECONDS)]
        seconds: u32,
    },
    /// Build the release daemon and install it with its systemd unit, sysusers.d entry, default
    /// config and docs/deploy.md; honours PREFIX (/usr/local) and DESTDIR
    Install,
    /// Only install the system packages and toolchain pieces
    InstallDeps,
    /// Internal: spin on one CPU until killed (one of the busy loops of `test --under-load`)
    BusyLoop,
}

#[derive(Subcommand, Debug, PartialEq)]
enum Bench {
    /// Probe cost per call vs a bare uprobe, for one function of each probe class on both MPIs,
    /// each BPF program's run time per call, the system call tax on processes the daemon does not
    /// track, and the demo's slowdown
    Overhead,
    /// Clustering speed
    Cluster,
    /// The job-wide analysis of one 30 s window of a job of up to 2,000 nodes × 64 ranks: bytes
    /// per node on the wire, the aggregator's decode and merge CPU and memory; then, as root, the
    /// series per node and job and a real Prometheus's rule evaluation time over 2,000 nodes
    Jobwide,
    /// The daemon under a burst storm: CPU per 10⁵ bursts/s, losses, peak memory, /metrics
    /// latency while windows are clustered
    Daemon,
    /// The slowdown of real MPI codes (halo exchange, CG solver, MPI_Test polling, LAMMPS)
    /// without the daemon, under the floor (empty probes where it probes) and with it, both MPIs
    Apps {
        /// Rotating rounds (6 by default)
        #[arg(value_parser = value_parser!(u32).range(1..))]
        rounds: Option<u32>,
    },
}

/// `--debug` of `build` and `run`.
#[derive(Args, Debug, PartialEq)]
struct ProfileArg {
    /// Build the debug profile instead of the release one
    #[arg(long)]
    debug: bool,
}

impl ProfileArg {
    fn profile(&self) -> Profile {
        if self.debug {
            Profile::Debug
        } else {
            Profile::Release
        }
    }
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Build { profile } => build(profile.profile()).map(|_| ()),
        Task::Run { profile, args } => run(profile.profile(), &args),
        Task::Demo { ranks, seconds } => demo(ranks, seconds),
        Task::Test { under_load, args } => match test(under_load, &args)? {
            // The summary and cargo's result lines are already out; nothing may follow them.
            Outcome::Passed => Ok(()),
            Outcome::Failed => std::process::exit(1),
        },
        Task::BusyLoop => loop {
            std::hint::spin_loop();
        },
        Task::Bench { bench } => match bench {
            Bench::Overhead => bench_overhead(),
            Bench::Cluster => status(&mut example("bench_cluster")),
            Bench::Jobwide => bench_jobwide(),
            Bench::Daemon => bench_daemon(),
            Bench::Apps { rounds } => bench_apps(rounds),
        },
        Task::Fuzz { targets, seconds } => fuzz::fuzz(&targets, seconds),
        Task::Install => install::install(&build(Profile::Release)?),
        Task::InstallDeps => install_deps(),
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[derive(Clone, Copy)]
enum Profile {
    Debug,
    Release,
}

fn status(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let st = cmd
        .status()
        .with_context(|| format!("cannot start {shown}"))?;
    if !st.success() {
        bail!("{shown} failed ({st})");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_some_and(|s| s.trim() == "0")
}

/// Debian packages, the pinned nightly with rust-src, and bpf-linker.
fn install_deps() -> Result<()> {
    install_apt_packages()?;
    install_toolchain()?;
    install_lint_components()
}

/// clippy and rustfmt for the lint gate of `cargo xtask test`.
fn install_lint_components() -> Result<()> {
    let installed = output(Command::new("rustup").args(["component", "list", "--installed"]))
        .unwrap_or_default();
    let missing: Vec<&str> = ["clippy", "rustfmt"]
        .into_iter()
        .filter(|c| !installed.lines().any(|l| l.starts_with(c)))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {}", missing.join(" and "));
    status(
        Command::new("rustup")
            .args(["component", "add"])
            .args(&missing),
    )
}

fn install_apt_packages() -> Result<()> {
    install_apt(APT_PACKAGES)
}

/// Installs those of `packages` that are missing (as root).
fn install_apt(packages: &[&str]) -> Result<()> {
    let missing: Vec<&str> = packages
        .iter()
        .copied()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_some_and(|s| s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!(
            "these Debian packages are missing and installing them needs root: {}",
            missing.join(" ")
        );
    }
    eprintln!("xtask: installing Debian packages: {}", missing.join(" "));
    status(Command::new("apt-get").args(["update", "-q"]))?;
    status(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn nightly() -> Result<String> {
    let path = root().join("profiler-ebpf/rust-toolchain.toml");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("channel = ")
                .map(|v| v.trim_matches('"').to_string())
        })
        .with_context(|| format!("no channel in {}", path.display()))
}

fn install_toolchain() -> Result<()> {
    let nightly = nightly()?;
    let has_src = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        &nightly,
    ]))
    .is_some_and(|s| s.lines().any(|l| l.starts_with("rust-src")));
    if !has_src {
        eprintln!("xtask: installing toolchain {nightly} with rust-src (for the BPF target)");
        status(Command::new("rustup").args([
            "toolchain",
            "install",
            &nightly,
            "--profile",
            "minimal",
            "--component",
            "rust-src",
        ]))?;
    }
    let linker = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if !linker.contains(BPF_LINKER_VERSION) {
        eprintln!("xtask: installing bpf-linker {BPF_LINKER_VERSION} (about 80 s)");
        status(Command::new("cargo").args([
            "install",
            &format!("bpf-linker@{BPF_LINKER_VERSION}"),
            "--locked",
            "--force",
        ]))?;
    }
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    c.current_dir(root());
    c
}

/// Builds the daemon (and, through its build script, the BPF object); returns the binary.
fn build(profile: Profile) -> Result<PathBuf> {
    install_toolchain()?;
    let mut cmd = cargo();
    cmd.args(["build", "-p", "profiler", "--bin", "mpiburst"])
        // The daemon this builds always carries its BPF programs.
        .env_remove("AYA_BUILD_SKIP");
    if let Profile::Release = profile {
        cmd.arg("--release");
    }
    status(&mut cmd)?;
    Ok(bin_dir(profile).join("mpiburst"))
}

fn bin_dir(profile: Profile) -> PathBuf {
    root().join("target").join(match profile {
        Profile::Debug => "debug",
        Profile::Release => "release",
    })
}

fn run(profile: Profile, daemon_args: &[String]) -> Result<()> {
    let bin = build(profile)?;
    if !is_root() {
        bail!("mpiburst loads BPF programs and must run as root: run `sudo -E cargo xtask run -- ...`");
    }
    status(Command::new(bin).args(daemon_args))
}

/// Compiles the bundled MPI programs for both MPI implementations into target/mpi.
fn build_mpi_programs() -> Result<PathBuf> {
    let out = root().join("target/mpi");
    std::fs::create_dir_all(&out)?;
    let built = Command::new("bash")
        .arg(root().join("tests/mpi/build.sh"))
        .arg(&out)
        .stderr(Stdio::inherit())
        .output()?;
    if !built.status.success() {
        bail!("building the MPI programs in tests/mpi failed (compiler output above)");
    }
    let count = String::from_utf8_lossy(&built.stdout)
        .lines()
        .filter(|l| l.starts_with("built "))
        .count();
    eprintln!(
        "xtask: built {count} MPI programs (Open MPI and MPICH) into {}",
        out.display()
    );
    Ok(out)
}

/// A started daemon, stopped with SIGTERM (a SIGINT that arrives while the daemon drains is
/// lost); killed if it is dropped running.
struct Daemon {
    child: Child,
}

impl Daemon {
    fn start(bin: &Path, args: &[&str]) -> Result<Daemon> {
        let mut child = Command::new(bin)
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        // Forward the daemon's log and tell the caller when it is ready.
        thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                eprintln!("{line}");
                if line.starts_with("mpiburst ready") {
                    let _ = tx.send(());
                }
            }
        });
        let mut daemon = Daemon { child };
        if rx.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = daemon.child.kill();
            bail!("the daemon did not become ready within 60 s (see its log above)");
        }
        Ok(daemon)
    }

    fn stop(mut self) -> Result<()> {
        self.terminate();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(st) = self.child.try_wait()? {
                if !st.success() {
                    bail!("the daemon exited with {st}");
                }
                return Ok(());
            }
            thread::sleep(Duration::from_millis(100));
        }
        bail!("the daemon did not stop within 20 s of SIGTERM")
    }

    fn terminate(&self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn openmpi_run(ranks: u32) -> Command {
    let mut cmd = Command::new("mpirun.openmpi");
    cmd.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--mca",
        "mpi_yield_when_idle",
        "1",
        "-np",
        &ranks.to_string(),
    ]);
    cmd
}

fn demo(ranks: u32, seconds: u32) -> Result<()> {
    install_deps()?;
    let bin = build(Profile::Release)?;
    if !is_root() {
        bail!("the demo loads BPF programs and must run as root");
    }
    let programs = build_mpi_programs()?;
    let recording = root().join("target/demo.jsonl");
    let daemon = Daemon::start(
        &bin,
        &[
            "record",
            "-o",
            recording.to_str().unwrap(),
            "--report-interval",
            "5",
        ],
    )?;
    eprintln!("xtask: running the demo ({ranks} ranks, {seconds} s); metrics: curl http://127.0.0.1:9464/metrics");
    status(
        openmpi_run(ranks)
            .arg(programs.join("demo.openmpi"))
            .arg(seconds.to_string()),
    )?;
    // The daemon notices the ranks are gone at its next totals read and prints the final report.
    thread::sleep(Duration::from_millis(2500));
    daemon.stop()?;
    eprintln!(
        "xtask: demo done. The recording is {}; `{} report {}` prints its report again.",
        recording.display(),
        bin.display(),
        recording.display()
    );
    Ok(())
}

/// The reason the privileged tests carry in their `#[ignore = ...]`.
const NEEDS_ROOT: &str = "needs root to load BPF programs";

/// How a test that cannot run on this machine reports itself skipped, and why (the tests'
/// harness.rs writes it).
const SKIPPED_AT_RUN_TIME: &str = "mpiburst-test skipped at run time: ";

/// How much of each failed test's panic the report repeats: enough for an assertion's message
/// and the state it prints, little enough that the result lines stay the last of the output.
const PANIC_LINES_SHOWN: usize = 12;
const PANIC_LINE_CHARS: usize = 4000;

enum Outcome {
    Passed,
    Failed,
}

/// `args` are what follows `--`: `cargo test`'s arguments, then after another `--` the test
/// binaries'.
fn test(under_load: bool, args: &[String]) -> Result<Outcome> {
    let (cargo_args, harness_args) = match args.iter().position(|a| a == "--") {
        Some(split) => (&args[..split], &args[split + 1..]),
        None => (args, &[][..]),
    };
    install_deps()?;
    let bin = build(Profile::Release)?;
    let programs = build_mpi_programs()?;
    // The whole suite is gated by the lints; a run of chosen tests is not.
    let lint_failures = if cargo_args.is_empty() {
        lint()?
    } else {
        Vec::new()
    };
    let root = is_root();
    // One test thread: the privileged tests share the machine's probes and cores.
    let mut harness = vec!["--test-threads=1"];
    if root {
        harness.push("--include-ignored");
    }
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--release", "--no-fail-fast"])
        .args(cargo_args)
        .arg("--")
        .args(harness)
        .args(harness_args)
        .env("MPIBURST_BIN", &bin)
        .env("MPIBURST_MPI_PROGRAMS", &programs);
    let started = Instant::now();
    let load = if under_load {
        Some(BusyLoops::start()?)
    } else {
        None
    };
    let mut run = TestRun::run(cmd)?;
    let busy_loops = load.map(|l| l.stop());
    if cargo_args.is_empty() {
        fuzz::test(&mut run);
    }
    run.failed.extend(lint_failures);
    Ok(run.report(root, busy_loops, started.elapsed()))
}

/// The lint gate: formatting, clippy with every warning an error, and the API docs with every
/// rustdoc warning an error (broken intra-doc links). Returns the checks that failed (named like
/// tests, `lint::fmt`, `lint::clippy`, `lint::doc`); their output is above.
fn lint() -> Result<Vec<String>> {
    struct Check {
        name: &'static str,
        args: &'static [&'static str],
        rustdocflags: Option<&'static str>,
        fix: &'static str,
    }
    let checks = [
        Check {
            name: "lint::fmt",
            args: &["fmt", "--all", "--check"],
            rustdocflags: None,
            fix: "`cargo fmt --all` fixes formatting",
        },
        Check {
            name: "lint::clippy",
            args: &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--release",
                "--",
                "-D",
                "warnings",
            ],
            rustdocflags: None,
            fix: "clippy names each warning and its fix above",
        },
        Check {
            name: "lint::doc",
            args: &[
                "doc",
                "--workspace",
                "--no-deps",
                "--document-private-items",
            ],
            rustdocflags: Some("-D warnings"),
            fix: "rustdoc names each broken link above",
        },
    ];
    let mut failed = Vec::new();
    for check in checks {
        eprintln!("xtask: cargo {}", check.args.join(" "));
        let mut cmd = cargo();
        cmd.args(check.args);
        if let Some(flags) = check.rustdocflags {
            cmd.env("RUSTDOCFLAGS", flags);
        }
        let status = cmd
            .status()
            .with_context(|| format!("cannot run cargo {}", check.args[0]))?;
        if !status.success() {
            eprintln!("xtask: {} failed ({status}); {}", check.name, check.fix);
            failed.push(check.name.to_string());
        }
    }
    Ok(failed)
}

/// What `cargo test` printed: the per-binary result lines and the tests that failed or were
/// skipped, each named `binary::test`.
#[derive(Default)]
struct TestRun {
    results: Vec<String>,
    binaries: Vec<String>,
    passed: u64,
    failed: Vec<String>,
    skipped: Vec<(String, String)>,
    /// Tests of the current binary that reported themselves skipped at run time: libtest counts
    /// them as passed.
    skipped_at_run_time: u64,
    /// The names under the last "failures:" line so far; libtest lists the failed tests of a
    /// binary there, just before its result line.
    failure_list: Option<Vec<String>>,
    /// Each failed test's panic, as `binary::test` and the lines from "panicked at" on: the CI
    /// log keeps only the end of the output, where the report repeats them.
    panics: Vec<(String, Vec<String>)>,
    /// The failed test whose captured output is being read ("---- NAME stdout ----" to the next
    /// such line or the list of failures), and whether its panic has begun.
    captured: Option<(String, bool)>,
    cargo_status: Option<std::process::ExitStatus>,
}

impl TestRun {
    /// Runs `cmd`, echoing its standard output and error (merged, in order) while reading them.
    fn run(mut cmd: Command) -> Result<TestRun> {
        use std::io::BufRead;
        let (reader, writer) = std::io::pipe()?;
        cmd.stdout(writer.try_clone()?).stderr(writer);
        let shown = format!("{cmd:?}");
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {shown}"))?;
        // The pipe's write ends now live only in the child: reading ends when it exits.
        drop(cmd);
        let mut run = TestRun::default();
        let mut binary = String::from("?");
        for line in std::io::BufReader::new(reader).lines() {
            let line = line?;
            println!("{line}");
            run.read_line(&line, &mut binary);
        }
        run.cargo_status = Some(child.wait()?);
        Ok(run)
    }

    fn read_line(&mut self, line: &str, binary: &mut String) {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("Running ") {
            // "Running tests/capture.rs (target/release/deps/capture-0123abcd)", or
            // "Running unittests src/main.rs (target/release/deps/mpiburst-4567ef89)"
            let (source, path) = rest.rsplit_once(" (").unwrap_or((rest, rest));
            let file = path
                .trim_end_matches(')')
                .rsplit('/')
                .next()
                .unwrap_or(path);
            let name = file.rsplit_once('-').map_or(file, |(name, _hash)| name);
            // A package's library and binary unit tests have the same name.
            *binary = if source.ends_with("main.rs") {
                format!("{name} (bin)")
            } else {
                name.to_string()
            };
        } else if let Some(krate) = trimmed.strip_prefix("Doc-tests ") {
            *binary = format!("{krate} doc-tests");
        } else if line.starts_with("test result: ") {
            self.results.push(line.to_string());
            self.binaries.push(binary.clone());
            self.passed += count_before(line, " passed")
                .saturating_sub(std::mem::take(&mut self.skipped_at_run_time));
            let failed = self.failure_list.take().unwrap_or_default();
            self.failed
                .extend(failed.into_iter().map(|name| format!("{binary}::{name}")));
        } else if line == "failures:" {
            self.failure_list = Some(Vec::new());
            self.captured = None;
        } else if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|rest| rest.strip_suffix(" stdout ----"))
        {
            self.failure_list = None;
            self.captured = Some((format!("{binary}::{name}"), false));
        } else if let Some((test, in_panic)) = &mut self.captured {
            // "thread 'NAME' panicked at …", or with the thread's id: "thread 'NAME' (42) panicked at …"
            if line.starts_with("thread '") && line.contains(" panicked at ") {
                *in_panic = true;
                self.panics.push((test.clone(), Vec::new()));
            } else if line == "stack backtrace:" {
                *in_panic = false;
            }
            if *in_panic && !line.is_empty() && !line.starts_with("note: ") {
                if let Some((_, lines)) = self.panics.last_mut() {
                    lines.push(line.to_string());
                }
            }
        } else if let (Some(list), Some(name)) = (&mut self.failure_list, line.strip_prefix("    "))
        {
            list.push(name.trim().to_string());
        } else if !line.is_empty() {
            self.failure_list = None;
        }
        // Anywhere in the line: with one test thread, libtest has printed "test NAME ... " before.
        if let Some((name, reason)) = line
            .split_once(SKIPPED_AT_RUN_TIME)
            .and_then(|(_, rest)| rest.split_once(": "))
        {
            self.skipped
                .push((format!("{binary}::{name}"), reason.to_string()));
            self.skipped_at_run_time += 1;
        }
        // Skipped tests are not run, so nothing a test prints can come between name and verdict.
        if let Some((name, verdict)) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.split_once(" ... "))
        {
            if let Some(reason) = verdict.strip_prefix("ignored") {
                let reason = reason.trim_start_matches(", ").trim();
                let reason = if reason.is_empty() {
                    "no reason given"
                } else {
                    reason
                };
                self.skipped
                    .push((format!("{binary}::{name}"), reason.to_string()));
            }
        }
    }

    /// Prints what was skipped and why, what failed, one summary line, and last cargo's result
    /// line of every test binary again (CI reads the last lines).
    fn report(self, root: bool, busy_loops: Option<usize>, took: Duration) -> Outcome {
        let mut reasons: Vec<&str> = self.skipped.iter().map(|(_, r)| r.as_str()).collect();
        reasons.sort_unstable();
        reasons.dedup();
        println!();
        for reason in &reasons {
            let tests: Vec<&str> = self
                .skipped
                .iter()
                .filter(|(_, r)| r == reason)
                .map(|(t, _)| t.as_str())
                .collect();
            println!("xtask: SKIPPED {} tests ({reason}):", tests.len());
            for t in tests {
                println!("    {t}");
            }
        }
        if !self.failed.is_empty() {
            println!("xtask: FAILED {} tests:", self.failed.len());
            for t in &self.failed {
                println!("    {t}");
            }
            for (test, lines) in &self.panics {
                println!("xtask: {test}:");
                for line in lines.iter().take(PANIC_LINES_SHOWN) {
                    println!("    {}", truncated(line, PANIC_LINE_CHARS));
                }
                if lines.len() > PANIC_LINES_SHOWN {
                    println!(
                        "    ... {} lines more, in the test's output above",
                        lines.len() - PANIC_LINES_SHOWN
                    );
                }
            }
        }
        let cargo_ok = self.cargo_status.is_some_and(|s| s.success());
        // cargo fails without a failed test when a binary does not build or crashes.
        let broken = !cargo_ok && self.failed.is_empty();
        let passed = cargo_ok && self.failed.is_empty();
        let skipped_note = match (self.skipped.is_empty(), root) {
            (true, _) => String::new(),
            (false, false) if reasons.iter().all(|r| r.starts_with(NEEDS_ROOT)) => {
                " (not root: run `sudo -E cargo xtask test` to run them)".into()
            }
            (false, _) => " (reasons above)".into(),
        };
        println!(
            "xtask test: {}: {} passed, {} failed, {} skipped{skipped_note} in {} test binaries{}{}, {:.0} s",
            if passed { "PASSED" } else { "FAILED" },
            self.passed,
            self.failed.len(),
            self.skipped.len(),
            self.results.len(),
            busy_loops.map_or(String::new(), |n| format!(", under load ({n} busy loops)")),
            if broken {
                format!(
                    "; cargo test exited with {} (see its errors above)",
                    self.cargo_status.map_or("no status".into(), |s| s.to_string())
                )
            } else {
                String::new()
            },
            took.as_secs_f64()
        );
        println!(
            "xtask: cargo's result lines, in the order {}:",
            self.binaries.join(", ")
        );
        for line in &self.results {
            println!("{line}");
        }
        if passed {
            Outcome::Passed
        } else {
            Outcome::Failed
        }
    }
}

/// `line` cut to at most `max` characters, marked where it was cut.
fn truncated(line: &str, max: usize) -> String {
    match line.char_indices().nth(max) {
        Some((cut, _)) => format!("{} [cut]", &line[..cut]),
        None => line.to_string(),
    }
}

/// The number just before `word` in a result line ("5 passed; 0 failed; ..."), or 0.
fn count_before(line: &str, word: &str) -> u64 {
    line.split_once(word)
        .and_then(|(head, _)| head.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

/// One busy-loop process per online CPU, at normal priority. Stopped by pid when dropped, and
/// each dies with xtask (PR_SET_PDEATHSIG), so an interrupted run leaves none behind.
struct BusyLoops {
    children: Vec<Child>,
}

impl BusyLoops {
    fn start() -> Result<BusyLoops> {
        use std::os::unix::process::CommandExt;
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
        let exe = env::current_exe()?;
        let mut loops = BusyLoops {
            children: Vec::with_capacity(cpus),
        };
        for _ in 0..cpus {
            let mut cmd = Command::new(&exe);
            cmd.arg("busy-loop").stdin(Stdio::null());
            // SAFETY: prctl is async-signal-safe, as code between fork and exec must be.
            unsafe {
                cmd.pre_exec(
                    || match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) {
                        0 => Ok(()),
                        _ => Err(std::io::Error::last_os_error()),
                    },
                );
            }
            loops
                .children
                .push(cmd.spawn().context("start a busy loop")?);
        }
        eprintln!("xtask: {cpus} busy loops running (one per online CPU)");
        Ok(loops)
    }

    /// Stops the loops; returns how many ran.
    fn stop(self) -> usize {
        self.children.len()
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The daemon's own cost under a burst storm: CPU per 10⁵ bursts/s, losses, peak memory and the
/// latency of /metrics while windows are clustered (profiler/examples/bench_daemon.rs).
fn bench_daemon() -> Result<()> {
    let (bin, programs) = bpf_bench_setup("daemon")?;
    status(
        example("bench_daemon")
            .arg(&bin)
            .arg(programs.join("call_loop.openmpi")),
    )
}

/// The aggregator's part of a large job (profiler/examples/bench_jobwide.rs), then Prometheus's
/// (tests/bench_jobwide_rules.rs), which replays a real daemon's /metrics and so runs as root.
fn bench_jobwide() -> Result<()> {
    status(&mut example("bench_jobwide"))?;
    println!();
    if !is_root() {
        println!(
            "The Prometheus part (rule evaluation over a job of 2,000 nodes) is skipped: it \
             replays the /metrics of a real daemon, which loads BPF programs; run as root."
        );
        return Ok(());
    }
    let (bin, programs) = bpf_bench_setup("jobwide")?;
    status(
        example_of("mpiburst-tests", "bench_jobwide_rules")
            .env("MPIBURST_BIN", &bin)
            .env("MPIBURST_MPI_PROGRAMS", &programs),
    )
}

/// The slowdown of real MPI codes under the daemon (tests/bench_apps.rs). LAMMPS, one of the
/// codes, is installed here (Debian package lammps, about 70 MB) and only here: without it the
/// benchmark says LAMMPS was skipped and why.
fn bench_apps(rounds: Option<u32>) -> Result<()> {
    let (bin, programs) = bpf_bench_setup("apps")?;
    if let Err(e) = install_apt(&["lammps"]) {
        eprintln!("xtask: the Debian package lammps is not installed ({e:#}); the benchmark runs without LAMMPS");
    }
    status(
        example_of("mpiburst-tests", "bench_apps")
            .env("MPIBURST_BIN", &bin)
            .env("MPIBURST_MPI_PROGRAMS", &programs)
            .args(rounds.map(|r| r.to_string())),
    )
}

/// What the benchmarks that load BPF programs need: the daemon binary and the MPI programs, as
/// root. Returns the binary and the programs' folder.
fn bpf_bench_setup(name: &str) -> Result<(PathBuf, PathBuf)> {
    install_deps()?;
    let bin = build(Profile::Release)?;
    if !is_root() {
        bail!("the {name} benchmark loads BPF programs and must run as root");
    }
    Ok((bin, build_mpi_programs()?))
}

/// `cargo run --release -p profiler --example NAME --`, for the caller's arguments.
fn example(name: &str) -> Command {
    example_of("profiler", name)
}

/// `cargo run --release -p PACKAGE --example NAME --`, for the caller's arguments.
fn example_of(package: &str, name: &str) -> Command {
    let mut cmd = cargo();
    cmd.args(["run", "--release", "-p", package, "--example", name, "--"]);
    cmd
}

fn bench_overhead() -> Result<()> {
    let (bin, programs) = bpf_bench_setup("overhead")?;
    status(example("bench_overhead").arg(&programs).arg(&bin))?;
    // Whole application: the demo with and without the daemon, alternating to cancel drift.
    let demo = programs.join("demo.openmpi");
    // The demo's last line reads "demo: done, N steps on R ranks in S s (X ms/step), ...".
    let ms_per_step = |out: &str| -> Option<f64> {
        let line = out.lines().rev().find(|l| l.starts_with("demo: done"))?;
        line.split(" ms/step")
            .next()?
            .rsplit('(')
            .next()?
            .parse()
            .ok()
    };
    let run_demo = || -> Result<f64> {
        let out = openmpi_run(2).arg(&demo).arg("10").output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        ms_per_step(&text).with_context(|| format!("the demo printed no summary line:\n{text}"))
    };
    let (mut bare, mut profiled) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        bare.push(run_demo()?);
        let daemon = Daemon::start(&bin, &["run", "--report-interval", "0"])?;
        profiled.push(run_demo()?);
        daemon.stop()?;
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (b, p) = (median(&mut bare), median(&mut profiled));
    println!("demo (2 ranks, 10 s, 3 runs each, median): {b:.2} ms/step without the daemon, {p:.2} ms/step with it");
    println!("application slowdown: {:.2} %", 100.0 * (p - b) / b);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &str) -> Result<Task, String> {
        Cli::try_parse_from(std::iter::once("xtask").chain(args.split_whitespace()))
            .map(|cli| cli.task)
            .map_err(|e| e.to_string())
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn the_commands_of_the_readme_parse() {
        let release = ProfileArg { debug: false };
        assert_eq!(parsed("build"), Ok(Task::Build { profile: release }));
        assert_eq!(
            parsed("build --debug"),
            Ok(Task::Build {
                profile: ProfileArg { debug: true }
            })
        );
        assert_eq!(
            parsed("run --debug -- record -o job.jsonl"),
            Ok(Task::Run {
                profile: ProfileArg { debug: true },
                args: strings(&["record", "-o", "job.jsonl"]),
            })
        );
        assert_eq!(
            parsed("demo"),
            Ok(Task::Demo {
                ranks: 2,
                seconds: 20
            })
        );
        assert_eq!(
            parsed("demo --ranks 4 --seconds 5"),
            Ok(Task::Demo {
                ranks: 4,
                seconds: 5
            })
        );
        assert_eq!(
            parsed("test"),
            Ok(Task::Test {
                under_load: false,
                args: Vec::new()
            })
        );
        assert_eq!(
            parsed("test --under-load -- -p profiler --lib -- --nocapture"),
            Ok(Task::Test {
                under_load: true,
                args: strings(&["-p", "profiler", "--lib", "--", "--nocapture"]),
            })
        );
        for (name, bench) in [
            ("overhead", Bench::Overhead),
            ("cluster", Bench::Cluster),
            ("jobwide", Bench::Jobwide),
            ("daemon", Bench::Daemon),
            ("apps", Bench::Apps { rounds: None }),
        ] {
            assert_eq!(parsed(&format!("bench {name}")), Ok(Task::Bench { bench }));
        }
        assert_eq!(
            parsed("bench apps 9"),
            Ok(Task::Bench {
                bench: Bench::Apps { rounds: Some(9) }
            })
        );
        assert_eq!(
            parsed("fuzz"),
            Ok(Task::Fuzz {
                targets: Vec::new(),
                seconds: fuzz::DEFAULT_SECONDS
            })
        );
        assert_eq!(
            parsed("fuzz proc_stat --seconds 600"),
            Ok(Task::Fuzz {
                targets: strings(&["proc_stat"]),
                seconds: 600
            })
        );
        assert_eq!(parsed("install"), Ok(Task::Install));
        assert_eq!(parsed("install-deps"), Ok(Task::InstallDeps));
        assert_eq!(parsed("busy-loop"), Ok(Task::BusyLoop));
    }

    #[test]
    fn unusable_arguments_are_refused() {
        for args in [
            "",
            "demo --ranks 5",
            "test --bogus",
            "bench",
            "bench apps 0",
            "fuzz --seconds x",
            "run record",
        ] {
            assert!(parsed(args).is_err(), "{args:?}");
        }
    }

    #[test]
    fn a_test_run_reads_failed_and_skipped_tests_from_cargo_output() {
        let output = "     Running unittests src/main.rs (target/release/deps/mpiburst-0123abcd)
running 0 tests
test result: ok. 0 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.00s
     Running tests/capture.rs (target/release/deps/capture-4567ef89)
running 3 tests
test call_sites ... ignored, needs root to load BPF programs: run `sudo -E cargo xtask test`
test counts ... program output on the test's line
ok
test kill_9 ... FAILED

failures:

---- kill_9 stdout ----
what the test printed before its panic
thread 'kill_9' (42) panicked at tests/capture.rs:1:1:
    an indented line of a panic message

note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace

failures:
    kill_9

test result: FAILED. 1 passed; 1 failed; 1 ignored; 0 measured; 0 filtered out; finished in 1.00s
error: test failed, to rerun pass `-p mpiburst-tests --test capture`
     Running tests/slurm.rs (target/release/deps/slurm-0011aabb)
running 2 tests
test runs ... mpiburst-test skipped at run time: runs: Slurm cannot run here: slurmd exited
ok
test scoped ... ok
test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 3.00s";
        let mut run = TestRun::default();
        let mut binary = String::new();
        for line in output.lines() {
            run.read_line(line, &mut binary);
        }
        assert_eq!(run.binaries, ["mpiburst (bin)", "capture", "slurm"]);
        assert_eq!(run.passed, 2);
        assert_eq!(run.failed, ["capture::kill_9"]);
        assert_eq!(
            run.panics,
            [(
                "capture::kill_9".to_string(),
                vec![
                    "thread 'kill_9' (42) panicked at tests/capture.rs:1:1:".to_string(),
                    "    an indented line of a panic message".to_string()
                ]
            )]
        );
        assert_eq!(
            run.skipped,
            [
                (
                    "capture::call_sites".to_string(),
                    "needs root to load BPF programs: run `sudo -E cargo xtask test`".to_string()
                ),
                (
                    "slurm::runs".to_string(),
                    "Slurm cannot run here: slurmd exited".to_string()
                )
            ]
        );
        assert_eq!(run.results.len(), 3);
    }
}
