//! Daemon configuration: TOML with unknown fields rejected, every field documented with its
//! default. Precedence is CLI > file > defaults; `mpiburst config --default` prints this file.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use serde::{Deserialize, Serialize};

use crate::{analysis::online::OnlineParams, properties::PropertyConfig};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: toml::de::Error,
    },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub capture: CaptureConfig,
    pub mpi: MpiConfig,
    /// Online phase analysis of every job: windows, clustering, tracking.
    pub analysis: OnlineParams,
    /// Thresholds and exponents of the bottleneck properties.
    pub properties: PropertyConfig,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DaemonConfig {
    /// Address of the HTTP server for /metrics and the JSON API. Loopback by default.
    pub listen: SocketAddr,
    /// Node name exported with every job; empty means the host name.
    pub node: String,
    /// Seconds between per-job reports printed while jobs run; 0 prints only at job end.
    pub report_interval_s: f64,
    /// Seconds an ended job stays in /metrics before it is evicted.
    pub ended_job_grace_s: f64,
    /// Most jobs held (and exported); above it, ended jobs are evicted before their grace period.
    pub max_jobs: usize,
    /// Profile only processes in this cgroup or below it (a path as in /proc/PID/cgroup, in any
    /// hierarchy); empty profiles every process.
    pub cgroup: String,
    /// Most bursts kept in memory per job (oldest dropped first; totals stay exact).
    pub max_bursts_per_job: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct CaptureConfig {
    /// Bursts shorter than this many microseconds are summed in kernel instead of shipped.
    pub min_burst_us: u64,
    /// Milliseconds between ring-buffer drains (there is no wakeup per record).
    pub drain_interval_ms: u64,
    /// Milliseconds between reads of the in-kernel per-thread totals.
    pub stats_interval_ms: u64,
    /// Ring buffer size in MiB (rounded up to a power of two).
    pub ring_buffer_mib: u32,
    /// Counters read in BPF per burst: "auto" (hardware instructions and cycles if the PMU has
    /// them, else none), "hardware" (fail without a PMU), "software" (the software cpu-clock event
    /// in both slots: exercises the counter path where no PMU exists), or "off".
    pub counters: CounterMode,
    /// Count the file I/O of the MPI processes from the raw syscall tracepoints. While they are
    /// attached every system call on the node takes the kernel's traced path;
    /// `cargo xtask bench overhead` measures what that adds per call.
    pub file_io: bool,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CounterMode {
    Auto,
    Hardware,
    Software,
    Off,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct MpiConfig {
    /// Extra MPI library files to probe besides those found in the ld.so cache and in the
    /// memory maps of running processes.
    pub libraries: Vec<PathBuf>,
    /// The probed MPI functions. `count_arg` and `datatype_arg` are the zero-based positions of
    /// the (count, datatype) pair in the C binding whose product gives the call's bytes.
    pub functions: Vec<FunctionSpec>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FunctionSpec {
    pub name: String,
    pub class: FunctionClass,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count_arg: Option<u8>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datatype_arg: Option<u8>,
}

#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum FunctionClass {
    P2p,
    Collective,
    Completion,
    /// Test/probe calls that applications spin on: counted in kernel, never a burst boundary.
    Polling,
    OneSided,
    Io,
    Lifecycle,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            listen: "127.0.0.1:9464".parse().unwrap(),
            node: String::new(),
            report_interval_s: 10.0,
            ended_job_grace_s: 300.0,
            max_jobs: 64,
            cgroup: String::new(),
            max_bursts_per_job: 1_000_000,
        }
    }
}

impl Default for CaptureConfig {
    fn default() -> Self {
        CaptureConfig {
            min_burst_us: 100,
            drain_interval_ms: 100,
            stats_interval_ms: 1000,
            ring_buffer_mib: 4,
            counters: CounterMode::Auto,
            file_io: true,
        }
    }
}

/// (name, class, (count argument, datatype argument)) of one default probe.
type DefaultFunction = (&'static str, FunctionClass, Option<(u8, u8)>);

const DEFAULT_FUNCTIONS: &[DefaultFunction] = {
    use FunctionClass::*;
    &[
        ("MPI_Init", Lifecycle, None),
        ("MPI_Init_thread", Lifecycle, None),
        ("MPI_Finalize", Lifecycle, None),
        ("MPI_Send", P2p, Some((1, 2))),
        ("MPI_Recv", P2p, Some((1, 2))),
        ("MPI_Isend", P2p, Some((1, 2))),
        ("MPI_Irecv", P2p, Some((1, 2))),
        ("MPI_Ssend", P2p, Some((1, 2))),
        ("MPI_Bsend", P2p, Some((1, 2))),
        ("MPI_Rsend", P2p, Some((1, 2))),
        ("MPI_Issend", P2p, Some((1, 2))),
        ("MPI_Sendrecv", P2p, Some((1, 2))),
        ("MPI_Sendrecv_replace", P2p, Some((1, 2))),
        ("MPI_Barrier", Collective, None),
        ("MPI_Bcast", Collective, Some((1, 2))),
        ("MPI_Reduce", Collective, Some((2, 3))),
        ("MPI_Allreduce", Collective, Some((2, 3))),
        ("MPI_Gather", Collective, Some((1, 2))),
        ("MPI_Gatherv", Collective, Some((1, 2))),
        ("MPI_Scatter", Collective, Some((1, 2))),
        ("MPI_Scatterv", Collective, None),
        ("MPI_Allgather", Collective, Some((1, 2))),
        ("MPI_Allgatherv", Collective, Some((1, 2))),
        ("MPI_Alltoall", Collective, Some((1, 2))),
        ("MPI_Alltoallv", Collective, None),
        ("MPI_Reduce_scatter", Collective, None),
        ("MPI_Reduce_scatter_block", Collective, Some((2, 3))),
        ("MPI_Scan", Collective, Some((2, 3))),
        ("MPI_Exscan", Collective, Some((2, 3))),
        ("MPI_Ibarrier", Collective, None),
        ("MPI_Ibcast", Collective, Some((1, 2))),
        ("MPI_Ireduce", Collective, Some((2, 3))),
        ("MPI_Iallreduce", Collective, Some((2, 3))),
        ("MPI_Igather", Collective, Some((1, 2))),
        ("MPI_Iscatter", Collective, Some((1, 2))),
        ("MPI_Iallgather", Collective, Some((1, 2))),
        ("MPI_Ialltoall", Collective, Some((1, 2))),
        ("MPI_Wait", Completion, None),
        ("MPI_Waitall", Completion, None),
        ("MPI_Waitany", Completion, None),
        ("MPI_Waitsome", Completion, None),
        ("MPI_Probe", Completion, None),
        ("MPI_Mprobe", Completion, None),
        ("MPI_Mrecv", Completion, None),
        ("MPI_Test", Polling, None),
        ("MPI_Testall", Polling, None),
        ("MPI_Testany", Polling, None),
        ("MPI_Testsome", Polling, None),
        ("MPI_Iprobe", Polling, None),
        ("MPI_Improbe", Polling, None),
        ("MPI_Win_fence", OneSided, None),
        ("MPI_Win_lock", OneSided, None),
        ("MPI_Win_unlock", OneSided, None),
        ("MPI_Win_lock_all", OneSided, None),
        ("MPI_Win_unlock_all", OneSided, None),
        ("MPI_Win_flush", OneSided, None),
        ("MPI_Win_flush_all", OneSided, None),
        ("MPI_Win_post", OneSided, None),
        ("MPI_Win_start", OneSided, None),
        ("MPI_Win_complete", OneSided, None),
        ("MPI_Win_wait", OneSided, None),
        ("MPI_Put", OneSided, Some((1, 2))),
        ("MPI_Get", OneSided, Some((1, 2))),
        ("MPI_Accumulate", OneSided, Some((1, 2))),
        ("MPI_File_open", Io, None),
        ("MPI_File_close", Io, None),
        ("MPI_File_sync", Io, None),
        ("MPI_File_read", Io, Some((2, 3))),
        ("MPI_File_write", Io, Some((2, 3))),
        ("MPI_File_read_all", Io, Some((2, 3))),
        ("MPI_File_write_all", Io, Some((2, 3))),
        ("MPI_File_read_at", Io, Some((3, 4))),
        ("MPI_File_write_at", Io, Some((3, 4))),
        ("MPI_File_read_at_all", Io, Some((3, 4))),
        ("MPI_File_write_at_all", Io, Some((3, 4))),
    ]
};

impl Default for MpiConfig {
    fn default() -> Self {
        let functions = DEFAULT_FUNCTIONS
            .iter()
            .map(|&(name, class, bytes)| FunctionSpec {
                name: name.to_string(),
                class,
                count_arg: bytes.map(|b| b.0),
                datatype_arg: bytes.map(|b| b.1),
            })
            .collect();
        MpiConfig {
            libraries: Vec::new(),
            functions,
        }
    }
}

impl Config {
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let config: Config = toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::BTreeSet::new();
        if self.mpi.functions.len() > u16::MAX as usize {
            return Err(ConfigError::Invalid(
                "mpi.functions has more than 65535 entries".into(),
            ));
        }
        for f in &self.mpi.functions {
            if !f.name.starts_with("MPI_") {
                return Err(ConfigError::Invalid(format!(
                    "mpi.functions: {:?} is not a C MPI name; write it as MPI_Xxx",
                    f.name
                )));
            }
            if !seen.insert(f.name.as_str()) {
                return Err(ConfigError::Invalid(format!(
                    "mpi.functions lists {} twice",
                    f.name
                )));
            }
            match (f.count_arg, f.datatype_arg) {
                (None, None) => {}
                (Some(c), Some(d)) if c < 6 && d < 6 => {}
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "mpi.functions {}: count_arg and datatype_arg go together and must be \
                         below 6 (register arguments)",
                        f.name
                    )))
                }
            }
        }
        if !self.daemon.cgroup.is_empty() && !self.daemon.cgroup.starts_with('/') {
            return Err(ConfigError::Invalid(format!(
                "daemon.cgroup = {:?}: write the path as /proc/PID/cgroup shows it, starting with /",
                self.daemon.cgroup
            )));
        }
        if self.daemon.max_jobs == 0 {
            return Err(ConfigError::Invalid(
                "daemon.max_jobs must be at least 1".into(),
            ));
        }
        if self.capture.drain_interval_ms == 0 || self.capture.stats_interval_ms == 0 {
            return Err(ConfigError::Invalid(
                "capture intervals must be at least 1 ms".into(),
            ));
        }
        if !(1..=1024).contains(&self.capture.ring_buffer_mib) {
            return Err(ConfigError::Invalid(
                "capture.ring_buffer_mib must be within 1..=1024".into(),
            ));
        }
        self.analysis
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("analysis: {e}")))
    }

    pub fn node_name(&self) -> String {
        if !self.daemon.node.is_empty() {
            return self.daemon.node.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into())
    }

    pub fn drain_interval(&self) -> Duration {
        Duration::from_millis(self.capture.drain_interval_ms)
    }

    pub fn stats_interval(&self) -> Duration {
        Duration::from_millis(self.capture.stats_interval_ms)
    }

    /// The complete default file, with each field's documentation as comments.
    pub fn default_toml() -> String {
        let d = Config::default();
        let mut out = String::from(
            "# mpiburst configuration. Every field is optional; shown here with its default.\n\
             # Precedence: command-line options > this file > defaults.\n\n",
        );
        out.push_str(&format!(
            "[daemon]\n\
             # Address of the HTTP server for /metrics and the JSON API.\n\
             listen = \"{}\"\n\
             # Node name exported with every job; empty means the host name.\n\
             node = \"\"\n\
             # Seconds between per-job reports while jobs run; 0 prints only at job end.\n\
             report_interval_s = {:?}\n\
             # Seconds an ended job stays in /metrics before it is evicted.\n\
             ended_job_grace_s = {:?}\n\
             # Most jobs held and exported; above it, ended jobs go before their grace period.\n\
             max_jobs = {}\n\
             # Profile only processes in this cgroup or below it, as /proc/PID/cgroup names it in any\n\
             # hierarchy (e.g. \"/system.slice/slurmstepd.scope\"); empty profiles every process.\n\
             cgroup = \"\"\n\
             # Most bursts kept in memory per job (oldest dropped first; totals stay exact).\n\
             max_bursts_per_job = {}\n\n",
            d.daemon.listen,
            d.daemon.report_interval_s,
            d.daemon.ended_job_grace_s,
            d.daemon.max_jobs,
            d.daemon.max_bursts_per_job
        ));
        out.push_str(&format!(
            "[capture]\n\
             # Bursts shorter than this (microseconds) are summed in kernel, not shipped.\n\
             min_burst_us = {}\n\
             # Milliseconds between ring-buffer drains (no wakeup per record).\n\
             drain_interval_ms = {}\n\
             # Milliseconds between reads of the in-kernel per-thread totals.\n\
             stats_interval_ms = {}\n\
             # Ring buffer size in MiB.\n\
             ring_buffer_mib = {}\n\
             # \"auto\" (hardware instructions+cycles if the PMU has them, else none), \"hardware\",\n\
             # \"software\" (cpu-clock in both slots, to exercise the counter path), or \"off\".\n\
             counters = \"auto\"\n\
             # Count the MPI processes' file I/O from the raw syscall tracepoints (read, write, open,\n\
             # close). While attached, every system call on the node takes the kernel's traced path\n\
             # (about 0.4 us more per call on a VM; `cargo xtask bench overhead` measures it here);\n\
             # false turns the I/O properties into \"not measured\".\n\
             file_io = true\n\n",
            d.capture.min_burst_us, d.capture.drain_interval_ms, d.capture.stats_interval_ms, d.capture.ring_buffer_mib
        ));
        out.push_str(
            "[mpi]\n\
             # Extra MPI library files to probe (the ld.so cache and running processes are searched).\n\
             libraries = []\n\
             # Probed functions. count_arg/datatype_arg: zero-based positions of the (count, datatype)\n\
             # pair in the C binding; their product is the call's bytes. Class \"polling\" functions\n\
             # are counted in kernel and never end a burst.\n\
             functions = [\n",
        );
        for f in &d.mpi.functions {
            let class = toml::Value::try_from(f.class).unwrap();
            match (f.count_arg, f.datatype_arg) {
                (Some(c), Some(t)) => out.push_str(&format!(
                    "  {{ name = \"{}\", class = {class}, count_arg = {c}, datatype_arg = {t} }},\n",
                    f.name
                )),
                _ => out.push_str(&format!("  {{ name = \"{}\", class = {class} }},\n", f.name)),
            }
        }
        out.push_str("]\n\n");
        // Generated from the types, so it cannot drift from them; the fields are documented on
        // `analysis::online::OnlineParams` and `analysis::tracking::TrackingParams`.
        #[derive(Serialize)]
        struct Analysis<'a> {
            analysis: &'a OnlineParams,
        }
        out.push_str(
            "# Online phase analysis: windows aligned to Unix time (window_s), re-clustering when a\n\
             # window closes or the provisional noise share rises, bounded samples, and tracking of\n\
             # phases across windows (stable ids).\n",
        );
        out.push_str(
            &toml::to_string(&Analysis {
                analysis: &d.analysis,
            })
            .expect("the defaults serialise"),
        );
        // The property file's own format, nested under [properties].
        out.push_str("\n[properties]\n");
        out.push_str(
            &PropertyConfig::default_toml().replace("\n[property.", "\n[properties.property."),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_file_parses_back_to_the_defaults() {
        let parsed: Config = toml::from_str(&Config::default_toml()).unwrap();
        assert_eq!(parsed, Config::default());
        parsed.validate().unwrap();
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = toml::from_str::<Config>("[capture]\nmin_burst = 5\n").unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }

    #[test]
    fn byte_arguments_must_come_in_pairs() {
        let mut c = Config::default();
        c.mpi.functions[3].datatype_arg = None;
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("go together"));
    }
}
