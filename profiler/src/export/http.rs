//! HTTP server: Prometheus `/metrics`, the JSON API (`/api/jobs`, `/api/jobs/{id}`,
//! `/api/jobs/{id}/phases`, `/api/jobs/{id}/properties`, `/api/jobs/{id}/ranks`, and for the
//! job-wide analysis `/api/jobs/{id}/samples` and `/api/jobs/{id}/ranks/signatures`) and
//! `/healthz` for the service manager and the node's health checks.
//!
//! The server runs on a thread of its own and reads only what the daemon last published (a
//! [`Published`](crate::export::published::Published) view behind a watch channel): a scrape
//! never waits for the daemon to drain bursts, cluster a window or evaluate properties, and the
//! daemon never waits for a slow client.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    thread::{self, JoinHandle},
};

use axum::{
    extract::{Path, State},
    http::{header, StatusCode},
    middleware,
    response::{IntoResponse, Response},
    routing::get,
    Json, Router,
};
use serde::{Deserialize, Serialize};

use crate::{
    analysis::{groups::merge::NodeRankGroups, online::NodeSamples},
    export::{
        compression,
        prometheus::Metrics,
        published::{PublishedState, SelfStats},
        sites,
    },
    model::JobId,
    store::{CallStats, Job, JobMeta, RankRecord, RankTotals},
    symbols::SiteResolver,
};

#[derive(Serialize)]
struct JobSummary<'a> {
    meta: &'a JobMeta,
    totals: RankTotals,
    mpi_ns: u64,
}

/// `/api/jobs/{id}`: the job's identity, its ranks with their exact totals, its calls, and the
/// counters its bursts carry.
#[derive(Serialize)]
pub struct JobDetail<'a> {
    meta: &'a JobMeta,
    totals: RankTotals,
    ranks: Vec<&'a RankRecord>,
    functions: std::collections::BTreeMap<&'a str, CallStats>,
    bursts_held: usize,
    bursts_evicted: u64,
    counters: &'a CountersInUse,
}

impl<'a> JobDetail<'a> {
    pub fn of(job: &'a Job, bursts_held: usize, counters: &'a CountersInUse) -> Self {
        JobDetail {
            meta: &job.meta,
            totals: job.totals(),
            ranks: job.ranks.values().collect(),
            functions: job.functions(),
            bursts_held,
            bursts_evicted: job.bursts_evicted,
            counters,
        }
    }
}

/// The counters a daemon reads per burst (`counters` of `/api/jobs/{id}`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CountersInUse {
    /// The counter events, comma-separated, or `none`.
    pub events: String,
    /// Whether they count instructions and cycles in hardware (the IPC properties need them).
    pub hardware: bool,
}

impl CountersInUse {
    /// What the daemon's health says it reads.
    pub fn of(health: &SelfStats) -> Self {
        CountersInUse {
            events: health.counter_events.clone(),
            hardware: health.hardware_counters,
        }
    }

    /// What several nodes read: hardware counters only where every node has them, and each
    /// node's events once.
    pub fn job_wide<'a>(nodes: impl IntoIterator<Item = &'a CountersInUse>) -> Option<Self> {
        let mut events: Vec<&str> = Vec::new();
        let mut hardware = true;
        for node in nodes {
            if !events.contains(&node.events.as_str()) {
                events.push(&node.events);
            }
            hardware &= node.hardware;
        }
        (!events.is_empty()).then(|| CountersInUse {
            events: events.join(" and "),
            hardware,
        })
    }

    /// The counters line of the job report.
    pub fn note(&self) -> String {
        if self.events == "none" {
            "no counters: bursts carry wall and on-CPU time only (the daemon's log says why)".into()
        } else if self.hardware {
            format!("hardware counters: {}", self.events)
        } else {
            format!(
                "software counters {} (no instructions or cycles)",
                self.events
            )
        }
    }
}

