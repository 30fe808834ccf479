//! The aggregator's HTTP API: a daemon's routes, answered for the whole job.
//!
//! * `/api/jobs`: the jobs the nodes know, each with its nodes named.
//! * `/api/jobs/{id}`: the job with the ranks of all its nodes.
//! * `/api/jobs/{id}/phases`: the job-wide phases of the last windows every node closed.
//! * `/api/jobs/{id}/properties`: the properties over the job's life, evaluated from the exact
//!   totals of all its ranks (POP over the whole job), as a recording's report evaluates them.
//! * `/api/jobs/{id}/ranks`: the rank groups and lead ranks of all ranks, clustered from the
//!   signatures each node's groups were last formed from (default `[groups]` settings), and the
//!   job's behaviour changes, merged from the nodes' ([`crate::analysis::groups::merge`]).
//! * `/healthz`, and `/metrics` with the aggregator's own counters.
//!
//! Each job answer carries `job_wide`: the nodes merged, the nodes that did not answer (with
//! why), and the world ranks that no node sent.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use axum::{
    extract::{Path, State},
    http::{header, StatusCode},
    middleware,
    response::{IntoResponse, Response},
    routing::get,
    Json, Router,
};
use serde::Serialize;
use serde_json::Value;

use super::fanout::{fan_out, Unreachable};
use super::Sources;
use crate::{
    analysis::{
        groups::{merge::NodeRankGroups, GroupParams},
        online::{merge_nodes, NodeSamples},
    },
    export::{
        client::{job_path, DaemonClient, ServedJob},
        compression,
        http::{CountersInUse, JobDetail},
    },
    model::{unix_now_ns, JobId},
    properties::{lifetime_properties, PropertyConfig},
    store::{
        job_wide::{merge_node_jobs, JobWideError},
        Job, JobMeta,
    },
};

/// What every request reads: where the nodes are, and the aggregator's own counters.
#[derive(Clone)]
struct Aggregator {
    sources: Arc<Sources>,
    counters: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    node_failures: AtomicU64,
    merge_failures: AtomicU64,
}

pub fn router(sources: Sources) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok: aggregator\n" }))
        .route("/metrics", get(metrics))
        .route("/api/jobs", get(jobs))
        .route("/api/jobs/{id}", get(job))
        .route("/api/jobs/{id}/phases", get(phases))
        .route("/api/jobs/{id}/properties", get(properties))
        .route("/api/jobs/{id}/ranks", get(ranks))
        .layer(middleware::from_fn(compression::gzip_when_accepted))
        .with_state(Aggregator {
            sources: Arc::new(sources),
            counters: Arc::default(),
        })
}

/// Who made up a job-wide answer.
#[derive(Serialize)]
struct Coverage<N: Serialize> {
    /// The nodes merged: their names, or for the phases each node's windows.
    nodes: N,
    /// The windows merged (the phases only): those every node has closed and still holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    windows: Option<Vec<u64>>,
    unreachable: Vec<Unreachable>,
    missing_ranks: Vec<u32>,
    /// Ranks whose node's daemon started after them (a daemon restarted while the job ran): their
    /// totals cover only the time since, as their `MPI_Init not seen` says.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ranks_seen_late: Vec<u32>,
}

/// A failed request: its status and what to do.
struct Failure(StatusCode, String);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, self.1).into_response()
    }
}

impl From<JobWideError> for Failure {
    fn from(e: JobWideError) -> Self {
        Failure(StatusCode::CONFLICT, e.to_string())
    }
}

impl Aggregator {
    /// The daemons of job `id`, and those that could not be asked.
    async fn nodes_of(&self, id: &JobId) -> Result<(Vec<DaemonClient>, Vec<Unreachable>), Failure> {
        self.counters.requests.fetch_add(1, Ordering::Relaxed);
        let mut found = self
            .sources
            .job_nodes(id)
            .await
            .map_err(|e| Failure(StatusCode::BAD_GATEWAY, e.to_string()))?;
        match found.nodes.remove(id) {
            Some(daemons) => Ok((daemons, found.unreachable)),
            None => Err(Failure(
                StatusCode::NOT_FOUND,
                format!(
                    "no node reports job {:?}; GET /api/jobs lists the jobs of {}{}",
                    id.0,
                    self.sources,
                    unreachable_note(&found.unreachable)
                ),
            )),
        }
    }

    /// Counts the nodes that did not answer.
    fn failed(&self, unreachable: &[Unreachable]) {
        self.counters
            .node_failures
            .fetch_add(unreachable.len() as u64, Ordering::Relaxed);
    }
}

fn unreachable_note(unreachable: &[Unreachable]) -> String {
    if unreachable.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = unreachable.iter().map(|u| u.node.as_str()).collect();
    format!(" (not answering: {})", names.join(", "))
}

