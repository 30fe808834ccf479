//! The job-wide analysis of a job whose ranks run on several nodes, each profiled by its own
//! daemon: local samples at the leaves, one model over them, as González García (2013, §10.5.1)
//! sketches for the burst clustering of large jobs.
//!
//! Each node keeps the samples of its last closed windows ([`WindowSample`]) and sends them with
//! what they belong to ([`NodeSamples`]). Windows are aligned to Unix time, so window k is the
//! same on every node, and a node's sample holds, for each (slot, rank) stratum, the first bursts
//! of that stratum: at least as many as one daemon seeing all ranks would keep, since a node's
//! quota is the window bound shared among fewer ranks. Pushed in rank order into a
//! [`JobPhases`] of the job's world size, the union is therefore cut to exactly the sample that
//! daemon would have kept, and clustered, tracked and scored as it would have (the analysis sees
//! bursts by rank and start time wherever they came from). Clock skew between nodes moves a
//! burst between slots only at slot edges.
//!
//! What a node sends is only what that cut keeps ([`NodeSamples::new`]): the strata of the
//! ranks in the job's [`RankSample`], each trimmed to the quota of the job's world size, so a
//! node of a large job sends a few bursts per window however many its daemon keeps for its own
//! analysis ([`super::wire`] encodes them compactly).
//!
//! Only windows that every node has closed and still holds are merged, so a node that is late
//! or lost its samples never makes a window look smaller than it was; the nodes, the windows
//! merged and the world ranks no node sent are reported beside the phases, never left out.

use std::{collections::BTreeMap, sync::Arc};

use serde::{Deserialize, Serialize};

use super::snapshot::live_signature;
use super::windows::{slot_of, window_ns};
use super::{JobPhases, OnlineError, OnlineParams, PhasesSnapshot, RankSample, WindowSample};
use crate::analysis::signature::live::{RepetitionSums, SumsError};
use crate::model::JobId;

/// Closed windows whose samples a node keeps: the last one, and two before it for a node that
/// closes its windows later than the others or an aggregator that asks late.
pub const KEPT_WINDOW_SAMPLES: usize = 3;

/// The samples one instance holds of its job, as every exporter's snapshot carries them
/// ([`PhasesSnapshot::samples`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeldSamples {
    pub params: OnlineParams,
    /// Samples of every closed window from this one on are held (the older ones are dropped)…
    pub samples_from: u64,
    /// …up to this one, the first window not closed yet.
    pub closed_before: u64,
    /// The samples of the windows that had bursts, oldest first.
    pub windows: Vec<Arc<WindowSample>>,
}

/// What one node holds of a job for the job-wide analysis, and whose it is. On the wire in the
/// compact form of [`super::wire`].
#[derive(Clone, Debug, PartialEq)]
pub struct NodeSamples {
    pub node: String,
    pub job: JobId,
    /// Ranks in the job's world communicator, over all nodes.
    pub world_size: u32,
    /// The world ranks that ran on this node.
    pub ranks: Vec<u32>,
    pub held: HeldSamples,
}