/// `/metrics`: the text exposition, or why there is none.
fn metrics(registry: &Metrics) -> Response {
    match registry.render() {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the metrics: {e}"),
        )
            .into_response(),
    }
}

/// `/healthz`: 200 once the probes are attached, 503 while the daemon starts (the server
/// listens before the BPF programs are loaded).
async fn healthz(State(state): State<PublishedState>) -> impl IntoResponse {
    if state.borrow().probes_attached {
        (StatusCode::OK, "ok: probes attached\n")
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "starting: the probes are not attached yet\n",
        )
    }
}

async fn jobs(State(state): State<PublishedState>) -> impl IntoResponse {
    let s = state.borrow().clone();
    let list: Vec<JobSummary> = s
        .store
        .jobs
        .values()
        .map(|j| JobSummary {
            meta: &j.meta,
            totals: j.totals(),
            mpi_ns: j.ranks.values().map(|r| r.mpi_ns()).sum(),
        })
        .collect();
    Json(serde_json::to_value(list).unwrap_or_default())
}

async fn job(State(state): State<PublishedState>, Path(id): Path<String>) -> impl IntoResponse {
    let s = state.borrow().clone();
    let id = JobId(id);
    let Some(j) = s.store.jobs.get(&id) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no job {id:?} on this node; GET /api/jobs lists them"),
        )
            .into_response();
    };
    let counters = CountersInUse::of(&s.health);
    let detail = JobDetail::of(
        j,
        s.bursts_held.get(&id).copied().unwrap_or_default(),
        &counters,
    );
    Json(serde_json::to_value(detail).unwrap_or_default()).into_response()
}

async fn job_properties(
    State(state): State<PublishedState>,
    Path(id): Path<String>,
) -> impl IntoResponse {
    let s = state.borrow().clone();
    match s.properties.get(&JobId(id.clone())) {
        Some(live) => {
            // The recommendations that apply, most severe first, next to the full results.
            let recommendations = |p: &crate::properties::JobProperties| p.recommendations();
            Json(serde_json::json!({
                "job": live.job,
                "job_recommendations": recommendations(&live.job),
                "window": live.window,
                "window_recommendations": live.window.as_ref().map(|w| recommendations(&w.properties)),
                "usage": s.usage.get(&JobId(id.clone())),
            }))
            .into_response()
        }
        None => (
            StatusCode::NOT_FOUND,
            format!("no properties for job {id:?} yet; GET /api/jobs lists the jobs"),
        )
            .into_response(),
    }
}

/// The job's rank groups (`groups`: id, lead, members, signature) and behaviour changes.
async fn job_ranks(State(state): State<PublishedState>, Path(id): Path<String>) -> Response {
    let s = state.borrow().clone();
    match s.rank_groups.get(&JobId(id.clone())) {
        Some(view) => Json(serde_json::to_value(view.as_ref()).unwrap_or_default()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no rank groups for job {id:?}; GET /api/jobs lists the jobs"),
        )
            .into_response(),
    }
}

/// The job's rank groups with this node's ranks' signatures: what the aggregator clusters into
/// the job-wide groups.
async fn job_rank_signatures(
    State(state): State<PublishedState>,
    Path(id): Path<String>,
) -> Response {
    let s = state.borrow().clone();
    let id = JobId(id);
    match (s.store.jobs.get(&id), s.rank_groups.get(&id)) {
        (Some(job), Some(view)) => Json(NodeRankGroups::of(&job.meta.node, view)).into_response(),
        _ => (
            StatusCode::NOT_FOUND,
            format!(
                "no rank groups for job {:?} on this node; GET /api/jobs lists the jobs",
                id.0
            ),
        )
            .into_response(),
    }
}