/// Who made up a merged job: its nodes, those that did not answer, the world ranks it lacks.
fn job_coverage(job: &Job, unreachable: Vec<Unreachable>) -> Coverage<Vec<&str>> {
    Coverage {
        nodes: job.meta.node.split(',').collect(),
        windows: None,
        unreachable,
        missing_ranks: (0..job.meta.size)
            .filter(|r| !job.ranks.contains_key(r))
            .collect(),
        ranks_seen_late: job
            .ranks
            .values()
            .filter(|r| r.region.init_return_ns.is_none() && r.calls() > 0)
            .map(|r| r.rank)
            .collect(),
    }
}

/// `value` (a JSON object) with `job_wide` added.
fn with_coverage<N: Serialize>(mut value: Value, coverage: Coverage<N>) -> Response {
    if let Some(fields) = value.as_object_mut() {
        fields.insert(
            "job_wide".into(),
            serde_json::to_value(coverage).unwrap_or_default(),
        );
    }
    Json(value).into_response()
}

async fn job(State(aggregator): State<Aggregator>, Path(id): Path<String>) -> Response {
    let id = JobId(id);
    match merged_job(&aggregator, &id).await {
        Ok((job, unreachable, counters)) => {
            let coverage = job_coverage(&job, unreachable);
            with_coverage(
                serde_json::to_value(JobDetail::of(&job, 0, &counters)).unwrap_or_default(),
                coverage,
            )
        }
        Err(failure) => failure.into_response(),
    }
}

/// The properties of the job over its life, from the exact totals of all its ranks.
async fn properties(State(aggregator): State<Aggregator>, Path(id): Path<String>) -> Response {
    let id = JobId(id);
    let (job, unreachable, counters) = match merged_job(&aggregator, &id).await {
        Ok(merged) => merged,
        Err(failure) => return failure.into_response(),
    };
    let properties = lifetime_properties(
        &job,
        counters.hardware,
        unix_now_ns(),
        &PropertyConfig::default(),
    );
    let coverage = job_coverage(&job, unreachable);
    with_coverage(
        serde_json::json!({
            "job": properties,
            "job_recommendations": properties.recommendations(),
        }),
        coverage,
    )
}

/// The rank groups of all the job's ranks, and the job's behaviour changes.
async fn ranks(State(aggregator): State<Aggregator>, Path(id): Path<String>) -> Response {
    let id = JobId(id);
    let (daemons, unreachable) = match aggregator.nodes_of(&id).await {
        Ok(found) => found,
        Err(failure) => return failure.into_response(),
    };
    let path = format!("{}/ranks/signatures", job_path(&id));
    let (merged, (answers, failed)) = tokio::join!(
        merged_job_of(&aggregator, &id, &daemons, unreachable),
        fan_out::<NodeRankGroups>(&daemons, path),
    );
    let (job, mut unreachable, _) = match merged {
        Ok(merged) => merged,
        Err(failure) => return failure.into_response(),
    };
    // A node that sent its job but not yet its groups (none before its first update) is named.
    for failure in failed {
        if !unreachable.iter().any(|u| u.node == failure.node) {
            aggregator.failed(std::slice::from_ref(&failure));
            unreachable.push(failure);
        }
    }
    let nodes: Vec<NodeRankGroups> = answers.into_iter().map(|(_, n)| n).collect();
    let merged = tokio::task::spawn_blocking(move || {
        crate::analysis::groups::merge::merge_nodes(&nodes, &GroupParams::default())
    })
    .await;
    let (view, longer_spans) = match merged {
        Ok(Ok(merged)) => merged,
        Ok(Err(e)) => {
            aggregator
                .counters
                .merge_failures
                .fetch_add(1, Ordering::Relaxed);
            return Failure(
                StatusCode::BAD_GATEWAY,
                format!("{e}{}", unreachable_note(&unreachable)),
            )
            .into_response();
        }
        Err(e) => {
            return Failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the merge of job {:?}'s rank groups failed: {e}", id.0),
            )
            .into_response()
        }
    };
    let mut value = serde_json::to_value(&view).unwrap_or_default();
    if let (Some(fields), false) = (value.as_object_mut(), longer_spans.is_empty()) {
        fields.insert(
            "longer_spans".into(),
            serde_json::to_value(longer_spans).unwrap_or_default(),
        );
    }
    with_coverage(value, job_coverage(&job, unreachable))
}

/// The job with the ranks of every node that answered, the nodes that did not, and the counters
/// of the nodes that did.
async fn merged_job(
    aggregator: &Aggregator,
    id: &JobId,
) -> Result<(Job, Vec<Unreachable>, CountersInUse), Failure> {
    let (daemons, unreachable) = aggregator.nodes_of(id).await?;
    merged_job_of(aggregator, id, &daemons, unreachable).await
}

