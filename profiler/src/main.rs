use std::process::ExitCode;

use anyhow::Context as _;
use clap::Parser as _;
use mpiburst::{
    cli::{Cli, Command},
    config::Config,
    daemon::{unix_now_ns, Daemon},
    export::{recording::Recording, report},
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
        Command::Report { recording } => {
            let r = Recording::read(&recording)?;
            if r.end.is_none() {
                eprintln!("note: {} was cut short (no end record); showing what it holds", recording.display());
            }
            let now = r.end.as_ref().map(|e| e.ended_ns).unwrap_or_else(unix_now_ns);
            for job in r.jobs.values() {
                println!("{}", report::render(job, now, &r.header.counters_note));
            }
            Ok(())
        }
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

fn daemon(config: Config, recording: Option<std::path::PathBuf>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let daemon = Daemon::start(config, recording)?;
        daemon.run().await?;
        anyhow::Ok(())
    })
}
