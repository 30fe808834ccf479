//! The rank groups of a job that spans nodes, from each node's tracker: the ranks' signatures
//! over the span each node's groups cover, clustered together as one tracker that saw every rank
//! clusters them, and the nodes' behaviour changes merged into the job's.
//!
//! A node's tracker decides its windows from its own ranks only. Where the job changes on every
//! node at once (a phase of the whole program), every node re-clusters in the same windows and
//! the merge equals the one tracker. Where only some nodes' ranks change, the others' groups
//! still cover their earlier span, whose counts no node kept at the change: their ranks, whose
//! call paths did not change, are compared at their rate over that span, scaled to the job's,
//! and the merge names those nodes and the scale.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{
    cluster, BehaviourChange, ChangeLeads, GroupParams, GroupState, RankGroupsView, RankSignature,
};

/// What a node serves for the merge: its view of a job's rank groups, its ranks' signatures and
/// the leads of each of its changes (in the order of `view.changes`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NodeRankGroups {
    pub node: String,
    pub view: RankGroupsView,
    pub signatures: BTreeMap<u32, RankSignature>,
    pub change_leads: Vec<ChangeLeads>,
}

impl NodeRankGroups {
    /// What node `node` serves of `view`.
    pub fn of(node: &str, view: &RankGroupsView) -> Self {
        NodeRankGroups {
            node: node.to_string(),
            view: view.clone(),
            signatures: view.signatures.as_ref().clone(),
            change_leads: view.changes.iter().map(|c| c.leads.clone()).collect(),
        }
    }
}

/// A node whose groups cover a longer span than the job's: it saw no change in the job's last
/// behaviour change, so its ranks' signatures start at its own `since_ns`. Their calls and bytes
/// are multiplied by `scale`, the job's span over the node's, so that they compare with the
/// other ranks' (estimates, from the rate over the node's span).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LongerSpan {
    pub node: String,
    pub since_ns: u64,
    pub scale: f64,
}

/// Nodes whose groups cannot be put together.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum GroupsMergeError {
    #[error("no node sent the job's rank groups")]
    NoNodes,
    #[error(
        "the nodes close rank-group windows of different lengths ({first}: {first_s} s, {other}: \
         {other_s} s); give every daemon the same [analysis] window_s"
    )]
    Windows {
        first: String,
        first_s: f64,
        other: String,
        other_s: f64,
    },
}

/// The job's rank groups from its nodes', and the nodes whose groups cover a longer span.
pub fn merge_nodes(
    nodes: &[NodeRankGroups],
    params: &GroupParams,
) -> Result<(RankGroupsView, Vec<LongerSpan>), GroupsMergeError> {
    let first = nodes.first().ok_or(GroupsMergeError::NoNodes)?;
    let window_s = first.view.window_s;
    if let Some(other) = nodes.iter().find(|n| n.view.window_s != window_s) {
        return Err(GroupsMergeError::Windows {
            first: first.node.clone(),
            first_s: window_s,
            other: other.node.clone(),
            other_s: other.view.window_s,
        });
    }
    let window_ns = ((window_s * 1e9) as u64).max(1);
    let changes = merge_changes(nodes, window_ns, params);
    // The span of the job's groups: from its last change, as the nodes that saw it re-clustered,
    // or from the job's start.
    let saw_last = |n: &NodeRankGroups| changes.last().is_none_or(|c| c.nodes.contains(&n.node));
    let since_ns = match changes.last() {
        Some(_) => nodes
            .iter()
            .filter(|n| saw_last(n))
            .map(|n| n.view.since_ns)
            .max(),
        None => nodes.iter().map(|n| n.view.since_ns).min(),
    }
    .unwrap_or_default();
    let mut signatures: BTreeMap<u32, RankSignature> = BTreeMap::new();
    let mut longer = Vec::new();
    for n in nodes {
        let span = n.view.through_ns.saturating_sub(n.view.since_ns);
        let job_span = n.view.through_ns.saturating_sub(since_ns);
        if saw_last(n) || n.signatures.is_empty() || job_span == 0 || span <= job_span {
            signatures.extend(n.signatures.iter().map(|(&r, s)| (r, s.clone())));
            continue;
        }
        let scale = job_span as f64 / span as f64;
        signatures.extend(n.signatures.iter().map(|(&r, s)| (r, s.scaled(scale))));
        longer.push(LongerSpan {
            node: n.node.clone(),
            since_ns: n.view.since_ns,
            scale,
        });
    }
    let view = RankGroupsView {
        groups: cluster(&signatures, params),
        changes,
        state: job_state(nodes),
        windows_closed: nodes
            .iter()
            .map(|n| n.view.windows_closed)
            .max()
            .unwrap_or(0),
        clusterings: nodes.iter().map(|n| n.view.clusterings).max().unwrap_or(0),
        since_ns,
        through_ns: nodes.iter().map(|n| n.view.through_ns).max().unwrap_or(0),
        window_s,
        signatures: signatures.into(),
    };
    Ok((view, longer))
}

