//! `mpiburst report --format json` and `mpiburst compare --format json` as scripts run them: the
//! built binary on recordings of synthetic jobs and on a stand-in for a daemon's JSON API serving
//! what a daemon would (no MPI, no BPF), standard output holding one JSON document and nothing
//! else.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::TcpListener,
    path::Path,
    process::Command,
    thread,
};

use mpiburst::{
    analysis::{
        online::{JobPhases, OnlineParams},
        synthetic::{Phase, SyntheticJob},
    },
    export::{
        client::encode_segment,
        recording::{write_synthetic, Recording, RecordingEnd, RecordingHeader, FORMAT_VERSION},
    },
    model::JobId,
    properties::PropertyConfig,
    store::JobMeta,
};
use serde_json::{json, Value};

/// Writes a recording of a 2-rank job of two phases, the second one taking `ms` milliseconds.
fn record(path: &Path, id: &str, ms: f64) {
    record_iterations(path, id, ms, 30);
}

fn record_iterations(path: &Path, id: &str, ms: f64, iterations: u32) {
    let job = SyntheticJob {
        ranks: 2,
        iterations,
        phases: vec![
            Phase::new(5e6, 1.0, 0.02),
            Phase::new(ms * 2.5e6, 1.0, 0.02),
        ],
        tiny_bursts_per_phase: 1,
        outlier_share: 0.0,
        counters: false,
        seed: 3,
    };
    let bursts = job.bursts();
    let first = bursts.iter().map(|b| b.start_ns).min().unwrap();
    let last = bursts
        .iter()
        .map(|b| b.start_ns + b.duration_ns)
        .max()
        .unwrap();
    write_synthetic(
        path,
        RecordingHeader {
            version: FORMAT_VERSION,
            node: "node7".into(),
            started_ns: first,
            min_burst_ns: 1_000,
            counter_events: None,
            counters_note: "no counters".into(),
            functions: vec!["MPI_Allreduce".into(), "MPI_Isend".into()],
        },
        &JobMeta {
            id: JobId(id.into()),
            node: "node7".into(),
            size: 2,
            source: "synthetic".into(),
            executable: "/opt/app".into(),
            build_id: Some("ab12".into()),
            first_seen_ns: first,
            ended_ns: Some(last),
        },
        &bursts,
        RecordingEnd {
            ended_ns: last,
            lost: Default::default(),
        },
    )
    .unwrap();
}

