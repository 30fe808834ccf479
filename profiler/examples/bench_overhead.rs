//! Cost per probed MPI call, measured side by side in one run (`cargo xtask bench overhead`),
//! for one function of each class of probe on both MPIs (Open MPI and MPICH, whichever is
//! installed):
//!
//! - (c) no probes,
//! - (a) the floor: empty BPF programs as uprobe + uretprobe at the same place in the function,
//! - (b) mpiburst's real probes, attached exactly as the daemon attaches them.
//!
//! The workload is tests/mpi/call_loop: one rank calling one function in a loop, so that it does
//! almost nothing (see call_loop.c for the classes: a collective without arguments read, bytes,
//! bytes and peer with the communicator on the stack, completion, polling, polling with peer),
//! and its Fortran twin call_loop.f90, whose MPI_Barrier goes through the Fortran wrapper to the
//! C function: two probed functions per call, the C one nested.
//! The probe cost of a configuration is its ns per call minus (c); the target is
//! cost(b) ≤ 1.15 × cost(a) on the collective and completion classes, and at most 250 ns of the
//! programs' own work per call on every class. Configurations alternate over several rounds and
//! medians are taken, so drift on the machine hits all three alike. Where the kernel would
//! single-step a function's first instruction, the probes sit further in
//! (capture/placement.rs): the table shows where.
//!
//! Three more alternating rounds run with the kernel's BPF statistics on, and the medians of the
//! run time and runs of the probe programs per call are printed, the floor's empty programs
//! beside mpiburst's: what the programs' own work costs, apart from the uprobe traps both pay,
//! and how many traps run programs (mpiburst's uprobe sessions skip the return of a nested
//! call). The statistics add their own clock reads to every run, which is why the rounds above
//! run without them.
//!
//! The file I/O programs sit on system call tracepoints, and while any system call tracepoint is
//! in use every system call on the node takes the kernel's traced path, so the tax on a process
//! the daemon does not track (every other process on the node) is measured too: 1-byte pwrite
//! calls to a file (a call the file I/O programs look at) and sched_yield (one they do not, the
//! polling of MPI libraries), without the daemon; with the scheduler programs alone (a daemon
//! without any system call tracepoint: file I/O off and no holds of new MPI libraries); with the
//! daemon running as deployed (`mpiburst run`, default settings) on a node that has had no MPI
//! process and no launcher for `capture.detach_idle_after_s` (0 here), where the file I/O and
//! scheduler programs and the watch on library opens (`library_open_exit` at openat's exit) are
//! detached; the same beside an idle launcher of MPI ranks (a `sleep` named `mpirun`), which
//! keeps the watch attached; and with file I/O on beside a tracked process (an idle one the
//! bench starts), where both are attached, alternating. Last, 1-byte pwrite calls of a tracked
//! process to a file it opened (counted requests, checked to be counted exactly). These calls
//! are made by a process of their own, this program run again, in its CPU time: the tax is that
//! of the other processes on the node, not of the one the daemon runs in (whose own system calls
//! were about 25 ns dearer, with or without a daemon).
//!
//! The scheduler programs run at every context switch on the node, whatever the task: their cost
//! per switch is measured over two processes that hand one CPU to each other with sched_yield,
//! by the wall time of their switches without the programs, with the floor (an empty program on
//! sched_switch alone: the kernel's dispatch of any raw tracepoint program) and with the
//! programs (BPF statistics off, as deployed; in turn), and by the kernel's BPF statistics
//! (which add their own clock reads to each run).
//!
//! Last, the daemon's start-up with the default probe list beside the same start with its first
//! 75 entries, the most common calls, alternating: the wall time to read the libraries, place
//! and attach the probes, and the resident memory it adds (the BPF side's kernel memory is not
//! in it).
//!
//! Usage: bench_overhead DIRECTORY_OF_THE_MPI_TEST_PROGRAMS MPIBURST_BINARY

