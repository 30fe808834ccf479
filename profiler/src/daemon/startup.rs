//! Start-up, from what costs nothing to what changes the node: the capabilities are checked,
//! the HTTP port bound and the lock file taken before the recording is truncated and the BPF
//! programs are loaded, so a daemon that cannot run, or a second one, changes nothing.

use std::{path::PathBuf, sync::Arc};

use tokio::sync::watch;

use super::{
    analysis::AnalysisWorker, instance, launchers::UnlistedLaunchers, libraries::Libraries,
    privileges, records::DrainRecords, Daemon, NodeState, Server,
};
use crate::{
    capture::{
        config::FunctionClass, governor::Governor, node_usage::NodeUsage, Capture, CaptureError,
        ProbeCost,
    },
    config::Config,
    discovery::{self, Binding, MpiLibrary},
    export::{
        http,
        printed::PrintedReports,
        published::Published,
        recording::{RankGroupSettings, RecordingHeader, RecordingWriter, FORMAT_VERSION},
        recording_sink::RecordingSink,
    },
    model::unix_now_ns,
    proc,
    properties::node::NodeProperties,
    store::{
        clock::Clock,
        ingest::{FunctionNames, Ingest},
        members::Members,
    },
};

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

impl Daemon {
    /// Checks the capabilities, binds the HTTP port and takes the lock file; then opens the
    /// recording if one is asked for, loads the BPF programs and attaches every MPI library
    /// already known.
    pub fn start(mut config: Config, recording: Option<PathBuf>) -> Result<Self, DaemonError> {
        privileges::check(config.mpi.hold_new_libraries)?;
        // A first call's hold is resumed by a daemon that may signal other users' processes;
        // without holds at library opens, CAP_KILL is not required, and where it is missing the
        // scheduler programs stay attached instead.
        if config.capture.scheduler_on_demand && !privileges::can_resume_others() {
            tracing::warn!(
                "capture.scheduler_on_demand needs CAP_KILL, to resume another user's process \
                 held at its first MPI call: the scheduler programs stay attached (about 0.1 us \
                 on every context switch of the node)"
            );
            config.capture.scheduler_on_demand = false;
        }
        let server = serve(&config)?;
        let node = config.node_name();
        let known = known_libraries(&config);
        let mut capture = Capture::load(&config.capture)?;
        let (counters_note, hardware_counters) = counters_in_use(&capture);
        let functions = config.mpi.function_names();
        let recording = match recording {
            Some(path) => Some(RecordingWriter::create(
                &path,
                recording_header(&config, &capture, &node, &counters_note),
            )?),
            None => None,
        };
        let (analysis, analysis_updates) =
            AnalysisWorker::start(config.analysis.clone(), config.daemon.max_bursts).map_err(
                |source| CaptureError::Io {
                    what: "the phase analysis thread".into(),
                    source,
                },
            )?;
        // Before the governor takes the map of the probes' modes the measurement sets.
        let probe_cost = measure_probe_cost(&mut capture);
        // Before any library is attached: the governed functions get links of their own.
        let governor = start_governor(&config, &mut capture, probe_cost);
        let clock = Clock::read();
        let memory_available_bytes = proc::node_memory_bytes().unwrap_or_else(|e| {
            tracing::warn!("node memory unknown ({e}): memory_used_share is not evaluated");
            0
        });
        let mut daemon = Daemon {
            libraries: Libraries::new(
                &functions,
                config.mpi.functions.clone(),
                config.mpi.hold_new_libraries,
                config.mpi.hold_limit(),
                config.mpi.library_read_timeout(),
            ),
            members: Members::new(node, config.daemon.cgroup.clone(), clock),
            ingest: Ingest::new(FunctionNames::new(functions), clock, hardware_counters),
            records: DrainRecords::default(),
            state: NodeState::default(),
            analysis,
            analysis_updates,
            usage: NodeUsage::new(config.capture.file_io),
            properties: NodeProperties::new(
                config.properties.clone(),
                (config.analysis.window_s * 1e9) as u64,
                hardware_counters,
                memory_available_bytes,
            ),
            recording: RecordingSink::new(recording),
            reports: PrintedReports::new(config.daemon.report_interval_s, counters_note),
            governor,
            probe_cost,
            clock,
            server,
            members_changed: false,
            unlisted_launchers: UnlistedLaunchers::default(),
            capture,
            config,
        };
        daemon.attach_known(&known);
        daemon.state.probes_attached = true;
        daemon.publish();
        Ok(daemon)
    }

    /// Attaches the libraries known at start, says what was attached, and starts watching the
    /// opens of new ones.
    fn attach_known(&mut self, known: &[MpiLibrary]) {
        for lib in known {
            self.libraries.attach_known(&mut self.capture, lib);
        }
        let attached = self.libraries.attacher.attached;
        tracing::info!(
            "attached {} probes to {attached} MPI libraries ({}); {}",
            self.capture.probes(),
            if self.capture.uprobe_sessions() {
                "uprobe sessions: a nested call's return runs no probe"
            } else {
                "an entry and a return probe per call"
            },
            counters_in_use(&self.capture).0
        );
        if attached == 0 {
            tracing::info!(
                "no MPI library known yet (none in the ld.so cache, in running processes or in \
                 `mpi.libraries`): the daemon attaches to MPI libraries as processes open them"
            );
        }
        self.libraries
            .start_holding(&mut self.capture, &self.config);
    }
}

