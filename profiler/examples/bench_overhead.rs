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

fn ns_per_call(program: &PathBuf) -> Result<f64> {
    let out = Command::new(program).arg(CALLS).env("OMPI_ALLOW_RUN_AS_ROOT", "1").env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1").output()?;
    if !out.status.success() {
        bail!("{} failed: {}", program.display(), String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.contains("ns_per_call")).context("no ns_per_call line")?;
    let value: serde_json::Value = serde_json::from_str(line)?;
    value["ns_per_call"].as_f64().context("ns_per_call is not a number")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    let program = PathBuf::from(std::env::args().nth(1).context("usage: bench_overhead PATH/call_loop.openmpi")?);
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
    let floor_point = AttachPoint { function: barrier.function.clone(), file_offset: barrier.file_offset, cookie: 0 };

    let (mut none, mut floor, mut real) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        none.push(ns_per_call(&program)?);
        {
            let mut capture = Capture::load(&config.capture, 0)?;
            capture.attach_floor(&libmpi.path, &[floor_point.clone()])?;
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
    let (c, a, b) = (median(none), median(floor), median(real));
    println!("MPI_Barrier(MPI_COMM_SELF), {CALLS} calls, median of {ROUNDS} alternating rounds:");
    println!("  (c) no probes            {c:>9.1} ns per call");
    println!("  (a) empty uprobe+uretprobe {a:>7.1} ns per call  -> probe floor {:.1} ns", a - c);
    println!("  (b) mpiburst probes      {b:>9.1} ns per call  -> probe cost  {:.1} ns", b - c);
    println!("  ratio b/a of probe costs: {:.3} (budget 1.3)", (b - c) / (a - c));
    Ok(())
}
