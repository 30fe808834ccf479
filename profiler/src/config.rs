//! Daemon configuration: TOML with unknown fields rejected, every field documented with its
//! default. Precedence is CLI > file > defaults; `mpiburst config --default` prints this file.
//! The file gathers one section per stage, each defined, validated and documented by its stage
//! (`[capture]` and `[mpi]` by capture, `[analysis]` by analysis, `[properties]` by properties);
//! only `[daemon]` is defined here. No stage imports this module.

use std::{net::SocketAddr, path::PathBuf};

use serde::{Deserialize, Serialize};

use crate::{
    analysis::{
        groups::{GroupParams, InvalidGroupParams},
        online::{OnlineError, OnlineParams},
    },
    capture::config::{CaptureConfig, GovernorConfig, InvalidSetting, MpiConfig},
    properties::PropertyConfig,
};

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
    Daemon(#[from] InvalidDaemonSetting),
    #[error("invalid configuration: {0}")]
    Capture(#[from] InvalidSetting),
    #[error("invalid configuration: analysis: {0}")]
    Analysis(#[from] OnlineError),
    #[error("invalid configuration: groups: {0}")]
    Groups(#[from] InvalidGroupParams),
}

/// A `[daemon]` setting the file format accepts but the daemon cannot use.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum InvalidDaemonSetting {
    #[error("daemon.cgroup = {0:?}: write the path as /proc/PID/cgroup shows it, starting with /")]
    Cgroup(String),
    #[error("daemon.{name} = {seconds}: write a number of seconds, 0 or more")]
    Seconds { name: &'static str, seconds: f64 },
    #[error("daemon.max_jobs must be at least 1")]
    NoJobs,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub daemon: DaemonConfig,
    pub capture: CaptureConfig,
    pub mpi: MpiConfig,
    /// What the probes of polling functions may cost, and their demotion above it.
    pub governor: GovernorConfig,
    /// Online phase analysis of every job: windows, clustering, tracking.
    pub analysis: OnlineParams,
    /// Rank groups of every job (windows of `analysis.window_s`).
    pub groups: GroupParams,
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
    /// Most bursts kept in memory on the node, over all jobs, for the phases printed when a job
    /// ends: the oldest of the job holding the most go first; totals stay exact. As many may
    /// wait for the phase analysis, beyond which the daemon waits for it.
    pub max_bursts: usize,
    /// Lock file that keeps a second daemon from starting (it holds the running one's pid);
    /// empty means mpiburst.lock in the runtime directory systemd gives the service, or none
    /// when there is none (the listen address then keeps a second daemon away).
    pub lock_file: String,
}

impl Default for DaemonConfig {
    fn default() -> Self {
        DaemonConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 9464)),
            node: String::new(),
            report_interval_s: 10.0,
            ended_job_grace_s: 300.0,
            max_jobs: 64,
            cgroup: String::new(),
            max_bursts: 200_000,
            lock_file: String::new(),
        }
    }
}

impl Config {
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::from_toml_str(&text, path)
    }

    /// Parses and validates the text of a config file; `path` names it in errors.
    pub fn from_toml_str(text: &str, path: &std::path::Path) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        config.validate()?;
        Ok(config)
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        self.mpi.validate()?;
        self.governor.validate()?;
        if !self.daemon.cgroup.is_empty() && !self.daemon.cgroup.starts_with('/') {
            return Err(InvalidDaemonSetting::Cgroup(self.daemon.cgroup.clone()).into());
        }
        for (name, seconds) in [
            ("report_interval_s", self.daemon.report_interval_s),
            ("ended_job_grace_s", self.daemon.ended_job_grace_s),
        ] {
            if !(seconds.is_finite() && seconds >= 0.0) {
                return Err(InvalidDaemonSetting::Seconds { name, seconds }.into());
            }
        }
        if self.daemon.max_jobs == 0 {
            return Err(InvalidDaemonSetting::NoJobs.into());
        }
        self.capture.validate()?;
        self.analysis.validate()?;
        Ok(self.groups.validate()?)
    }

    pub fn node_name(&self) -> String {
        if !self.daemon.node.is_empty() {
            return self.daemon.node.clone();
        }
        crate::proc::kernel_setting("hostname").unwrap_or_else(|_| "localhost".into())
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
             # Most bursts kept in memory on the node, over all jobs, for the phases printed when a\n\
             # job ends: the oldest of the job holding the most go first; totals stay exact. As\n\
             # many may wait for the phase analysis, beyond which the daemon waits for it.\n\
             max_bursts = {}\n\
             # Lock file that keeps a second daemon from starting; it holds the running one's pid.\n\
             # Empty: mpiburst.lock in the runtime directory systemd gives the service\n\
             # ($RUNTIME_DIRECTORY), or none outside systemd (the listen address then keeps a\n\
             # second daemon away).\n\
             lock_file = \"\"\n\n",
            d.daemon.listen,
            d.daemon.report_interval_s,
            d.daemon.ended_job_grace_s,
            d.daemon.max_jobs,
            d.daemon.max_bursts
        ));
        out.push_str(&CaptureConfig::default_toml());
        out.push_str(&MpiConfig::default_toml());
        out.push_str(&GovernorConfig::default_toml());
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
        out.push_str(&format!(
            "\n# Rank groups (CallPath+Parameter clustering, Bahmani and Mueller): main groups by\n\
             # call path (the MPI functions called, at their call sites), subgroups by their calls\n\
             # and message sizes, re-clustered when a rank's call path changes for two windows of\n\
             # analysis.window_s.\n\
             [groups]\n\
             # Most groups per job; raised to the number of distinct call paths.\n\
             k = {}\n\
             # Relative difference within which calls or mean message sizes count as equal.\n\
             count_tolerance = {:?}\n\
             # Also split ranks whose mean peer relative to the rank differs at a call site (the\n\
             # corners of a stencil by orientation, workers by their distance to the master).\n\
             split_by_peers = {}\n",
            d.groups.k, d.groups.count_tolerance, d.groups.split_by_peers
        ));
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
    fn seconds_and_the_duration_filter_must_be_in_range() {
        let invalid = |text: &str| {
            Config::from_toml_str(text, std::path::Path::new("mpiburst.toml"))
                .unwrap_err()
                .to_string()
        };
        assert!(invalid("[daemon]\nreport_interval_s = nan\n").contains("report_interval_s"));
        assert!(invalid("[daemon]\nended_job_grace_s = -1.0\n").contains("ended_job_grace_s"));
        assert!(invalid("[capture]\nmin_burst_us = 9223372036854775807\n")
            .contains("capture.min_burst_us"));
        assert!(invalid("[mpi]\nlibrary_read_timeout_ms = 0\n").contains("library_read_timeout_ms"));
        let longest = "[capture]\nmin_burst_us = 3600000000\n";
        let config = Config::from_toml_str(longest, std::path::Path::new("mpiburst.toml")).unwrap();
        assert_eq!(config.capture.min_burst_ns(), 3_600_000_000_000);
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