/// `mpiburst ARGS`: success, standard output, standard error.
fn mpiburst(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_mpiburst"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("run the built mpiburst");
    (
        out.status.success(),
        String::from_utf8(out.stdout).expect("UTF-8 on stdout"),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn report_json_is_the_only_output_and_matches_the_text() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("run.jsonl");
    record(&path, "pmix:7", 8.0);
    let path = path.to_str().unwrap();

    let (ok, stdout, stderr) = mpiburst(&["report", path, "--phases", "--format", "json"]);
    assert!(ok, "{stderr}");
    assert_eq!(stderr, "", "nothing but the JSON, and no notes");
    let doc: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert_eq!(doc["schema"], "mpiburst-report");
    assert_eq!(doc["version"], 1);
    let jobs = doc["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(job["meta"]["id"], "pmix:7");
    assert_eq!(job["ranks"].as_array().unwrap().len(), 2);
    let clusters = job["phases"]["analysis"]["clusters"].as_array().unwrap();
    assert_eq!(clusters.len(), 2, "{stdout}");
    assert_eq!(clusters[0]["bursts"], 60, "30 iterations × 2 ranks");

    // The text shows the same numbers.
    let (ok, text, stderr) = mpiburst(&["report", path, "--phases"]);
    assert!(ok, "{stderr}");
    let pop = &job["bottlenecks"]["properties"]["pop"];
    let lb = pop["load_balance"]["value"].as_f64().unwrap();
    assert!(text.contains(&format!("load balance {lb:.3}")), "{text}");
    let spmd = job["phases"]["analysis"]["global_score"].as_f64().unwrap();
    assert!(
        text.contains(&format!(
            "2 clusters over 2 ranks, global SPMD score {spmd:.3}"
        )),
        "{text}"
    );

    // Errors go to standard error with the text's message, and nothing to standard output.
    let (ok, stdout, stderr) = mpiburst(&["report", path, "--job", "pmix:8", "--format", "json"]);
    assert!(!ok);
    assert_eq!(stdout, "");
    assert!(
        stderr.contains("job pmix:8 is not in") && stderr.contains("pass one of: pmix:7"),
        "{stderr}"
    );

    // --html writes its page next to the JSON.
    let html = dir.path().join("phases.html");
    let (ok, stdout, stderr) = mpiburst(&[
        "report",
        path,
        "--html",
        html.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(ok, "{stderr}");
    let doc: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert_eq!(doc["jobs"][0]["phases"], Value::Null, "no --phases");
    assert!(html.exists() && stderr.contains("wrote "), "{stderr}");
}

#[test]
fn compare_json_lists_the_matched_phases() {
    let dir = tempfile::tempdir().unwrap();
    let (before, after) = (
        dir.path().join("before.jsonl"),
        dir.path().join("after.jsonl"),
    );
    record(&before, "pmix:1", 8.0);
    record(&after, "pmix:2", 12.0);
    let (ok, stdout, stderr) = mpiburst(&[
        "compare",
        before.to_str().unwrap(),
        after.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(ok, "{stderr}");
    assert_eq!(stderr, "");
    let doc: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert_eq!(doc["schema"], "mpiburst-compare");
    assert_eq!(doc["version"], 1);
    assert_eq!(doc["before"]["job"], "pmix:1");
    assert_eq!(doc["after"]["job"], "pmix:2");
    let phases = doc["match"]["phases"].as_array().unwrap();
    assert_eq!(phases.len(), 2, "{stdout}");
    // The phase that went from 8 ms to 12 ms is 50 % longer.
    let changes: Vec<f64> = phases
        .iter()
        .map(|p| p["trend"]["duration_mean_change"].as_f64().unwrap())
        .collect();
    assert!(
        changes.iter().any(|c| (c - 0.5).abs() < 0.05),
        "{changes:?}"
    );
}

/// Serves `routes` (path → body) over HTTP/1.0 on loopback, one request per connection, until
/// a request for /stop; any other path is a 404.
fn serve(routes: Vec<(String, String)>) -> (String, thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let handle = thread::spawn(move || {
        for stream in listener.incoming() {
            let mut stream = stream.unwrap();
            let mut request = String::new();
            let mut reader = BufReader::new(&stream);
            reader.read_line(&mut request).unwrap();
            let mut header = String::new();
            // The headers, up to the empty line.
            while reader.read_line(&mut header).unwrap() > 0 && header != "\r\n" {
                header.clear();
            }
            let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
            if path == "/stop" {
                return;
            }
            let response = match routes.iter().find(|(p, _)| *p == path) {
                Some((_, body)) => format!(
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                ),
                None => "HTTP/1.0 404 Not Found\r\n\r\nno such path".to_string(),
            };
            stream.write_all(response.as_bytes()).unwrap();
        }
    });
    (addr, handle)
}

#[test]
fn report_json_from_a_daemon_carries_its_properties_and_online_phases() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.jsonl");
    // 2 ranks × 400 iterations of 10 ms: the 1 s windows 0 to 2 are complete.
    record_iterations(&path, "pmix:9", 8.0, 400);
    let r = Recording::read(&path).unwrap();
    let job = r.jobs.values().next().unwrap();
    let end = r.end.as_ref().unwrap().ended_ns;
    let properties = r.job_properties(job, end, &PropertyConfig::default());
    let mut online = JobPhases::new(
        2,
        OnlineParams {
            window_s: 1.0,
            lateness_s: 0.0,
            ..OnlineParams::default()
        },
    )
    .unwrap();
    for b in &job.bursts {
        online.push(b);
    }
    online.tick(end);
    let snapshot = online.snapshot();
    let id = format!("/api/jobs/{}", encode_segment(&job.meta.id.0));
    let ranks: Vec<_> = job.ranks.values().collect();
    let (addr, server) = serve(vec![
        (
            "/api/jobs".into(),
            json!([{ "meta": job.meta }]).to_string(),
        ),
        (
            "/metrics".into(),
            "mpiburst_counters_info{event=\"none\",hardware=\"false\"} 1\n".into(),
        ),
        (
            id.clone(),
            json!({ "meta": job.meta, "ranks": ranks, "bursts_evicted": 0 }).to_string(),
        ),
        (
            format!("{id}/properties"),
            json!({ "job": properties }).to_string(),
        ),
        (format!("{id}/phases"), json!(snapshot).to_string()),
    ]);
    let daemon = format!("http://{addr}");

    let (ok, stdout, stderr) = mpiburst(&["report", &daemon, "--phases", "--format", "json"]);
    let (text_ok, text, text_err) = mpiburst(&["report", &daemon, "--phases"]);
    let _ = std::net::TcpStream::connect(&addr)
        .and_then(|mut s| s.write_all(b"GET /stop HTTP/1.0\r\n\r\n"));
    server.join().unwrap();

    assert!(ok, "{stderr}");
    assert_eq!(stderr, "");
    let doc: Value = serde_json::from_str(&stdout).expect("stdout is one JSON document");
    assert_eq!(doc["schema"], "mpiburst-report");
    let j = &doc["jobs"][0];
    assert_eq!(j["meta"]["id"], "pmix:9");
    assert_eq!(
        j["bottlenecks"]["properties"],
        serde_json::to_value(&properties).unwrap(),
        "the daemon's own evaluation"
    );
    let phases = &j["phases"];
    assert_eq!(phases["source"], "daemon");
    let window = &phases["online"]["last_window"];
    let last = snapshot.last_window.as_ref().expect("a clustered window");
    assert_eq!(window["window"], last.window);
    let ids: Vec<u64> = window["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids.len(), 2, "{stdout}");

    assert!(text_ok, "{text_err}");
    let lb = properties.pop.load_balance.value().unwrap();
    assert!(text.contains(&format!("load balance {lb:.3}")), "{text}");
    assert!(
        text.contains(&format!(
            "tracking: phases {} active",
            ids.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )),
        "{text}"
    );
}