use std::{
    collections::{BTreeMap, HashSet},
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use mpiburst::{
    capture::{config::CaptureConfig, usage, AttachPoint, Capture, SchedulerFloor},
    config::Config,
    daemon::Daemon,
    discovery::{self, Binding, MpiFlavor, MpiLibrary},
    export::client::DaemonClient,
};

const CALLS: &str = "300000";
/// Calls every call_loop makes before its timed ones.
const WARM_UP_CALLS: u64 = 10_000;
const ROUNDS: usize = 5;
/// Rounds with the kernel's BPF statistics on.
const STATS_ROUNDS: usize = 3;
const SYSCALLS: u32 = 1_000_000;

/// One function of each class of probe: the call_loop program and its name for the function,
/// the MPI function, the class.
const CLASSES: [(&str, &str, &str, &str); 7] = [
    ("call_loop", "barrier", "MPI_Barrier", "collective"),
    (
        "call_loop",
        "allreduce",
        "MPI_Allreduce",
        "collective, bytes",
    ),
    (
        "call_loop",
        "sendrecv",
        "MPI_Sendrecv",
        "p2p, bytes, peer (stack)",
    ),
    ("call_loop", "waitall", "MPI_Waitall", "completion"),
    ("call_loop", "test", "MPI_Test", "polling"),
    ("call_loop", "iprobe", "MPI_Iprobe", "polling, peer"),
    (
        "call_loop_f90",
        "barrier",
        "MPI_Barrier",
        "Fortran wrapper, C nested",
    ),
];

/// An installed MPI: where its call_loop builds are, its C and Fortran libraries, and the
/// floor's attach points in each (the probe places of the CLASSES functions).
struct Mpi {
    name: &'static str,
    programs: PathBuf,
    suffix: &'static str,
    floor: Vec<(MpiLibrary, Vec<AttachPoint>)>,
    /// Bytes from the entry point to the probes, per function (0: at the entry point).
    probe_shift: BTreeMap<String, u64>,
}

/// The installed MPIs whose call_loop programs were built; a missing one is reported and left
/// out.
fn installed_mpis(programs: &Path) -> Result<Vec<Mpi>> {
    let libraries = discovery::discover_libraries(&[])?;
    let functions: Vec<String> = CLASSES.iter().map(|c| c.2.to_string()).collect();
    let mut mpis = Vec::new();
    for (flavor, name, suffix) in [
        (MpiFlavor::OpenMpi, "Open MPI", "openmpi"),
        (MpiFlavor::Mpich, "MPICH", "mpich"),
    ] {
        let c = libraries
            .iter()
            .find(|l| l.flavor == flavor && l.binding == Binding::C);
        let built = CLASSES
            .iter()
            .all(|c| programs.join(format!("{}.{suffix}", c.0)).exists());
        let (Some(c), true) = (c, built) else {
            eprintln!(
                "{name}: not installed or call_loop and call_loop_f90 not built in {}; left out",
                programs.display()
            );
            continue;
        };
        // The Fortran libraries call_loop_f90 loads: the daemon attaches a Fortran library only
        // once a process maps it, or when the configuration names it.
        let fortran: Vec<MpiLibrary> =
            linked_libraries(&programs.join(format!("call_loop_f90.{suffix}")))?
                .iter()
                .filter_map(|path| MpiLibrary::open(path).ok())
                .filter(|l| l.flavor == flavor && l.binding == Binding::Fortran)
                .collect();
        let mut floor = Vec::new();
        let mut probe_shift = BTreeMap::new();
        for library in std::iter::once(c).chain(&fortran) {
            let points = discovery::probe_points(library, &functions)?.points;
            if points.is_empty() {
                continue;
            }
            if library.binding == Binding::C {
                probe_shift = points
                    .iter()
                    .map(|p| (p.function.clone(), p.probe_offset - p.file_offset))
                    .collect();
            }
            let floor_points = points.iter().map(AttachPoint::floor).collect();
            floor.push((library.clone(), floor_points));
        }
        mpis.push(Mpi {
            name,
            programs: programs.to_path_buf(),
            suffix,
            floor,
            probe_shift,
        });
    }
    if mpis.is_empty() {
        bail!("no MPI with a built call_loop: run `cargo xtask build` and tests/mpi/build.sh");
    }
    Ok(mpis)
}

impl Mpi {
    fn program(&self, stem: &str) -> PathBuf {
        self.programs.join(format!("{stem}.{}", self.suffix))
    }
}

/// The shared libraries `program` loads, as `ldd` resolves them, symbolic links resolved.
fn linked_libraries(program: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(program)
        .output()
        .with_context(|| format!("running ldd on {}", program.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once("=> ")?.1.split_whitespace().next())
        .filter_map(|path| Path::new(path).canonicalize().ok())
        .collect())
}

/// The floor's empty programs on every function of every MPI.
fn load_floor(config: &Config, mpis: &[Mpi]) -> Result<Capture> {
    let mut capture = Capture::load(&config.capture)?;
    for (library, points) in mpis.iter().flat_map(|mpi| &mpi.floor) {
        capture.attach_floor(&library.path, points)?;
    }
    Ok(capture)
}

/// ns per call of every (MPI, class), in the order of `mpis` × CLASSES.
fn ns_per_call_of_all(mpis: &[Mpi]) -> Result<Vec<f64>> {
    let mut out = Vec::new();
    for mpi in mpis {
        for (stem, arg, _, _) in CLASSES {
            out.push(ns_per_call(&mpi.program(stem), arg)?);
        }
    }
    Ok(out)
}

/// Run time (ns) and run count of the loaded BPF probe programs, the floor's or mpiburst's,
/// that `known` does not list (those loaded before this benchmark, by another daemon say).
fn program_runs(floor: bool, known: &HashSet<u32>) -> Result<(u64, u64)> {
    let names: &[&str] = if floor {
        &["floor_enter", "floor_exit"]
    } else {
        &["mpi_enter", "mpi_exit", "mpi_session"]
    };
    let mut runs = (0, 0);
    for info in aya::programs::loaded_programs() {
        let info = info?;
        if known.contains(&info.id()) || !names.iter().any(|&n| Some(n) == info.name_as_str()) {
            continue;
        }
        runs.0 += info.run_time().as_nanos() as u64;
        runs.1 += info.run_count();
    }
    Ok(runs)
}

/// Per call of each (MPI, class), in the order of `mpis` × CLASSES: ns in the floor's or
/// mpiburst's probe programs, and their runs.
/// Per class, the medians over rounds of (run time, runs) per call.
fn medians(rounds: &[Vec<(f64, f64)>]) -> Vec<(f64, f64)> {
    (0..rounds[0].len())
        .map(|i| {
            (
                median(rounds.iter().map(|r| r[i].0).collect()),
                median(rounds.iter().map(|r| r[i].1).collect()),
            )
        })
        .collect()
}

fn program_time_per_call(
    mpis: &[Mpi],
    floor: bool,
    known: &HashSet<u32>,
) -> Result<Vec<(f64, f64)>> {
    let calls = (CALLS.parse::<u64>()? + WARM_UP_CALLS) as f64;
    let mut out = Vec::new();
    for mpi in mpis {
        for (stem, arg, _, _) in CLASSES {
            let before = program_runs(floor, known)?;
            ns_per_call(&mpi.program(stem), arg)?;
            let after = program_runs(floor, known)?;
            out.push((
                (after.0 - before.0) as f64 / calls,
                (after.1 - before.1) as f64 / calls,
            ));
        }
    }
    Ok(out)
}

/// This thread's CPU time per call of `call`, made SYSCALLS times. CPU time, not wall time:
/// what other tasks run on the CPU meanwhile (sched_yield hands it to them) is not the caller's
/// cost.
fn cpu_ns_per_call(mut call: impl FnMut() -> std::io::Result<()>) -> Result<f64> {
    let start = usage::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    for _ in 0..SYSCALLS {
        call()?;
    }
    let spent = usage::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID) - start;
    Ok(spent as f64 / f64::from(SYSCALLS))
}

