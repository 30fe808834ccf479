use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use mpiburst::{
    aggregate::Sources,
    analysis::{
        analyse,
        signature::{predict::predict, signature, AppSignature},
        tracking::{match_runs, AppIdentity, RunSignature, TrackingParams},
        AnalysisParams,
    },
    cli::{
        Cli, Command, CompareArgs, OutputFormat, PredictArgs, RecordingSet, ReportArgs,
        ReportTarget, RunArg, RunSource,
    },
    config::Config,
    daemon::Daemon,
    export::{
        bottlenecks::Bottlenecks,
        client::{ClientError, DaemonClient},
        groups, html,
        phases::{self, KernelFilter},
        recording::{NodeRanks, Recording},
        report::JobReport,
        report_json::{
            AnalysisView, CompareDocument, JobDocument, OnlineView, PhasesDocument, ReportDocument,
            RunSide, SignatureView,
        },
        signature::{regions, render_signature, PredictDocument, RunPoint},
        sites,
    },
    model::{unix_now_ns, Burst, JobId},
    properties::PropertyConfig,
    store::{Job, JobMeta},
    symbols::{SiteNames, SiteResolver},
};
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mpiburst: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// Keeps the daemon's heap close to what it holds. glibc serves a block of 128 KiB or more with
/// its own mapping, returned at its free, but raises that threshold to the size of each such
/// block freed, up to 32 MiB: after the burst buffers had grown by doubling, their successors came
/// from the heap, and the holes left there kept the resident memory of a 10⁵ bursts/s storm at
/// 105 MiB. The threshold is fixed at 4 MiB instead, which still serves a drain's batch (10⁴
/// bursts at 10⁵ bursts/s) from the heap: mapping and unmapping each batch cost the analysis
/// thread a tenth of its time. The heap is trimmed beyond 64 MiB free rather than at every free
/// of 128 KiB, which would fault the same pages in again at every drain.
fn bounded_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; called before the daemon's threads start.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 4 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 64 << 20);
    }
}

/// The error and its causes, each cause once: the module errors already name their source in
/// their own message, and anyhow's chain would repeat it.
fn error_chain(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Run(args) => daemon(args.config()?, None),
        Command::Record { output, run } => daemon(run.config()?, Some(output)),
        Command::Report(args) => report_command(&args),
        Command::Compare(args) => compare_command(&args),
        Command::Predict(args) => predict_command(&args),
        Command::Aggregate(args) => {
            let node_timeout = std::time::Duration::from_secs_f64(args.node_timeout);
            let sources = match args.prometheus {
                Some(server) => Sources::Prometheus {
                    server,
                    node_timeout,
                },
                None => Sources::Daemons(
                    args.daemons
                        .into_iter()
                        .map(|d| d.with_timeout(node_timeout))
                        .collect(),
                ),
            };
            Ok(mpiburst::aggregate::run(args.listen, sources)?)
        }
        Command::HoldGuard(args) => Ok(mpiburst::capture::hold_guard::run(
            args.map_fd,
            args.daemon_fd,
            std::time::Duration::from_millis(args.limit_ms),
        )?),
        Command::Config { default, file } => {
            if default {
                print!("{}", Config::default_toml());
            } else {
                let c = match file {
                    Some(f) => Config::load(&f)?,
                    None => Config::default(),
                };
                print!(
                    "{}",
                    toml::to_string(&c).context("serialise the configuration")?
                );
            }
            Ok(())
        }
    }
}

