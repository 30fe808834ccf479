//! Command line. Options given here override the config file, which overrides the defaults.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
};

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::{
    capture::config::CounterMode,
    config::{Config, ConfigError},
    export::client::{ClientError, DaemonClient},
};

#[derive(Parser, Debug)]
#[command(
    name = "mpiburst",
    version,
    about = "Always-on eBPF profiler for MPI jobs"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run the daemon: probe MPI libraries, serve /metrics and the JSON API, print job reports.
    Run(RunArgs),
    /// Run the daemon and also write everything it captures to a recording file.
    Record {
        /// Recording file to write (JSON Lines, see docs/recording.md).
        #[arg(short, long)]
        output: PathBuf,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Print the report of every job in a recording or on a running daemon, with its bottlenecks
    /// (POP efficiencies, recommendations); optionally its phases and their pictures.
    ///
    /// From a recording, the phases are clustered from its bursts. From a daemon, the report shows
    /// the daemon's own online analysis: the table of the last clustered window (windows of
    /// `analysis.window_s`, 30 s by default, aligned to Unix time, so the first table comes a few
    /// seconds after the first window ends), with phase ids that stay the same from window to
    /// window, how the phases were tracked, and a table of a sample of the whole job so far.
    ///
    /// Either way the analysis covers the ranks that ran on that node: load balance and SPMD
    /// scores are over those ranks, not over the whole job. Given the recordings of all the
    /// job's nodes, it covers the whole job: they are merged, jobs matched by id.
    Report(ReportArgs),
    /// Match the phases of two runs of the same application (two recordings) and print how each
    /// phase changed: duration, time share, and instructions and IPC when measured.
    ///
    /// A run recorded on several nodes is given as its nodes' recordings joined by commas
    /// (n1.jsonl,n2.jsonl), merged into the job-wide run.
    Compare(CompareArgs),
    /// Predict the run time of an application at a new workload value (problem size, iteration
    /// count…) from recordings of the same build at two or more other values.
    ///
    /// Each recording's phases, with how often each repeats (W) and what one repetition costs
    /// (PET), make its signature; per phase, W and PET are fitted as functions of the workload
    /// (constant, log, linear, n log n, a line up to a cap, quadratic or cubic, chosen by how well
    /// each predicts a measured run it was not fitted to), and the prediction is Σ PET × W plus
    /// the time no phase covers. The run time is the one `mpiburst report` shows: MPI_Init's return to
    /// MPI_Finalize's entry of the slowest rank.
    Predict(PredictArgs),
    /// Serve one job-wide view of the jobs whose ranks run on many nodes: the daemons' API
    /// (`/api/jobs`, `/api/jobs/JOB` and its `/phases`, `/properties`, `/ranks`) answered for the
    /// whole job: the ranks of every node, POP and properties over all ranks, rank groups across
    /// nodes, and phases clustered over every node's samples. Stateless: it asks the nodes on
    /// every request (`mpiburst report http://THIS --job JOB --phases` reads it).
    Aggregate(AggregateArgs),
    /// Print configuration.
    Config {
        /// Print the complete default configuration file, with comments.
        #[arg(long)]
        default: bool,
        /// Print the effective configuration after merging this file and the defaults.
        #[arg(long, conflicts_with = "default")]
        file: Option<PathBuf>,
    },
    /// The hold guard, which the daemon starts: resumes the processes the daemon holds when it
    /// does not (see `mpi.hold_limit_s`).
    #[command(name = crate::capture::hold_guard::SUBCOMMAND, hide = true)]
    HoldGuard(HoldGuardArgs),
}

/// What the daemon passes its hold guard.
#[derive(Args, Debug)]
pub struct HoldGuardArgs {
    /// The descriptor of the BPF map of held processes.
    #[arg(long)]
    pub map_fd: i32,
    /// The read end of the pipe only the daemon writes to: its end of file says the daemon exited.
    #[arg(long)]
    pub daemon_fd: i32,
    /// Resume a process held longer than this, in ms.
    #[arg(long)]
    pub limit_ms: u64,
}