/// CPU ns per 1-byte pwrite to a fresh file in a temporary directory (page cache).
fn ns_per_write() -> Result<f64> {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir()?;
    let file = std::fs::File::create(dir.path().join("w"))?;
    cpu_ns_per_call(|| file.write_at(b"x", 0).map(drop))
}

/// CPU ns per sched_yield call.
fn ns_per_yield() -> Result<f64> {
    cpu_ns_per_call(|| {
        // SAFETY: no arguments, no memory touched.
        unsafe { libc::sched_yield() };
        Ok(())
    })
}

/// The argument that makes this program measure its system calls and exit (see [`SyscallLoop`]).
const SYSCALL_LOOP: &str = "--syscall-loop";
/// The argument that makes this program yield its CPU (CPU 0) SWITCHES times and exit.
const YIELD_LOOP: &str = "--yield-loop";
/// Context switches the scheduler programs' cost is measured over, per round.
const SWITCHES: u32 = 1_000_000;

/// The yield loop's side: on CPU 0, which the other loop shares, each sched_yield switches to it.
fn yield_loop() -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(0, &mut set) };
    // SAFETY: the set is a valid cpu_set_t of the size given.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) } != 0 {
        bail!("cannot pin to CPU 0: {}", std::io::Error::last_os_error());
    }
    for _ in 0..SWITCHES / 2 {
        // SAFETY: no arguments, no memory touched.
        unsafe { libc::sched_yield() };
    }
    Ok(())
}

/// The scheduler programs' cost in one round.
struct SchedulerRound {
    /// Wall ns per context switch of the yield loops without the programs, with the floor's
    /// empty program on sched_switch alone, and with the programs (BPF statistics off, as
    /// deployed).
    without_ns: f64,
    floor_ns: f64,
    with_ns: f64,
    /// By the kernel's BPF statistics: the program's run time per switch.
    stats_ns: f64,
}