/// `mpiburst report`: the per-job report, and with `--phases` or `--html` the phases, from a
/// running daemon, or from recordings: one, or those of one job's nodes, merged.
fn report_command(args: &ReportArgs) -> anyhow::Result<()> {
    if let [ReportTarget::Daemon(daemon)] = &args.targets[..] {
        return report_daemon(daemon, args);
    }
    let paths = args
        .targets
        .iter()
        .map(|target| match target {
            ReportTarget::Recording(path) => Ok(path.clone()),
            ReportTarget::Daemon(daemon) => Err(anyhow::anyhow!(
                "{daemon} is a daemon, which reports alone; pass either one daemon's address or \
                 recordings (a file of that name is read as a recording)"
            )),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    report_recording(&paths, args)
}

/// The jobs to report: the one `--job` names, those of the Slurm job `--slurm-job` names, or all
/// of them. An unknown job is an error that lists the known ones; no jobs at all is one when
/// phases were asked for (`hint` says how to get some), else a note.
fn select_jobs(
    known: Vec<&JobMeta>,
    args: &ReportArgs,
    place: &str,
    hint: &str,
) -> anyhow::Result<Vec<JobId>> {
    let listing = || {
        if known.is_empty() {
            "it holds no jobs".to_string()
        } else {
            let ids: Vec<String> = known
                .iter()
                .map(|m| match &m.scheduler_job {
                    Some(slurm) => format!("{} (Slurm job {slurm})", m.id),
                    None => m.id.0.clone(),
                })
                .collect();
            format!("pass one of: {}", ids.join(", "))
        }
    };
    if let Some(id) = &args.job {
        let id = JobId(id.clone());
        if known.iter().any(|m| m.id == id) {
            return Ok(vec![id]);
        }
        anyhow::bail!("job {id} is not in {place}; {}", listing());
    }
    if let Some(slurm) = &args.slurm_job {
        let ids: Vec<JobId> = known
            .iter()
            .filter(|m| m.scheduler_job.as_deref() == Some(slurm.as_str()))
            .map(|m| m.id.clone())
            .collect();
        if ids.is_empty() {
            anyhow::bail!("no job of Slurm job {slurm} is in {place}; {}", listing());
        }
        return Ok(ids);
    }
    let known: Vec<JobId> = known.into_iter().map(|m| m.id.clone()).collect();
    if known.is_empty() {
        if args.phases || args.html.is_some() {
            anyhow::bail!("{place} holds no jobs, so there are no phases to show; {hint}");
        }
        eprintln!("note: {place} holds no jobs");
    }
    Ok(known)
}

/// Writes the HTML page of one job where `--html` asked for it, and says so (`what` it shows).
fn write_html(
    out: &std::path::Path,
    id: &JobId,
    several: bool,
    html: String,
    what: &str,
) -> anyhow::Result<()> {
    let file = html::html_path(out, id, several);
    std::fs::write(&file, html).with_context(|| {
        format!(
            "cannot write {}; check that the directory exists and is writable",
            file.display()
        )
    })?;
    eprintln!("wrote {} ({what})", file.display());
    Ok(())
}

/// The title of a job's bottleneck view.
fn over_its_life(job: &Job) -> String {
    format!("over its life on {}", job.meta.node)
}

/// Where the results of `mpiburst report` go: printed as text job by job, or gathered as JSON
/// and printed as one document at the end.
struct ReportOutput {
    format: OutputFormat,
    stdout: Stdout,
    jobs: Vec<serde_json::Value>,
}

impl ReportOutput {
    fn new(format: OutputFormat) -> ReportOutput {
        ReportOutput {
            format,
            stdout: Stdout::default(),
            jobs: Vec::new(),
        }
    }

    /// Text output only: JSON gathers [`Self::job`] documents instead.
    fn text(&mut self, text: &str) -> anyhow::Result<()> {
        match self.format {
            OutputFormat::Text => self.stdout.print(text),
            OutputFormat::Json => Ok(()),
        }
    }

    /// Says why a job has no phases: in the text, or, where the JSON says it by its nulls, as a
    /// note when `--html` asked for a page that is then not written.
    fn no_phases(&mut self, why: &str, html: bool) -> anyhow::Result<()> {
        match self.format {
            OutputFormat::Text => self.stdout.print(&format!("   {why}\n\n")),
            OutputFormat::Json if html => {
                eprintln!("note: {why}");
                Ok(())
            }
            OutputFormat::Json => Ok(()),
        }
    }

    fn job(&mut self, document: &JobDocument) -> anyhow::Result<()> {
        if self.format == OutputFormat::Json {
            self.jobs
                .push(serde_json::to_value(document).with_context(|| {
                    format!("serialise the report of job {}", document.report.meta.id)
                })?);
        }
        Ok(())
    }

    /// Prints the JSON document, when that is the format.
    fn finish(mut self) -> anyhow::Result<()> {
        match self.format {
            OutputFormat::Text => Ok(()),
            OutputFormat::Json => self
                .stdout
                .print(&json_text(&ReportDocument::new(self.jobs))?),
        }
    }
}

/// A JSON document as printed: indented, with a final newline.
fn json_text(document: &impl serde::Serialize) -> anyhow::Result<String> {
    Ok(serde_json::to_string_pretty(document).context("serialise the JSON document")? + "\n")
}

/// The report of a recording, or of the recordings of a job's nodes merged into one: the phases
/// of each job are clustered from its recorded bursts over the ranks recorded (see
/// [`Job::node_ranks`](mpiburst::store::Job::node_ranks)), the bottlenecks evaluated from the
/// ranks' exact totals as the daemon evaluates them over a job's life.
fn report_recording(paths: &[std::path::PathBuf], args: &ReportArgs) -> anyhow::Result<()> {
    let path = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let r = Recording::read_all(paths)?;
    for part in r.parts.iter().filter(|p| p.cut_short) {
        eprintln!(
            "note: {} was cut short (no end record); showing what it holds",
            part.path.display()
        );
    }
    let merged = r.parts.len() > 1;
    let now = r
        .end
        .as_ref()
        .map(|e| e.ended_ns)
        .unwrap_or_else(unix_now_ns);
    let ids = select_jobs(
        r.jobs.values().map(|j| &j.meta).collect(),
        args,
        &path.to_string(),
        "record while an MPI program runs (`mpiburst record -o FILE`, then start the job)",
    )?;
    let several = ids.len() > 1;
    let mut out = ReportOutput::new(args.format);
    let mut resolver = SiteResolver::new();
    for id in &ids {
        let job = &r.jobs[id];
        let report = JobReport::new(job, now, &r.header.counters_note);
        let properties = r.job_properties(job, now, &PropertyConfig::default());
        let bottlenecks = Bottlenecks::new(&properties);
        let rank_groups = recorded_groups(&r, job, now);
        let nodes = merged.then(|| r.nodes_of(id));
        out.text(&format!(
            "{}{}{}\n{}\n",
            report.text(),
            nodes.as_deref().map(render_nodes).unwrap_or_default(),
            groups::render(&rank_groups, job.meta.first_seen_ns),
            bottlenecks.text(&over_its_life(job))
        ))?;
        let wanted = args.phases || args.html.is_some();
        let bursts: Vec<Burst> = if wanted {
            job.bursts.iter().cloned().collect()
        } else {
            Vec::new()
        };
        let analysis = if bursts.is_empty() {
            None
        } else {
            Some(
                analyse(&bursts, job.node_ranks(), &AnalysisParams::default())
                    .with_context(|| format!("phase analysis of job {id}"))?,
            )
        };
        if wanted && analysis.is_none() {
            out.no_phases(
                &format!(
                    "no bursts of job {id} in the recording: nothing to cluster (every burst was \
                     shorter than the kernel filter of {}; record with a lower --min-burst-us)",
                    phases::duration(r.header.min_burst_ns)
                ),
                args.html.is_some(),
            )?;
        }
        // The sites of the phase table, and of every burst the HTML page shows.
        let names = analysis.as_ref().map(|a| {
            let bursts = args.html.as_ref().map(|_| sites::burst_sites(&bursts));
            let shown = sites::analysis_sites(a).chain(bursts.into_iter().flatten());
            sites::names(&mut resolver, &[&job.meta], shown)
        });
        let signature = analysis
            .as_ref()
            .filter(|_| args.phases)
            .map(|a| signature(&bursts, a, &regions(job, now)));
        if let (true, Some(analysis), Some(names)) = (args.phases, &analysis, &names) {
            let text = phases::render_phases(id, analysis, names);
            let filter = phases::render_kernel_filter(job, Some(r.header.min_burst_ns));
            let signature = match &signature {
                Some(Ok(s)) => render_signature(s, names),
                Some(Err(e)) => format!("signature: none ({e})\n"),
                None => String::new(),
            };
            out.text(&format!("{text}{filter}\n{signature}\n"))?;
        }
        out.job(&JobDocument {
            report,
            bottlenecks: Some(bottlenecks),
            phases: args.phases.then(|| PhasesDocument::Recording {
                min_burst_ns: r.header.min_burst_ns,
                analysis: analysis.as_ref().map(AnalysisView::from),
                kernel_filter: KernelFilter::of(job, Some(r.header.min_burst_ns)),
                call_sites: names.as_ref().map(SiteNames::entries).unwrap_or_default(),
                signature: signature.and_then(Result::ok).map(SignatureView::from),
            }),
            rank_groups: Some(&rank_groups),
            nodes,
        })?;
        if let (Some(html), Some(analysis), Some(names)) = (&args.html, &analysis, &names) {
            write_html(
                html,
                id,
                several,
                html::render_html(job, &bursts, analysis, names, Some(&rank_groups)),
                &format!("phases of job {id}"),
            )?;
        }
    }
    out.finish()
}

/// The line of a job-wide report that says which node recorded which ranks.
fn render_nodes(nodes: &[NodeRanks]) -> String {
    let nodes: Vec<String> = nodes
        .iter()
        .map(|n| {
            format!(
                "{} (ranks {}, {})",
                n.node,
                groups::rank_list(n.ranks),
                n.recording.display()
            )
        })
        .collect();
    format!("   nodes: {}\n", nodes.join("; "))
}

/// The rank groups of a recorded job, replayed with the settings of the daemon that recorded
/// it (the defaults for recordings made before rank groups).
fn recorded_groups(
    r: &Recording,
    job: &Job,
    now: u64,
) -> mpiburst::analysis::groups::RankGroupsView {
    let settings = r.header.rank_groups.clone().unwrap_or_else(|| {
        let defaults = Config::default();
        mpiburst::export::recording::RankGroupSettings {
            window_s: defaults.analysis.window_s,
            params: defaults.groups,
        }
    });
    let readings = r.readings.get(&job.meta.id).map_or(&[][..], Vec::as_slice);
    groups::replay(job, readings, &settings.params, settings.window_s, now)
}

/// The report of the jobs a running daemon holds, from its JSON API: the job report from the
/// job's identity and exact totals, the bottlenecks from the daemon's evaluation over the job's
/// life, the phases from its online analysis.
fn report_daemon(daemon: &DaemonClient, args: &ReportArgs) -> anyhow::Result<()> {
    let place = format!("the daemon at {daemon}");
    let known = daemon.jobs()?;
    let ids = select_jobs(
        known.iter().collect(),
        args,
        &place,
        "start an MPI program while the daemon runs",
    )?;
    let several = ids.len() > 1;
    let mut out = ReportOutput::new(args.format);
    let mut resolver = SiteResolver::new();
    for id in &ids {
        let served = match daemon.job(id) {
            Err(ClientError::Status { status: 404, .. }) => {
                eprintln!("note: job {id} ended and was dropped by {place} while this report ran");
                continue;
            }
            served => served?,
        };
        let counters_note = served.counters().note();
        let job = served.into_job();
        let now = unix_now_ns();
        let report = JobReport::new(&job, now, &counters_note);
        let properties = daemon.properties(id)?;
        let bottlenecks = properties.as_ref().map(Bottlenecks::new);
        let rank_groups = daemon.rank_groups(id)?;
        let groups_text = rank_groups
            .as_ref()
            .map(|v| groups::render(v, job.meta.first_seen_ns))
            .unwrap_or_else(|| {
                "   rank groups: none yet (the daemon groups the ranks at its next stats update)\n"
                    .into()
            });
        out.text(&format!("{}{groups_text}\n", report.text()))?;
        out.text(&match &bottlenecks {
            Some(b) => format!("{}\n", b.text(&over_its_life(&job))),
            None => format!(
                "   no bottleneck evaluation of job {id} yet: the daemon evaluates the properties \
                 at its next stats update (capture.stats_interval_ms)\n\n"
            ),
        })?;
        let wanted = args.phases || args.html.is_some();
        let snapshot = if wanted { daemon.phases(id)? } else { None };
        if wanted && snapshot.is_none() {
            out.no_phases(
                &format!(
                    "no phase analysis of job {id} yet: the daemon starts it with the job's first \
                     bursts above its kernel filter"
                ),
                args.html.is_some(),
            )?;
        }
        // Named from the binaries the daemon says the job mapped, where this node has them.
        let names = snapshot
            .as_ref()
            .map(|s| sites::names(&mut resolver, &[&job.meta], sites::snapshot_sites(s)))
            .unwrap_or_default();
        let text = snapshot.as_ref().map(|s| {
            phases::render_live_phases(id, s, now, &names)
                + &phases::render_kernel_filter(&job, None)
        });
        if let (true, Some(text)) = (args.phases, &text) {
            out.text(&format!("{text}\n"))?;
        }
        out.job(&JobDocument {
            report,
            bottlenecks,
            phases: args.phases.then(|| PhasesDocument::Daemon {
                online: snapshot.as_ref().map(|s| OnlineView::new(s, now)),
                kernel_filter: KernelFilter::of(&job, None),
                call_sites: names.entries(),
            }),
            rank_groups: rank_groups.as_ref(),
            nodes: None,
        })?;
        if let (Some(html), Some(snapshot), Some(text)) = (&args.html, &snapshot, &text) {
            let page = html::render_live_html(&job, snapshot, text, &daemon.to_string(), &names);
            let what = format!(
                "phase sequences and tables of job {id}; the scatter plot and the timeline need a recording"
            );
            write_html(html, id, several, page, &what)?;
        }
    }
    out.finish()
}

/// The one job of a recording (or the named one), with a helpful error otherwise.
fn pick_job<'a>(
    r: &'a Recording,
    path: &std::path::Path,
    id: Option<&str>,
    how_to_choose: &str,
) -> anyhow::Result<&'a Job> {
    let known = || {
        r.jobs
            .keys()
            .map(|j| j.0.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match id {
        Some(id) => r.jobs.get(&JobId(id.to_string())).ok_or_else(|| {
            anyhow::anyhow!(
                "job {id} is not in {}; it holds: {}",
                path.display(),
                known()
            )
        }),
        None => match r.jobs.values().collect::<Vec<_>>()[..] {
            [only] => Ok(only),
            [] => anyhow::bail!("{} holds no jobs", path.display()),
            _ => anyhow::bail!(
                "{} holds several jobs ({}); {how_to_choose}",
                path.display(),
                known()
            ),
        },
    }
}

fn compare_command(args: &CompareArgs) -> anyhow::Result<()> {
    let params = TrackingParams::default();
    let mut signatures = Vec::new();
    let mut metas = Vec::new();
    for (path, id) in [
        (&args.before, args.job_before.as_deref()),
        (&args.after, args.job_after.as_deref()),
    ] {
        let recording = Recording::read_all(&path.paths)?;
        let path = &path.name;
        let job = pick_job(
            &recording,
            path,
            id,
            "choose one with --job-before/--job-after",
        )?;
        let bursts: Vec<Burst> = job.bursts.iter().cloned().collect();
        let analysis = analyse(&bursts, job.node_ranks(), &AnalysisParams::default())
            .with_context(|| {
                format!(
                    "phase analysis of job {} in {}",
                    job.meta.id,
                    path.display()
                )
            })?;
        signatures.push(RunSignature::from_analysis(
            app_identity(&job.meta),
            job.meta.id.0.clone(),
            &analysis,
            &bursts,
            &params,
        )?);
        metas.push(job.meta.clone());
    }
    let matched = match_runs(&signatures[0], &signatures[1], &params);
    let names = sites::names(
        &mut SiteResolver::new(),
        &metas.iter().collect::<Vec<_>>(),
        signatures.iter().flat_map(sites::signature_sites),
    );
    let text = match args.format {
        OutputFormat::Text => {
            phases::render_run_match(&signatures[0], &signatures[1], &matched, &names)
        }
        OutputFormat::Json => json_text(&CompareDocument::new(
            RunSide::new(&args.before.name, &signatures[0]),
            RunSide::new(&args.after.name, &signatures[1]),
            &matched,
            names.entries(),
        ))?,
    };
    Stdout::default().print(&text)
}

/// `mpiburst predict`: the signature of each run (from its recordings, or live from a daemon or
/// the aggregator), the workload model fitted to them, and the run time it predicts.
fn predict_command(args: &PredictArgs) -> anyhow::Result<()> {
    let mut runs: Vec<(JobMeta, AppSignature)> = Vec::new();
    for run in &args.runs {
        let (meta, signature) = match &run.source {
            RunSource::Recordings(set) => recorded_run(run, set, args.executable.as_deref())?,
            RunSource::Live(client) => live_run(run, client)?,
        };
        if let Some((first, _)) = runs.first() {
            anyhow::ensure!(
                app_identity(first).same_application(&app_identity(&meta)),
                "{} is a run of {} (build-id {}), not of {} (build-id {}) like {}: a prediction \
                 needs runs of one build",
                run.name.display(),
                meta.executable,
                meta.build_id.as_deref().unwrap_or("none"),
                first.executable,
                first.build_id.as_deref().unwrap_or("none"),
                args.runs[0].name.display()
            );
        }
        runs.push((meta, signature));
    }
    let points: Vec<(f64, &_)> = args
        .runs
        .iter()
        .zip(&runs)
        .map(|(run, (_, s))| (run.workload, s))
        .collect();
    let prediction = predict(&points, args.at, args.tolerance, args.extrapolate)?;
    let points = args
        .runs
        .iter()
        .zip(&runs)
        .map(|(run, (meta, s))| RunPoint::new(&run.name, &meta.id.0, run.workload, s))
        .collect();
    let metas: Vec<&JobMeta> = runs.iter().map(|(meta, _)| meta).collect();
    let keys = prediction
        .phases
        .iter()
        .flat_map(|m| [&m.key.start, &m.key.end]);
    let names = sites::names(&mut SiteResolver::new(), &metas, keys);
    let document = PredictDocument::new(points, &prediction, args.tolerance, &names);
    let text = match args.format {
        OutputFormat::Text => document.text(),
        OutputFormat::Json => json_text(&document)?,
    };
    Stdout::default().print(&text)
}

/// A recorded run of a prediction: its job, and the signature of its bursts.
fn recorded_run(
    run: &RunArg,
    set: &RecordingSet,
    executable: Option<&str>,
) -> anyhow::Result<(JobMeta, AppSignature)> {
    let recording = Recording::read_all(&set.paths)?;
    let job = predicted_job(&recording, run, executable)?;
    let bursts: Vec<Burst> = job.bursts.iter().cloned().collect();
    let context = || format!("job {} in {}", job.meta.id, run.name.display());
    let analysis = analyse(&bursts, job.node_ranks(), &AnalysisParams::default())
        .with_context(|| format!("phase analysis of {}", context()))?;
    let now = recording
        .end
        .as_ref()
        .map(|e| e.ended_ns)
        .unwrap_or_else(unix_now_ns);
    let s = signature(&bursts, &analysis, &regions(job, now))
        .with_context(|| format!("the signature of {}", context()))?;
    Ok((job.meta.clone(), s))
}

/// A run that a daemon or the aggregator still holds: its live signature, which covers the whole
/// run once the window in which the job ended has closed.
fn live_run(run: &RunArg, client: &DaemonClient) -> anyhow::Result<(JobMeta, AppSignature)> {
    let id = JobId(run.job.clone().unwrap_or_default());
    let job = client
        .job(&id)
        .with_context(|| format!("job {id} on {client}"))?
        .into_job();
    let Some(ended_ns) = job.meta.ended_ns else {
        anyhow::bail!(
            "job {id} on {client} is still running: a prediction needs whole runs; pass it once \
             it has ended"
        );
    };
    // The run time ends at the last rank's MPI_Finalize entry (at its exit without one).
    let region_end_ns = job
        .ranks
        .values()
        .map(|r| r.region.finalize_entry_ns.unwrap_or(ended_ns))
        .max()
        .unwrap_or(ended_ns);
    let live = client
        .phases(&id)
        .with_context(|| format!("the phases of job {id} on {client}"))?
        .and_then(|snapshot| snapshot.signature);
    match live {
        Some(live) if live.up_to_ns >= region_end_ns => Ok((job.meta, live.signature)),
        Some(live) => anyhow::bail!(
            "job {id} on {client} ended at {}, but its signature covers it only up to {}: the \
             window in which it ended has not closed yet; try again in a window's length \
             (analysis.window_s)",
            phases::utc(region_end_ns),
            phases::utc(live.up_to_ns)
        ),
        None => anyhow::bail!(
            "job {id} on {client} has no signature: no window of its phase analysis has closed \
             yet; try again in a window's length (analysis.window_s)"
        ),
    }
}

/// The job of one run of a prediction: the one `#JOB` names, else the one that ran
/// `executable`, else the recording's only job.
fn predicted_job<'a>(
    recording: &'a Recording,
    run: &RunArg,
    executable: Option<&str>,
) -> anyhow::Result<&'a Job> {
    let path = &run.name;
    if run.job.is_some() || executable.is_none() {
        return pick_job(
            recording,
            path,
            run.job.as_deref(),
            "name the run's job as RECORDING#JOB=X, or its program with --executable",
        );
    }
    let wanted = executable.unwrap_or_default();
    let ran = |job: &&Job| {
        let exe = std::path::Path::new(&job.meta.executable);
        exe == std::path::Path::new(wanted) || exe.file_name() == Some(std::ffi::OsStr::new(wanted))
    };
    let matching: Vec<&Job> = recording.jobs.values().filter(ran).collect();
    match matching[..] {
        [job] => Ok(job),
        [] => anyhow::bail!(
            "no job in {} ran {wanted}; it holds: {}",
            path.display(),
            recording
                .jobs
                .values()
                .map(|j| format!("{} ({})", j.meta.id, j.meta.executable))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        _ => anyhow::bail!(
            "{} holds several jobs that ran {wanted} ({}); name one as RECORDING#JOB=X",
            path.display(),
            matching
                .iter()
                .map(|j| j.meta.id.0.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn app_identity(meta: &JobMeta) -> AppIdentity {
    AppIdentity {
        build_id: meta.build_id.clone(),
        executable: meta.executable.clone(),
    }
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
    bounded_heap();
    // The threads that read library files are named like every thread of the daemon: a second
    // daemon on the node holds no thread named mpiburst* at its open of an MPI library, and two
    // daemons holding each other's readers would both stop for good.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("mpiburst-reader")
        .build()?;
    let result = runtime.block_on(async {
        let daemon = Daemon::start(config, recording)?;
        daemon.run().await?;
        anyhow::Ok(())
    });
    // A read stuck on a hung file system never returns: exit without waiting for its thread.
    runtime.shutdown_background();
    result
}