impl NodeSamples {
    /// What node `node` sends of job `job` (`world_size` ranks, `ranks` of them here) from the
    /// samples it holds: of each window, the bursts the merge keeps (see the module docs).
    pub fn new(
        node: String,
        job: JobId,
        world_size: u32,
        ranks: Vec<u32>,
        held: &HeldSamples,
    ) -> NodeSamples {
        let params = &held.params;
        let sample = RankSample::new(world_size, params);
        let quota = sample.stratum_quota(params) as usize;
        let window_ns = window_ns(params);
        let trim = |window: &Arc<WindowSample>| {
            // The bursts are by rank and start, so each stratum is one stretch of them.
            let mut bursts = Vec::new();
            let mut stratum = None;
            let mut in_stratum = 0;
            for burst in window.bursts.iter().filter(|b| sample.keeps(b.rank)) {
                let (_, slot, _, _) = slot_of(burst.start_ns, window_ns, params.window_slots);
                if stratum != Some((burst.rank, slot)) {
                    stratum = Some((burst.rank, slot));
                    in_stratum = 0;
                }
                if in_stratum < quota {
                    bursts.push(burst.clone());
                    in_stratum += 1;
                }
            }
            let left_out = (window.bursts.len() - bursts.len()) as u64;
            Arc::new(WindowSample {
                dropped: window.dropped + left_out,
                bursts,
                repetitions: window.repetitions.clone(),
                ..**window
            })
        };
        NodeSamples {
            node,
            job,
            world_size,
            ranks,
            held: HeldSamples {
                params: params.clone(),
                samples_from: held.samples_from,
                closed_before: held.closed_before,
                windows: held.windows.iter().map(trim).collect(),
            },
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MergeError {
    #[error("no node sent samples of job {0}")]
    NoNodes(JobId),
    #[error("node {node} sent the samples of job {found}, not of job {expected}")]
    OtherJob {
        node: String,
        found: JobId,
        expected: JobId,
    },
    #[error(
        "nodes {first} and {other} analyse job {job} with different [online] settings; give \
         every node's daemon the same configuration"
    )]
    Params {
        job: JobId,
        first: String,
        other: String,
    },
    #[error(
        "nodes {first} and {other} disagree on the size of job {job} ({first_size} and \
         {other_size} ranks): they do not see the same job; check how the job was launched"
    )]
    WorldSize {
        job: JobId,
        first: String,
        first_size: u32,
        other: String,
        other_size: u32,
    },
    #[error(
        "rank {rank} of job {job} was sent by two nodes, {first} and {other}: two daemons \
         profile the same processes; give each node's daemon its own --cgroup"
    )]
    RankTwice {
        job: JobId,
        rank: u32,
        first: String,
        other: String,
    },
    #[error("{0}; give every node's daemon the same [analysis] settings")]
    Repetitions(#[from] SumsError),
    #[error(transparent)]
    Online(#[from] OnlineError),
}

/// One node's part in a merge.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeCoverage {
    pub node: String,
    pub ranks: Vec<u32>,
    pub samples_from: u64,
    pub closed_before: u64,
    /// The node is behind the others: windows it has not closed yet were left out of the merge.
    pub late: bool,
}

/// The job-wide phases of the windows merged, and what they were made of.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MergedPhases {
    pub job: JobId,
    pub world_size: u32,
    /// The analysis over all nodes' samples of [`MergedPhases::windows`], in the shape of one
    /// daemon's ([`PhasesSnapshot`]). It has no cumulative view: that would cover only these
    /// windows, not the job.
    pub snapshot: PhasesSnapshot,
    /// The windows merged: closed on every node, and held by every node.
    pub windows: Vec<u64>,
    pub nodes: Vec<NodeCoverage>,
    /// World ranks that no node sent: their node is down or did not answer, or they did not
    /// start.
    pub missing_ranks: Vec<u32>,
}