/// Binds the HTTP port and takes the lock file.
fn serve(config: &Config) -> Result<Server, DaemonError> {
    let publisher = watch::Sender::new(Arc::new(Published::default()));
    let listen = config.daemon.listen;
    let (addr, thread) =
        http::serve(listen, publisher.subscribe()).map_err(|source| DaemonError::Listen {
            addr: listen,
            source,
        })?;
    let runtime_directory = std::env::var("RUNTIME_DIRECTORY").ok();
    let instance = instance::lock_path(&config.daemon.lock_file, runtime_directory.as_deref())
        .map(|path| instance::InstanceLock::acquire(&path))
        .transpose()?;
    Ok(Server {
        publisher,
        addr,
        _thread: thread,
        _instance: instance,
    })
}

/// The MPI libraries to attach at start. C libraries are probed from the start so no MPI_Init
/// is missed. Fortran libraries wait until a process maps one (they add hundreds of probes, and
/// every probe costs a grace period at detach); until then the C call inside each Fortran
/// wrapper counts the call.
fn known_libraries(config: &Config) -> Vec<MpiLibrary> {
    let configured = |l: &MpiLibrary| {
        config
            .mpi
            .libraries
            .iter()
            .any(|p| p.canonicalize().is_ok_and(|p| p == l.path))
    };
    let mut libraries: Vec<MpiLibrary> = discovery::discover_libraries(&config.mpi.libraries)
        .unwrap_or_else(|e| {
            // None at all is said after the attach, with what the daemon does about it.
            if !matches!(e, discovery::DiscoveryError::NoLibraries) {
                tracing::warn!("library discovery: {e}");
            }
            Vec::new()
        })
        .into_iter()
        .filter(|l| l.binding == Binding::C || configured(l))
        .collect();
    libraries.extend(discovery::all_process_libraries());
    libraries
}

/// What the counter slots hold, for the reports, and whether they are instructions and cycles.
pub(super) fn counters_in_use(capture: &Capture) -> (String, bool) {
    match &capture.counters {
        Ok(events) if events.iter().all(|e| e.is_hardware()) => (
            format!("hardware counters: {}, {}", events[0].name, events[1].name),
            true,
        ),
        Ok(events) => (
            format!(
                "software counters {} and {} in the counter slots (test mode; no instructions or cycles)",
                events[0].name, events[1].name
            ),
            false,
        ),
        Err(reason) => (reason.to_string(), false),
    }
}

/// The header of the recording: what the daemon measures and how.
fn recording_header(
    config: &Config,
    capture: &Capture,
    node: &str,
    counters_note: &str,
) -> RecordingHeader {
    RecordingHeader {
        version: FORMAT_VERSION,
        node: node.to_string(),
        started_ns: unix_now_ns(),
        min_burst_ns: config.capture.min_burst_ns(),
        counter_events: capture
            .counters
            .as_ref()
            .ok()
            .map(|e| e.map(|e| e.name.to_string())),
        counters_note: counters_note.to_string(),
        functions: config.mpi.function_names(),
        rank_groups: Some(RankGroupSettings {
            window_s: config.analysis.window_s,
            params: config.groups.clone(),
        }),
    }
}

/// Measures what a probe hit costs on this node, or says why it cannot (then no job gets an
/// estimate of what profiling cost it).
fn measure_probe_cost(capture: &mut Capture) -> Option<ProbeCost> {
    match capture.measure_probe_cost() {
        Ok(cost) => {
            let entry = cost
                .count_only_ns
                .map(|ns| format!(", {ns:.0} ns at entry only"))
                .unwrap_or_default();
            let run = |ns: Option<f64>| ns.map_or("-".into(), |ns| format!("{ns:.0} ns"));
            tracing::info!(
                "a probe hit costs {:.0} ns here among a code's work (each call after a pass over \
                 {} KiB, the core's cache), {:.0} ns back to back{entry}; a run of the probe \
                 program {} among work, {} back to back",
                cost.full_among_work_ns,
                cost.work_bytes >> 10,
                cost.full_ns,
                run(cost.run_among_work_ns),
                run(cost.run_back_to_back_ns),
            );
            Some(cost)
        }
        Err(e) => {
            tracing::warn!(
                "cannot measure what a probe hit costs ({e}): the jobs get no estimate of what \
                 profiling cost them"
            );
            None
        }
    }
}

/// Starts the probe governor, unless it is off or cannot run (then every call of a polling
/// function is probed, and a warning says so).
fn start_governor(
    config: &Config,
    capture: &mut Capture,
    probe_cost: Option<ProbeCost>,
) -> Option<Governor> {
    if !config.governor.enabled {
        return None;
    }
    match capture.start_governor() {
        Ok(handle) => {
            let polling = config
                .mpi
                .functions
                .iter()
                .enumerate()
                .filter(|(_, f)| f.class == FunctionClass::Polling)
                .map(|(id, _)| id as u32)
                .collect();
            Some(Governor::start(
                handle,
                config.governor.clone(),
                config.mpi.function_names(),
                polling,
                probe_cost,
            ))
        }
        Err(e) => {
            tracing::warn!(
                "probe governor off ({e}): every call of a polling function is probed, whatever \
                 it costs"
            );
            None
        }
    }
}