#[derive(Args, Debug, Clone)]
#[command(group = clap::ArgGroup::new("nodes").required(true))]
pub struct AggregateArgs {
    /// Address to serve the job-wide API on.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9465")]
    pub listen: SocketAddr,
    /// A node's daemon: HOST:PORT, or http://HOST:PORT (port 9464 when omitted); repeat for
    /// every node. A job's nodes are those of these daemons that list it.
    #[arg(long = "daemon", value_name = "ADDRESS", group = "nodes", value_parser = parse_daemon)]
    pub daemons: Vec<DaemonClient>,
    /// The Prometheus server that scrapes the daemons, or a server with Prometheus's query API
    /// that holds their series: HOST:PORT, http://HOST:PORT or HOST (port 9090 when omitted),
    /// then the API's path prefix if it is not at the root
    /// (http://vmselect:8481/select/0/prometheus).
    /// A job's nodes are the instances of its `mpiburst_job_info` series of the last 10 minutes.
    #[arg(long, value_name = "ADDRESS", group = "nodes", value_parser = parse_prometheus)]
    pub prometheus: Option<DaemonClient>,
    /// Seconds a node's daemon may take to connect, to answer, and for each read of its answer;
    /// a node that takes longer is named as not answering and the others are merged.
    #[arg(long, value_name = "SECONDS", default_value_t = 3.0, value_parser = parse_node_timeout)]
    pub node_timeout: f64,
}

fn parse_node_timeout(arg: &str) -> Result<f64, String> {
    match arg.parse::<f64>() {
        Ok(s) if (0.1..=600.0).contains(&s) => Ok(s),
        _ => Err(format!(
            "{arg}: give the seconds as a number from 0.1 to 600"
        )),
    }
}

/// A daemon's address, its port the daemons' default when omitted.
fn parse_daemon(arg: &str) -> Result<DaemonClient, String> {
    parse_address(arg, Config::default().daemon.listen.port())
}

/// Prometheus's query API, port 9090 when omitted, at the root unless a path says where.
fn parse_prometheus(arg: &str) -> Result<DaemonClient, String> {
    DaemonClient::parse_api(arg, 9090).map_err(|e| e.to_string())
}

fn parse_address(arg: &str, default_port: u16) -> Result<DaemonClient, String> {
    match DaemonClient::parse(arg, default_port) {
        Ok(Some(address)) => Ok(address),
        Ok(None) => Err(format!("{arg}: expected HOST:PORT or http://HOST:PORT")),
        Err(e) => Err(e.to_string()),
    }
}

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// The earlier run's recording, or the recordings of its nodes joined by commas
    /// (node1.jsonl,node2.jsonl): they are merged into the job-wide run.
    #[arg(value_name = "RECORDING[,RECORDING…]", value_parser = RecordingSet::parse)]
    pub before: RecordingSet,
    /// The later run's recording, or the recordings of its nodes joined by commas.
    #[arg(value_name = "RECORDING[,RECORDING…]", value_parser = RecordingSet::parse)]
    pub after: RecordingSet,
    /// The job in the earlier recording, when it holds several.
    #[arg(long, value_name = "ID")]
    pub job_before: Option<String>,
    /// The job in the later recording, when it holds several.
    #[arg(long, value_name = "ID")]
    pub job_after: Option<String>,
    /// What to print: tables for people, or one JSON document for scripts (docs/report-json.md).
    #[arg(long, value_enum, default_value_t)]
    pub format: OutputFormat,
}

