//! The Prometheus side of a large job (`cargo xtask bench jobwide`, after the aggregator's
//! part): the series every node's daemon exports for a job and for itself, and how long a real
//! Prometheus takes to evaluate the project's recording and alerting rules
//! (dashboards/rules/*.rules.yml) over a job of 2,000 nodes. It measures and prints; it asserts
//! nothing.
//!
//! Method. A real daemon profiles a real job (tests/mpi/phases on 4 ranks with an imbalanced
//! phase, so that properties fire and recommendations are made, in 2 s windows); its /metrics,
//! read while the job runs once the window values and properties are in it, is the exposition of
//! one node of that job.
//! The bench replays it as the /metrics of N nodes (2,000 by default): node i serves the same
//! exposition with `node="node-i"`, from a small HTTP server of its own on loopback. The
//! daemon's series do not grow with the ranks of a node (per-rank values are aggregates and
//! histograms), so a node of 4 ranks exports what a node of 64 does for the same phases.
//! Debian's Prometheus scrapes the N targets every 30 s and evaluates every rule file every 10 s
//! (on this machine's cores, which it shares with the replaying server); the bench
//! waits until every target is up and the job-wide recording rules have a value, then reads each
//! rule group's evaluation time from `/api/v1/rules` after each of several evaluations, and
//! Prometheus's own head series and resident memory. As a check that the rules ran on the
//! replayed job, the job-wide load balance from the rules is printed beside the node's own, read
//! from its daemon right after its /metrics: N identical nodes have the load balance of one.
//!
//! Usage: bench_jobwide_rules [NODES=2000], with MPIBURST_BIN and MPIBURST_MPI_PROGRAMS as for
//! the integration tests (`cargo xtask bench jobwide` sets them); as root.

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Write},
    net::{TcpListener, TcpStream},
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use mpiburst_tests::*;

/// Prometheus scrapes the nodes every SCRAPE_S and evaluates the rules every INTERVAL_S seconds.
const SCRAPE_S: u32 = 30;
const INTERVAL_S: u32 = 10;
/// Evaluations of every rule group whose times are taken.
const EVALUATIONS: usize = 6;
const RANKS: u32 = 4;

/// One node's exposition split where its node label is, so that node i's is quick to write.
struct Replay {
    parts: Vec<String>,
}

impl Replay {
    fn new(exposition: &str, node_label: &str) -> Replay {
        Replay {
            parts: exposition.split(node_label).map(str::to_string).collect(),
        }
    }

    fn node(&self, i: usize) -> String {
        self.parts.join(&format!("node=\"{}\"", node_name(i)))
    }
}

fn node_name(i: usize) -> String {
    format!("node-{i:04}")
}

/// Serves `GET /metrics/i` with node i's exposition until the process ends; one thread per
/// connection, closed after the answer.
fn serve(replay: Arc<Replay>, nodes: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    let addr = listener.local_addr().unwrap().to_string();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let replay = replay.clone();
            thread::spawn(move || answer(stream, &replay, nodes));
        }
    });
    addr
}

fn answer(mut stream: TcpStream, replay: &Replay, nodes: usize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request = String::new();
    if reader.read_line(&mut request).is_err() {
        return;
    }
    // The request's header lines, up to the empty one.
    let mut line = String::new();
    while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
        line.clear();
    }
    let node = request
        .split_whitespace()
        .nth(1)
        .and_then(|path| path.strip_prefix("/metrics/"))
        .and_then(|i| i.parse::<usize>().ok())
        .filter(|&i| i < nodes);
    let (status, body) = match node {
        Some(i) => ("200 OK", replay.node(i)),
        None => ("404 Not Found", format!("no such node: {request}")),
    };
    let _ = write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// The static scrape configuration of `nodes` targets on `addr`, one path each.
fn scrape_configs(addr: &str, nodes: usize) -> String {
    let mut config = String::from("  - job_name: mpiburst\n    static_configs:\n");
    for i in 0..nodes {
        config.push_str(&format!(
            "      - targets: ['{addr}']\n        labels: {{__metrics_path__: '/metrics/{i}', instance: '{}:9464'}}\n",
            node_name(i)
        ));
    }
    config
}