/// The job-wide analysis of the samples `nodes` sent of job `job` (see the module docs).
pub fn merge_nodes(job: &JobId, nodes: &[NodeSamples]) -> Result<MergedPhases, MergeError> {
    let first = nodes
        .first()
        .ok_or_else(|| MergeError::NoNodes(job.clone()))?;
    let mut owner: BTreeMap<u32, &str> = BTreeMap::new();
    for node in nodes {
        if node.job != *job {
            return Err(MergeError::OtherJob {
                node: node.node.clone(),
                found: node.job.clone(),
                expected: job.clone(),
            });
        }
        if node.held.params != first.held.params {
            return Err(MergeError::Params {
                job: job.clone(),
                first: first.node.clone(),
                other: node.node.clone(),
            });
        }
        if node.world_size != first.world_size {
            return Err(MergeError::WorldSize {
                job: job.clone(),
                first: first.node.clone(),
                first_size: first.world_size,
                other: node.node.clone(),
                other_size: node.world_size,
            });
        }
        for &rank in &node.ranks {
            if let Some(other) = owner.insert(rank, &node.node) {
                return Err(MergeError::RankTwice {
                    job: job.clone(),
                    rank,
                    first: other.to_string(),
                    other: node.node.clone(),
                });
            }
        }
    }

    // Windows closed on every node and still held by every node.
    let from = nodes.iter().map(|n| n.held.samples_from).max().unwrap_or(0);
    let before = nodes
        .iter()
        .map(|n| n.held.closed_before)
        .min()
        .unwrap_or(0);
    let latest = nodes
        .iter()
        .map(|n| n.held.closed_before)
        .max()
        .unwrap_or(0);
    let mut by_window: BTreeMap<u64, Vec<&WindowSample>> = BTreeMap::new();
    for node in nodes {
        for sample in node
            .held
            .windows
            .iter()
            .filter(|s| (from..before).contains(&s.window))
        {
            by_window.entry(sample.window).or_default().push(sample);
        }
    }

    let world_size = first.world_size.max(owner.len() as u32);
    let mut phases = JobPhases::new(world_size, first.held.params.clone())?;
    let lateness_ns = phases.lateness_ns;
    for (&window, samples) in &by_window {
        let mut bursts: Vec<_> = samples
            .iter()
            .flat_map(|s| s.bursts.iter())
            .cloned()
            .collect();
        bursts.sort_by_key(|b| (b.rank, b.start_ns, b.tid));
        phases.push_all(&bursts);
        phases.tick((window + 1).saturating_mul(phases.window_ns) + lateness_ns);
    }
    let mut snapshot = phases.snapshot();
    snapshot.cumulative = None;
    // The window totals and the repetitions are the nodes', not the re-pushed samples'.
    snapshot.signature = None;
    if let Some(last) = snapshot.last_window.as_mut() {
        if let Some(samples) = by_window.get(&last.window) {
            last.bursts_seen = samples.iter().map(|s| s.seen).sum();
            last.time_seen_ns = samples.iter().map(|s| s.seen_time_ns).sum();
            last.bursts_dropped = last.bursts_seen.saturating_sub(last.bursts_analysed);
        }
    }
    // The repetitions up to the end of the last window any node sampled, as a daemon's own
    // signature: a node that sampled no later window had no burst since its last sample, so its
    // sums up to that sample hold at the later cut (all but the time of a burst that spans whole
    // windows).
    if let (Some(last), Some(&window)) = (&snapshot.last_window, by_window.keys().next_back()) {
        let cut_ns = (window + 1).saturating_mul(phases.window_ns);
        let mut repetitions = RepetitionSums {
            cut_ns,
            ..RepetitionSums::default()
        };
        for node in nodes {
            let latest = node
                .held
                .windows
                .iter()
                .filter(|s| (from..=window).contains(&s.window))
                .max_by_key(|s| s.window);
            if let Some(sample) = latest {
                repetitions.add(&RepetitionSums {
                    cut_ns,
                    ..sample.repetitions.clone()
                })?;
            }
        }
        snapshot.signature = live_signature(last, &repetitions);
    }
    Ok(MergedPhases {
        job: job.clone(),
        world_size,
        snapshot,
        windows: by_window.keys().copied().collect(),
        nodes: nodes
            .iter()
            .map(|n| NodeCoverage {
                node: n.node.clone(),
                ranks: n.ranks.clone(),
                samples_from: n.held.samples_from,
                closed_before: n.held.closed_before,
                late: n.held.closed_before < latest,
            })
            .collect(),
        missing_ranks: (0..world_size).filter(|r| !owner.contains_key(r)).collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{spmd, test_params, E1_PHASES, T0};
    use super::*;
    use crate::model::Burst;

    const JOB: &str = "pmix:1";

    /// One daemon's analysis of the bursts of `ranks` of a 4-rank SPMD job, 6 s long, on a node
    /// whose clock is `skew_ns` behind.
    fn profiled(ranks: &[u32], skew_ns: u64, counters: bool) -> JobPhases {
        profiled_in(4, ranks, &test_params(), skew_ns, counters)
    }

    /// One daemon's analysis of the bursts of `ranks` of a `world`-rank SPMD job, 6 s long,
    /// analysed with `params`, on a node whose clock is `skew_ns` behind.
    fn profiled_in(
        world: u32,
        ranks: &[u32],
        params: &OnlineParams,
        skew_ns: u64,
        counters: bool,
    ) -> JobPhases {
        let window_ns = (params.window_s * 1e9) as u64;
        let mut phases = JobPhases::new(ranks.len() as u32, params.clone()).unwrap();
        let mut pushed = 0u64;
        spmd(
            world,
            counters,
            &E1_PHASES,
            window_ns,
            6.0,
            3,
            |_, _, _| 1.0,
            |b: Burst| {
                if ranks.contains(&b.rank) {
                    phases.push(&Burst {
                        start_ns: b.start_ns - skew_ns,
                        ..b
                    });
                    pushed += 1;
                    if pushed.is_multiple_of(500) {
                        phases.tick(b.start_ns - skew_ns);
                    }
                }
            },
        );
        phases.tick(T0 + 20 * window_ns);
        phases
    }

    /// What node `name` sends of a 4-rank job.
    fn node(name: &str, ranks: &[u32], phases: &JobPhases) -> NodeSamples {
        node_of(name, 4, ranks, phases)
    }

    /// What node `name` sends of a `world`-rank job, as the aggregator reads it off the wire.
    fn node_of(name: &str, world: u32, ranks: &[u32], phases: &JobPhases) -> NodeSamples {
        let sent = NodeSamples::new(
            name.into(),
            JobId(JOB.into()),
            world,
            ranks.to_vec(),
            &phases.snapshot().samples,
        );
        serde_json::from_str(&serde_json::to_string(&sent).unwrap()).unwrap()
    }

    /// Each phase's (time share, SPMD score) in the last window, by time rank, and the window's
    /// SPMD score.
    fn last_window(snapshot: &PhasesSnapshot) -> (u64, Vec<(f64, f64)>, f64) {
        let last = snapshot.last_window.as_ref().expect("a closed window");
        let mut phases: Vec<_> = last.phases.iter().collect();
        phases.sort_by_key(|p| p.time_rank);
        let shares = phases
            .iter()
            .map(|p| (p.stats.time_share, p.stats.spmd_score))
            .collect();
        (last.window, shares, last.spmd_score)
    }

    /// The last windows of `merged` and `one` are the same window with the same phases, their
    /// time shares and scores equal but for the precision of the wire (four significant digits).
    fn assert_same_last_window(merged: &PhasesSnapshot, one: &PhasesSnapshot, what: &str) {
        let (window, phases, score) = last_window(merged);
        let (expected_window, expected, expected_score) = last_window(one);
        assert_eq!(window, expected_window, "{what}");
        assert_eq!(
            phases.len(),
            expected.len(),
            "{what}: {phases:?} vs {expected:?}"
        );
        let close = |a: f64, b: f64| (a - b).abs() < 1e-4;
        for (got, want) in phases.iter().zip(&expected) {
            assert!(
                close(got.0, want.0) && close(got.1, want.1),
                "{what}: {phases:?} vs {expected:?}"
            );
        }
        assert!(
            close(score, expected_score),
            "{what}: {score} vs {expected_score}"
        );
    }

    #[test]
    fn the_nodes_samples_merge_into_what_one_daemon_seeing_all_ranks_finds() {
        for counters in [true, false] {
            let all = profiled(&[0, 1, 2, 3], 0, counters);
            let a = profiled(&[0, 1], 0, counters);
            let b = profiled(&[2, 3], 0, counters);
            let merged = merge_nodes(
                &JobId(JOB.into()),
                &[node("a", &[0, 1], &a), node("b", &[2, 3], &b)],
            )
            .unwrap();
            assert_eq!(merged.windows.len(), KEPT_WINDOW_SAMPLES);
            assert!(merged.missing_ranks.is_empty());
            assert!(merged.nodes.iter().all(|n| !n.late));
            assert_same_last_window(
                &merged.snapshot,
                &all.snapshot(),
                &format!("counters {counters}"),
            );
            assert!(merged.snapshot.cumulative.is_none());
            // The signature: sums of every rank's repetitions, exact, over the same phases.
            let signature = |s: &PhasesSnapshot| {
                let s = s.signature.clone().expect("a signature").signature;
                let phases: Vec<_> = s
                    .phases
                    .iter()
                    .map(|p| (p.key.clone(), p.weight, p.pet_ns))
                    .collect();
                (s.ranks, s.runtime_ns, phases)
            };
            let (ranks, runtime_ns, phases) = signature(&merged.snapshot);
            assert_eq!((ranks, phases.len()), (4, E1_PHASES.len()));
            assert!(phases.iter().all(|p| p.1 > 1.0 && p.2 > 0.0), "{phases:?}");
            assert_eq!((ranks, runtime_ns, phases), signature(&all.snapshot()));
        }
    }

    #[test]
    fn nodes_of_a_job_too_large_for_the_bound_send_the_rank_sample_and_merge_into_one_daemons() {
        // 64 ranks on 4 nodes: 16 bursts in each of 8 slots of 64 ranks do not fit a bound of
        // 4,096 bursts, of 16 ranks they do.
        let params = OnlineParams {
            max_window_bursts: 4_096,
            ..test_params()
        };
        let world = 64;
        let sample = RankSample::new(world, &params);
        assert_eq!((sample.kept(), sample.stratum_quota(&params)), (32, 16));
        let all: Vec<u32> = (0..world).collect();
        let one_daemon = profiled_in(world, &all, &params, 0, true);
        let nodes: Vec<NodeSamples> = all
            .chunks(16)
            .enumerate()
            .map(|(i, ranks)| {
                let phases = profiled_in(world, ranks, &params, 0, true);
                assert_eq!(
                    phases.rank_sample.kept(),
                    16,
                    "a node's own sample keeps its ranks"
                );
                node_of(&format!("n{i}"), world, ranks, &phases)
            })
            .collect();
        for node in &nodes {
            for window in &node.held.windows {
                // Only sampled ranks, 16 bursts per (slot, rank) stratum.
                assert!(window.bursts.iter().all(|b| sample.keeps(b.rank)));
                let sampled = node.ranks.iter().filter(|&&r| sample.keeps(r)).count();
                assert!(window.bursts.len() <= sampled * params.window_slots as usize * 16);
            }
        }
        let merged = merge_nodes(&JobId(JOB.into()), &nodes).unwrap();
        assert!(merged.missing_ranks.is_empty());
        let last = merged.snapshot.last_window.as_ref().unwrap();
        assert_eq!(last.ranks_sampled, 32);
        assert_eq!(last.bursts_analysed, 4_096);
        assert!(last.sequences.iter().all(|s| sample.keeps(s.rank)));
        assert_same_last_window(&merged.snapshot, &one_daemon.snapshot(), "64 ranks");
    }

    #[test]
    fn clock_skew_of_50_ms_between_nodes_keeps_the_phases() {
        let all = profiled(&[0, 1, 2, 3], 0, false);
        let a = profiled(&[0, 1], 0, false);
        let b = profiled(&[2, 3], 50_000_000, false);
        let merged = merge_nodes(
            &JobId(JOB.into()),
            &[node("a", &[0, 1], &a), node("b", &[2, 3], &b)],
        )
        .unwrap();
        let (window, skewed, score) = last_window(&merged.snapshot);
        let (expected_window, phases, expected_score) = last_window(&all.snapshot());
        assert_eq!(window, expected_window);
        assert_eq!(skewed.len(), phases.len());
        for (got, want) in skewed.iter().zip(&phases) {
            assert!((got.0 - want.0).abs() < 0.01, "{skewed:?} vs {phases:?}");
        }
        assert!(
            (score - expected_score).abs() < 0.02,
            "{score} vs {expected_score}"
        );
    }

    #[test]
    fn a_node_that_did_not_answer_leaves_its_ranks_missing_and_a_late_one_its_windows_out() {
        let a = profiled(&[0, 1], 0, false);
        let b = profiled(&[2, 3], 0, false);
        let merged = merge_nodes(&JobId(JOB.into()), &[node("a", &[0, 1], &a)]).unwrap();
        assert_eq!(merged.missing_ranks, vec![2, 3]);

        // Node b has not closed the last window yet.
        let mut late = node("b", &[2, 3], &b);
        let last = late.held.windows.pop().unwrap().window;
        late.held.closed_before = last;
        let merged = merge_nodes(&JobId(JOB.into()), &[node("a", &[0, 1], &a), late]).unwrap();
        assert_eq!(merged.windows.len(), KEPT_WINDOW_SAMPLES - 1);
        assert!(!merged.windows.contains(&last));
        assert!(merged.nodes[1].late && !merged.nodes[0].late);
    }

    #[test]
    fn samples_of_other_jobs_settings_or_the_same_rank_twice_are_refused() {
        let a = profiled(&[0, 1], 0, false);
        let job = JobId(JOB.into());
        let twice = merge_nodes(&job, &[node("a", &[0, 1], &a), node("b", &[1, 2], &a)]);
        assert!(
            matches!(twice, Err(MergeError::RankTwice { rank: 1, .. })),
            "{twice:?}"
        );
        let mut other = node("b", &[2, 3], &a);
        other.held.params.window_s = 30.0;
        let settings = merge_nodes(&job, &[node("a", &[0, 1], &a), other]);
        assert!(settings
            .unwrap_err()
            .to_string()
            .contains("give every node's daemon the same configuration"));
        let mut stranger = node("b", &[2, 3], &a);
        stranger.job = JobId("pmix:2".into());
        let other_job = merge_nodes(&job, &[node("a", &[0, 1], &a), stranger]);
        assert!(matches!(other_job, Err(MergeError::OtherJob { .. })));
        assert!(matches!(
            merge_nodes(&job, &[]),
            Err(MergeError::NoNodes(_))
        ));
    }
}
