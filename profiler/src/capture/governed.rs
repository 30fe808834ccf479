//! The kernel's side of the probe governor: the probes of polling functions, one uprobe_multi
//! link per (library file, function), so that one function can be detached node-wide and
//! attached again for sampling windows; how the probes treat each function (`GOVERNANCE`); the
//! storm reports (`STORMS`); what the sampling windows saw (`SAMPLES`); and the measured cost of
//! a probe hit on this node.

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Instant,
};

use aya::maps::{Array, HashMap, MapData, RingBuf};
use profiler_common::{cookie, mode, Governance, Sample, StormEvent, ThreadFunc, GOVERNED_FUNCS};

use super::{multi, multi::ProbeKind, read_record, CaptureError};
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

/// One function's probe points in one library file, and its link while attached.
struct FunctionLink {
    path: PathBuf,
    /// The file attached first, held open: attached again through it, the probes land in that
    /// file even after its path names another (an upgrade) or none (a container's gone).
    file: Option<std::fs::File>,
    offsets: Vec<u64>,
    cookies: Vec<u64>,
    link: Option<OwnedFd>,
}

impl FunctionLink {
    /// The path the kernel resolves to the file attached first.
    fn attach_path(&self) -> PathBuf {
        match &self.file {
            Some(f) => crate::proc::own_open_file(f.as_raw_fd()),
            None => self.path.clone(),
        }
    }
}

/// The governed functions' links, by function id: shared by the capture, which adds the points of
/// every library it attaches, and the governor, which detaches and attaches them.
#[derive(Default)]
pub(super) struct GovernedLinks {
    by_func: BTreeMap<u32, Vec<FunctionLink>>,
    /// Functions the governor has detached: a library attached meanwhile waits for the next
    /// window of sampling too.
    detached: BTreeSet<u32>,
}

impl GovernedLinks {
    /// Adds the points of `func` in one library file and attaches them, unless the function is
    /// detached.
    pub(super) fn add(
        &mut self,
        program: BorrowedFd<'_>,
        path: &Path,
        func: u32,
        offsets: Vec<u64>,
        cookies: Vec<u64>,
    ) -> std::io::Result<()> {
        let link = if self.detached.contains(&func) {
            None
        } else {
            Some(multi::attach(
                program,
                ProbeKind::Session,
                path,
                &offsets,
                &cookies,
                0,
            )?)
        };
        self.by_func.entry(func).or_default().push(FunctionLink {
            path: path.to_path_buf(),
            file: std::fs::File::open(path).ok(),
            offsets,
            cookies,
            link,
        });
        Ok(())
    }
}

impl Drop for GovernedLinks {
    fn drop(&mut self) {
        close_together(
            self.by_func
                .values_mut()
                .flatten()
                .filter_map(|l| l.link.take())
                .collect(),
        );
    }
}

/// Closes links each on a thread of its own, and returns when all are closed. The kernel removes
/// a link's probes after a grace period; closed one after the other, the last would wait for
/// one grace period per link.
fn close_together(links: Vec<OwnedFd>) {
    std::thread::scope(|s| {
        for link in links {
            s.spawn(move || drop(link));
        }
    });
}

/// Whether an attach point is governed: polling functions whose id `GOVERNANCE` has room for.
pub(super) fn governed(cookie: u64) -> Option<u32> {
    let func = cookie::func(cookie);
    (cookie::polling(cookie) && func < GOVERNED_FUNCS).then_some(func)
}

/// The governor's handle on the kernel side; it owns the governor's maps.
pub struct GovernorHandle {
    program: OwnedFd,
    links: Arc<Mutex<GovernedLinks>>,
    governance: Array<MapData, Governance>,
    samples: HashMap<MapData, ThreadFunc, Sample>,
    storms: RingBuf<MapData>,
}

impl GovernorHandle {
    pub(super) fn new(
        program: OwnedFd,
        links: Arc<Mutex<GovernedLinks>>,
        governance: Array<MapData, Governance>,
        samples: HashMap<MapData, ThreadFunc, Sample>,
        storms: RingBuf<MapData>,
    ) -> Self {
        GovernorHandle {
            program,
            links,
            governance,
            samples,
            storms,
        }
    }

    /// How the probes are to treat `func` from now on.
    pub fn set(&mut self, func: u32, governance: Governance) -> Result<(), CaptureError> {
        self.governance
            .set(func, governance, 0)
            .map_err(|e| CaptureError::Io {
                what: format!("setting the probe mode of function {func}"),
                source: std::io::Error::other(e),
            })
    }

    /// When a thread last polled a count-only `func` fast enough to storm if it were probed in
    /// full (CLOCK_MONOTONIC ns; `None`: not since its mode was set, or the map cannot be read).
    pub fn full_storm_ns(&self, func: u32) -> Option<u64> {
        let stamp = self.governance.get(&func, 0).ok()?.full_storm_ns;
        (stamp != 0).then_some(stamp)
    }

    /// Detaches `func` in every library, and returns once the kernel has removed its probes
    /// (after a grace period, tens of ms on a VM).
    pub fn detach(&mut self, func: u32) {
        let links = {
            let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
            links.detached.insert(func);
            links
                .by_func
                .get_mut(&func)
                .map(|v| v.iter_mut().filter_map(|l| l.link.take()).collect())
                .unwrap_or_default()
        };
        close_together(links);
    }

