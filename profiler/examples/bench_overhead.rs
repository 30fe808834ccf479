//! Cost per probed MPI call, measured side by side in one run (`cargo xtask bench overhead`):
//!
//! - (c) no probes,
//! - (a) the floor: empty BPF programs as uprobe + uretprobe on the same function,
//! - (b) mpiburst's real probes, attached exactly as the daemon attaches them.
//!
//! The workload is tests/mpi/call_loop: one rank calling MPI_Barrier(MPI_COMM_SELF) in a loop.
//! The probe cost of a configuration is its ns per call minus (c); the budget is
//! cost(b) ≤ 1.3 × cost(a). Configurations alternate over several rounds and medians are taken,
//! so drift on the machine hits all three alike.
//!
//! The file I/O programs sit on system call tracepoints, and while any system call tracepoint is
//! in use every system call on the node takes the kernel's traced path, so the tax on a process
//! the daemon does not track (every other process on the node) is measured too: 1-byte pwrite
//! calls to a file (a call the file I/O programs look at) and sched_yield (one they do not, the
//! polling of MPI libraries), in this process's CPU time, without the daemon, with the daemon
//! but file I/O off (the scheduler programs alone) and with file I/O on, alternating. Last,
//! 1-byte pwrite calls of a tracked process to a file it opened (counted requests, checked to be
//! counted exactly).

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};
use mpiburst::{
    capture::{config::CaptureConfig, usage, AttachPoint, Capture},
    config::Config,
    daemon::Daemon,
    discovery::{self, Binding, MpiFlavor},
};

const CALLS: &str = "2000000";
const ROUNDS: usize = 5;
const SYSCALLS: u32 = 1_000_000;

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

fn ns_per_call(program: &PathBuf) -> Result<f64> {
    let out = Command::new(program)
        .arg(CALLS)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
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
    let program = PathBuf::from(
        std::env::args()
            .nth(1)
            .context("usage: bench_overhead PATH/call_loop.openmpi")?,
    );
    // The daemon's loop does not run here, so nothing would resume a process held at its open
    // of an MPI library.
    let mut config = Config::default();
    config.mpi.hold_new_libraries = false;
    let libmpi = discovery::discover_libraries(&[])?
        .into_iter()
        .find(|l| l.flavor == MpiFlavor::OpenMpi && l.binding == Binding::C)
        .context("Open MPI's libmpi not found")?;
    let barrier = discovery::probe_points(&libmpi, &["MPI_Barrier".to_string()])?
        .points
        .into_iter()
        .next()
        .context("MPI_Barrier not in libmpi")?;
    let floor_point = AttachPoint {
        function: barrier.function.clone(),
        file_offset: barrier.probe_offset,
        cookie: 0,
    };

    let (mut none, mut floor, mut real) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        none.push(ns_per_call(&program)?);
        {
            let mut capture = Capture::load(&config.capture)?;
            capture.attach_floor(&libmpi.path, std::slice::from_ref(&floor_point))?;
            floor.push(ns_per_call(&program)?);
        }
        {
            let _daemon = Daemon::start(config.clone(), None)?;
            real.push(ns_per_call(&program)?);
        }
        eprintln!(
            "round {}: none {:.1} ns, floor {:.1} ns, mpiburst {:.1} ns per call",
            round + 1,
            none[round],
            floor[round],
            real[round]
        );
    }
    // Untracked system calls: without the daemon, with it but without file I/O counting (the
    // scheduler programs alone), and with file I/O counting.
    let io_off = Config {
        capture: CaptureConfig {
            file_io: false,
            ..config.capture.clone()
        },
        ..config.clone()
    };
    let io_on = Config {
        capture: CaptureConfig {
            file_io: true,
            ..config.capture.clone()
        },
        ..config.clone()
    };
    let mut writes: [Vec<f64>; 3] = Default::default();
    let mut yields: [Vec<f64>; 3] = Default::default();
    for round in 0..ROUNDS {
        for (setup, daemon_config) in [None, Some(&io_off), Some(&io_on)].into_iter().enumerate() {
            let _daemon = daemon_config
                .map(|c| Daemon::start(c.clone(), None))
                .transpose()?;
            writes[setup].push(ns_per_write()?);
            yields[setup].push(ns_per_yield()?);
        }
        eprintln!(
            "round {}: untracked pwrite {:.1} / {:.1} / {:.1} ns, sched_yield {:.1} / {:.1} / {:.1} ns \
             (without the daemon / file I/O off / on)",
            round + 1,
            writes[0][round],
            writes[1][round],
            writes[2][round],
            yields[0][round],
            yields[1][round],
            yields[2][round]
        );
    }
    let mut tracked = Vec::new();
    for round in 0..ROUNDS {
        let mut capture = Capture::load(&io_on.capture)?;
        capture.track(std::process::id())?;
        tracked.push(ns_per_write()?);
        let counted = capture
            .read_io()?
            .get(&std::process::id())
            .map_or(0, |t| t.write_calls);
        if counted != u64::from(SYSCALLS) {
            bail!("the tracked writes were counted {counted} times, not {SYSCALLS}");
        }
        eprintln!(
            "round {}: pwrite {:.1} ns tracked and counted",
            round + 1,
            tracked[round]
        );
    }
    let (c, a, b) = (median(none), median(floor), median(real));
    println!("MPI_Barrier(MPI_COMM_SELF), {CALLS} calls, median of {ROUNDS} alternating rounds:");
    println!("  (c) no probes            {c:>9.1} ns per call");
    println!(
        "  (a) empty uprobe+uretprobe {a:>7.1} ns per call  -> probe floor {:.1} ns",
        a - c
    );
    println!(
        "  (b) mpiburst probes      {b:>9.1} ns per call  -> probe cost  {:.1} ns",
        b - c
    );
    println!(
        "  ratio b/a of probe costs: {:.3} (budget 1.3)",
        (b - c) / (a - c)
    );
    println!(
        "system calls of a process the daemon does not track, CPU time, {SYSCALLS} calls, median \
         of {ROUNDS} alternating rounds:"
    );
    println!(
        "                          without daemon   daemon, file I/O off   daemon, file I/O on   \
         tax of file I/O (on - off)   tax of the daemon (on - without)"
    );
    let [write_bare, write_off, write_on] = writes.map(median);
    let [yield_bare, yield_off, yield_on] = yields.map(median);
    for (name, bare, off, on) in [
        ("1-byte pwrite to a file", write_bare, write_off, write_on),
        ("sched_yield", yield_bare, yield_off, yield_on),
    ] {
        println!(
            "  {name:<24} {bare:>9.1} ns {off:>18.1} ns {on:>19.1} ns {:>23.1} ns {:>29.1} ns",
            on - off,
            on - bare
        );
    }
    let t = median(tracked);
    println!(
        "tracked process, counted 1-byte pwrite: {t:.1} ns per call (tax {:.1} ns)",
        t - write_bare
    );
    Ok(())
}
