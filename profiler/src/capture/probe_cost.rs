//! What a probe hit costs on this node, measured when the daemon starts: the probes the daemon
//! attaches to MPI functions (the session program, or the entry and return pair where the kernel
//! has no uprobe sessions), set at functions of this executable for this process only, against
//! their unprobed twin.
//!
//! Two costs of a hit in full: back to back, as a thread pays it in a polling storm (calls in a
//! tight loop keep the trap path, the programs and their maps in the core's caches), from which
//! the probe governor sets its storm limits; and among work, each call timed alone after a write
//! pass over a buffer of the core's own cache size, which evicts all that from the core's caches.
//! Beside each, the mean of the probe runs the programs timed (`BurstTotals::timed_runs`). Each
//! rank's estimate of what profiling cost it (`store::probe_cost`) scales the cost back to back
//! by how much longer its own timed runs took, or takes the cost among work where it has too
//! few; its storm calls cost an entry-only hit back to back.

use std::{
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    sync::mpsc,
    time::Instant,
};

use aya::maps::{Array, HashMap, MapData};
use profiler_common::{cookie, mode, BurstTotals, Governance, ThreadState, GOVERNED_FUNCS};

use super::{
    map_mut, map_ref, multi, multi::ProbeKind, threads, Capture, CaptureError, SESSION_PROGRAM,
    UPROBE_PROGRAMS,
};
use crate::proc::{self, ProcError};

/// Why the cost of a probe hit could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum ProbeCostError {
    #[error("cannot find the measured function in this process's maps: {0}")]
    Maps(#[from] ProcError),
    #[error("the measured function is in no file mapping of this process")]
    Unmapped,
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error("the measuring thread panicked")]
    Panicked,
}

/// What a probe hit costs, in ns per call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeCost {
    /// Entry and return probed, calls back to back.
    pub full_ns: f64,
    /// Entry only, as the probe governor counts a polling storm (back to back); `None` without
    /// uprobe sessions, where no call is counted at its entry only.
    pub count_only_ns: Option<f64>,
    /// Entry and return probed, each call after a write pass over `work_bytes`.
    pub full_among_work_ns: f64,
    /// The size of the pass: the core's own cache (level 2), as the kernel lists it.
    pub work_bytes: u64,
    /// The mean time of a probe run the programs timed, back to back and among work (`None`
    /// where they timed none).
    pub run_back_to_back_ns: Option<f64>,
    pub run_among_work_ns: Option<f64>,
}

/// Probe runs the programs timed (`BurstTotals::timed_runs`) and their summed time.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TimedRuns {
    pub runs: u64,
    pub ns: u64,
}

impl TimedRuns {
    /// The timed runs in a thread's or a process's burst totals.
    pub fn of(totals: &BurstTotals) -> TimedRuns {
        TimedRuns {
            runs: totals.timed_runs,
            ns: totals.timed_run_ns,
        }
    }

    pub fn add(&mut self, o: TimedRuns) {
        self.runs += o.runs;
        self.ns += o.ns;
    }

    /// The mean time of a run, in ns; `None` without runs.
    pub fn mean_ns(&self) -> Option<f64> {
        (self.runs > 0).then(|| self.ns as f64 / self.runs as f64)
    }
}

/// Rounds and calls of the measurement back to back (about 0.1 s in all here).
const ROUNDS: usize = 3;
const CALLS: u64 = 20_000;
/// Calls per round among work, each of the probed function and of its twin after its own pass
/// (a pass over 1 MiB takes tens of µs: about 0.1 s in all here). Each call is timed alone and
/// the medians compared, so that a pass's own noise stays out.
const CALLS_AMONG_WORK: usize = 400;
/// The pass's size where the kernel lists no level 2 cache.
const DEFAULT_WORK_BYTES: u64 = 1 << 20;

