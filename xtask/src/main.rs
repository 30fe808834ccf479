//! `cargo xtask`: set-up, build, run, demo, test and benchmarks for mpiburst. Every command
//! installs what it needs (Debian packages, the pinned nightly's rust-src, bpf-linker), and does
//! nothing when it is already there.

use std::{
    env,
    ffi::OsString,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

/// Pinned with the nightly in profiler-ebpf/rust-toolchain.toml: newer bpf-linker releases need
/// a newer LLVM than that toolchain has.
const BPF_LINKER_VERSION: &str = "0.10.4";
/// Debian packages: MPI implementations and compilers for the bundled MPI programs, the
/// Prometheus server and promtool for the metric tests.
const APT_PACKAGES: &[&str] =
    &["openmpi-bin", "libopenmpi-dev", "mpich", "libmpich-dev", "gfortran", "gcc", "prometheus", "binutils", "curl"];

const USAGE: &str = "usage: cargo xtask <command>
  build [--debug]         build the BPF object and the daemon (release by default)
  run [--debug] -- ARGS   build, then run `mpiburst ARGS` (as root)
  demo [--ranks N] [--seconds S]
                          run the bundled MPI demo under the daemon and print its reports
  test [-- CARGO TEST ARGS]
                          run every test: unit tests and the privileged BPF + MPI tests
  bench overhead|cluster  measure probe cost per call and application slowdown, or clustering speed
  install-deps            only install the system packages and toolchain pieces";

fn main() -> Result<()> {
    let args: Vec<String> = env::args().skip(1).collect();
    let Some(command) = args.first() else {
        eprintln!("{USAGE}");
        bail!("no command given");
    };
    let rest = &args[1..];
    match command.as_str() {
        "build" => build(profile(rest)).map(|_| ()),
        "run" => run(rest),
        "demo" => demo(rest),
        "test" => test(rest),
        "bench" => bench(rest),
        "install-deps" => install_deps(),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => {
            eprintln!("{USAGE}");
            bail!("unknown command {other:?}")
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[derive(Clone, Copy)]
enum Profile {
    Debug,
    Release,
}

fn profile(args: &[String]) -> Profile {
    if args.iter().any(|a| a == "--debug") {
        Profile::Debug
    } else {
        Profile::Release
    }
}

fn status(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let st = cmd.status().with_context(|| format!("cannot start {shown}"))?;
    if !st.success() {
        bail!("{shown} failed ({st})");
    }
    Ok(())
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_root() -> bool {
    output(Command::new("id").arg("-u")).is_some_and(|s| s.trim() == "0")
}

/// Debian packages, the pinned nightly with rust-src, and bpf-linker.
fn install_deps() -> Result<()> {
    install_apt_packages()?;
    install_toolchain()
}

fn install_apt_packages() -> Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p])).is_some_and(|s| s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !is_root() {
        bail!("these Debian packages are missing and installing them needs root: {}", missing.join(" "));
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
    let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
    text.lines()
        .find_map(|l| l.trim().strip_prefix("channel = ").map(|v| v.trim_matches('"').to_string()))
        .with_context(|| format!("no channel in {}", path.display()))
}

fn install_toolchain() -> Result<()> {
    let nightly = nightly()?;
    let has_src = output(Command::new("rustup").args(["component", "list", "--installed", "--toolchain", &nightly]))
        .is_some_and(|s| s.lines().any(|l| l.starts_with("rust-src")));
    if !has_src {
        eprintln!("xtask: installing toolchain {nightly} with rust-src (for the BPF target)");
        status(Command::new("rustup").args(["toolchain", "install", &nightly, "--profile", "minimal", "--component", "rust-src"]))?;
    }
    let linker = output(Command::new("bpf-linker").arg("--version")).unwrap_or_default();
    if !linker.contains(BPF_LINKER_VERSION) {
        eprintln!("xtask: installing bpf-linker {BPF_LINKER_VERSION} (about 80 s)");
        status(Command::new("cargo").args(["install", &format!("bpf-linker@{BPF_LINKER_VERSION}"), "--locked", "--force"]))?;
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
    cmd.args(["build", "-p", "profiler", "--bin", "mpiburst"]);
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

fn run(args: &[String]) -> Result<()> {
    let split = args.iter().position(|a| a == "--").unwrap_or(args.len());
    let bin = build(profile(&args[..split]))?;
    if !is_root() {
        bail!("mpiburst loads BPF programs and must run as root: run `sudo -E cargo xtask run -- ...`");
    }
    let daemon_args = args.get(split + 1..).unwrap_or_default();
    status(Command::new(bin).args(daemon_args))
}

/// Compiles the bundled MPI programs for both MPI implementations into target/mpi.
fn build_mpi_programs() -> Result<PathBuf> {
    let out = root().join("target/mpi");
    std::fs::create_dir_all(&out)?;
    let built = Command::new("bash").arg(root().join("tests/mpi/build.sh")).arg(&out).stderr(Stdio::inherit()).output()?;
    if !built.status.success() {
        bail!("building the MPI programs in tests/mpi failed (compiler output above)");
    }
    let count = String::from_utf8_lossy(&built.stdout).lines().filter(|l| l.starts_with("built ")).count();
    eprintln!("xtask: built {count} MPI programs (Open MPI and MPICH) into {}", out.display());
    Ok(out)
}

fn flag_value(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

/// A started daemon, stopped (SIGINT, then SIGKILL after a while) when dropped.
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
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
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
        self.interrupt();
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
        bail!("the daemon did not stop within 20 s of SIGINT")
    }

    fn interrupt(&self) {
        let _ = Command::new("kill").args(["-INT", &self.child.id().to_string()]).status();
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
    cmd.args(["--allow-run-as-root", "--oversubscribe", "--mca", "mpi_yield_when_idle", "1", "-np", &ranks.to_string()]);
    cmd
}

fn demo(args: &[String]) -> Result<()> {
    install_deps()?;
    let ranks: u32 = flag_value(args, "--ranks").map(|v| v.parse()).transpose()?.unwrap_or(2);
    let seconds: u32 = flag_value(args, "--seconds").map(|v| v.parse()).transpose()?.unwrap_or(20);
    if !(2..=4).contains(&ranks) {
        bail!("the demo runs with 2 to 4 ranks");
    }
    let bin = build(Profile::Release)?;
    if !is_root() {
        bail!("the demo loads BPF programs and must run as root");
    }
    let programs = build_mpi_programs()?;
    let recording = root().join("target/demo.jsonl");
    let daemon = Daemon::start(&bin, &["record", "-o", recording.to_str().unwrap(), "--report-interval", "5"])?;
    eprintln!("xtask: running the demo ({ranks} ranks, {seconds} s); metrics: curl http://127.0.0.1:9464/metrics");
    status(openmpi_run(ranks).arg(programs.join("demo.openmpi")).arg(seconds.to_string()))?;
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

fn test(args: &[String]) -> Result<()> {
    install_deps()?;
    let bin = build(Profile::Release)?;
    let programs = build_mpi_programs()?;
    let extra: Vec<OsString> = match args.iter().position(|a| a == "--") {
        Some(i) => args[i + 1..].iter().map(Into::into).collect(),
        None => Vec::new(),
    };
    // One test thread: the privileged tests share the machine's probes and its two cores.
    status(
        cargo()
            .args(["test", "--workspace", "--release"])
            .args(&extra)
            .args(["--", "--test-threads=1"])
            .env("MPIBURST_BIN", &bin)
            .env("MPIBURST_MPI_PROGRAMS", &programs),
    )
}

fn bench(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("overhead") => bench_overhead(),
        Some("cluster") => status(cargo().args(["run", "--release", "-p", "profiler", "--example", "bench_cluster"])),
        _ => bail!("usage: cargo xtask bench overhead|cluster"),
    }
}

fn bench_overhead() -> Result<()> {
    install_deps()?;
    let bin = build(Profile::Release)?;
    if !is_root() {
        bail!("the overhead benchmark loads BPF programs and must run as root");
    }
    let programs = build_mpi_programs()?;
    status(
        cargo()
            .args(["run", "--release", "-p", "profiler", "--example", "bench_overhead", "--"])
            .arg(programs.join("call_loop.openmpi")),
    )?;
    // Whole application: the demo with and without the daemon, alternating to cancel drift.
    let demo = programs.join("demo.openmpi");
    // The demo's last line reads "demo: done, N steps on R ranks in S s (X ms/step), ...".
    let ms_per_step = |out: &str| -> Option<f64> {
        let line = out.lines().rev().find(|l| l.starts_with("demo: done"))?;
        line.split(" ms/step").next()?.rsplit('(').next()?.parse().ok()
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