#[derive(Args, Debug, Clone)]
pub struct PredictArgs {
    /// The workload value to predict the run time at.
    #[arg(long, value_name = "X", allow_negative_numbers = true)]
    pub at: f64,
    /// Each recording with the workload value its run had, e.g. run-64.jsonl=64. A recording
    /// that holds several jobs names the one meant: run-64.jsonl#JOB=64 (or see --executable).
    /// A run recorded on several nodes is the recordings of its nodes joined by commas, merged
    /// into the job-wide run: n1-64.jsonl,n2-64.jsonl=64 or n1-64.jsonl,n2-64.jsonl#JOB=64.
    /// A run that no one recorded is read from the daemon, or the aggregator for a job over
    /// several nodes, that still holds it after it ended: http://HOST:PORT#JOB=64 (its live
    /// signature, once the window in which the job ended has closed).
    #[arg(value_name = "RECORDING[,RECORDING…][#JOB]=X|ADDRESS#JOB=X", required = true, num_args = 2.., value_parser = RunArg::parse)]
    pub runs: Vec<RunArg>,
    /// In recordings that hold several jobs, take the one that ran this executable (its path,
    /// or its file name).
    #[arg(long, value_name = "PATH|NAME")]
    pub executable: Option<String>,
    /// Predict also outside the measured workloads (extrapolation is less reliable).
    #[arg(long)]
    pub extrapolate: bool,
    /// Largest relative miss on a held-out run for which a model with fewer coefficients is
    /// preferred.
    #[arg(long, default_value_t = crate::analysis::signature::fit::DEFAULT_TOLERANCE)]
    pub tolerance: f64,
    /// What to print: tables for people, or one JSON document for scripts (docs/report-json.md).
    #[arg(long, value_enum, default_value_t)]
    pub format: OutputFormat,
}

/// The recordings of one run: one file, or the files of its nodes joined by commas.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordingSet {
    /// As given on the command line: what the reports call the run.
    pub name: PathBuf,
    /// The files, in the order given.
    pub paths: Vec<PathBuf>,
}

impl RecordingSet {
    /// Splits at the commas, unless a file of the whole name exists (a path may contain one).
    pub fn parse(arg: &str) -> Result<RecordingSet, String> {
        let paths: Vec<PathBuf> = if Path::new(arg).exists() {
            vec![arg.into()]
        } else {
            arg.split(',').map(PathBuf::from).collect()
        };
        if paths.iter().any(|p| p.as_os_str().is_empty()) {
            return Err(format!(
                "expected RECORDING or RECORDING,RECORDING… (the recordings of one run's nodes), \
                 got {arg}"
            ));
        }
        Ok(RecordingSet {
            name: arg.into(),
            paths,
        })
    }
}

/// Where `mpiburst predict` reads one run.
#[derive(Clone, Debug, PartialEq)]
pub enum RunSource {
    /// The run's recordings: its bursts, clustered as `mpiburst report` does.
    Recordings(RecordingSet),
    /// A daemon or the aggregator that still holds the ended job: its live signature.
    Live(DaemonClient),
}

/// One run of `mpiburst predict`: `RECORDING[,RECORDING…][#JOB]=X` or `ADDRESS#JOB=X`.
#[derive(Clone, Debug, PartialEq)]
pub struct RunArg {
    /// As given on the command line, without the job and the value: what the output calls it.
    pub name: PathBuf,
    pub source: RunSource,
    pub job: Option<String>,
    pub workload: f64,
}

impl RunArg {
    /// The last `=` splits off the value and the last `#` the job, so a path may contain either.
    fn parse(arg: &str) -> Result<RunArg, String> {
        let (run, value) = arg.rsplit_once('=').ok_or_else(|| {
            format!("expected RECORDING=X (the workload value of that run), got {arg}")
        })?;
        let workload: f64 = value
            .trim()
            .parse()
            .map_err(|_| format!("the workload value of {run} is not a number: {value}"))?;
        let (path, job) = match run.rsplit_once('#') {
            Some((path, job)) if !job.is_empty() => (path, Some(job.to_string())),
            _ => (run, None),
        };
        if !workload.is_finite() {
            return Err(format!(
                "expected RECORDING[,RECORDING…][#JOB]=X with a finite number X, got {arg}"
            ));
        }
        let default_port = Config::default().daemon.listen.port();
        let live = if Path::new(path).exists() {
            None
        } else {
            DaemonClient::parse(path, default_port).map_err(|e| e.to_string())?
        };
        let source = match live {
            Some(_) if job.is_none() => {
                return Err(format!(
                    "a daemon or an aggregator holds many jobs: name the run's as \
                     {path}#JOB={value} (`mpiburst report {path}` lists them)"
                ))
            }
            Some(client) => RunSource::Live(client),
            None => RunSource::Recordings(RecordingSet::parse(path)?),
        };
        Ok(RunArg {
            name: path.into(),
            source,
            job,
            workload,
        })
    }
}