/// The samples of the job's last closed windows, with this node's ranks of the job: what the
/// aggregator merges into the job-wide analysis (`mpiburst aggregate`), trimmed to what the merge
/// keeps and in the compact form of [`crate::analysis::online::wire`].
async fn job_samples(State(state): State<PublishedState>, Path(id): Path<String>) -> Response {
    let s = state.borrow().clone();
    let id = JobId(id);
    let (Some(job), Some(snapshot)) = (s.store.jobs.get(&id), s.phases.get(&id)) else {
        return (
            StatusCode::NOT_FOUND,
            format!(
                "no phase analysis for job {:?} on this node; GET /api/jobs lists the jobs",
                id.0
            ),
        )
            .into_response();
    };
    let samples = NodeSamples::new(
        job.meta.node.clone(),
        id,
        job.meta.size,
        job.ranks.keys().copied().collect(),
        &snapshot.samples,
    );
    Json(samples).into_response()
}

/// The snapshot, with `call_sites`: the names of its code regions' call sites, resolved here on
/// the server's thread (not the daemon's) and cached per build-id.
async fn job_phases(
    State(state): State<PublishedState>,
    Path(id): Path<String>,
    resolver: Arc<Mutex<SiteResolver>>,
) -> impl IntoResponse {
    let s = state.borrow().clone();
    let id = JobId(id);
    let Some(snapshot) = s.phases.get(&id) else {
        return (
            StatusCode::NOT_FOUND,
            format!(
                "no phase analysis for job {:?} yet; it starts with the job's first bursts",
                id.0
            ),
        )
            .into_response();
    };
    let metas: Vec<&JobMeta> = s.store.jobs.get(&id).map(|j| &j.meta).into_iter().collect();
    let mut resolver = resolver.lock().unwrap_or_else(|e| e.into_inner());
    let names = sites::names(&mut resolver, &metas, sites::snapshot_sites(snapshot));
    let mut body = serde_json::to_value(snapshot.as_ref()).unwrap_or_default();
    if let Some(fields) = body.as_object_mut() {
        let call_sites = serde_json::to_value(names.entries()).unwrap_or_default();
        fields.insert("call_sites".into(), call_sites);
    }
    Json(body).into_response()
}

/// Binds the listener (so a bad address fails at start-up) and serves on a thread of its own
/// until the daemon drops its end of the watch channel. Returns the bound address and the
/// thread.
pub fn serve(
    addr: SocketAddr,
    state: PublishedState,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let registry = Metrics::new(state.clone()).map_err(|e| {
        std::io::Error::other(format!("cannot set up the Prometheus registry: {e}"))
    })?;
    let mut closed = state.clone();
    let resolver = Arc::new(Mutex::new(SiteResolver::new()));
    let app = Router::new()
        .route(
            "/metrics",
            get(move || std::future::ready(metrics(&registry))),
        )
        .route("/healthz", get(healthz))
        .route("/api/jobs", get(jobs))
        .route("/api/jobs/{id}", get(job))
        .route(
            "/api/jobs/{id}/phases",
            get(move |state, id| job_phases(state, id, resolver.clone())),
        )
        .route("/api/jobs/{id}/properties", get(job_properties))
        .route("/api/jobs/{id}/ranks", get(job_ranks))
        .route("/api/jobs/{id}/ranks/signatures", get(job_rank_signatures))
        .route("/api/jobs/{id}/samples", get(job_samples))
        .layer(middleware::from_fn(compression::gzip_when_accepted))
        .with_state(state);
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let local = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let thread = thread::Builder::new()
        .name("mpiburst-http".into())
        .spawn(move || {
            let served = runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                axum::serve(listener, app)
                    .with_graceful_shutdown(async move {
                        // Err once the daemon has dropped the sender: it is shutting down.
                        while closed.changed().await.is_ok() {}
                    })
                    .await
            });
            if let Err(e) = served {
                tracing::error!("the HTTP server on {local} stopped: {e}");
            }
        })?;
    Ok((local, thread))
}

#[cfg(test)]
mod tests {
    use tokio::sync::watch;

    use super::*;
    use crate::export::{
        client::{ClientError, DaemonClient},
        published::Published,
    };

