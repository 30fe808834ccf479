//! The daemon's own cost under a burst storm, measured in one run (`cargo xtask bench daemon`):
//! the real daemon with the duration filter off (every burst is shipped) and 10 s analysis
//! windows, and tests/mpi/call_loop as one rank calling MPI_Barrier(MPI_COMM_SELF) as fast as it
//! can. It prints the storm's burst rate, the daemon's CPU time per 10⁵ bursts/s, the bursts lost,
//! the peak resident memory, and the latency of `/metrics` idle and while the storm's windows are
//! clustered.
//!
//! Usage: bench_daemon MPIBURST_BINARY CALL_LOOP_PROGRAM

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use mpiburst::export::client::DaemonClient;

/// Calls of the storm: tens of seconds at this machine's rate, so that several 10 s windows close
/// while it runs.
const STORM_CALLS: &str = "6000000";
/// Time between two scrapes of /metrics.
const SCRAPE_EVERY: Duration = Duration::from_millis(20);

struct Daemon {
    child: Child,
    client: DaemonClient,
    clustered: Arc<std::sync::atomic::AtomicU64>,
}

impl Daemon {
    fn start(binary: &Path, config: &Path) -> Result<Daemon> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut child = Command::new(binary)
            .args(["run", "--report-interval", "0", "--listen", &addr, "-c"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let (ready, wait) = mpsc::channel();
        let clustered = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let seen = clustered.clone();
        let stderr = child.stderr.take().context("the daemon's stderr")?;
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.starts_with("mpiburst ready") {
                    let _ = ready.send(());
                }
                if line.contains(" clustered: ") {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        if wait.recv_timeout(Duration::from_secs(60)).is_err() {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the daemon did not become ready within 60 s");
        }
        let client = DaemonClient::parse(&addr)?.context("the daemon's address")?;
        Ok(Daemon {
            child,
            client,
            clustered,
        })
    }

    /// (CPU seconds, peak resident bytes) of the daemon so far.
    fn usage(&self) -> Result<(f64, u64)> {
        let process = procfs::process::Process::new(self.child.id() as i32)?;
        let stat = process.stat()?;
        let ticks = procfs::ticks_per_second() as f64;
        let cpu = (stat.utime + stat.stime) as f64 / ticks;
        let peak = process.status()?.vmhwm.unwrap_or(0) * 1024;
        Ok((cpu, peak))
    }

    fn metrics(&self) -> Result<String> {
        Ok(String::from_utf8(self.client.get("/metrics")?)?)
    }

    fn stop(mut self) -> Result<()> {
        let pid = self.child.id().to_string();
        Command::new("kill").args(["-TERM", &pid]).status()?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(50));
        }
        self.child.kill()?;
        self.child.wait()?;
        bail!("the daemon did not stop within 60 s of SIGTERM")
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Sum of every sample of a metric family in an exposition, optionally only those whose labels
/// contain `with`.
fn family_sum(exposition: &str, name: &str, with: &str) -> f64 {
    exposition
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
                && l.contains(with)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Scrapes /metrics every [`SCRAPE_EVERY`] until `stop` is set; the latencies in ms.
fn scrape_latencies(client: DaemonClient, stop: Arc<AtomicBool>) -> thread::JoinHandle<Vec<f64>> {
    thread::spawn(move || {
        let mut latencies = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            let start = Instant::now();
            if client.get("/metrics").is_ok() {
                latencies.push(start.elapsed().as_secs_f64() * 1e3);
            }
            thread::sleep(SCRAPE_EVERY);
        }
        latencies
    })
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn describe(mut latencies: Vec<f64>) -> String {
    latencies.sort_by(f64::total_cmp);
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {} scrapes",
        quantile(&latencies, 0.5),
        quantile(&latencies, 0.99),
        latencies.last().copied().unwrap_or(f64::NAN),
        latencies.len()
    )
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [binary, call_loop] = &args[..] else {
        bail!("usage: bench_daemon MPIBURST_BINARY CALL_LOOP_PROGRAM");
    };
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("storm.toml");
    std::fs::write(
        &config,
        "[capture]\nmin_burst_us = 0\n\n[analysis]\nwindow_s = 10.0\n",
    )?;
    let daemon = Daemon::start(Path::new(binary), &config)?;

    let stop = Arc::new(AtomicBool::new(false));
    let idle = scrape_latencies(daemon.client.clone(), stop.clone());
    thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let idle = idle.join().expect("the idle scraper");

    let before = daemon.metrics()?;
    let (cpu_before, _) = daemon.usage()?;
    let clustered_before = daemon.clustered.load(Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let storm_scrapes = scrape_latencies(daemon.client.clone(), stop.clone());
    let started = Instant::now();
    let out = Command::new(call_loop)
        .arg(STORM_CALLS)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .output()?;
    if !out.status.success() {
        bail!(
            "{call_loop} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let storm_s = started.elapsed().as_secs_f64();
    // The last window of the storm closes and is clustered after it: keep scraping through it.
    thread::sleep(Duration::from_secs(12));
    stop.store(true, Ordering::Relaxed);
    let storm_scrapes = storm_scrapes.join().expect("the storm scraper");
    let wall_s = started.elapsed().as_secs_f64();
    let (cpu_after, peak_bytes) = daemon.usage()?;
    let after = daemon.metrics()?;
    let clustered = daemon.clustered.load(Ordering::Relaxed) - clustered_before;
    daemon.stop()?;

    let delta =
        |name: &str, with: &str| family_sum(&after, name, with) - family_sum(&before, name, with);
    let bursts = delta("mpiburst_job_bursts_total", "");
    let shipped = bursts - delta("mpiburst_job_filtered_bursts_total", "");
    let dropped = delta("mpiburst_job_dropped_bursts_total", "");
    let lost = delta("mpiburst_lost_events_total", "kind=\"bursts\"");
    let rate = bursts / storm_s;
    let core_share = (cpu_after - cpu_before) / wall_s;
    println!("storm: {bursts:.0} bursts in {storm_s:.1} s = {rate:.0} bursts/s ({shipped:.0} shipped to the daemon)");
    println!(
        "daemon CPU: {:.2} % of a core over {wall_s:.1} s (storm and the clustering after it) = {:.2} % of a core per 10⁵ bursts/s",
        100.0 * core_share,
        100.0 * core_share / (rate / 1e5)
    );
    println!("bursts lost: {dropped:.0} dropped by the ring buffer, {lost:.0} lost events of kind bursts");
    println!(
        "peak resident memory of the daemon: {:.1} MiB",
        peak_bytes as f64 / (1024.0 * 1024.0)
    );
    println!("windows clustered during and after the storm: {clustered}");
    println!("/metrics idle: {}", describe(idle));
    println!(
        "/metrics during the storm and its clustering: {}",
        describe(storm_scrapes)
    );
    Ok(())
}