/// Wall ns per context switch of two yield loops that hand CPU 0 to each other.
fn yield_loops_ns() -> Result<f64> {
    let start = Instant::now();
    let loops: Vec<std::process::Child> = (0..2)
        .map(|_| {
            Command::new(std::env::current_exe()?)
                .arg(YIELD_LOOP)
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    for mut child in loops {
        let status = child.wait()?;
        if !status.success() {
            bail!("a yield loop failed: {status}");
        }
    }
    Ok(start.elapsed().as_nanos() as f64 / f64::from(SWITCHES))
}

/// Per round, the scheduler programs' cost per context switch: by the wall time of the yield
/// loops without and with them (alternating which goes first), and by the kernel's BPF
/// statistics, with the daemon's probes as `config` has them.
fn scheduler_cost(config: &Config) -> Result<Vec<SchedulerRound>> {
    let with_stats = CaptureConfig {
        bpf_stats: true,
        ..config.capture.clone()
    };
    let without_stats = CaptureConfig {
        bpf_stats: false,
        ..config.capture.clone()
    };
    let mut rounds = Vec::new();
    for round in 0..ROUNDS {
        let with_programs = || -> Result<f64> {
            let _capture = Capture::load(&without_stats)?;
            yield_loops_ns()
        };
        let with_floor = || -> Result<f64> {
            let _floor = SchedulerFloor::attach()?;
            yield_loops_ns()
        };
        // Each setup goes first, second and third in turn.
        let (mut without_ns, mut floor_ns, mut with_ns) = (0.0, 0.0, 0.0);
        for setup in 0..3 {
            match (setup + round) % 3 {
                0 => without_ns = yield_loops_ns()?,
                1 => floor_ns = with_floor()?,
                _ => with_ns = with_programs()?,
            }
        }
        let capture = Capture::load(&with_stats)?;
        let stats = |capture: &Capture| -> BTreeMap<&'static str, (u128, u64)> {
            capture
                .program_stats()
                .into_iter()
                .filter_map(|p| Some((p.name, (p.run_time?.as_nanos(), p.run_count?))))
                .collect()
        };
        let before = stats(&capture);
        yield_loops_ns()?;
        let after = stats(&capture);
        let delta = |name: &str| -> Result<(f64, f64)> {
            let (t0, n0) = before
                .get(name)
                .context("no BPF statistics: are they on?")?;
            let (t1, n1) = after[name];
            Ok(((t1 - t0) as f64, (n1 - n0) as f64))
        };
        let (switch_ns, switches) = delta("sched_switch")?;
        let r = SchedulerRound {
            without_ns,
            floor_ns,
            with_ns,
            stats_ns: switch_ns / switches,
        };
        eprintln!(
            "round {}: a context switch {:.1} ns without the scheduler programs, {:.1} ns with an \
             empty program on sched_switch, {:.1} ns with them; their run time {:.1} ns per switch \
             over {switches} switches",
            round + 1,
            r.without_ns,
            r.floor_ns,
            r.with_ns,
            r.stats_ns
        );
        rounds.push(r);
    }
    Ok(rounds)
}

fn print_scheduler_cost(rounds: Vec<SchedulerRound>) {
    let of = |f: fn(&SchedulerRound) -> f64| median(rounds.iter().map(f).collect());
    let (without, floor, with) = (of(|r| r.without_ns), of(|r| r.floor_ns), of(|r| r.with_ns));
    let added = of(|r| r.with_ns - r.without_ns);
    let floor_added = of(|r| r.floor_ns - r.without_ns);
    println!(
        "scheduler programs, per context switch between two processes the daemon does not track, \
         median of {ROUNDS} rounds of {SWITCHES} switches: {added:+.1} ns by the switches' wall \
         time, BPF statistics off as deployed ({without:.1} ns without the programs, {with:.1} ns \
         with them), {:.2} times the floor, an empty program on sched_switch alone \
         ({floor_added:+.1} ns, {floor:.1} ns a switch: what the kernel's dispatch of any raw \
         tracepoint program costs a switch here); {:.1} ns of sched_switch's run time by the \
         kernel's BPF statistics, their own clock reads included",
        added / floor_added,
        of(|r| r.stats_ns)
    );
}

/// This program run again as a process of its own that measures CPU ns per pwrite and per
/// sched_yield: the tax of system calls is that of the other processes on the node, and the
/// daemon runs in this one. The child says it is ready and waits for a line on its standard
/// input before it opens its file and measures, so that it can be tracked first.
struct SyscallLoop {
    /// Until it is told to measure; a loop dropped before that is killed.
    child: Option<std::process::Child>,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl Drop for SyscallLoop {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl SyscallLoop {
    fn start() -> Result<SyscallLoop> {
        use std::io::BufRead;
        let mut child = Command::new(std::env::current_exe()?)
            .arg(SYSCALL_LOOP)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let stdout = child.stdout.take().context("child's stdout")?;
        let mut syscall_loop = SyscallLoop {
            child: Some(child),
            stdout: std::io::BufReader::new(stdout),
        };
        let mut ready = String::new();
        syscall_loop.stdout.read_line(&mut ready)?;
        if ready.trim() != "ready" {
            bail!("the system call loop did not start: {ready:?}");
        }
        Ok(syscall_loop)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, std::process::Child::id)
    }

    /// Lets it measure: CPU ns per pwrite and per sched_yield.
    fn measure(mut self) -> Result<(f64, f64)> {
        use std::io::{Read, Write};
        let mut child = self.child.take().context("a loop measures once")?;
        child
            .stdin
            .take()
            .context("child's stdin")?
            .write_all(b"go\n")?;
        let mut text = String::new();
        self.stdout.read_to_string(&mut text)?;
        let status = child.wait()?;
        if !status.success() {
            bail!("the system call loop failed ({status}): {text}");
        }
        let mut values = text.split_whitespace().map(str::parse::<f64>);
        match (values.next(), values.next()) {
            (Some(Ok(write)), Some(Ok(sched_yield))) => Ok((write, sched_yield)),
            _ => bail!("the system call loop printed {text:?}"),
        }
    }

    /// The child's side.
    fn run() -> Result<()> {
        use std::io::{BufRead, Write};
        println!("ready");
        std::io::stdout().flush()?;
        std::io::stdin().lock().read_line(&mut String::new())?;
        println!("{} {}", ns_per_write()?, ns_per_yield()?);
        Ok(())
    }
}

/// ns per call of `function` (call_loop's name) measured by call_loop itself.
fn ns_per_call(program: &Path, function: &str) -> Result<f64> {
    let out = Command::new(program)
        .args([CALLS, function])
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()?;
    if !out.status.success() {
        bail!(
            "{} {function} failed: {}",
            program.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("ns_per_call"))
        .context("no ns_per_call line")?;
    let value: serde_json::Value = serde_json::from_str(line)?;
    value["ns_per_call"]
        .as_f64()
        .context("ns_per_call is not a number")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    const USAGE: &str = "usage: bench_overhead DIRECTORY_OF_THE_MPI_TEST_PROGRAMS MPIBURST_BINARY";
    let programs = PathBuf::from(std::env::args().nth(1).context(USAGE)?);
    if programs.as_os_str() == SYSCALL_LOOP {
        return SyscallLoop::run();
    }
    if programs.as_os_str() == YIELD_LOOP {
        return yield_loop();
    }
    let binary = PathBuf::from(std::env::args().nth(2).context(USAGE)?);
    let mpis = installed_mpis(&programs)?;
    let config = daemon_config(&mpis);
    let rounds = cost_per_call(&config, &mpis)?;
    let (floor_runs, real_runs) = program_run_times(&config, &mpis)?;
    print_cost_per_call(&mpis, &rounds);
    print_program_run_times(&mpis, &floor_runs, &real_runs);
    let (writes, yields) = untracked_system_calls(&config, &binary)?;
    let tracked = tracked_pwrite(&config)?;
    print_system_call_tax(writes, yields, tracked);
    print_scheduler_cost(scheduler_cost(&config)?);
    print_start_up(&config, start_up(&config)?);
    Ok(())
}

/// The first entries of the default probe list: the most common calls (point-to-point, the
/// common collectives, completion, polling, the basic one-sided and MPI-IO calls).
const COMMON_FUNCTIONS: usize = 75;

/// Per probe list (the common functions, the default list), per round: the wall time of the
/// daemon's start (libraries' symbols read, probe places found, probes attached) in s, and this
/// process's resident memory after it, less before, in bytes.
type StartUpRounds = [Vec<(f64, f64)>; 2];

/// The daemon's start with the common functions only and with the default list, alternating.
fn start_up(config: &Config) -> Result<StartUpRounds> {
    let mut common = config.clone();
    common.mpi.functions.truncate(COMMON_FUNCTIONS);
    let mut rounds: StartUpRounds = Default::default();
    for _ in 0..ROUNDS {
        for (list, config) in [&common, config].into_iter().enumerate() {
            let before = resident_bytes()?;
            let started = std::time::Instant::now();
            let daemon = Daemon::start(config.clone(), None)?;
            let seconds = started.elapsed().as_secs_f64();
            let grown = resident_bytes()? - before;
            drop(daemon);
            rounds[list].push((seconds, grown));
        }
    }
    Ok(rounds)
}

/// This process's resident set (VmRSS), in bytes.
fn resident_bytes() -> Result<f64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<f64>().ok())
        .map(|kib| kib * 1024.0)
        .context("no VmRSS in /proc/self/status")
}

fn print_start_up(config: &Config, rounds: StartUpRounds) {
    println!(
        "daemon start-up (libraries read, probes placed and attached), median of {ROUNDS} \
         alternating rounds:"
    );
    let [common, all] = rounds.map(|r| {
        let (seconds, bytes): (Vec<f64>, Vec<f64>) = r.into_iter().unzip();
        (median(seconds), median(bytes))
    });
    for (name, functions, (seconds, bytes)) in [
        ("common functions", COMMON_FUNCTIONS, common),
        ("default list", config.mpi.functions.len(), all),
    ] {
        println!(
            "  {name:<18} {functions:>4} functions  {:>8.1} ms  {:>6.1} MiB more resident",
            seconds * 1e3,
            bytes / (1024.0 * 1024.0)
        );
    }
    println!(
        "  default list / common functions: {:.2} × the start-up time",
        all.0 / common.0
    );
}

/// The daemon's configuration for the bench: it probes the libraries the floor probes, Fortran
/// ones included.
fn daemon_config(mpis: &[Mpi]) -> Config {
    // The daemon's loop does not run here, so nothing would resume a process held at its open
    // of an MPI library or at a first call; and its hold guard would be this program.
    let mut config = Config::default();
    config.mpi.hold_new_libraries = false;
    config.capture.scheduler_on_demand = false;
    // A port of its own for each daemon started here: a dropped daemon's HTTP thread closes its
    // listener a moment later, and the next one would find the port in use.
    config.daemon.listen = ([127, 0, 0, 1], 0).into();
    config.mpi.libraries = mpis
        .iter()
        .flat_map(|mpi| &mpi.floor)
        .map(|(library, _)| library.path.clone())
        .collect();
    config
}

/// Per setup (none, floor, mpiburst), per round, ns per call of each (MPI, class).
type Rounds = [Vec<Vec<f64>>; 3];

/// The cost per call without probes, under the floor and under the daemon, in alternating
/// rounds.
fn cost_per_call(config: &Config, mpis: &[Mpi]) -> Result<Rounds> {
    let mut rounds: Rounds = Default::default();
    for round in 0..ROUNDS {
        rounds[0].push(ns_per_call_of_all(mpis)?);
        {
            let _floor = load_floor(config, mpis)?;
            rounds[1].push(ns_per_call_of_all(mpis)?);
        }
        {
            let _daemon = Daemon::start(config.clone(), None)?;
            rounds[2].push(ns_per_call_of_all(mpis)?);
        }
        eprintln!("round {} of {ROUNDS} done", round + 1);
    }
    Ok(rounds)
}

/// Per (MPI, class): a program's run time per call (ns) and its runs per call.
type RunTimes = Vec<(f64, f64)>;

/// Each BPF program's run time and runs per call, floor and daemon, with the kernel's
/// statistics on for these rounds only.
fn program_run_times(config: &Config, mpis: &[Mpi]) -> Result<(RunTimes, RunTimes)> {
    let known: HashSet<u32> = aya::programs::loaded_programs()
        .map(|info| info.map(|i| i.id()))
        .collect::<Result<_, _>>()?;
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime)
        .context("turning on the kernel's BPF run-time statistics")?;
    let mut floor_rounds = Vec::new();
    let mut real_rounds = Vec::new();
    for _ in 0..STATS_ROUNDS {
        {
            let _floor = load_floor(config, mpis)?;
            floor_rounds.push(program_time_per_call(mpis, true, &known)?);
        }
        let _daemon = Daemon::start(config.clone(), None)?;
        real_rounds.push(program_time_per_call(mpis, false, &known)?);
    }
    Ok((medians(&floor_rounds), medians(&real_rounds)))
}