/// Every rule group's (name, rules, evaluation time in s, last evaluation).
fn rule_groups(prometheus: &Prometheus) -> Vec<(String, usize, f64, String)> {
    let rules = get_json(&prometheus.addr, "/api/v1/rules");
    rules["data"]["groups"]
        .as_array()
        .expect("rule groups")
        .iter()
        .map(|g| {
            (
                g["name"].as_str().unwrap_or_default().to_string(),
                g["rules"].as_array().map_or(0, Vec::len),
                g["evaluationTime"].as_f64().unwrap_or(0.0),
                g["lastEvaluation"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The value of a sample of Prometheus's own /metrics.
fn own_metric(prometheus: &Prometheus, name: &str) -> f64 {
    http_get(&prometheus.addr, "/metrics")
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Waits, bounded, until `query` has a result: its first value.
fn value_within(prometheus: &Prometheus, query: &str, limit: Duration) -> Option<f64> {
    let deadline = Instant::now() + limit;
    loop {
        let v = get_json(
            &prometheus.addr,
            &format!("/api/v1/query?query={}", encode(query)),
        );
        if let Some(value) = v["data"]["result"]
            .as_array()
            .and_then(|r| r.first())
            .and_then(|s| s["value"][1].as_str()?.parse().ok())
        {
            return Some(value);
        }
        if Instant::now() > deadline {
            return None;
        }
        thread::sleep(Duration::from_secs(1));
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn main() {
    let nodes: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("NODES is a number of nodes"))
        .unwrap_or(2000);

    // One node of a real job, its /metrics read while the job runs, once every family has
    // series: the window values and properties too (2 s windows).
    let daemon = Daemon::with_config(
        "[analysis]\nwindow_s = 2.0\nlateness_s = 0.5\n",
        &["--node", "replayed"],
    );
    let program = program("phases", Mpi::OpenMpi);
    let mut launch = Mpi::OpenMpi.launcher(RANKS);
    launch
        .arg(&program)
        .args(["iters=400", "ms=2,6,12", "imbalance=0:1:1.5"]);
    let mut job = launch.spawn().expect("start mpirun");
    let mut exposition = String::new();
    wait_until(
        &daemon,
        Duration::from_secs(60),
        "window series of the job",
        || {
            exposition = http_get(&daemon.addr, "/metrics");
            [
                "mpiburst_job_window_ranks{",
                "span=\"window\"",
                "mpiburst_phase_key_bursts{",
            ]
            .iter()
            .all(|family| exposition.contains(family))
        },
    );
    // The node's own load balance over the job so far, as of the same stats update.
    let id = job_id(&daemon.addr, &program, &[]);
    let properties = get_json(
        &daemon.addr,
        &format!("/api/jobs/{}/properties", encode(&id)),
    );
    let node_load_balance = job_property_value(&properties, "load_balance");
    let status = wait_with_timeout(&mut job, Duration::from_secs(180)).expect("the job ends");
    assert!(status.success(), "phases failed: {status}");
    drop(daemon.stop());

    let job_label = format!("mpi_job=\"{id}\"");
    let series: Vec<&str> = exposition
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    let job_series = series.iter().filter(|l| l.contains(&job_label)).count();
    let mut families: BTreeMap<&str, usize> = BTreeMap::new();
    for line in series.iter().filter(|l| l.contains(&job_label)) {
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        *families.entry(name).or_default() += 1;
    }
    let node_series = series.len() - job_series;

    let replay = Arc::new(Replay::new(&exposition, "node=\"replayed\""));
    let addr = serve(replay.clone(), nodes);
    println!(
        "Prometheus rule evaluation over one job of {nodes} nodes: each node replays the /metrics of \
         a real daemon that profiled job {id} ({RANKS} ranks of tests/mpi/phases, one phase \
         imbalanced), scraped every {SCRAPE_S} s and its rules evaluated every {INTERVAL_S} s by {}.",
        prometheus_version()
    );
    println!();
    println!("| series | per node | for the job over {nodes} nodes |");
    println!("|---|---|---|");
    println!(
        "| of the job (label mpi_job) | {job_series} | {} |",
        job_series * nodes
    );
    println!(
        "| of the daemon itself | {node_series} | {} |",
        node_series * nodes
    );
    println!(
        "| one node's exposition | {} bytes | {} MB per scrape round (uncompressed) |",
        replay.node(0).len(),
        replay.node(0).len() * nodes / 1_000_000
    );
    println!();
    let largest: Vec<String> = {
        let mut by_count: Vec<_> = families.iter().collect();
        by_count.sort_by(|a, b| b.1.cmp(a.1));
        by_count
            .iter()
            .take(6)
            .map(|(name, count)| format!("{name} {count}"))
            .collect()
    };
    println!(
        "The job's largest families on a node (series): {}. None has a rank label: a node's \
         series grow with the job's phases, MPI functions and properties, not with its ranks.",
        largest.join(", ")
    );
    println!();

    let started = Instant::now();
    let prometheus = Prometheus::scraping(
        SCRAPE_S,
        INTERVAL_S,
        &scrape_configs(&addr, nodes),
        "",
        Duration::from_secs(300),
    );
    let up = value_within(
        &prometheus,
        &format!("count(up{{job=\"mpiburst\"}} == 1) >= {nodes}"),
        Duration::from_secs(120),
    );
    let job_wide = format!("mpi_job:mpiburst_load_balance:ratio{{mpi_job=\"{id}\"}}");
    let rules_load_balance = value_within(&prometheus, &job_wide, Duration::from_secs(120));
    println!(
        "Prometheus ready, {} of {nodes} targets up and the job-wide rules evaluated after {:.0} s.",
        up.map_or("not all".to_string(), |n| format!("{n:.0}")),
        started.elapsed().as_secs_f64()
    );

    // Each group's evaluation time after each of its next evaluations.
    let mut times: BTreeMap<String, (usize, Vec<f64>)> = BTreeMap::new();
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let deadline =
        Instant::now() + Duration::from_secs(u64::from(INTERVAL_S) * (EVALUATIONS as u64 + 3));
    while Instant::now() < deadline
        && (times.is_empty() || times.values().any(|(_, t)| t.len() < EVALUATIONS))
    {
        for (name, rules, seconds, evaluated) in rule_groups(&prometheus) {
            if last.get(&name) != Some(&evaluated) {
                last.insert(name.clone(), evaluated);
                times
                    .entry(name)
                    .or_insert((rules, Vec::new()))
                    .1
                    .push(seconds);
            }
        }
        thread::sleep(Duration::from_secs(1));
    }
    let head_series = own_metric(&prometheus, "prometheus_tsdb_head_series");
    let resident = own_metric(&prometheus, "process_resident_memory_bytes");
    let prometheus_cpu = own_metric(&prometheus, "process_cpu_seconds_total");
    println!();
    println!("| rule group | rules | evaluations | evaluation time median | max | share of the {INTERVAL_S} s interval (max) |");
    println!("|---|---|---|---|---|---|");
    let mut total_median = 0.0;
    for (name, (rules, seconds)) in &times {
        // The first reading may be an evaluation from before every target was scraped.
        let seconds: Vec<f64> = seconds.iter().skip(1).copied().collect();
        if seconds.is_empty() {
            println!("| {name} | {rules} | 0 | – | – | – |");
            continue;
        }
        let max = seconds.iter().copied().fold(0.0, f64::max);
        let med = median(seconds.clone());
        total_median += med;
        println!(
            "| {name} | {rules} | {} | {:.3} s | {:.3} s | {:.1} % |",
            seconds.len(),
            med,
            max,
            100.0 * max / f64::from(INTERVAL_S)
        );
    }
    println!();
    println!(
        "All groups: {total_median:.3} s of evaluation per {INTERVAL_S} s (medians). Prometheus: {head_series:.0} head series, {:.0} MiB resident, {prometheus_cpu:.0} s CPU since its start ({:.0} s ago, scrapes included).",
        resident / (1024.0 * 1024.0),
        started.elapsed().as_secs_f64()
    );
    println!(
        "Check: the job-wide load balance from the rules is {} over {nodes} identical nodes; the node's own is {node_load_balance:.4}.",
        rules_load_balance.map_or("missing".into(), |v| format!("{v:.4}")),
    );
}

/// `prometheus --version`'s first line.
fn prometheus_version() -> String {
    std::process::Command::new("prometheus")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned()
                + &String::from_utf8_lossy(&o.stderr);
            text.lines().next().map(str::to_string)
        })
        .unwrap_or_else(|| "Prometheus".into())
}