    /// Attaches `func` again in every library; the first failure, after trying them all.
    pub fn attach(&mut self, func: u32) -> Result<(), CaptureError> {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        links.detached.remove(&func);
        let mut failed = None;
        for l in links.by_func.get_mut(&func).into_iter().flatten() {
            if l.link.is_some() {
                continue;
            }
            match multi::attach(
                self.program.as_fd(),
                ProbeKind::Session,
                &l.attach_path(),
                &l.offsets,
                &l.cookies,
                0,
            ) {
                Ok(link) => l.link = Some(link),
                Err(source) => {
                    failed.get_or_insert(CaptureError::Attach {
                        function: format!("function {func}"),
                        path: l.path.clone(),
                        program: super::SESSION_PROGRAM,
                        source,
                    });
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Takes (reads and deletes) what the sampling windows saw of `func`.
    pub fn take_samples(&mut self, func: u32) -> Vec<(ThreadFunc, Sample)> {
        let keys: Vec<ThreadFunc> = self
            .samples
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.func == func)
            .collect();
        keys.into_iter()
            .filter_map(|k| {
                let sample = self.samples.get(&k, 0).ok();
                let _ = self.samples.remove(&k);
                sample.map(|s| (k, s))
            })
            .collect()
    }

    /// The storms reported since the last call.
    pub fn drain_storms(&mut self) -> Vec<StormEvent> {
        let mut events = Vec::new();
        while let Some(item) = self.storms.next() {
            events.extend(read_record::<StormEvent>(&item));
        }
        events
    }

    /// The storm ring's descriptor, readable when a storm is reported.
    pub fn storms_fd(&self) -> i32 {
        self.storms.as_raw_fd()
    }

    /// Measures what a probe hit of a governed function costs here, in ns per call: the session
    /// program at a function of this executable, attached for this process only, probed in full
    /// and counted at entry only, against the function without probes. The median of `rounds`
    /// alternating rounds of `calls` calls each, on a thread of its own (whose state the kernel
    /// frees when it exits).
    pub fn measure_probe_cost(
        &mut self,
        rounds: usize,
        calls: u64,
    ) -> Result<ProbeCost, ProbeCostError> {
        let (path, offset) = calibration_point()?;
        let func = GOVERNED_FUNCS - 1;
        let cookie = cookie::encode(
            func as u16,
            cookie::NO_ARG,
            cookie::NO_ARG,
            cookie::DTYPE_NONE,
            cookie::POLLING,
        );
        let link = multi::attach(
            self.program.as_fd(),
            ProbeKind::Session,
            &path,
            &[offset],
            &[cookie],
            std::process::id(),
        )
        .map_err(|source| CaptureError::Attach {
            function: "mpiburst_probe_cost_target".into(),
            path: path.clone(),
            program: super::SESSION_PROGRAM,
            source,
        })?;
        let mut full = Vec::new();
        let mut count_only = Vec::new();
        for _ in 0..rounds {
            for (mode, into) in [(mode::FULL, &mut full), (mode::COUNT_ONLY, &mut count_only)] {
                self.set(
                    func,
                    Governance {
                        mode,
                        ..Governance::default()
                    },
                )?;
                let (bare, probed) = std::thread::spawn(move || {
                    (
                        time_calls(mpiburst_probe_cost_bare, calls),
                        time_calls(mpiburst_probe_cost_target, calls),
                    )
                })
                .join()
                .map_err(|_| ProbeCostError::Panicked)?;
                into.push(probed.saturating_sub(bare) as f64 / calls as f64);
            }
        }
        drop(link);
        let _ = self.set(func, Governance::default());
        Ok(ProbeCost {
            full_ns: median(&mut full),
            count_only_ns: median(&mut count_only),
        })
    }
}

/// What a probe hit of a governed function costs, in ns per call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProbeCost {
    /// Entry and return probed.
    pub full_ns: f64,
    /// Entry only.
    pub count_only_ns: f64,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The function the probe cost is measured at, and its twin that is never probed. Not inlined,
/// and with a call inside, so that each keeps a frame: it starts with a push, which the kernel
/// emulates at a probe, as at an MPI function, rather than single-stepping it.
#[inline(never)]
#[no_mangle]
pub extern "C" fn mpiburst_probe_cost_target(x: u64) -> u64 {
    probe_cost_work(x) ^ std::hint::black_box(1)
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

/// This executable's file and the file offset of the probe on the target (its first instruction
/// the kernel emulates).
fn calibration_point() -> Result<(PathBuf, u64), ProbeCostError> {
    let address = mpiburst_probe_cost_target as *const () as u64;
    let maps = proc::read_maps(std::process::id())?;
    let mapping = maps
        .iter()
        .find(|m| m.start <= address && address < m.end && m.path.is_some())
        .ok_or(ProbeCostError::Unmapped)?;
    // SAFETY: the function's first bytes are mapped executable code of this process.
    let code = unsafe { std::slice::from_raw_parts(address as *const u8, 32) };
    let path = mapping.path.clone().unwrap_or_default();
    let offset = address - mapping.start + mapping.offset;
    Ok((path, offset + super::probe_offset(code, 0)))
}