/// Every (MPI, class) the bench measures, in the order of its rounds.
fn measured(mpis: &[Mpi]) -> impl Iterator<Item = (&Mpi, &(&str, &str, &str, &str))> {
    mpis.iter()
        .flat_map(|mpi| CLASSES.iter().map(move |c| (mpi, c)))
}

fn print_cost_per_call(mpis: &[Mpi], rounds: &Rounds) {
    println!(
        "cost per call, {CALLS} calls per run, median of {ROUNDS} alternating rounds (ns per call; \
         probe cost = with probes - without; target: mpiburst/floor <= 1.15):"
    );
    println!(
        "  {:<9} {:<14} {:<26} {:>8} {:>8} {:>8} {:>9} {:>11} {:>13} {:>6}",
        "MPI",
        "function",
        "class",
        "probe at",
        "none",
        "floor",
        "mpiburst",
        "floor cost",
        "mpiburst cost",
        "ratio"
    );
    for (i, (mpi, (_, _, function, class))) in measured(mpis).enumerate() {
        let [c, a, b] = [0, 1, 2].map(|k| median(rounds[k].iter().map(|r| r[i]).collect()));
        println!(
            "  {:<9} {:<14} {:<26} {:>8} {c:>8.1} {a:>8.1} {b:>9.1} {:>11.1} {:>13.1} {:>6.3}",
            mpi.name,
            function,
            class,
            format!("+{}", mpi.probe_shift.get(*function).copied().unwrap_or(0)),
            a - c,
            b - c,
            (b - c) / (a - c)
        );
    }
}

