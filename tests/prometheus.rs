//! The daemon's metrics with a real Prometheus (Debian's `prometheus` and `promtool`): the
//! exposition passes promtool's checks, the recording rules pass their unit tests, and the
//! job-wide load balance Prometheus computes from a live daemon equals the one computed directly
//! from every rank.

use std::{
    path::Path,
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use mpiburst_tests::*;

fn rules_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../dashboards/rules")
}

fn promtool(args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new("promtool")
        .args(args)
        .current_dir(rules_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; `cargo xtask test` installs it)");
    if let Some(input) = stdin {
        use std::io::Write;
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

#[test]
fn recording_rules_pass_promtool_checks_and_unit_tests() {
    promtool(&["check", "rules", "mpiburst.rules.yml"], None);
    promtool(&["test", "rules", "mpiburst.rules.test.yml"], None);
}

/// Prometheus, scraping one daemon every second and evaluating the recording rules; stopped on
/// drop.
struct Prometheus {
    child: std::process::Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let rules = rules_dir().join("mpiburst.rules.yml").canonicalize().unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: mpiburst\n    static_configs:\n      - targets: ['{target}']\n",
            rules.display()
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let addr = free_loopback_addr();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", dir.path().join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus (Debian package; `cargo xtask test` installs it)");
        let p = Prometheus { child, addr, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&p.addr).is_err() {
            assert!(Instant::now() < deadline, "prometheus did not start listening");
            thread::sleep(Duration::from_millis(200));
        }
        p
    }

    /// The single value of an instant query, once it has one (bounded wait).
    fn value(&self, query: &str) -> f64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let body = http_get(&self.addr, &format!("/api/v1/query?query={}", encode(query)));
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            if let Some(sample) = v["data"]["result"].as_array().and_then(|r| r.first()) {
                return sample["value"][1].as_str().unwrap().parse().unwrap();
            }
            assert!(Instant::now() < deadline, "no result for {query}: {body}");
            thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'_' | b'.' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[test]
fn job_load_balance_from_the_rules_equals_the_direct_value() {
    if !privileged("load_balance_rules") {
        return;
    }
    let daemon = Daemon::start(&[]);
    let prometheus = Prometheus::start(&daemon.addr);
    // Rank 0 does a tenth of rank 1's work per iteration: load balance about (0.1 + 1) / 2 = 0.55.
    let program = program("imbalance", Mpi::OpenMpi);
    run_mpi(Mpi::OpenMpi, 2, &program, &["40", "20"]);
    thread::sleep(Duration::from_millis(1500));
    // The exposition of a real job passes promtool's linter.
    promtool(&["check", "metrics"], Some(&http_get(&daemon.addr, "/metrics")));
    let jobs: serde_json::Value = serde_json::from_str(&http_get(&daemon.addr, "/api/jobs")).unwrap();
    let id = jobs.as_array().unwrap()[0]["meta"]["id"].as_str().unwrap().to_string();
    let detail: serde_json::Value =
        serde_json::from_str(&http_get(&daemon.addr, &format!("/api/jobs/{}", encode(&id)))).unwrap();
    let useful: Vec<f64> =
        detail["ranks"].as_array().unwrap().iter().map(|r| r["totals"]["burst_ns"].as_f64().unwrap() / 1e9).collect();
    assert_eq!(useful.len(), 2);
    let direct = useful.iter().sum::<f64>() / useful.len() as f64 / useful.iter().cloned().fold(0.0, f64::max);
    // Let Prometheus scrape the final values and evaluate the rules on them.
    thread::sleep(Duration::from_secs(3));
    let from_rules = prometheus.value(&format!("mpi_job:mpiburst_load_balance:ratio{{mpi_job=\"{id}\"}}"));
    eprintln!("load balance: {from_rules} from the recording rules, {direct} from the ranks directly");
    assert!((from_rules - direct).abs() < 1e-9, "rules {from_rules} vs direct {direct}");
    assert!((0.5..0.62).contains(&direct), "load balance {direct}, expected about 0.55");
    let recording = daemon.stop();
    let job = job_of(&recording, &program);
    // Rank 0 waits for rank 1 most of each iteration: its MPI fraction is about 0.9.
    let r0 = &job.ranks[&0];
    let fraction = r0.mpi_ns() as f64 / (r0.mpi_ns() + r0.totals.burst_ns) as f64;
    eprintln!("MPI fraction of rank 0: {fraction:.3}");
    assert!((0.8..0.95).contains(&fraction), "MPI fraction of rank 0: {fraction}");
}
