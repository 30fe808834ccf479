//! The daemon's own cost under a burst storm, measured in one run (`cargo xtask bench daemon`):
//! the real daemon with the duration filter off (every burst is shipped) and otherwise its
//! defaults, and tests/mpi/call_loop as one rank calling MPI_Barrier(MPI_COMM_SELF), first paced
//! at 10⁵ calls/s, then as two ranks of one job at half that rate each (their records interleave
//! in the ring), then as one rank as fast as it can. For each storm it prints the burst rate; the
//! daemon's CPU time beyond the idle daemon's while the bursts flow, per burst (and per 10⁵
//! bursts/s) and by thread, and after the storm (its last window and the phases of the ended
//! job); the CPU time per scrape of `/metrics`; the bursts lost; the peak resident memory; and the
//! latency of `/metrics` while the storm's windows are clustered. A lone rank runs on the first
//! CPU and the daemon on the last, so that every record crosses from one core to the other in
//! every run: left to the scheduler, the two sometimes share a core and the daemon's cost per
//! burst drops by a third.
//!
//! Usage: bench_daemon MPIBURST_BINARY CALL_LOOP_PROGRAM

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    os::unix::process::CommandExt,
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
use mpiburst::{config::Config, export::client::DaemonClient};

/// The storm at the target's rate: 60 s of 10⁵ bursts/s, two of the default 30 s analysis windows.
const PACED_CALLS: u64 = 6_000_000;
const PACED_PERIOD_NS: u64 = 10_000;
/// Long enough after a storm for its last window to close (30 s after its start, plus the 3 s
/// of lateness) and be clustered.
const AFTER_STORM: Duration = Duration::from_secs(38);
/// From the daemon's start to the measurement of its idle cost.
const SETTLE: Duration = Duration::from_secs(5);
/// The HTTP server's thread.
const HTTP_THREAD: &str = "mpiburst-http";
/// The storm at full speed: about ten seconds at this machine's rate.
const FULL_SPEED_CALLS: u64 = 6_000_000;
/// Time between two scrapes of /metrics: often enough for a p99 of hundreds of scrapes, rarely
/// enough that serving them is not most of what the daemon does.
const SCRAPE_EVERY: Duration = Duration::from_millis(100);

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
        let mut child = pinned(Command::new(binary), Cpu::Last)
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
        let client = DaemonClient::parse(&addr, Config::default().daemon.listen.port())?
            .context("the daemon's address")?;
        Ok(Daemon {
            child,
            client,
            clustered,
        })
    }

    /// Peak resident bytes of the daemon so far.
    fn peak_memory(&self) -> Result<u64> {
        let process = procfs::process::Process::new(self.child.id() as i32)?;
        Ok(process.status()?.vmhwm.unwrap_or(0) * 1024)
    }

    /// CPU seconds of the daemon's threads so far, by thread name (the loop is `mpiburst`): the
    /// scheduler's run time in ns (schedstat), not the 10 ms ticks of stat, which made an idle
    /// thread's share over a few seconds too coarse to take out of a storm's.
    fn threads(&self) -> Result<BTreeMap<String, f64>> {
        let process = procfs::process::Process::new(self.child.id() as i32)?;
        let mut by_name = BTreeMap::new();
        for task in process.tasks()?.flatten() {
            if let (Ok(stat), Ok(run)) = (task.stat(), task.schedstat()) {
                *by_name.entry(stat.comm).or_default() += run.sum_exec_runtime as f64 * 1e-9;
            }
        }
        Ok(by_name)
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

/// What the daemon costs while no burst comes, scraped as often as in the storms.
struct Idle {
    /// Share of a core, in all and by thread name.
    share: f64,
    threads: BTreeMap<String, f64>,
    latencies: Vec<f64>,
}

/// One storm: `ranks` ranks (1: a singleton, else under mpirun), each making `calls` barriers
/// paced at one per `period_ns` (0: as fast as they go), scraped all along; prints what it cost
/// the daemon beyond its idle cost.
fn storm(
    daemon: &Daemon,
    call_loop: &str,
    ranks: u32,
    calls: u64,
    period_ns: u64,
    idle: &Idle,
) -> Result<()> {
    let before = daemon.metrics()?;
    let threads_before = daemon.threads()?;
    let clustered_before = daemon.clustered.load(Ordering::Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let storm_scrapes = scrape_latencies(daemon.client.clone(), stop.clone());
    let started = Instant::now();
    let mut command = if ranks == 1 {
        pinned(Command::new(call_loop), Cpu::First)
    } else {
        // The ranks bound one per core, as on a node they fill: the daemon shares one with a rank.
        let mut mpirun = Command::new("mpirun.openmpi");
        mpirun.args(["-np", &ranks.to_string(), "--oversubscribe", call_loop]);
        mpirun
    };
    let out = command
        .args([calls.to_string(), "barrier".into(), period_ns.to_string()])
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
    let threads_at_end = daemon.threads()?;
    // The last window of the storm closes and is clustered after it: keep scraping through it.
    thread::sleep(AFTER_STORM);
    stop.store(true, Ordering::Relaxed);
    let storm_scrapes = storm_scrapes.join().expect("the storm scraper");
    let wall_s = started.elapsed().as_secs_f64();
    let peak_bytes = daemon.peak_memory()?;
    let threads_after = daemon.threads()?;
    let after = daemon.metrics()?;
    let clustered = daemon.clustered.load(Ordering::Relaxed) - clustered_before;

    let delta =
        |name: &str, with: &str| family_sum(&after, name, with) - family_sum(&before, name, with);
    let bursts = delta("mpiburst_job_bursts_total", "");
    let shipped = bursts - delta("mpiburst_job_filtered_bursts_total", "");
    let dropped = delta("mpiburst_job_dropped_bursts_total", "");
    let lost = delta("mpiburst_lost_events_total", "kind=\"bursts\"");
    let rate = bursts / storm_s;
    // CPU time beyond what the idle daemon (scraped as often) used in as long, by thread: while
    // the bursts flow (the sustained cost: the loop, the online analysis and the windows that
    // close meanwhile), and after the storm (its last window, and the phases of the whole job that
    // the daemon clusters and prints once the job has ended). The HTTP server's is the scrapes':
    // they cost more with a job to export than idle, whatever its burst rate, and a Prometheus
    // scrapes every 15 s or so, not ten times a second as here. The other threads' is the bursts'.
    let beyond_idle = |from: &BTreeMap<String, f64>, to: &BTreeMap<String, f64>, seconds: f64| {
        to.iter()
            .map(|(name, after)| {
                let before = from.get(name).unwrap_or(&0.0);
                let idle_s = idle.threads.get(name).unwrap_or(&0.0) * seconds;
                (name.clone(), after - before - idle_s)
            })
            .collect::<BTreeMap<String, f64>>()
    };
    let during = beyond_idle(&threads_before, &threads_at_end, storm_s);
    let after_storm = beyond_idle(&threads_at_end, &threads_after, wall_s - storm_s);
    let of_bursts = |cpu: &BTreeMap<String, f64>| -> f64 {
        cpu.iter()
            .filter(|(name, _)| *name != HTTP_THREAD)
            .map(|(_, s)| s)
            .sum()
    };
    let scrapes = storm_scrapes.len().max(1) as f64;
    let serving_s = during.get(HTTP_THREAD).copied().unwrap_or(0.0)
        + after_storm.get(HTTP_THREAD).copied().unwrap_or(0.0);
    let during_s = of_bursts(&during);
    let after_s = of_bursts(&after_storm);
    let per_burst_ns = during_s / bursts * 1e9;
    println!("  {bursts:.0} bursts in {storm_s:.1} s = {rate:.0} bursts/s ({shipped:.0} shipped to the daemon)");
    println!(
        "  daemon CPU while the bursts flow: {during_s:.2} s beyond idle = {per_burst_ns:.0} ns per burst = {:.2} % of a core per 10⁵ bursts/s",
        per_burst_ns * 1e5 / 1e9 * 100.0
    );
    let by_thread: Vec<String> = during
        .iter()
        .filter(|(name, _)| *name != HTTP_THREAD)
        .map(|(name, s)| format!("{name} {:.0} ns", s / bursts * 1e9))
        .collect();
    println!("    per burst by thread: {}", by_thread.join(", "));
    println!(
        "  daemon CPU in the {:.0} s after the storm (its last window, the phases of the ended job): {after_s:.2} s beyond idle; with it, {:.0} ns per burst",
        wall_s - storm_s,
        (during_s + after_s) / bursts * 1e9
    );
    println!(
        "  serving /metrics with the storm's job: {:.2} ms of CPU per scrape beyond idle ({scrapes:.0} scrapes)",
        serving_s / scrapes * 1e3
    );
    println!("  bursts lost: {dropped:.0} dropped by the ring buffer, {lost:.0} lost events of kind bursts");
    println!(
        "  peak resident memory of the daemon so far: {:.1} MiB",
        peak_bytes as f64 / (1024.0 * 1024.0)
    );
    println!("  windows clustered during and after the storm: {clustered}");
    println!(
        "  /metrics during the storm and its clustering: {}",
        describe(storm_scrapes)
    );
    Ok(())
}

#[derive(Clone, Copy)]
enum Cpu {
    First,
    Last,
}

/// `command`, to run on one online CPU (its threads inherit the affinity).
fn pinned(mut command: Command, cpu: Cpu) -> Command {
    let cpus = mpiburst::capture::online_cpus().expect("the online CPUs");
    let cpu = match cpu {
        Cpu::First => cpus.first(),
        Cpu::Last => cpus.last(),
    };
    let cpu = *cpu.expect("an online CPU") as usize;
    // SAFETY: sched_setaffinity on the child itself, between fork and exec, allocates nothing.
    unsafe {
        command.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    command
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [binary, call_loop] = &args[..] else {
        bail!("usage: bench_daemon MPIBURST_BINARY CALL_LOOP_PROGRAM");
    };
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("storm.toml");
    std::fs::write(&config, "[capture]\nmin_burst_us = 0\n")?;
    let daemon = Daemon::start(Path::new(binary), &config)?;

    // The idle daemon's own cost, with the same scrapes: taken out of the storms'. After the
    // start has settled (the first scans of the node's processes and libraries).
    thread::sleep(SETTLE);
    let idle_threads_before = daemon.threads()?;
    let idle_started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let idle = scrape_latencies(daemon.client.clone(), stop.clone());
    thread::sleep(Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    let idle = idle.join().expect("the idle scraper");
    let idle_s = idle_started.elapsed().as_secs_f64();
    let threads: BTreeMap<String, f64> = daemon
        .threads()?
        .into_iter()
        .map(|(name, after)| {
            let share = (after - idle_threads_before.get(&name).unwrap_or(&0.0)) / idle_s;
            (name, share)
        })
        .collect();
    let idle = Idle {
        share: threads.values().sum(),
        threads,
        latencies: idle,
    };
    println!(
        "idle daemon, scraped every {} ms: {:.2} % of a core; /metrics {}",
        SCRAPE_EVERY.as_millis(),
        100.0 * idle.share,
        describe(idle.latencies.clone())
    );
    // First the target's rate, so that the peak memory printed after it is that storm's.
    println!("storm at 10⁵ bursts/s ({PACED_CALLS} calls, one every {PACED_PERIOD_NS} ns):");
    storm(&daemon, call_loop, 1, PACED_CALLS, PACED_PERIOD_NS, &idle)?;
    println!(
        "storm at 10⁵ bursts/s from 2 ranks of one job ({} calls each, one every {} ns):",
        PACED_CALLS / 2,
        2 * PACED_PERIOD_NS
    );
    storm(
        &daemon,
        call_loop,
        2,
        PACED_CALLS / 2,
        2 * PACED_PERIOD_NS,
        &idle,
    )?;
    println!("storm as fast as one rank calls ({FULL_SPEED_CALLS} calls):");
    storm(&daemon, call_loop, 1, FULL_SPEED_CALLS, 0, &idle)?;
    daemon.stop()
}