fn print_program_run_times(mpis: &[Mpi], floor_runs: &[(f64, f64)], real_runs: &[(f64, f64)]) {
    println!(
        "BPF probe programs per call, median of {STATS_ROUNDS} more alternating rounds with the \
         kernel's statistics on (their own clock reads included):"
    );
    println!(
        "  {:<9} {:<14} {:<26} {:>11} {:>10} {:>14} {:>13} {:>22}",
        "MPI",
        "function",
        "class",
        "floor time",
        "floor runs",
        "mpiburst time",
        "mpiburst runs",
        "work of the programs"
    );
    for (i, (mpi, (_, _, function, class))) in measured(mpis).enumerate() {
        let ((ft, fr), (mt, mr)) = (floor_runs[i], real_runs[i]);
        println!(
            "  {:<9} {:<14} {:<26} {ft:>8.1} ns {fr:>10.2} {mt:>11.1} ns {mr:>13.2} {:>19.1} ns",
            mpi.name,
            function,
            class,
            mt - ft
        );
    }
}

/// The daemon's configuration with file I/O counting on or off.
fn with_file_io(config: &Config, file_io: bool) -> Config {
    Config {
        capture: CaptureConfig {
            file_io,
            ..config.capture.clone()
        },
        ..config.clone()
    }
}

