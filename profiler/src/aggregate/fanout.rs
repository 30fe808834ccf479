//! One GET to many daemons at once: the answers of those that gave one, and, named, those that
//! did not (down, late, or without the job), so that a merge over the rest says what it lacks.

use serde::{de::DeserializeOwned, Serialize};

use crate::export::client::DaemonClient;

/// A daemon that gave no answer, and why.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Unreachable {
    /// The daemon's address (HOST:PORT).
    pub node: String,
    pub error: String,
}

/// GETs `path` from every daemon concurrently: the answers in the daemons' order, and those that
/// failed. Each GET has the client's own time limits, so a frozen daemon costs one timeout, not
/// one per daemon.
pub async fn fan_out<T: DeserializeOwned + Send + 'static>(
    daemons: &[DaemonClient],
    path: String,
) -> (Vec<(DaemonClient, T)>, Vec<Unreachable>) {
    let requests: Vec<_> = daemons
        .iter()
        .cloned()
        .map(|daemon| {
            let path = path.clone();
            tokio::spawn(async move { daemon.fetch_json::<T>(&path).await })
        })
        .collect();
    let mut answers = Vec::new();
    let mut unreachable = Vec::new();
    for (daemon, request) in daemons.iter().zip(requests) {
        let error = match request.await {
            Ok(Ok(answer)) => {
                answers.push((daemon.clone(), answer));
                continue;
            }
            Ok(Err(e)) => e.to_string(),
            Err(e) => format!("the request failed: {e}"),
        };
        unreachable.push(Unreachable {
            node: daemon.to_string(),
            error,
        });
    }
    (answers, unreachable)
}