/// [`merged_job`] from the daemons of the job already found.
async fn merged_job_of(
    aggregator: &Aggregator,
    id: &JobId,
    daemons: &[DaemonClient],
    mut unreachable: Vec<Unreachable>,
) -> Result<(Job, Vec<Unreachable>, CountersInUse), Failure> {
    let (answers, failed) = fan_out::<ServedJob>(daemons, job_path(id)).await;
    unreachable.extend(failed);
    aggregator.failed(&unreachable);
    if answers.is_empty() {
        return Err(Failure(
            StatusCode::BAD_GATEWAY,
            format!(
                "none of the nodes of job {:?} answered{}",
                id.0,
                unreachable_note(&unreachable)
            ),
        ));
    }
    let counters = CountersInUse::job_wide(answers.iter().map(|(_, a)| a.counters()))
        .expect("at least one node answered");
    let job = merge_node_jobs(answers.into_iter().map(|(_, a)| a.into_job()).collect())
        .inspect_err(|_| {
            aggregator
                .counters
                .merge_failures
                .fetch_add(1, Ordering::Relaxed);
        })?;
    Ok((job, unreachable, counters))
}

async fn phases(State(aggregator): State<Aggregator>, Path(id): Path<String>) -> Response {
    let id = JobId(id);
    let (daemons, mut unreachable) = match aggregator.nodes_of(&id).await {
        Ok(found) => found,
        Err(failure) => return failure.into_response(),
    };
    let path = format!("{}/samples", job_path(&id));
    let (answers, failed) = fan_out::<NodeSamples>(&daemons, path).await;
    unreachable.extend(failed);
    aggregator.failed(&unreachable);
    let samples: Vec<NodeSamples> = answers.into_iter().map(|(_, s)| s).collect();
    // Clustering takes CPU: off the threads that answer requests.
    let merging = id.clone();
    let merged = tokio::task::spawn_blocking(move || merge_nodes(&merging, &samples)).await;
    match merged {
        Ok(Ok(merged)) => {
            let coverage = Coverage {
                nodes: merged.nodes,
                windows: Some(merged.windows),
                unreachable,
                missing_ranks: merged.missing_ranks,
                ranks_seen_late: Vec::new(),
            };
            with_coverage(
                serde_json::to_value(&merged.snapshot).unwrap_or_default(),
                coverage,
            )
        }
        Ok(Err(e)) => {
            aggregator
                .counters
                .merge_failures
                .fetch_add(1, Ordering::Relaxed);
            Failure(
                StatusCode::BAD_GATEWAY,
                format!("{e}{}", unreachable_note(&unreachable)),
            )
            .into_response()
        }
        Err(e) => Failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the merge of job {:?} failed: {e}", id.0),
        )
        .into_response(),
    }
}

/// The jobs of all nodes, each job's identity merged over its nodes.
async fn jobs(State(aggregator): State<Aggregator>) -> Response {
    aggregator.counters.requests.fetch_add(1, Ordering::Relaxed);
    let (daemons, unaddressable) = match aggregator.sources.daemons().await {
        Ok(found) => found,
        Err(e) => return Failure(StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    };
    #[derive(serde::Deserialize)]
    struct Listed {
        meta: JobMeta,
    }
    let (answers, mut unreachable) = fan_out::<Vec<Listed>>(&daemons, "/api/jobs".into()).await;
    unreachable.extend(unaddressable);
    aggregator.failed(&unreachable);
    if answers.is_empty() && !unreachable.is_empty() {
        return Failure(
            StatusCode::BAD_GATEWAY,
            format!(
                "no node answered, so no job can be listed{}",
                unreachable_note(&unreachable)
            ),
        )
        .into_response();
    }
    let mut parts: std::collections::BTreeMap<JobId, Vec<Job>> = Default::default();
    for listed in answers.into_iter().flat_map(|(_, listed)| listed) {
        parts
            .entry(listed.meta.id.clone())
            .or_default()
            .push(Job::new(listed.meta));
    }
    let mut list = Vec::new();
    for (id, parts) in parts {
        match merge_node_jobs(parts) {
            Ok(job) => list.push(serde_json::json!({ "meta": job.meta })),
            Err(e) => tracing::warn!("job {id} left out of the list: {e}"),
        }
    }
    if !unreachable.is_empty() {
        tracing::warn!(
            "jobs listed without the nodes that did not answer{}",
            unreachable_note(&unreachable)
        );
    }
    Json(list).into_response()
}

/// The aggregator's own counters, in the Prometheus text format.
async fn metrics(State(aggregator): State<Aggregator>) -> Response {
    let c = &aggregator.counters;
    let counter = |name: &str, help: &str, value: &AtomicU64| {
        format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}\n",
            value.load(Ordering::Relaxed)
        )
    };
    let body = [
        counter(
            "mpiburst_aggregator_requests_total",
            "Job requests answered.",
            &c.requests,
        ),
        counter(
            "mpiburst_aggregator_node_failures_total",
            "Nodes that did not answer a request.",
            &c.node_failures,
        ),
        counter(
            "mpiburst_aggregator_merge_failures_total",
            "Merges refused (nodes that disagree on a job).",
            &c.merge_failures,
        ),
    ]
    .concat();
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}