/// The daemon's configuration without any system call tracepoint: file I/O off, and no holds of
/// processes that open an MPI library at a new path (whose program sits at openat's exit).
fn without_syscall_tracepoints(config: &Config) -> Config {
    let mut quiet = with_file_io(config, false);
    quiet.mpi.hold_new_libraries = false;
    quiet
}

/// Per setup (without the daemon; the scheduler programs alone; the daemon as deployed on a node
/// without MPI processes, alone and beside an idle launcher (its watch on library opens detached
/// and attached); file I/O counting beside a tracked process), per round: ns per untracked
/// pwrite and sched_yield.
type SyscallRounds = [Vec<f64>; 5];

/// `mpiburst run` with the default settings (its own port and lock file), once it has detached
/// the programs it attaches only while the node has MPI processes (a node between jobs), with
/// or without an idle launcher of MPI ranks beside it, which keeps the watch on library opens
/// attached.
struct IdleDaemon {
    child: std::process::Child,
    launcher: Option<std::process::Child>,
    dir: tempfile::TempDir,
}

impl IdleDaemon {
    fn start(binary: &Path, beside_launcher: bool) -> Result<IdleDaemon> {
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("mpiburst.toml");
        std::fs::write(
            &config,
            format!(
                "[daemon]\nlock_file = \"{}\"\n[capture]\ndetach_idle_after_s = 0\n",
                dir.path().join("lock").display(),
            ),
        )?;
        let addr = format!(
            "127.0.0.1:{}",
            std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port()
        );
        let mut child = Command::new(binary)
            .args(["run", "--report-interval", "0", "--listen", &addr, "-c"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let stderr = child.stderr.take().context("the daemon's stderr")?;
        let mut daemon = IdleDaemon {
            child,
            launcher: None,
            dir,
        };
        // Read to the end on a thread of its own, so that the daemon never blocks on its log.
        let (ready, wait) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.starts_with("mpiburst ready") {
                    let _ = ready.send(());
                }
            }
        });
        wait.recv_timeout(Duration::from_secs(60))
            .context("the daemon did not become ready within 60 s")?;
        let client = DaemonClient::parse(&addr, Config::default().daemon.listen.port())?
            .context("the daemon's address")?;
        if beside_launcher {
            // Named like a launcher: the kernel names a process after the file it runs (argv[0]
            // stays `sleep`, for a multi-call binary).
            let mpirun = daemon.dir.path().join("mpirun");
            std::os::unix::fs::symlink("/bin/sleep", &mpirun)?;
            daemon.launcher = Some(Command::new(&mpirun).arg0("sleep").arg("3600").spawn()?);
        }
        let watch = u8::from(beside_launcher);
        let detached = |text: &str| {
            [("file_io", 0), ("scheduler", 0), ("library_watch", watch)]
                .iter()
                .all(|(programs, attached)| {
                    let series = format!(
                        "mpiburst_on_demand_programs_attached{{programs=\"{programs}\"}} {attached}"
                    );
                    text.lines().any(|l| l == series)
                })
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !detached(&String::from_utf8(client.get("/metrics")?)?) {
            if Instant::now() > deadline {
                bail!("the daemon did not detach its idle programs within 30 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(daemon)
    }
}

impl Drop for IdleDaemon {
    fn drop(&mut self) {
        if let Some(launcher) = &mut self.launcher {
            let _ = launcher.kill();
            let _ = launcher.wait();
        }
        // SIGTERM: the daemon releases what it holds and exits; killed if it does not in 30 s.
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The capture with file I/O on, tracking an idle process of its own: the file I/O programs
/// attached, as beside an MPI job.
struct BesideTracked {
    _capture: Capture,
    idle: std::process::Child,
}

impl BesideTracked {
    fn start(config: &Config) -> Result<BesideTracked> {
        let mut capture = Capture::load(&config.capture)?;
        let mut idle = Command::new("sleep").arg("600").spawn()?;
        if let Err(e) = capture.track(idle.id()) {
            let _ = idle.kill();
            let _ = idle.wait();
            return Err(e.into());
        }
        if !capture.counts_file_io() {
            bail!("the file I/O programs are not attached while a process is tracked");
        }
        Ok(BesideTracked {
            _capture: capture,
            idle,
        })
    }
}

impl Drop for BesideTracked {
    fn drop(&mut self) {
        let _ = self.idle.kill();
        let _ = self.idle.wait();
    }
}

/// What runs beside the system call loop.
#[derive(Clone, Copy)]
enum Beside {
    Nothing,
    /// A daemon without system call tracepoints (its loop does not run: the programs stay).
    SchedulerPrograms,
    IdleDaemon,
    IdleDaemonBesideLauncher,
    TrackedProcess,
}

fn untracked_system_calls(
    config: &Config,
    binary: &Path,
) -> Result<(SyscallRounds, SyscallRounds)> {
    let quiet = without_syscall_tracepoints(config);
    let io_on = with_file_io(config, true);
    let mut writes: SyscallRounds = Default::default();
    let mut yields: SyscallRounds = Default::default();
    for round in 0..ROUNDS {
        let setups = [
            Beside::Nothing,
            Beside::SchedulerPrograms,
            Beside::IdleDaemon,
            Beside::IdleDaemonBesideLauncher,
            Beside::TrackedProcess,
        ];
        for (setup, beside) in setups.into_iter().enumerate() {
            let _daemon = matches!(beside, Beside::SchedulerPrograms)
                .then(|| Daemon::start(quiet.clone(), None))
                .transpose()?;
            let _idle = match beside {
                Beside::IdleDaemon => Some(IdleDaemon::start(binary, false)?),
                Beside::IdleDaemonBesideLauncher => Some(IdleDaemon::start(binary, true)?),
                _ => None,
            };
            let _beside = matches!(beside, Beside::TrackedProcess)
                .then(|| BesideTracked::start(&io_on))
                .transpose()?;
            let (write, sched_yield) = SyscallLoop::start()?.measure()?;
            writes[setup].push(write);
            yields[setup].push(sched_yield);
        }
        let row = |v: &SyscallRounds| {
            let values: Vec<String> = v.iter().map(|s| format!("{:.1}", s[round])).collect();
            values.join(" / ")
        };
        eprintln!(
            "round {}: untracked pwrite {} ns, sched_yield {} ns (without the daemon / scheduler \
             programs alone / idle daemon / idle, beside a launcher / beside a tracked process)",
            round + 1,
            row(&writes),
            row(&yields)
        );
    }
    Ok((writes, yields))
}

/// ns per pwrite of a process the capture tracks, each round checking that every write was
/// counted.
fn tracked_pwrite(config: &Config) -> Result<Vec<f64>> {
    let io_on = with_file_io(config, true);
    let mut tracked = Vec::new();
    for round in 0..ROUNDS {
        let mut capture = Capture::load(&io_on.capture)?;
        let child = SyscallLoop::start()?;
        let pid = child.pid();
        capture.track(pid)?;
        tracked.push(child.measure()?.0);
        let counted = capture.read_io()?.get(&pid).map_or(0, |t| t.write_calls);
        if counted != u64::from(SYSCALLS) {
            bail!("the tracked writes were counted {counted} times, not {SYSCALLS}");
        }
        eprintln!(
            "round {}: pwrite {:.1} ns tracked and counted",
            round + 1,
            tracked[round]
        );
    }
    Ok(tracked)
}

fn print_system_call_tax(writes: SyscallRounds, yields: SyscallRounds, tracked: Vec<f64>) {
    println!(
        "system calls of a process the daemon does not track, CPU time, {SYSCALLS} calls, median \
         of {ROUNDS} alternating rounds; with file I/O on, its programs are attached only while \
         the daemon tracks a process:"
    );
    println!(
        "                          without daemon   scheduler programs alone   daemon, no MPI \
         process   the same, beside a launcher   beside a tracked process"
    );
    let [write, sched_yield] = [writes, yields].map(|rounds| rounds.map(median));
    let rows = [
        ("1-byte pwrite to a file", write),
        ("sched_yield", sched_yield),
    ];
    for (name, ns) in rows {
        println!(
            "  {name:<24} {:>11.1} ns {:>23.1} ns {:>20.1} ns {:>25.1} ns {:>23.1} ns",
            ns[0], ns[1], ns[2], ns[3], ns[4]
        );
    }
    println!("tax against no daemon:");
    for (name, ns) in rows {
        let tax = |i: usize| ns[i] - ns[0];
        println!(
            "  {name:<24} {:>11} {:>23.1} ns {:>20.1} ns {:>25.1} ns {:>23.1} ns",
            "",
            tax(1),
            tax(2),
            tax(3),
            tax(4)
        );
    }
    let t = median(tracked);
    println!(
        "tracked process, counted 1-byte pwrite: {t:.1} ns per call (tax {:.1} ns)",
        t - write[0]
    );
}
