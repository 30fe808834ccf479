//! The aggregator (`mpiburst aggregate`): one job-wide view of a job whose ranks run on many
//! nodes, each profiled by its own daemon. Stateless, after Thanos Query: on every request it
//! finds the job's nodes ([`sources`]: the daemons it was given, or those Prometheus scrapes),
//! asks them all at once ([`fanout`]), merges what they answered, and serves the result in the
//! shapes of a daemon's API, so that `mpiburst report http://AGGREGATOR --job JOB` reads it as it
//! reads a daemon. It keeps nothing between requests: a restart loses nothing, and several
//! aggregators can serve side by side, each for the jobs it is asked about.
//!
//! What it merges ([`server`]):
//! * `/api/jobs/{id}`: the ranks of every node ([`crate::store::job_wide`]): exact totals, hence
//!   the POP efficiencies of the whole job.
//! * `/api/jobs/{id}/phases`: the samples of the last closed windows of every node, clustered as
//!   one sample ([`crate::analysis::online::merge`]): phases, SPMD score and rank sequences over
//!   all ranks.
//!
//! Every answer names, under `job_wide`, the nodes merged, those that did not answer and the
//! ranks no node sent: a merge over the nodes that answered is never passed off as the job's.

use std::net::SocketAddr;

use crate::export::client::ClientError;

pub mod fanout;
pub mod server;
pub mod sources;

pub use sources::Sources;

#[derive(Debug, thiserror::Error)]
pub enum AggregateError {
    #[error(
        "cannot find the jobs' nodes through Prometheus: {source}; check --prometheus (the \
         address of the Prometheus server that scrapes the daemons, or of a query API that holds \
         their series, with its path prefix if any)"
    )]
    Prometheus { source: ClientError },
    #[error("cannot listen on {addr}: {source}; choose another --listen address")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the aggregator's runtime: {0}")]
    Runtime(std::io::Error),
}

/// Serves the job-wide API on `listen` until SIGINT or SIGTERM.
pub fn run(listen: SocketAddr, sources: Sources) -> Result<(), AggregateError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(AggregateError::Runtime)?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .map_err(|source| AggregateError::Listen {
                addr: listen,
                source,
            })?;
        let local = listener.local_addr().map_err(AggregateError::Runtime)?;
        eprintln!(
            "mpiburst ready: aggregating the jobs of {sources}, jobs at http://{local}/api/jobs"
        );
        axum::serve(listener, server::router(sources))
            .with_graceful_shutdown(stop_signal())
            .await
            .map_err(AggregateError::Runtime)
    })
}

/// SIGINT or SIGTERM.
async fn stop_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::warn!("cannot watch SIGTERM ({e}); stop the aggregator with SIGINT");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