/// How `mpiburst report`, `compare` and `predict` print their results.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Tables and sentences.
    #[default]
    Text,
    /// One JSON document with the same content, in base units (docs/report-json.md).
    Json,
}

/// What `mpiburst report` reads.
#[derive(Clone, Debug, PartialEq)]
pub enum ReportTarget {
    /// A recording file.
    Recording(PathBuf),
    /// A running daemon's JSON API.
    Daemon(DaemonClient),
}

impl ReportTarget {
    /// An existing file is a recording, whatever its name. Otherwise `http://HOST[:PORT]` (the
    /// port of the default configuration when omitted) or `HOST:PORT` is a daemon, and anything
    /// else a recording path (which then fails to open with its own error).
    pub fn parse(arg: &str) -> Result<Self, ClientError> {
        if Path::new(arg).exists() {
            return Ok(ReportTarget::Recording(arg.into()));
        }
        let default_port = Config::default().daemon.listen.port();
        Ok(match DaemonClient::parse(arg, default_port)? {
            Some(daemon) => ReportTarget::Daemon(daemon),
            None => ReportTarget::Recording(arg.into()),
        })
    }
}

#[derive(Args, Debug, Clone)]
pub struct ReportArgs {
    /// A recording written by `mpiburst record`, or a running daemon: http://HOST:PORT or
    /// http://HOST (port 9464, the daemon's default) or HOST:PORT, the address it listens on
    /// (`mpiburst run --listen`). An existing file of that name is read as a recording. Several
    /// recordings, one per node of the same job (`mpiburst record --node NAME` on each), are
    /// merged into the job-wide report: every number over all their ranks.
    #[arg(value_name = "RECORDING…|ADDRESS", required = true, num_args = 1.., value_parser = ReportTarget::parse)]
    pub targets: Vec<ReportTarget>,
    /// Also print each job's phase table: from a recording, its bursts clustered into phases;
    /// from a daemon, its online analysis (last window, tracking, whole job so far).
    #[arg(long)]
    pub phases: bool,
    /// Write the phases' pictures to this HTML file (self-contained; with several jobs, one file
    /// per job named OUT-JOBID.html). From a recording: the cluster scatter plot and the rank ×
    /// time timeline. From a daemon: the phase sequences of each rank in the last window and the
    /// phase tables; the scatter plot and the timeline need every burst, which only a recording
    /// holds (`mpiburst record`).
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<PathBuf>,
    /// Only this job (as printed in the report's first line).
    #[arg(long, value_name = "ID", conflicts_with = "slurm_job")]
    pub job: Option<String>,
    /// Only the jobs of this Slurm job (its steps, and what mpirun or mpiexec launched in it): the
    /// job's summary by its scheduler id, e.g. from a Slurm epilog (packaging/slurm/).
    #[arg(long, value_name = "SLURM_JOB_ID")]
    pub slurm_job: Option<String>,
    /// What to print: tables for people, or one JSON document for scripts (docs/report-json.md).
    #[arg(long, value_enum, default_value_t)]
    pub format: OutputFormat,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Configuration file (TOML); see `mpiburst config --default`.
    #[arg(short, long)]
    pub config: Option<PathBuf>,
    /// Address for /metrics and the JSON API.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Node name exported with every job.
    #[arg(long)]
    pub node: Option<String>,
    /// Duration filter in microseconds: shorter bursts are summed in kernel only.
    #[arg(long)]
    pub min_burst_us: Option<u64>,
    /// Seconds between reports of running jobs (0: only at job end).
    #[arg(long)]
    pub report_interval: Option<f64>,
    /// Counters per burst.
    #[arg(long, value_enum)]
    pub counters: Option<CounterMode>,
    /// Extra MPI library file to probe (repeatable).
    #[arg(long = "library")]
    pub libraries: Vec<PathBuf>,
    /// Profile only processes in this cgroup or below it, as /proc/PID/cgroup names it (e.g. a
    /// Slurm step's).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,
    /// Probe every call of every polling function in full, whatever it costs (exact counts and
    /// times; the probe governor is off).
    #[arg(long)]
    pub no_governor: bool,
}

