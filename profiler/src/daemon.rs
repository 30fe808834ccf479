//! The daemon loop: attaches to MPI libraries as they are found, drains the kernel on timers,
//! maps processes to jobs, keeps the per-job store, and feeds the exports.
//!
//! Start-up goes from what costs nothing to what changes the node: the capabilities are checked,
//! the HTTP port bound and the lock file taken before the recording is truncated and the BPF
//! programs are loaded, so a daemon that cannot run, or a second one, changes nothing.

mod analysis;
mod attach;
mod file_reads;
mod governor;
mod groups;
mod instance;
mod libraries;
mod library_reads;
pub mod privileges;
mod records;

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::PathBuf,
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use profiler_common::{BurstRecord, BURST_HAS_COUNTERS, NO_FUNC};
use tokio::{signal::unix::SignalKind, sync::watch};

use crate::{
    analysis::online::PhasesSnapshot,
    capture::{
        self,
        config::FunctionClass,
        usage::{self, JobUsage, UsageTotals},
        Capture, CaptureError,
    },
    config::Config,
    discovery::{self, AddressResolver, Binding, MpiLibrary},
    export::{
        bottlenecks,
        http::{self, Published},
        phases,
        recording::{
            RankGroupSettings, RecordedBurst, RecordingEnd, RecordingHeader, RecordingWriter,
            FORMAT_VERSION,
        },
        report, SelfStats,
    },
    model::{is_lifecycle_function, unix_now_ns, Burst, HwCounters, JobId, Name},
    proc,
    properties::{LiveEvaluator, LiveProperties, PropertyConfig},
    store::{CallStats, Job, JobMeta, JobStore, RankRecord, RankTotals, RegionMarks, SiteStats},
};
use records::DrainRecords;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Privileges(#[from] privileges::PrivilegeError),
    #[error(transparent)]
    Instance(#[from] instance::InstanceError),
    #[error(transparent)]
    Capture(#[from] CaptureError),
    #[error(transparent)]
    Recording(#[from] crate::export::recording::RecordingError),
    #[error("cannot serve HTTP on {addr}: {source}; {}", listen_advice(source))]
    Listen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// What to do when the HTTP port cannot be bound.
fn listen_advice(error: &std::io::Error) -> &'static str {
    if error.kind() == std::io::ErrorKind::AddrInUse {
        "the port is in use, most likely by an mpiburst daemon already running: stop it first \
         (`systemctl stop mpiburst`), or choose another `daemon.listen` address (or --listen)"
    } else {
        "choose another `daemon.listen` address (or --listen)"
    }
}

/// Scan an exec'ed process's maps after these delays (counted from when the exec notification
/// is drained, itself up to one drain interval late): the dynamic loader maps its libraries
/// within milliseconds of exec; the later scans catch libraries opened with dlopen.
const EXEC_SCAN_DELAYS: [Duration; 3] = [
    Duration::ZERO,
    Duration::from_secs(1),
    Duration::from_secs(5),
];

/// How long the exec time of a process that is not (yet) a rank is kept. Every exec on the node
/// is noted, so this bounds the map (a minute of a node's execs); a rank makes its first call,
/// MPI_Init, within seconds of its exec, and one first seen later starts at its fork, to the
/// clock tick.
const EXEC_TIMES_KEPT: Duration = Duration::from_secs(60);

/// When a process started the program it runs, from its last exec seen (to the nanosecond)
/// and its fork as /proc gives it (to the clock tick, rounded down). An exec before the fork is
/// a former process's of the same pid, not yet forgotten.
fn program_start(exec_ns: Option<u64>, fork_ns: Option<u64>) -> Option<u64> {
    match (exec_ns, fork_ns) {
        (Some(exec), Some(fork)) => Some(exec.max(fork)),
        (exec, fork) => exec.or(fork),
    }
}

/// The identity of a pid as the store uses it.
#[derive(Clone)]
struct Member {
    job: JobId,
    rank: u32,
}

/// What the daemon knows about the node's jobs. Only the daemon's thread touches it; after every
/// update it publishes a copy without the burst buffers ([`NodeState::published`]) for the HTTP
/// server.
#[derive(Default)]
struct NodeState {
    store: JobStore,
    health: SelfStats,
    /// The online phase analysis of each job, as of the last tick.
    phases: BTreeMap<JobId, Arc<PhasesSnapshot>>,
    /// Each job's properties (life and last window), as of the last stats update.
    properties: BTreeMap<JobId, Arc<LiveProperties>>,
    /// Each job's kernel usage (CPU time, memory, file I/O) on this node.
    usage: BTreeMap<JobId, UsageTotals>,
    /// The start-up has attached the probes to the MPI libraries it found.
    probes_attached: bool,
    /// Each job's rank groups.
    groups: groups::GroupTrackers,
}

impl NodeState {
    fn published(&self) -> Published {
        Published {
            store: JobStore {
                jobs: self
                    .store
                    .jobs
                    .iter()
                    .map(|(id, job)| (id.clone(), job.without_bursts()))
                    .collect(),
            },
            bursts_held: self
                .store
                .jobs
                .iter()
                .map(|(id, job)| (id.clone(), job.bursts.len()))
                .collect(),
            health: self.health.clone(),
            phases: self.phases.clone(),
            properties: self.properties.clone(),
            usage: self.usage.clone(),
            probes_attached: self.probes_attached,
            rank_groups: self.groups.views.clone(),
        }
    }
}

pub struct Daemon {
    config: Config,
    node: String,
    capture: Capture,
    functions: Vec<String>,
    /// The names bursts carry, by function id, then "-" (no function) and "?" (an unknown id):
    /// shared, so that a burst costs no allocation for its names.
    function_names: Vec<Name>,
    state: NodeState,
    /// The HTTP server's view of `state`, replaced after every stats update and whenever a
    /// process joins a job.
    publisher: watch::Sender<Arc<Published>>,
    /// Where the HTTP server listens; it runs until `publisher` is dropped.
    addr: std::net::SocketAddr,
    _server: JoinHandle<()>,
    /// Held until the daemon exits.
    _instance: Option<instance::InstanceLock>,
    /// A process joined a job since the last publication.
    members_changed: bool,
    resolver: AddressResolver,
    /// Shared, so that looking a pid up for each burst copies no job id.
    members: HashMap<u32, Arc<Member>>,
    /// Processes outside `daemon.cgroup`: their data is dropped.
    outside: HashSet<u32>,
    /// Online phase analysis of every job, on its own thread; `None` once shut down.
    analysis: Option<analysis::AnalysisWorker>,
    /// Its snapshots after each tick, for the loop to publish.
    analysis_updates: tokio::sync::mpsc::UnboundedReceiver<analysis::Update>,
    /// The records of the current drain.
    records: DrainRecords,
    /// The bursts of the current drain for the analysis, by job, with the job's rank count.
    analysis_batch: BTreeMap<JobId, (u32, Vec<Burst>)>,
    /// Kernel usage (CPU time, memory, file I/O) per job, and the property evaluation.
    usage: BTreeMap<JobId, JobUsage>,
    evaluators: BTreeMap<JobId, LiveEvaluator>,
    property_config: PropertyConfig,
    /// The node's physical memory: what a job may use when nothing else says.
    memory_available_bytes: u64,
    scans: Vec<(Instant, u32)>,
    /// The last exec of each process seen to exec since the daemon started (CLOCK_MONOTONIC
    /// ns), until the process becomes a rank or `EXEC_TIMES_KEPT` has passed: a rank's start to
    /// the nanosecond (see `start_of`).
    exec_times: HashMap<u32, u64>,
    recording: Option<RecordingWriter>,
    /// Unix time minus CLOCK_MONOTONIC (the BPF clock), in ns.
    unix_offset_ns: i128,
    /// Unix time the daemon started, in ns.
    started_ns: u64,
    libraries: usize,
    /// Libraries found at run time: held processes, PMPI interposers.
    run_time_libraries: libraries::RunTimeLibraries,
    /// Where Open MPI datatypes keep their size, once an Open MPI library is attached.
    ompi_dtype_offset: Option<u64>,
    counters_note: String,
    hardware_counters: bool,
    last_report: Instant,
    /// The probe governor, unless it is off.
    governor: Option<governor::Governor>,
}

/// Writes to the recording; on an error (a full disk) the recording stops and says why, and
/// profiling goes on without it instead of ending the daemon.
fn write_recording(
    recording: &mut Option<RecordingWriter>,
    write: impl FnOnce(&mut RecordingWriter) -> Result<(), crate::export::recording::RecordingError>,
) {
    if let Some(w) = recording {
        if let Err(e) = write(w) {
            tracing::error!(
                "the recording stopped: {e}; profiling goes on without it (make room, then \
                 restart the daemon to record again)"
            );
            *recording = None;
        }
    }
}

/// Prints a report on standard output; a reader that went away (`mpiburst run | head`) is not
/// an error of the daemon, which goes on with its metrics and API.
fn print_report(text: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// Keeps where the job's processes mapped the modules of a burst's call sites, so that reports
/// can name them (see [`JobMeta::modules`]); the recording gets the job again when one is new.
fn note_modules(
    resolver: &AddressResolver,
    recording: &mut Option<RecordingWriter>,
    job: &mut Job,
    burst: &Burst,
) {
    let mut added = false;
    for site in [&burst.start_site, &burst.end_site] {
        if job.meta.modules.contains_key(site.module.as_ref()) {
            continue;
        }
        if let Some(path) = resolver.path_of(&site.module) {
            let path = path.display().to_string();
            job.meta.modules.insert(site.module.to_string(), path);
            added = true;
        }
    }
    if added {
        write_recording(recording, |w| w.job(&job.meta));
    }
}

/// A time of the BPF clock (CLOCK_MONOTONIC) as Unix time, given Unix time minus monotonic time.
fn to_unix_ns(unix_offset_ns: i128, monotonic_ns: u64) -> u64 {
    (monotonic_ns as i128 + unix_offset_ns) as u64
}

/// The kernel's clock (CLOCK_MONOTONIC) at Unix time `unix_ns`; the inverse of `to_unix_ns`.
fn monotonic_ns(unix_offset_ns: i128, unix_ns: u64) -> u64 {
    (unix_ns as i128 - unix_offset_ns).max(0) as u64
}

/// The shared name of function `id` in `names` (see `Daemon::function_names`): its own, "-" for
/// no function, "?" for an id the daemon did not attach.
fn function_name(names: &[Name], id: u32) -> Name {
    let known = names.len() - 2;
    let index = match id {
        NO_FUNC => known,
        id if (id as usize) < known => id as usize,
        _ => known + 1,
    };
    names[index]
}

impl Daemon {
    /// Checks the capabilities, binds the HTTP port and takes the lock file; then opens the
    /// recording if one is asked for, loads the BPF programs and attaches every MPI library
    /// already known.
    pub fn start(config: Config, recording: Option<PathBuf>) -> Result<Self, DaemonError> {
        privileges::check(config.mpi.hold_new_libraries)?;
        let publisher = watch::Sender::new(Arc::new(Published::default()));
        let listen = config.daemon.listen;
        let (addr, server) =
            http::serve(listen, publisher.subscribe()).map_err(|source| DaemonError::Listen {
                addr: listen,
                source,
            })?;
        let runtime_directory = std::env::var("RUNTIME_DIRECTORY").ok();
        let instance = instance::lock_path(&config.daemon.lock_file, runtime_directory.as_deref())
            .map(|path| instance::InstanceLock::acquire(&path))
            .transpose()?;
        let node = config.node_name();
        // C libraries are probed from the start so no MPI_Init is missed. Fortran libraries wait
        // until a process maps one (they add hundreds of probes, and every probe costs a grace
        // period at detach); until then the C call inside each Fortran wrapper counts the call.
        let configured = |l: &MpiLibrary| {
            config
                .mpi
                .libraries
                .iter()
                .any(|p| p.canonicalize().is_ok_and(|p| p == l.path))
        };
        let mut libraries: Vec<MpiLibrary> = discovery::discover_libraries(&config.mpi.libraries)
            .unwrap_or_else(|e| {
                // None at all is said below, with what the daemon does about it.
                if !matches!(e, discovery::DiscoveryError::NoLibraries) {
                    tracing::warn!("library discovery: {e}");
                }
                Vec::new()
            })
            .into_iter()
            .filter(|l| l.binding == Binding::C || configured(l))
            .collect();
        libraries.extend(discovery::all_process_libraries());
        let mut capture = Capture::load(&config.capture)?;
        let (counters_note, hardware_counters) = match &capture.counters {
            Ok(events) if events.iter().all(|e| e.is_hardware()) => {
                (format!("hardware counters: {}, {}", events[0].name, events[1].name), true)
            }
            Ok(events) => (
                format!(
                    "software counters {} and {} in the counter slots (test mode; no instructions or cycles)",
                    events[0].name, events[1].name
                ),
                false,
            ),
            Err(reason) => (reason.to_string(), false),
        };
        let functions = config.mpi.function_names();
        let property_config = config.properties.clone();
        let memory_available_bytes = proc::node_memory_bytes().unwrap_or_else(|e| {
            tracing::warn!("node memory unknown ({e}): memory_used_share is not evaluated");
            0
        });
        let recording = match recording {
            Some(path) => Some(RecordingWriter::create(
                &path,
                RecordingHeader {
                    version: FORMAT_VERSION,
                    node: node.clone(),
                    started_ns: unix_now_ns(),
                    min_burst_ns: config.capture.min_burst_ns(),
                    counter_events: capture
                        .counters
                        .as_ref()
                        .ok()
                        .map(|e| e.map(|e| e.name.to_string())),
                    counters_note: counters_note.clone(),
                    functions: functions.clone(),
                    rank_groups: Some(RankGroupSettings {
                        window_s: config.analysis.window_s,
                        params: config.groups.clone(),
                    }),
                },
            )?),
            None => None,
        };
        let (analysis, analysis_updates) =
            analysis::AnalysisWorker::start(config.analysis.clone(), config.daemon.max_bursts)
                .map_err(|source| {
                    DaemonError::Capture(CaptureError::Io {
                        what: "the phase analysis thread".into(),
                        source,
                    })
                })?;
        let function_names = functions
            .iter()
            .map(|f| Name::new(f))
            .chain([Name::new("-"), Name::new("?")])
            .collect();
        let run_time_libraries =
            libraries::RunTimeLibraries::new(&functions, config.mpi.library_read_timeout());
        // Before any library is attached: the governed functions get links of their own.
        let governor = config
            .governor
            .enabled
            .then(|| match capture.start_governor() {
                Ok(handle) => {
                    let polling = config
                        .mpi
                        .functions
                        .iter()
                        .enumerate()
                        .filter(|(_, f)| f.class == FunctionClass::Polling)
                        .map(|(id, _)| id as u32)
                        .collect();
                    Some(governor::Governor::start(
                        handle,
                        config.governor.clone(),
                        functions.clone(),
                        polling,
                    ))
                }
                Err(e) => {
                    tracing::warn!(
                        "probe governor off ({e}): every call of a polling function is probed, \
                         whatever it costs"
                    );
                    None
                }
            })
            .flatten();
        let mut daemon = Daemon {
            node,
            capture,
            functions,
            function_names,
            state: NodeState::default(),
            publisher,
            addr,
            _server: server,
            _instance: instance,
            members_changed: false,
            resolver: AddressResolver::new(),
            members: HashMap::new(),
            outside: HashSet::new(),
            analysis: Some(analysis),
            analysis_updates,
            records: DrainRecords::default(),
            analysis_batch: BTreeMap::new(),
            usage: BTreeMap::new(),
            evaluators: BTreeMap::new(),
            property_config,
            memory_available_bytes,
            scans: Vec::new(),
            exec_times: HashMap::new(),
            recording,
            unix_offset_ns: usage::clock_ns(libc::CLOCK_REALTIME) as i128
                - usage::clock_ns(libc::CLOCK_MONOTONIC) as i128,
            started_ns: unix_now_ns(),
            libraries: 0,
            run_time_libraries,
            ompi_dtype_offset: None,
            counters_note,
            hardware_counters,
            last_report: Instant::now(),
            governor,
            config,
        };
        for lib in &libraries {
            daemon.attach(lib);
        }
        tracing::info!(
            "attached {} probes to {} MPI libraries ({}); {}",
            daemon.capture.probes(),
            daemon.libraries,
            if daemon.capture.uprobe_sessions() {
                "uprobe sessions: a nested call's return runs no probe"
            } else {
                "an entry and a return probe per call"
            },
            daemon.counters_note
        );
        if daemon.libraries == 0 {
            tracing::info!(
                "no MPI library known yet (none in the ld.so cache, in running processes or in \
                 `mpi.libraries`): the daemon attaches to MPI libraries as processes open them"
            );
        }
        daemon.watch_library_opens();
        daemon.state.probes_attached = true;
        daemon.publish();
        Ok(daemon)
    }

    /// Publishes the current state to the HTTP server.
    fn publish(&mut self) {
        self.publisher
            .send_replace(Arc::new(self.state.published()));
        self.members_changed = false;
    }

    fn unix_ns(&self, monotonic_ns: u64) -> u64 {
        to_unix_ns(self.unix_offset_ns, monotonic_ns)
    }

    /// When process `pid` started the program it runs (Unix ns): see `program_start`. Both
    /// times are compared on the BPF programs' clock, and converted as the bursts are.
    fn start_of(&self, pid: u32) -> u64 {
        program_start(
            self.exec_times.get(&pid).copied(),
            usage::start_time_monotonic_ns(pid).ok(),
        )
        .map_or_else(unix_now_ns, |start| self.unix_ns(start))
    }

    /// When the gone process `pid` of a rank seen since `first_seen_ns` ended (Unix ns): the
    /// kernel's exit time, else (not tracked) `now`, when its absence was noticed.
    fn ended_at(&self, pid: u32, first_seen_ns: u64, now: u64) -> u64 {
        let exited = self.capture.exit_time(pid).map(|t| self.unix_ns(t));
        exited.unwrap_or(now).clamp(first_seen_ns, now)
    }

    /// Finds (or makes) the job and rank of a pid, and registers it in the store; `None` for a
    /// process outside `daemon.cgroup`.
    fn member(&mut self, pid: u32, state: &mut NodeState) -> Option<Arc<Member>> {
        if let Some(m) = self.members.get(&pid) {
            return Some(m.clone());
        }
        if self.outside.contains(&pid) {
            return None;
        }
        let scope = &self.config.daemon.cgroup;
        if !scope.is_empty() && !discovery::in_cgroup(pid, scope) {
            tracing::debug!("pid {pid} is outside cgroup {scope}: not profiled");
            self.outside.insert(pid);
            return None;
        }
        // From the process's start, but not before the daemon's: the kernel totals start then.
        // (The efficiencies use the region of interest from MPI_Init's return instead.)
        let first_seen_ns = self.start_of(pid).max(self.started_ns);
        self.exec_times.remove(&pid);
        let (meta, rank) = match discovery::identify(pid, &self.node) {
            Ok(id) => (
                JobMeta {
                    id: id.job.clone(),
                    node: self.node.clone(),
                    size: id.size,
                    source: format!("{:?}", id.source),
                    executable: proc::executable(pid)
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    build_id: discovery::build_id(&proc::executable_file(pid))
                        .ok()
                        .flatten(),
                    cgroup: id.cgroup.clone(),
                    modules: Default::default(),
                    first_seen_ns,
                    ended_ns: None,
                },
                id.rank,
            ),
            // Keep the data of a process that left before it could be identified.
            Err(e) => {
                tracing::debug!("pid {pid}: {e}");
                (
                    JobMeta {
                        id: JobId(format!("pid:{pid}")),
                        node: self.node.clone(),
                        size: 1,
                        source: format!("unidentified ({e})"),
                        executable: String::new(),
                        build_id: None,
                        cgroup: None,
                        modules: Default::default(),
                        first_seen_ns,
                        ended_ns: None,
                    },
                    0,
                )
            }
        };
        let member = Arc::new(Member {
            job: meta.id.clone(),
            rank,
        });
        let job = state.store.jobs.entry(meta.id.clone()).or_insert_with(|| {
            tracing::info!("new job {} ({}), {} ranks", meta.id, meta.source, meta.size);
            write_recording(&mut self.recording, |w| w.job(&meta));
            Job::new(meta)
        });
        job.ranks.entry(rank).or_insert_with(|| RankRecord {
            call_sites: Vec::new(),
            rank,
            pid,
            first_seen_ns,
            ended_ns: None,
            totals: RankTotals::default(),
            functions: BTreeMap::new(),
            region: Default::default(),
        });
        if let Err(e) = self.capture.track(pid) {
            tracing::warn!("pid {pid}: file I/O not counted, exit time approximate: {e}");
        }
        self.members.insert(pid, member.clone());
        self.members_changed = true;
        Some(member)
    }

    /// Takes in a run of burst records of one process: the job and its batch are looked up once
    /// per run, not per burst (a drain in a storm holds tens of thousands of records, grouped by
    /// process). The recording gets every burst, also of a job no longer held.
    fn ingest(&mut self, run: &[BurstRecord], state: &mut NodeState) {
        let Some(first) = run.first() else { return };
        let Some(member) = self.member(first.pid, state) else {
            return;
        };
        let mut job = state.store.jobs.get_mut(&member.job);
        let mut batch = match &job {
            Some(job) => {
                let batch = match self.analysis_batch.get_mut(&member.job) {
                    Some(batch) => batch,
                    None => self.analysis_batch.entry(member.job.clone()).or_default(),
                };
                batch.0 = job.ranks.len().max(1) as u32;
                batch.1.reserve(run.len());
                Some(batch)
            }
            None => None,
        };
        let first_new = batch.as_ref().map_or(0, |batch| batch.1.len());
        // The modules of the previous burst's sites, already noted in the job's metadata: a
        // run's sites nearly all share them, and comparing two names is cheaper than looking
        // them up.
        let mut noted: Option<[Name; 2]> = None;
        for record in run {
            let has_counters = record.flags & BURST_HAS_COUNTERS != 0;
            let burst = Burst {
                pid: record.pid,
                tid: record.tid,
                rank: member.rank,
                start_ns: to_unix_ns(self.unix_offset_ns, record.start_ns),
                duration_ns: record.duration_ns,
                oncpu_ns: record.oncpu_ns,
                counters: (has_counters && self.hardware_counters).then(|| HwCounters {
                    instructions: record.counters[0],
                    cycles: record.counters[1],
                }),
                start_func: function_name(&self.function_names, record.start_func),
                end_func: function_name(&self.function_names, record.end_func),
                start_site: self.resolver.resolve(record.pid, record.start_site),
                end_site: self.resolver.resolve(record.pid, record.end_site),
            };
            let modules = [burst.start_site.module, burst.end_site.module];
            if let Some(job) = job.as_deref_mut().filter(|_| noted != Some(modules)) {
                note_modules(&self.resolver, &mut self.recording, job, &burst);
                noted = Some(modules);
            }
            write_recording(&mut self.recording, |w| {
                w.burst(RecordedBurst {
                    job: member.job.clone(),
                    burst: burst.clone(),
                    event_counts: has_counters.then_some(record.counters),
                })
            });
            if let Some(batch) = batch.as_mut() {
                batch.1.push(burst);
            }
        }
        if let Some(batch) = batch {
            state.store.push_bursts(
                &member.job,
                batch.1[first_new..].iter().cloned(),
                self.config.daemon.max_bursts,
            );
        }
    }

    /// One drain: exec notifications, pending library scans, and the burst ring buffer. Publishes
    /// when a process joined a job, so the API lists a new job before its first stats update.
    pub fn drain(&mut self) -> Result<usize, DaemonError> {
        let mut state = std::mem::take(&mut self.state);
        let drained = self.drain_into(&mut state);
        self.state = state;
        if self.members_changed {
            self.publish();
        }
        drained
    }

    fn drain_into(&mut self, state: &mut NodeState) -> Result<usize, DaemonError> {
        self.handle_library_opens();
        let now = Instant::now();
        for exec in self.capture.drain_execs() {
            self.exec_times.insert(exec.pid, exec.exec_ns);
            self.scans
                .extend(EXEC_SCAN_DELAYS.iter().map(|d| (now + *d, exec.pid)));
        }
        self.start_scans(now);
        self.capture.forward_bpf_log();
        // Kept between drains, so that a storm's drains do not grow a new buffer each time.
        let mut records = std::mem::take(&mut self.records);
        self.capture.drain_bursts(|r| records.push(r));
        for run in records.grouped().chunk_by(|a, b| a.pid == b.pid) {
            self.ingest(run, state);
        }
        let drained = records.clear();
        self.records = records;
        for (job, (ranks, bursts)) in std::mem::take(&mut self.analysis_batch) {
            self.send_analysis(analysis::Request::Bursts { job, ranks, bursts });
        }
        Ok(drained)
    }

    /// Reads the exact in-kernel totals, notices ended ranks and jobs, prints reports, and
    /// publishes the result.
    pub fn update_totals(&mut self, final_update: bool) -> Result<(), DaemonError> {
        let mut state = std::mem::take(&mut self.state);
        let updated = self.update_totals_of(&mut state, final_update);
        self.state = state;
        self.publish();
        updated
    }

    fn update_totals_of(
        &mut self,
        state: &mut NodeState,
        final_update: bool,
    ) -> Result<(), DaemonError> {
        // Liveness first: whatever the kernel holds for a pid already gone is final. Drain after
        // it, so the last bursts of a process that just ended reach its job before it is forgotten.
        let gone: HashSet<u32> = self
            .members
            .keys()
            .chain(&self.outside)
            .copied()
            .filter(|&pid| !proc::is_alive(pid))
            .collect();
        self.drain_into(state)?;
        let totals = self.capture.read_totals()?;
        let mut per_process = capture::per_process(&totals);
        // The governor's measurement of the probe cost runs the probes in this process.
        per_process.remove(&std::process::id());
        let governor: Option<governor::Shared> = self
            .governor
            .as_ref()
            .map(|g| g.shared.lock().unwrap_or_else(|e| e.into_inner()).clone());
        let io = self.capture.read_io()?;
        let now = unix_now_ns();
        let now_mono = usage::clock_ns(libc::CLOCK_MONOTONIC);
        // The oldest start of a rank read now: demotions that ended before it mark no one.
        let mut oldest_start = now_mono;
        for (pid, process) in &per_process {
            let Some(member) = self.member(*pid, state) else {
                continue;
            };
            let Some(rank) = state
                .store
                .jobs
                .get_mut(&member.job)
                .and_then(|j| j.ranks.get_mut(&member.rank))
            else {
                continue;
            };
            let bursts = &process.bursts;
            rank.totals = RankTotals {
                bursts: bursts.bursts,
                burst_ns: bursts.burst_ns,
                burst_oncpu_ns: bursts.burst_oncpu_ns,
                filtered_bursts: bursts.filtered_bursts,
                filtered_ns: bursts.filtered_ns,
                dropped_bursts: bursts.dropped_bursts,
                counter_sums: self.capture.counters.is_ok().then_some(bursts.counters),
            };
            let name = |id: u32| {
                self.functions
                    .get(id as usize)
                    .cloned()
                    .unwrap_or_else(|| format!("#{id}"))
            };
            // The rank's life in the kernel's clock, to its exit or now. A process found gone in
            // this update has its end set below, after this reading: its exit time counts here
            // too, or a demotion that came after it would mark it.
            let ended = rank.ended_ns.or_else(|| {
                gone.contains(pid)
                    .then(|| self.ended_at(*pid, rank.first_seen_ns, now))
            });
            let life = (
                monotonic_ns(self.unix_offset_ns, rank.first_seen_ns),
                ended.map_or(now_mono, |t| monotonic_ns(self.unix_offset_ns, t)),
            );
            oldest_start = oldest_start.min(life.0);
            rank.functions = process
                .functions
                .iter()
                .map(|(&id, s)| {
                    let (count_only, sampled) = governor
                        .as_ref()
                        .map_or((false, false), |g| g.modes_within(id, life.0, life.1));
                    (
                        name(id),
                        CallStats {
                            calls: s.calls,
                            time_ns: s.time_ns,
                            bytes: s.bytes,
                            sized_calls: s.sized_calls,
                            count_only,
                            sampled,
                        },
                    )
                })
                .collect();
            // A function sampled while the rank ran may have been called only between two
            // windows: 0 calls seen, still a lower bound.
            for id in governor
                .iter()
                .flat_map(|g| g.sampled_within(life.0, life.1))
            {
                rank.functions.entry(name(id)).or_insert(CallStats {
                    sampled: true,
                    ..CallStats::default()
                });
            }
            rank.call_sites = process
                .sites
                .iter()
                .map(|(&(id, address), s)| SiteStats {
                    function: name(id),
                    site: self.resolver.resolve(*pid, address),
                    calls: s.calls,
                    bytes: s.bytes,
                    world_peer_calls: s.world_peer_calls,
                    world_peer_sum: s.world_peer_sum,
                })
                .collect();
            rank.call_sites
                .sort_by(|a, b| (&a.function, &a.site).cmp(&(&b.function, &b.site)));
            let marks = totals.regions.get(pid).copied().unwrap_or_default();
            let seen = |t: u64| (t != 0).then(|| self.unix_ns(t));
            rank.region = RegionMarks {
                init_return_ns: seen(marks.init_return_ns),
                finalize_entry_ns: seen(marks.finalize_entry_ns),
                open_calls_since_ns: totals
                    .open_calls
                    .iter()
                    .filter(|c| {
                        c.pid == *pid
                            && !self
                                .functions
                                .get(c.func as usize)
                                .is_some_and(|f| is_lifecycle_function(f))
                    })
                    .map(|c| self.unix_ns(c.entry_ns))
                    .collect(),
            };
        }
        self.update_usage(&io, &gone);
        let ended: HashSet<u32> = if final_update {
            self.members.keys().copied().collect()
        } else {
            gone.clone()
        };
        for pid in &ended {
            let Some(member) = self.members.get(pid).cloned() else {
                continue;
            };
            let Some(job) = state.store.jobs.get_mut(&member.job) else {
                continue;
            };
            if let Some(rank) = job.ranks.get_mut(&member.rank) {
                if gone.contains(pid) && rank.ended_ns.is_none() {
                    rank.ended_ns = Some(self.ended_at(*pid, rank.first_seen_ns, now));
                }
                write_recording(&mut self.recording, |w| w.rank(&member.job, rank));
            }
        }
        if !gone.is_empty() {
            self.capture.forget_processes(&gone)?;
            for pid in &gone {
                self.members.remove(pid);
                self.outside.remove(pid);
                self.resolver.forget(*pid);
            }
        }
        self.tick_phases(state, now);
        self.evaluate_properties(state, now);
        let mut finished = Vec::new();
        for job in state.store.jobs.values_mut() {
            if job.meta.ended_ns.is_none()
                && !job.ranks.is_empty()
                && job.ranks.values().all(|r| r.ended_ns.is_some())
            {
                job.meta.ended_ns = Some(now);
                finished.push(job.meta.id.clone());
                write_recording(&mut self.recording, |w| w.job(&job.meta));
            }
        }
        for id in &finished {
            let Some(job) = state.store.jobs.get_mut(id) else {
                continue;
            };
            let ranks = phases::node_ranks(job);
            let report = report::render(job, now, &self.counters_note);
            // Printed by the analysis thread once it has clustered the job: together, and
            // without holding up the loop. The bursts move there: nothing on this side reads an
            // ended job's bursts, and a copy of a full budget would double the daemon's memory.
            self.send_analysis(analysis::Request::Ended {
                job: Box::new(job.meta.clone()),
                ranks,
                bursts: std::mem::take(&mut job.bursts).into(),
                report,
                bottlenecks: state
                    .properties
                    .get(id)
                    .map(|live| bottlenecks::render(&live.job, "over its life on this node")),
            });
        }
        let (params, window_s) = (&self.config.groups, self.config.analysis.window_s);
        for id in state.groups.update(&state.store, now, params, window_s) {
            for rank in state.store.jobs[&id].ranks.values() {
                write_recording(&mut self.recording, |w| w.rank_reading(&id, rank, now));
            }
        }
        let interval = self.config.daemon.report_interval_s;
        if final_update || (interval > 0.0 && self.last_report.elapsed().as_secs_f64() >= interval)
        {
            self.last_report = Instant::now();
            for job in state.store.jobs.values().filter(|j| !j.is_ended()) {
                print_report(&format!(
                    "{}\n",
                    report::render(job, now, &self.counters_note)
                ));
            }
        }
        let grace = (self.config.daemon.ended_job_grace_s * 1e9) as u64;
        for id in state
            .store
            .evict_ended(now, grace, self.config.daemon.max_jobs)
        {
            tracing::info!(
                "job {id} evicted (ended over {} s ago, or more than {} jobs held)",
                self.config.daemon.ended_job_grace_s,
                self.config.daemon.max_jobs
            );
            self.send_analysis(analysis::Request::Forget(id.clone()));
            self.usage.remove(&id);
            self.evaluators.remove(&id);
            state.phases.remove(&id);
            state.properties.remove(&id);
            state.groups.forget(&id);
        }
        state.health = SelfStats {
            lost: self.capture.lost()?,
            programs: self.capture.program_stats(),
            probes: self.capture.probes(),
            libraries: self.libraries,
            library_opens: self.run_time_libraries.stats,
            counter_events: match &self.capture.counters {
                Ok(e) => format!("{},{}", e[0].name, e[1].name),
                Err(_) => "none".into(),
            },
            hardware_counters: self.hardware_counters,
            process: proc::read_process(std::process::id()).ok(),
            governor: governor.map(|g| g.stats).unwrap_or_default(),
        };
        if let Some(g) = &self.governor {
            g.shared
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .forget_before(oldest_start);
        }
        let kept_from = usage::clock_ns(libc::CLOCK_MONOTONIC)
            .saturating_sub(EXEC_TIMES_KEPT.as_nanos() as u64);
        self.exec_times.retain(|_, &mut exec| exec >= kept_from);
        write_recording(&mut self.recording, |w| w.flush());
        Ok(())
    }

    /// Reads the CPU time, memory and file I/O of every member process into its job's usage.
    fn update_usage(&mut self, io: &BTreeMap<u32, profiler_common::IoTotals>, gone: &HashSet<u32>) {
        for (pid, member) in &self.members {
            let file_io = self.config.capture.file_io;
            let job = self
                .usage
                .entry(member.job.clone())
                .or_insert_with(|| JobUsage::new(file_io));
            if let Some(counts) = io.get(pid) {
                job.update_io(*pid, counts.into());
            }
            if gone.contains(pid) {
                job.ended(*pid);
            } else if let Ok(u) = proc::read_process(*pid) {
                job.update(*pid, u);
            }
        }
    }

    /// Evaluates every job's properties (over its life and its last complete window) and
    /// publishes them.
    fn evaluate_properties(&mut self, state: &mut NodeState, now: u64) {
        let window_ns = (self.config.analysis.window_s * 1e9) as u64;
        for (id, job) in &state.store.jobs {
            let usage = self.usage.get(id).map(JobUsage::totals);
            if let Some(u) = usage {
                state.usage.insert(id.clone(), u);
            }
            let phases = state.phases.get(id).and_then(|p| p.last_window.as_ref());
            let live = self
                .evaluators
                .entry(id.clone())
                .or_insert_with(|| LiveEvaluator::new(window_ns, self.hardware_counters))
                .update(
                    job,
                    usage.as_ref(),
                    self.memory_available_bytes,
                    phases,
                    now,
                    &self.property_config,
                );
            state.properties.insert(id.clone(), Arc::new(live));
        }
    }

    /// Asks the analysis thread to close the windows due (they close on Unix time); it sends
    /// back every job's snapshot, which [`Daemon::take_analysis_updates`] publishes.
    fn tick_phases(&mut self, state: &NodeState, now: u64) {
        let ranks = state
            .store
            .jobs
            .iter()
            .map(|(id, job)| (id.clone(), job.ranks.len().max(1) as u32))
            .collect();
        self.send_analysis(analysis::Request::Tick { now_ns: now, ranks });
    }

    fn send_analysis(&self, request: analysis::Request) {
        if let Some(worker) = &self.analysis {
            worker.send(request);
        }
    }

    /// Takes the snapshots the analysis thread has sent since the last call, and publishes them.
    fn take_analysis_updates(&mut self, first: analysis::Update) {
        let mut update = Some(first);
        while let Some((id, snapshot)) = update {
            match snapshot {
                // A snapshot of a job evicted meanwhile is dropped with it.
                Some(s) if self.state.store.jobs.contains_key(&id) => {
                    self.state.phases.insert(id, s);
                }
                _ => {
                    self.state.phases.remove(&id);
                }
            }
            update = self.analysis_updates.try_recv().ok();
        }
        self.publish();
    }

    /// Runs until SIGINT or SIGTERM, then drains once more, writes the final state and detaches
    /// (dropping the BPF object closes every link).
    pub async fn run(mut self) -> Result<(), DaemonError> {
        let addr = self.addr;
        eprintln!(
            "mpiburst ready: metrics at http://{addr}/metrics, jobs at http://{addr}/api/jobs"
        );
        let mut drain = tokio::time::interval(self.config.capture.drain_interval());
        // The BPF side wakes this when the burst ring fills faster than the timer drains it.
        let wakeup = self.capture.bursts_wakeup()?;
        // The BPF side reports a process it holds at the open of a new MPI library at once.
        let library_opens = self.library_opens_ready()?;
        // SAFETY: the AsyncFd owns the descriptor (an OwnedFd), which stays open and names the
        // same ring buffer for as long as the AsyncFd lives.
        let ring = unsafe {
            tokio::io::unix::AsyncFd::register_with_interest(wakeup, tokio::io::Interest::READABLE)
        }
        .map_err(|e| {
            DaemonError::Capture(CaptureError::Io {
                what: "waiting on the burst ring buffer".into(),
                source: e.into(),
            })
        })?;
        let mut stats = tokio::time::interval(self.config.capture.stats_interval());
        // Both streams exist for the whole loop: a signal that arrives while a drain or an update
        // runs is kept for the next select (a stream made inside the loop would miss it).
        let signal = |kind: SignalKind, name: &str| {
            tokio::signal::unix::signal(kind).map_err(|source| {
                DaemonError::Capture(CaptureError::Io {
                    what: format!("{name} handler"),
                    source,
                })
            })
        };
        let (mut sigint, mut sigterm) = (
            signal(SignalKind::interrupt(), "SIGINT")?,
            signal(SignalKind::terminate(), "SIGTERM")?,
        );
        loop {
            tokio::select! {
                _ = drain.tick() => { self.drain()?; }
                ready = ring.readable() => {
                    if let Ok(mut guard) = ready {
                        self.drain()?;
                        guard.clear_ready();
                    }
                }
                ready = libraries::library_open_reported(&library_opens) => {
                    if let Ok(mut guard) = ready {
                        self.handle_library_opens();
                        guard.clear_ready();
                    }
                }
                finished = self.run_time_libraries.read_finished() => self.finish_read(finished),
                _ = stats.tick() => { self.update_totals(false)?; }
                Some(update) = self.analysis_updates.recv() => self.take_analysis_updates(update),
                _ = sigint.recv() => break,
                _ = sigterm.recv() => break,
            }
        }
        tracing::info!("shutting down: final drain");
        // No process may wait on the final drain, the recording or the last clustering, nor on
        // the governor's thread, which a window may hold for a grace period of the kernel.
        self.capture.release_held_processes();
        if let Some(g) = &mut self.governor {
            g.stop();
        }
        self.run_time_libraries.release_waiting();
        self.update_totals(true)?;
        if let Some(w) = self.recording.take() {
            let end = RecordingEnd {
                ended_ns: unix_now_ns(),
                lost: self.capture.lost()?,
            };
            if let Err(e) = w.finish(end) {
                tracing::error!("the recording could not be completed: {e}");
            }
        }
        // The phases of the jobs that ended last are printed before the daemon exits.
        if let Some(worker) = self.analysis.take() {
            worker.finish();
        }
        // Dropping the daemon drops the publisher, which stops the server.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn a_program_starts_at_its_exec_unless_the_exec_was_a_former_process_s() {
        // Fork known to the tick (rounded down), exec to the nanosecond after it.
        assert_eq!(
            program_start(Some(1_004_321), Some(1_000_000)),
            Some(1_004_321)
        );
        // An exec before the fork: a process that had the pid before.
        assert_eq!(
            program_start(Some(900_000), Some(1_000_000)),
            Some(1_000_000)
        );
        assert_eq!(program_start(None, Some(1_000_000)), Some(1_000_000));
        assert_eq!(program_start(Some(1_004_321), None), Some(1_004_321));
        assert_eq!(program_start(None, None), None);
    }

    /// A full disk: /dev/full takes the file's creation and fails every write.
    #[test]
    fn a_recording_that_cannot_be_written_stops_and_the_daemon_goes_on() {
        let header = RecordingHeader {
            version: FORMAT_VERSION,
            node: "n".into(),
            started_ns: 1,
            min_burst_ns: 1,
            counter_events: None,
            counters_note: String::new(),
            functions: Vec::new(),
            rank_groups: None,
        };
        let mut recording = Some(RecordingWriter::create(Path::new("/dev/full"), header).unwrap());
        write_recording(&mut recording, |w| w.flush());
        assert!(recording.is_none());
        // Nothing more is written, and nothing fails.
        write_recording(&mut recording, |w| w.flush());
    }
}
