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
//! The file I/O programs on the raw syscall tracepoints make every system call on the node take
//! the kernel's traced path, so their cost is measured too, on 1-byte pwrite calls to a file: without the BPF programs, with them
//! loaded (a process the daemon does not track: every other process on the node), and in a
//! tracked process writing to a file it opened (a counted request).

use std::{path::PathBuf, process::Command};

use anyhow::{bail, Context, Result};
use mpiburst::{
    capture::{AttachPoint, Capture},
    config::Config,
    daemon::Daemon,
    discovery::{self, Binding, MpiFlavor},
};

const CALLS: &str = "2000000";
const ROUNDS: usize = 5;
const WRITES: u32 = 1_000_000;

/// ns per 1-byte pwrite to a fresh file in a temporary directory (page cache).
fn ns_per_write() -> Result<f64> {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir()?;
    let file = std::fs::File::create(dir.path().join("w"))?;
    let start = std::time::Instant::now();
    for _ in 0..WRITES {
        file.write_at(b"x", 0)?;
    }
    Ok(start.elapsed().as_nanos() as f64 / WRITES as f64)
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
    let config = Config::default();
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
        file_offset: barrier.file_offset,
        cookie: 0,
    };

    let (mut none, mut floor, mut real) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        none.push(ns_per_call(&program)?);
        {
            let mut capture = Capture::load(&config.capture, 0)?;
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
    let (mut plain, mut loaded, mut tracked) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        plain.push(ns_per_write()?);
        let mut capture = Capture::load(&config.capture, 0)?;
        loaded.push(ns_per_write()?);
        capture.track(std::process::id())?;
        tracked.push(ns_per_write()?);
        let counted = capture
            .read_io()?
            .get(&std::process::id())
            .map_or(0, |t| t.write_calls);
        if counted != u64::from(WRITES) {
            bail!("the tracked writes were counted {counted} times, not {WRITES}");
        }
        eprintln!(
            "round {}: pwrite {:.1} ns without the programs, {:.1} ns untracked, {:.1} ns tracked and counted",
            round + 1,
            plain[round],
            loaded[round],
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
    let (p, l, t) = (median(plain), median(loaded), median(tracked));
    println!("1-byte pwrite to a file, {WRITES} calls, median of {ROUNDS} rounds:");
    println!("  without the BPF programs {p:>9.1} ns per call");
    println!(
        "  untracked process        {l:>9.1} ns per call  -> tracepoint cost {:.1} ns",
        l - p
    );
    println!(
        "  tracked, counted file    {t:>9.1} ns per call  -> tracepoint cost {:.1} ns",
        t - p
    );
    Ok(())
}
