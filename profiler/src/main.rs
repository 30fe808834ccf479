use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use mpiburst::{
    analysis::{
        analyse,
        tracking::{match_runs, AppIdentity, RunSignature, TrackingParams},
        AnalysisParams,
    },
    cli::{Cli, Command, CompareArgs, ReportArgs},
    config::Config,
    daemon::{unix_now_ns, Daemon},
    export::{phases, recording::Recording, report, svg},
    model::{Burst, JobId},
    store::Job,
};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mpiburst: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => daemon(args.config()?, None),
        Command::Record { output, run } => daemon(run.config()?, Some(output)),
        Command::Report(args) => report_command(&args),
        Command::Compare(args) => compare_command(&args),
        Command::Config { default, file } => {
            if default {
                print!("{}", Config::default_toml());
            } else {
                let c = match file {
                    Some(f) => Config::load(&f)?,
                    None => Config::default(),
                };
                print!("{}", toml::to_string(&c).context("serialise the configuration")?);
            }
            Ok(())
        }
    }
}

/// `mpiburst report`: the per-job report, and with `--phases` or `--html` the phase analysis of
/// each job's recorded bursts over the ranks this node ran (see [`phases::node_ranks`]).
fn report_command(args: &ReportArgs) -> anyhow::Result<()> {
    let path = args.recording.display();
    let r = Recording::read(&args.recording)?;
    if r.end.is_none() {
        eprintln!("note: {path} was cut short (no end record); showing what it holds");
    }
    let now = r.end.as_ref().map(|e| e.ended_ns).unwrap_or_else(unix_now_ns);
    let jobs: Vec<&Job> = match &args.job {
        Some(id) => {
            let job = r.jobs.get(&JobId(id.clone())).ok_or_else(|| {
                let known: Vec<&str> = r.jobs.keys().map(|j| j.0.as_str()).collect();
                anyhow::anyhow!(
                    "job {id} is not in {path}; {}",
                    if known.is_empty() {
                        "it holds no jobs".to_string()
                    } else {
                        format!("pass one of: {}", known.join(", "))
                    }
                )
            })?;
            vec![job]
        }
        None => r.jobs.values().collect(),
    };
    let analysed = args.phases || args.html.is_some();
    if jobs.is_empty() {
        if analysed {
            anyhow::bail!(
                "{path} holds no jobs, so there are no phases to show; record while an MPI program runs \
                 (`mpiburst record -o FILE`, then start the job)"
            );
        }
        eprintln!("note: {path} holds no jobs");
        return Ok(());
    }
    let several = jobs.len() > 1;
    let mut out = Stdout::default();
    for job in jobs {
        out.print(&format!("{}\n", report::render(job, now, &r.header.counters_note)))?;
        if !analysed {
            continue;
        }
        let id = &job.meta.id;
        let bursts: Vec<Burst> = job.bursts.iter().cloned().collect();
        if bursts.is_empty() {
            out.print(&format!(
                "   no bursts of job {id} in the recording: nothing to cluster (every burst was shorter \
                 than the kernel filter of {}; record with a lower --min-burst-us)\n\n",
                phases::duration(r.header.min_burst_ns)
            ))?;
            continue;
        }
        let analysis = analyse(&bursts, phases::node_ranks(job), &AnalysisParams::default())
            .with_context(|| format!("phase analysis of job {id}"))?;
        if args.phases {
            let mut text = phases::render_phases(id, &analysis);
            if let Some(line) = phases::render_kernel_filter(job, r.header.min_burst_ns) {
                text.push_str(&line);
                text.push('\n');
            }
            text.push('\n');
            out.print(&text)?;
        }
        if let Some(out) = &args.html {
            let file = svg::html_path(out, id, several);
            std::fs::write(&file, svg::render_html(job, &bursts, &analysis)).with_context(|| {
                format!("cannot write {}; check that the directory exists and is writable", file.display())
            })?;
            eprintln!("wrote {} (phases of job {id})", file.display());
        }
    }
    Ok(())
}

/// The one job of a recording (or the named one), with a helpful error otherwise.
fn pick_job<'a>(r: &'a Recording, path: &std::path::Path, id: Option<&str>) -> anyhow::Result<&'a Job> {
    let known = || r.jobs.keys().map(|j| j.0.as_str()).collect::<Vec<_>>().join(", ");
    match id {
        Some(id) => r
            .jobs
            .get(&JobId(id.to_string()))
            .ok_or_else(|| anyhow::anyhow!("job {id} is not in {}; it holds: {}", path.display(), known())),
        None if r.jobs.len() == 1 => Ok(r.jobs.values().next().unwrap()),
        None if r.jobs.is_empty() => anyhow::bail!("{} holds no jobs", path.display()),
        None => anyhow::bail!("{} holds several jobs ({}); choose one with --job-before/--job-after", path.display(), known()),
    }
}

fn compare_command(args: &CompareArgs) -> anyhow::Result<()> {
    let params = TrackingParams::default();
    let mut signatures = Vec::new();
    for (path, id) in [(&args.before, args.job_before.as_deref()), (&args.after, args.job_after.as_deref())] {
        let recording = Recording::read(path)?;
        let job = pick_job(&recording, path, id)?;
        let bursts: Vec<Burst> = job.bursts.iter().cloned().collect();
        let analysis = analyse(&bursts, phases::node_ranks(job), &AnalysisParams::default())
            .with_context(|| format!("phase analysis of job {} in {}", job.meta.id, path.display()))?;
        let app = AppIdentity { build_id: None, executable: job.meta.executable.clone() };
        signatures.push(RunSignature::from_analysis(app, job.meta.id.0.clone(), &analysis, &bursts, &params)?);
    }
    let matched = match_runs(&signatures[0], &signatures[1], &params);
    print!("{}", phases::render_run_match(&signatures[0], &signatures[1], &matched));
    Ok(())
}

/// Standard output that stops printing, without failing, once its reader has gone (`| head`), so
/// that the files a command writes are still written.
#[derive(Default)]
struct Stdout {
    closed: bool,
}

impl Stdout {
    fn print(&mut self, text: &str) -> anyhow::Result<()> {
        use std::io::Write as _;
        if self.closed {
            return Ok(());
        }
        match std::io::stdout().lock().write_all(text.as_bytes()) {
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                self.closed = true;
                Ok(())
            }
            result => result.context("write to standard output"),
        }
    }
}

fn daemon(config: Config, recording: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let daemon = Daemon::start(config, recording)?;
        daemon.run().await?;
        anyhow::Ok(())
    })
}