impl Capture {
    /// Measures what a probe hit costs here: the median of alternating rounds, each timing
    /// calls of a probed function against calls of its twin, on a thread of its own (whose
    /// state the kernel frees when it exits). Probed in full, the calls take the path of an
    /// ordinary MPI call (the probes ship no burst of the daemon's own); with uprobe sessions,
    /// a second function is a polling one to the probes, counted at entry only (its mode
    /// `GOVERNANCE` sets). Call it before the probe governor takes that map.
    pub fn measure_probe_cost(&mut self) -> Result<ProbeCost, ProbeCostError> {
        let (path, offsets) = calibration_points()?;
        // The id of the polling function, whose mode GOVERNANCE sets; the ordinary one shares it.
        let func = GOVERNED_FUNCS - 1;
        let cookie = |flags| {
            cookie::encode(
                func as u16,
                cookie::NO_ARG,
                cookie::NO_ARG,
                cookie::DTYPE_NONE,
                flags,
            )
        };
        let cookies = [cookie(0), cookie(cookie::POLLING)];
        let attach = |fd: std::os::fd::BorrowedFd<'_>, kind: ProbeKind, program: &'static str| {
            multi::attach(fd, kind, &path, &offsets, &cookies, std::process::id()).map_err(
                |source| CaptureError::Attach {
                    function: "mpiburst_probe_cost_target".into(),
                    path: path.clone(),
                    program,
                    source,
                },
            )
        };
        let links: Vec<OwnedFd> = match &self.session_program {
            Some(fd) => vec![attach(fd.as_fd(), ProbeKind::Session, SESSION_PROGRAM)?],
            // Return first: an entry probe without its return would leave the depth raised.
            None => [1, 0]
                .into_iter()
                .map(|i| {
                    let (name, kind) = UPROBE_PROGRAMS[i];
                    attach(self.uprobe_programs[i].as_fd(), kind, name)
                })
                .collect::<Result<_, _>>()?,
        };
        let sessions = self.session_program.is_some();
        let targets: &[(extern "C" fn(u64) -> u64, u32)] = if sessions {
            &[
                (mpiburst_probe_cost_target, mode::FULL),
                (mpiburst_probe_cost_polled, mode::COUNT_ONLY),
            ]
        } else {
            &[(mpiburst_probe_cost_target, mode::FULL)]
        };
        let mut times = vec![Vec::new(); targets.len()];
        let work_bytes = core_cache_bytes();
        let mut among_work = Vec::new();
        let (mut runs_back_to_back, mut runs_among_work) =
            (TimedRuns::default(), TimedRuns::default());
        for _ in 0..ROUNDS {
            for (&(target, mode), into) in targets.iter().zip(&mut times) {
                self.set_probe_mode(func, mode)?;
                let ((bare, probed), runs) = self.on_own_thread(move || {
                    (
                        time_calls(mpiburst_probe_cost_bare, CALLS),
                        time_calls(target, CALLS),
                    )
                })?;
                if mode == mode::FULL {
                    runs_back_to_back.add(runs);
                }
                into.push(probed.saturating_sub(bare) as f64 / CALLS as f64);
            }
            let (time, runs) = self.on_own_thread(move || time_among_work(work_bytes))?;
            among_work.push(time);
            runs_among_work.add(runs);
        }
        drop(links);
        self.set_probe_mode(func, mode::FULL)?;
        Ok(ProbeCost {
            full_ns: median(&mut times[0]),
            count_only_ns: sessions.then(|| median(&mut times[1])),
            full_among_work_ns: median(&mut among_work),
            work_bytes,
            run_back_to_back_ns: runs_back_to_back.mean_ns(),
            run_among_work_ns: runs_among_work.mean_ns(),
        })
    }

