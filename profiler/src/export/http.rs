//! HTTP server: Prometheus `/metrics` and the JSON API (`/api/jobs`, `/api/jobs/{id}`,
//! `/api/jobs/{id}/phases`, `/api/jobs/{id}/properties`).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
};

use axum::{
    extract::{Path, State},
    http::{header, StatusCode},
    response::{IntoResponse, Response},
    routing::get,
    Json, Router,
};
use serde::Serialize;

use crate::{
    analysis::online::PhasesSnapshot,
    capture::usage::UsageTotals,
    export::{prometheus::Metrics, SelfStats},
    properties::LiveProperties,
    store::{CallStats, JobMeta, JobStore, RankRecord, RankTotals},
};

/// What the daemon loop updates and the server reads.
#[derive(Default)]
pub struct Shared {
    pub store: JobStore,
    pub health: SelfStats,
    /// The online phase analysis of each job, as of the last tick.
    pub phases: std::collections::BTreeMap<crate::model::JobId, PhasesSnapshot>,
    /// Each job's properties (life and last window), as of the last stats update.
    pub properties: std::collections::BTreeMap<crate::model::JobId, LiveProperties>,
    /// Each job's kernel usage (CPU time, memory, file I/O) on this node.
    pub usage: std::collections::BTreeMap<crate::model::JobId, UsageTotals>,
}

pub type SharedState = Arc<Mutex<Shared>>;

#[derive(Serialize)]
struct JobSummary<'a> {
    meta: &'a JobMeta,
    totals: RankTotals,
    mpi_ns: u64,
}

#[derive(Serialize)]
struct JobDetail<'a> {
    meta: &'a JobMeta,
    totals: RankTotals,
    ranks: Vec<&'a RankRecord>,
    functions: std::collections::BTreeMap<&'a str, CallStats>,
    bursts_held: usize,
    bursts_evicted: u64,
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

async fn jobs(State(state): State<SharedState>) -> impl IntoResponse {
    let s = state.lock().unwrap();
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

async fn job(State(state): State<SharedState>, Path(id): Path<String>) -> impl IntoResponse {
    let s = state.lock().unwrap();
    let Some(j) = s.store.jobs.get(&crate::model::JobId(id.clone())) else {
        return (
            StatusCode::NOT_FOUND,
            format!("no job {id:?} on this node; GET /api/jobs lists them"),
        )
            .into_response();
    };
    let detail = JobDetail {
        meta: &j.meta,
        totals: j.totals(),
        ranks: j.ranks.values().collect(),
        functions: j.functions(),
        bursts_held: j.bursts.len(),
        bursts_evicted: j.bursts_evicted,
    };
    Json(serde_json::to_value(detail).unwrap_or_default()).into_response()
}

async fn job_properties(
    State(state): State<SharedState>,
    Path(id): Path<String>,
) -> impl IntoResponse {
    let s = state.lock().unwrap();
    match s.properties.get(&crate::model::JobId(id.clone())) {
        Some(live) => {
            // The recommendations that apply, most severe first, next to the full results.
            let recommendations = |p: &crate::properties::JobProperties| p.recommendations();
            Json(serde_json::json!({
                "job": live.job,
                "job_recommendations": recommendations(&live.job),
                "window": live.window,
                "window_recommendations": live.window.as_ref().map(|w| recommendations(&w.properties)),
                "usage": s.usage.get(&crate::model::JobId(id.clone())),
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

async fn job_phases(State(state): State<SharedState>, Path(id): Path<String>) -> impl IntoResponse {
    let s = state.lock().unwrap();
    match s.phases.get(&crate::model::JobId(id.clone())) {
        Some(snapshot) => Json(serde_json::to_value(snapshot).unwrap_or_default()).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            format!("no phase analysis for job {id:?} yet; it starts with the job's first bursts"),
        )
            .into_response(),
    }
}

/// Binds the listener (so a bad address fails at start-up) and returns the bound address and
/// the server future.
pub async fn bind(
    addr: SocketAddr,
    state: SharedState,
) -> std::io::Result<(
    SocketAddr,
    impl std::future::Future<Output = std::io::Result<()>>,
)> {
    let registry = Metrics::new(state.clone()).map_err(|e| {
        std::io::Error::other(format!("cannot set up the Prometheus registry: {e}"))
    })?;
    let app = Router::new()
        .route(
            "/metrics",
            get(move || std::future::ready(metrics(&registry))),
        )
        .route("/api/jobs", get(jobs))
        .route("/api/jobs/{id}", get(job))
        .route("/api/jobs/{id}/phases", get(job_phases))
        .route("/api/jobs/{id}/properties", get(job_properties))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((local, async move { axum::serve(listener, app).await }))
}