    #[test]
    fn healthz_answers_200_only_once_the_probes_are_attached() {
        let publisher = watch::Sender::new(Arc::new(Published::default()));
        let (addr, server) = serve("127.0.0.1:0".parse().unwrap(), publisher.subscribe()).unwrap();
        let client = DaemonClient::parse(&addr.to_string(), addr.port())
            .unwrap()
            .unwrap();
        match client.get("/healthz") {
            Err(ClientError::Status { status, .. }) => assert_eq!(status, 503),
            other => panic!("before the probes are attached: {other:?}"),
        }
        publisher.send_replace(Arc::new(Published {
            probes_attached: true,
            ..Published::default()
        }));
        assert_eq!(client.get("/healthz").unwrap(), b"ok: probes attached\n");
        drop(publisher);
        server.join().unwrap();
    }

    #[test]
    fn the_counters_note_and_the_job_wide_counters_of_several_nodes() {
        let counters = |events: &str, hardware| CountersInUse {
            events: events.into(),
            hardware,
        };
        let none = counters("none", false);
        assert!(none
            .note()
            .starts_with("no counters: bursts carry wall and on-CPU time only"));
        let hw = counters("instructions,cycles", true);
        assert_eq!(hw.note(), "hardware counters: instructions,cycles");
        let sw = counters("task-clock,page-faults", false);
        assert!(sw
            .note()
            .starts_with("software counters task-clock,page-faults"));
        assert_eq!(CountersInUse::job_wide([&hw, &hw]), Some(hw.clone()));
        // One node without a PMU: no IPC job-wide.
        assert_eq!(
            CountersInUse::job_wide([&hw, &sw, &hw]),
            Some(counters(
                "instructions,cycles and task-clock,page-faults",
                false
            ))
        );
        assert_eq!(CountersInUse::job_wide([]), None);
    }

    /// The head and body of a GET over a connection of its own, with `accept_encoding`.
    fn raw_get(addr: SocketAddr, path: &str, accept_encoding: Option<&str>) -> (String, Vec<u8>) {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        let accept = accept_encoding
            .map(|a| format!("Accept-Encoding: {a}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{accept}Connection: close\r\n\r\n"
        )
        .unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).unwrap();
        let split = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&answer[..split]).to_ascii_lowercase();
        (head, answer[split + 4..].to_vec())
    }

    #[test]
    fn answers_are_gzipped_only_for_clients_that_accept_it_and_the_client_reads_both() {
        let publisher = watch::Sender::new(Arc::new(Published::default()));
        let (addr, server) = serve("127.0.0.1:0".parse().unwrap(), publisher.subscribe()).unwrap();
        let (plain_head, plain) = raw_get(addr, "/metrics", None);
        assert!(!plain_head.contains("content-encoding"), "{plain_head}");
        assert!(
            plain.len() > 1024,
            "the exposition is long enough to compress"
        );
        let (head, body) = raw_get(addr, "/metrics", Some("gzip"));
        assert!(head.contains("content-encoding: gzip"), "{head}");
        assert!(body.len() < plain.len());
        let unzipped = compression::gunzip(&body).unwrap();
        // The process_* metrics change between the two GETs; the families do not.
        let families = |text: &[u8]| -> Vec<String> {
            String::from_utf8_lossy(text)
                .lines()
                .filter(|l| l.starts_with("# TYPE"))
                .map(str::to_string)
                .collect()
        };
        assert_eq!(families(&unzipped), families(&plain));
        let client = DaemonClient::parse(&addr.to_string(), addr.port())
            .unwrap()
            .unwrap();
        assert_eq!(families(&client.get("/metrics").unwrap()), families(&plain));
        // Short answers go uncompressed even when gzip is accepted.
        let (head, body) = raw_get(addr, "/healthz", Some("gzip"));
        assert!(!head.contains("content-encoding"), "{head}");
        assert!(
            body.starts_with(b"starting"),
            "{:?}",
            String::from_utf8_lossy(&body)
        );
        drop(publisher);
        server.join().unwrap();
    }
}