    /// Runs `timing` on a thread of its own and, before the thread exits and its state goes,
    /// reads the probe runs the programs timed on it.
    fn on_own_thread<T: Send + 'static>(
        &self,
        timing: impl FnOnce() -> T + Send + 'static,
    ) -> Result<(T, TimedRuns), ProbeCostError> {
        let (done, timed) = mpsc::channel();
        let (exit, may_exit) = mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let out = timing();
            let _ = done.send((out, unsafe { libc::gettid() } as u32));
            let _ = may_exit.recv();
        });
        let timed = timed.recv();
        let runs = timed
            .as_ref()
            .ok()
            .and_then(|&(_, tid)| self.live_thread_state(tid))
            .map(|st| TimedRuns::of(&st.totals))
            .unwrap_or_default();
        drop(exit);
        thread.join().map_err(|_| ProbeCostError::Panicked)?;
        let (out, _) = timed.map_err(|_| ProbeCostError::Panicked)?;
        Ok((out, runs))
    }

    /// The state of live thread `tid`, if it has one.
    fn live_thread_state(&self, tid: u32) -> Option<ThreadState> {
        let slots: Array<&MapData, ThreadState> = map_ref(&self.ebpf, "THREAD_SLOTS").ok()?;
        threads::read(&slots, threads::slot(tid), tid).or_else(|| {
            map_ref::<HashMap<&MapData, u32, ThreadState>>(&self.ebpf, "THREADS")
                .ok()?
                .get(&tid, 0)
                .ok()
        })
    }

    fn set_probe_mode(&mut self, func: u32, mode: u32) -> Result<(), CaptureError> {
        let mut governance: Array<_, Governance> = map_mut(&mut self.ebpf, "GOVERNANCE")?;
        governance
            .set(
                func,
                Governance {
                    mode,
                    ..Governance::default()
                },
                0,
            )
            .map_err(|e| CaptureError::Io {
                what: format!("setting the probe mode of function {func}"),
                source: std::io::Error::other(e),
            })
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The functions the probe cost is measured at (an ordinary call and a polling one), and their
/// twin that is never probed. Not inlined, and with a call inside, so that each keeps a frame:
/// it starts with a push, which the kernel emulates at a probe, as at an MPI function, rather
/// than single-stepping it.
#[inline(never)]
#[no_mangle]
pub extern "C" fn mpiburst_probe_cost_target(x: u64) -> u64 {
    probe_cost_work(x) ^ std::hint::black_box(1)
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn mpiburst_probe_cost_polled(x: u64) -> u64 {
    probe_cost_work(x) ^ std::hint::black_box(3)
}

#[inline(never)]
#[no_mangle]
pub extern "C" fn mpiburst_probe_cost_bare(x: u64) -> u64 {
    probe_cost_work(x) ^ std::hint::black_box(2)
}

#[inline(never)]
fn probe_cost_work(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_add(1)
}

/// The median ns of a probed call less that of an unprobed one, each call timed alone after a
/// write pass over `work_bytes`, the two alternating.
fn time_among_work(work_bytes: u64) -> f64 {
    let mut work = vec![0u8; work_bytes as usize];
    let mut times = [Vec::new(), Vec::new()];
    let mut x = 0;
    for i in 0..CALLS_AMONG_WORK {
        for (f, into) in [mpiburst_probe_cost_bare, mpiburst_probe_cost_target]
            .into_iter()
            .zip(&mut times)
        {
            work.fill(i as u8);
            std::hint::black_box(&mut work);
            let start = Instant::now();
            x = std::hint::black_box(f(x));
            into.push(start.elapsed().as_nanos() as f64);
        }
    }
    let [mut bare, mut probed] = times;
    (median(&mut probed) - median(&mut bare)).max(0.0)
}

/// The size of the first CPU's level 2 cache (its own, on most processors: the largest a core
/// does not share), from sysfs; DEFAULT_WORK_BYTES where the kernel lists none.
fn core_cache_bytes() -> u64 {
    let caches = std::fs::read_dir("/sys/devices/system/cpu/cpu0/cache")
        .into_iter()
        .flatten();
    caches
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("index"))
        .find_map(|entry| {
            let read = |name: &str| std::fs::read_to_string(entry.path().join(name)).ok();
            let level = read("level")?;
            let kind = read("type")?;
            (level.trim() == "2" && kind.trim() != "Instruction")
                .then(|| cache_size_bytes(&read("size")?))
                .flatten()
        })
        .unwrap_or(DEFAULT_WORK_BYTES)
}

/// A sysfs cache size ("1024K", "2M", "512").
fn cache_size_bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let (digits, unit) = match text.strip_suffix('K') {
        Some(d) => (d, 1 << 10),
        None => match text.strip_suffix('M') {
            Some(d) => (d, 1 << 20),
            None => (text, 1),
        },
    };
    digits
        .parse::<u64>()
        .ok()
        .map(|n| n * unit)
        .filter(|&n| n > 0)
}

/// Calls `f` `calls` times, in ns.
fn time_calls(f: extern "C" fn(u64) -> u64, calls: u64) -> u64 {
    let start = Instant::now();
    let mut x = 0;
    for _ in 0..calls {
        x = std::hint::black_box(f(x));
    }
    std::hint::black_box(x);
    start.elapsed().as_nanos() as u64
}

/// This executable's file and the file offsets of the probes on the ordinary and the polling
/// target (their first instruction the kernel emulates).
fn calibration_points() -> Result<(PathBuf, [u64; 2]), ProbeCostError> {
    let maps = proc::read_maps(std::process::id())?;
    let point = |f: extern "C" fn(u64) -> u64| {
        let address = f as *const () as u64;
        let mapping = maps
            .iter()
            .find(|m| m.start <= address && address < m.end && m.path.is_some())
            .ok_or(ProbeCostError::Unmapped)?;
        // SAFETY: the function's first bytes are mapped executable code of this process.
        let code = unsafe { std::slice::from_raw_parts(address as *const u8, 32) };
        let offset = address - mapping.start + mapping.offset;
        Ok::<_, ProbeCostError>((
            mapping.path.clone().unwrap_or_default(),
            offset + super::probe_offset(code, 0),
        ))
    };
    let (path, target) = point(mpiburst_probe_cost_target)?;
    let (_, polled) = point(mpiburst_probe_cost_polled)?;
    Ok((path, [target, polled]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_sizes_read_as_sysfs_writes_them() {
        assert_eq!(cache_size_bytes("1024K\n"), Some(1 << 20));
        assert_eq!(cache_size_bytes("2M"), Some(2 << 20));
        assert_eq!(cache_size_bytes("512"), Some(512));
        assert_eq!(cache_size_bytes("0K"), None);
        assert_eq!(cache_size_bytes("large"), None);
    }
}
