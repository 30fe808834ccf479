//! The kernel's side of the probe governor: the probes of polling functions, one uprobe_multi
//! link per (library file, function), so that one function can be detached node-wide and
//! attached again for sampling windows; how the probes treat each function (`GOVERNANCE`); the
//! storm reports (`STORMS`); and what the sampling windows saw (`SAMPLES`).

use std::{
    collections::{BTreeMap, BTreeSet},
    os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use aya::maps::{Array, HashMap, MapData, RingBuf};
use profiler_common::{cookie, Governance, Sample, StormEvent, ThreadFunc, GOVERNED_FUNCS};

use super::{multi, multi::ProbeKind, read_record, CaptureError};

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
}