/// The least settled of the nodes' states: the job is stable only where every node is.
fn job_state(nodes: &[NodeRankGroups]) -> GroupState {
    let states: Vec<GroupState> = nodes.iter().map(|n| n.view.state).collect();
    [GroupState::AllTracing, GroupState::Clustering]
        .into_iter()
        .find(|s| states.contains(s))
        .unwrap_or(GroupState::Lead)
}

/// The nodes' behaviour changes as the job's. One tracker over all ranks stays in its changed
/// state while any rank's call path changes, and re-clusters at the first window in which none
/// does: a node's change that begins before another's was confirmed is the same change of the
/// job, from the first window that differed to the last confirmation. Its groups before and
/// after are those of the nodes' leads, clustered together.
fn merge_changes(
    nodes: &[NodeRankGroups],
    window_ns: u64,
    params: &GroupParams,
) -> Vec<BehaviourChange> {
    let mut seen: Vec<(&str, &BehaviourChange, Option<&ChangeLeads>)> = nodes
        .iter()
        .flat_map(|n| {
            let leads = n
                .change_leads
                .iter()
                .map(Some)
                .chain(std::iter::repeat(None));
            n.view
                .changes
                .iter()
                .zip(leads)
                .map(|(c, l)| (n.node.as_str(), c, l))
        })
        .collect();
    seen.sort_by_key(|(node, c, _)| (c.window, c.end_ns, *node));
    let mut job: Vec<(BehaviourChange, ChangeLeads)> = Vec::new();
    for (node, c, leads) in seen {
        let leads = leads.cloned().unwrap_or_default();
        match job.last_mut() {
            // The confirming window is the last before the confirmation's reading.
            Some((last, job_leads)) if c.window < last.confirmed_ns / window_ns => {
                if c.window == last.window {
                    last.end_ns = last.end_ns.max(c.end_ns);
                }
                last.start_ns = last.start_ns.min(c.start_ns);
                last.confirmed_ns = last.confirmed_ns.max(c.confirmed_ns);
                last.ranks.extend(&c.ranks);
                last.ranks.sort_unstable();
                last.ranks.dedup();
                if !last.nodes.iter().any(|n| n == node) {
                    last.nodes.push(node.to_string());
                    last.nodes.sort();
                }
                job_leads.before.extend(leads.before);
                job_leads.after.extend(leads.after);
            }
            _ => job.push((
                BehaviourChange {
                    nodes: vec![node.to_string()],
                    leads: ChangeLeads::default(),
                    ..c.clone()
                },
                leads,
            )),
        }
    }
    job.into_iter()
        .map(|(mut change, leads)| {
            if !leads.before.is_empty() || !leads.after.is_empty() {
                change.groups_before = cluster(&leads.before, params).len();
                change.groups_after = cluster(&leads.after, params).len();
            }
            change
        })
        .collect()
}