impl RunArgs {
    /// The effective configuration: these options over the file over the defaults.
    pub fn config(&self) -> Result<Config, ConfigError> {
        let mut c = match &self.config {
            Some(path) => Config::load(path)?,
            None => Config::default(),
        };
        if let Some(v) = self.listen {
            c.daemon.listen = v;
        }
        if let Some(v) = &self.node {
            c.daemon.node = v.clone();
        }
        if let Some(v) = self.min_burst_us {
            c.capture.min_burst_us = v;
        }
        if let Some(v) = self.report_interval {
            c.daemon.report_interval_s = v;
        }
        if let Some(v) = self.counters {
            c.capture.counters = v;
        }
        c.mpi.libraries.extend(self.libraries.iter().cloned());
        if let Some(v) = &self.cgroup {
            c.daemon.cgroup = v.clone();
        }
        if self.no_governor {
            c.governor.enabled = false;
        }
        c.validate()?;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line_overrides_file_overrides_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "[capture]\nmin_burst_us = 500\nring_buffer_mib = 8\n",
        )
        .unwrap();
        let cli = Cli::parse_from([
            "mpiburst",
            "run",
            "-c",
            path.to_str().unwrap(),
            "--min-burst-us",
            "50",
            "--cgroup",
            "/slurm/job_7",
        ]);
        let Command::Run(args) = cli.command else {
            panic!("parsed {:?}", cli.command)
        };
        let c = args.config().unwrap();
        assert_eq!(c.daemon.cgroup, "/slurm/job_7");
        assert_eq!(c.capture.min_burst_us, 50, "CLI wins over the file");
        assert_eq!(
            c.capture.ring_buffer_mib, 8,
            "the file wins over the default"
        );
        assert_eq!(
            c.capture.drain_interval_ms,
            Config::default().capture.drain_interval_ms
        );
    }

    #[test]
    fn report_takes_phases_html_and_job() {
        let cli = Cli::parse_from(["mpiburst", "report", "r.jsonl"]);
        let Command::Report(a) = cli.command else {
            panic!("parsed {:?}", cli.command)
        };
        assert!(!a.phases && a.html.is_none() && a.job.is_none());
        let cli = Cli::parse_from([
            "mpiburst", "report", "r.jsonl", "--phases", "--html", "o.html", "--job", "pmix:1",
        ]);
        let Command::Report(a) = cli.command else {
            panic!("parsed {:?}", cli.command)
        };
        assert_eq!(
            a.targets,
            [ReportTarget::Recording(PathBuf::from("r.jsonl"))]
        );
        assert!(a.phases);
        assert_eq!(a.html, Some(PathBuf::from("o.html")));
        assert_eq!(a.job.as_deref(), Some("pmix:1"));
    }

    #[test]
    fn report_and_compare_print_text_unless_json_is_asked_for() {
        let parse = |args: &[&str]| Cli::try_parse_from(args).map_err(|e| e.to_string());
        type Parsed = Result<OutputFormat, String>;
        let report_format = |args: &[&str]| -> Parsed {
            match parse(args)?.command {
                Command::Report(a) => Ok(a.format),
                other => panic!("parsed {other:?}"),
            }
        };
        let compare_format = |args: &[&str]| -> Parsed {
            match parse(args)?.command {
                Command::Compare(a) => Ok(a.format),
                other => panic!("parsed {other:?}"),
            }
        };
        assert_eq!(
            report_format(&["mpiburst", "report", "r.jsonl"]),
            Ok(OutputFormat::Text)
        );
        assert_eq!(
            report_format(&["mpiburst", "report", "r.jsonl", "--phases", "--format", "json"]),
            Ok(OutputFormat::Json)
        );
        assert_eq!(
            report_format(&["mpiburst", "report", "r.jsonl", "--format", "text"]),
            Ok(OutputFormat::Text)
        );
        assert_eq!(
            compare_format(&["mpiburst", "compare", "a.jsonl", "b.jsonl"]),
            Ok(OutputFormat::Text)
        );
        assert_eq!(
            compare_format(&["mpiburst", "compare", "a.jsonl", "b.jsonl", "--format=json"]),
            Ok(OutputFormat::Json)
        );
        let e = report_format(&["mpiburst", "report", "r.jsonl", "--format", "yaml"]).unwrap_err();
        assert!(e.contains("possible values: text, json"), "{e}");
    }

    #[test]
    fn report_reads_a_recording_or_a_daemon() {
        let target = |arg: &str| {
            let cli =
                Cli::try_parse_from(["mpiburst", "report", arg]).map_err(|e| e.to_string())?;
            let Command::Report(a) = cli.command else {
                panic!("parsed {:?}", cli.command)
            };
            Ok::<_, String>(a.targets.into_iter().next().unwrap())
        };
        let daemon = |s: &str| ReportTarget::Daemon(DaemonClient::parse(s, 9464).unwrap().unwrap());
        assert_eq!(
            target("http://127.0.0.1:9464"),
            Ok(daemon("127.0.0.1:9464"))
        );
        assert_eq!(
            target("127.0.0.1:9464"),
            Ok(daemon("http://127.0.0.1:9464/"))
        );
        assert_eq!(
            target("http://n1"),
            Ok(daemon("n1:9464")),
            "the daemon's default port"
        );
        assert_eq!(
            target("job.jsonl"),
            Ok(ReportTarget::Recording("job.jsonl".into()))
        );
        let e = target("https://n1:9464").unwrap_err();
        assert!(e.contains("plain HTTP; pass http://n1:9464"), "{e}");
    }

    #[test]
    fn a_run_is_one_recording_or_its_nodes_recordings() {
        let set = |arg: &str| RecordingSet::parse(arg).map(|s| s.paths);
        assert_eq!(set("r.jsonl"), Ok(vec![PathBuf::from("r.jsonl")]));
        assert_eq!(
            set("n1.jsonl,n2.jsonl"),
            Ok(vec![PathBuf::from("n1.jsonl"), PathBuf::from("n2.jsonl")])
        );
        assert!(set("n1.jsonl,").is_err());
        let dir = tempfile::tempdir().unwrap();
        let odd = dir.path().join("a,b.jsonl");
        std::fs::write(&odd, "").unwrap();
        assert_eq!(set(odd.to_str().unwrap()), Ok(vec![odd.clone()]));

        let run = RunArg::parse("n1.jsonl,n2.jsonl#pmix:7=64").unwrap();
        let RunSource::Recordings(recordings) = &run.source else {
            panic!("{run:?}")
        };
        assert_eq!(recordings.paths.len(), 2);
        assert_eq!(run.name, PathBuf::from("n1.jsonl,n2.jsonl"));
        assert_eq!((run.job.as_deref(), run.workload), (Some("pmix:7"), 64.0));

        let run = RunArg::parse("http://127.0.0.1:9465#pmix:7=64").unwrap();
        assert_eq!(
            run.source,
            RunSource::Live(
                DaemonClient::parse("127.0.0.1:9465", 9464)
                    .unwrap()
                    .unwrap()
            )
        );
        assert_eq!((run.job.as_deref(), run.workload), (Some("pmix:7"), 64.0));
        let e = RunArg::parse("http://127.0.0.1:9465=64").unwrap_err();
        assert!(e.contains("http://127.0.0.1:9465#JOB=64"), "{e}");

        let cli = Cli::parse_from(["mpiburst", "report", "n1.jsonl", "n2.jsonl", "--phases"]);
        let Command::Report(a) = cli.command else {
            panic!("parsed {:?}", cli.command)
        };
        assert_eq!(a.targets.len(), 2);
    }
}
