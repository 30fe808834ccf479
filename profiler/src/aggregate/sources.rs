//! Where the aggregator finds a job's nodes: the daemons named on its command line, or the
//! daemons a Prometheus server scrapes, each job on the `instance`s of its `mpiburst_job_info`
//! series. Either way the aggregator keeps no list of its own: it asks on every request.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use serde::Deserialize;

use super::fanout::{fan_out, Unreachable};
use super::AggregateError;
use crate::export::client::{encode_segment, DaemonClient};
use crate::model::JobId;

/// How far back Prometheus is asked for a job's nodes: a node whose daemon went down a few
/// minutes ago is still one of the job's nodes, named as missing rather than forgotten.
const NODES_SEEN_WITHIN: &str = "10m";

/// Where the nodes are.
#[derive(Clone, Debug)]
pub enum Sources {
    /// These daemons; a job's nodes are those that list it.
    Daemons(Vec<DaemonClient>),
    /// The daemons this Prometheus server scrapes, found by their `mpiburst_job_info` series,
    /// each asked with the time limit `node_timeout`.
    Prometheus {
        server: DaemonClient,
        node_timeout: Duration,
    },
}

/// The nodes of each job, and the daemons that could not be asked.
#[derive(Debug, Default)]
pub struct JobNodes {
    pub nodes: BTreeMap<JobId, Vec<DaemonClient>>,
    pub unreachable: Vec<Unreachable>,
}

impl Sources {
    /// The nodes of `job`.
    pub async fn job_nodes(&self, job: &JobId) -> Result<JobNodes, AggregateError> {
        match self {
            Sources::Daemons(daemons) => Ok(listed_jobs(daemons, job).await),
            Sources::Prometheus {
                server,
                node_timeout,
            } => scraped_jobs(server, *node_timeout, Some(job)).await,
        }
    }

    /// Every daemon the sources know (to list all jobs), and those that could not be named.
    pub async fn daemons(&self) -> Result<(Vec<DaemonClient>, Vec<Unreachable>), AggregateError> {
        match self {
            Sources::Daemons(daemons) => Ok((daemons.clone(), Vec::new())),
            Sources::Prometheus {
                server,
                node_timeout,
            } => {
                let found = scraped_jobs(server, *node_timeout, None).await?;
                let mut daemons: Vec<DaemonClient> = found.nodes.into_values().flatten().collect();
                daemons.sort_by_key(ToString::to_string);
                daemons.dedup();
                Ok((daemons, found.unreachable))
            }
        }
    }
}

/// Asks every daemon whether it holds `job`.
async fn listed_jobs(daemons: &[DaemonClient], job: &JobId) -> JobNodes {
    #[derive(Deserialize)]
    struct Listed {
        meta: Meta,
    }
    #[derive(Deserialize)]
    struct Meta {
        id: JobId,
    }
    let (answers, unreachable) = fan_out::<Vec<Listed>>(daemons, "/api/jobs".into()).await;
    let mut nodes: BTreeMap<JobId, Vec<DaemonClient>> = BTreeMap::new();
    for (daemon, listed) in answers {
        if listed.iter().any(|l| l.meta.id == *job) {
            nodes.entry(job.clone()).or_default().push(daemon.clone());
        }
    }
    JobNodes { nodes, unreachable }
}

/// Asks Prometheus which daemons reported which jobs lately.
async fn scraped_jobs(
    prometheus: &DaemonClient,
    node_timeout: Duration,
    job: Option<&JobId>,
) -> Result<JobNodes, AggregateError> {
    #[derive(Deserialize)]
    struct Answer {
        data: Data,
    }
    #[derive(Deserialize)]
    struct Data {
        result: Vec<Series>,
    }
    #[derive(Deserialize)]
    struct Series {
        metric: Labels,
    }
    #[derive(Deserialize)]
    struct Labels {
        mpi_job: JobId,
        instance: String,
    }
    let selector = match job {
        Some(job) => format!(
            "{{mpi_job=\"{}\"}}",
            job.0.replace('\\', "\\\\").replace('"', "\\\"")
        ),
        None => String::new(),
    };
    let query = format!("last_over_time(mpiburst_job_info{selector}[{NODES_SEEN_WITHIN}])");
    let path = format!("/api/v1/query?query={}", encode_segment(&query));
    let answer: Answer = prometheus
        .fetch_json(&path)
        .await
        .map_err(|source| AggregateError::Prometheus { source })?;
    let mut nodes: BTreeMap<JobId, BTreeSet<String>> = BTreeMap::new();
    for series in answer.data.result {
        nodes
            .entry(series.metric.mpi_job)
            .or_default()
            .insert(series.metric.instance);
    }
    let mut found = JobNodes::default();
    for (id, instances) in nodes {
        let mut daemons = Vec::new();
        for instance in instances {
            // An instance is the HOST:PORT Prometheus scrapes: the daemon's API is there too.
            match DaemonClient::parse(&instance, 0) {
                Ok(Some(daemon)) => daemons.push(daemon.with_timeout(node_timeout)),
                _ => found.unreachable.push(Unreachable {
                    node: instance.clone(),
                    error: format!(
                        "Prometheus scrapes it as {instance:?}, which is not HOST:PORT of a daemon"
                    ),
                }),
            }
        }
        found.nodes.insert(id, daemons);
    }
    Ok(found)
}

impl std::fmt::Display for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Sources::Daemons(daemons) => {
                let list: Vec<String> = daemons.iter().map(ToString::to_string).collect();
                write!(f, "the daemons at {}", list.join(", "))
            }
            Sources::Prometheus { server, .. } => {
                write!(f, "the daemons that Prometheus at {server} scrapes")
            }
        }
    }
}
