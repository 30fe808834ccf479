//! One job from the parts of it that its nodes hold: each node's daemon sees only the ranks that
//! ran there, under the job's world ranks and the same job id on every node, so the job is the
//! union of the parts' ranks. What is exact per rank (the kernel's totals, the calls) stays
//! exact; the job's identity is the parts', with every node named.

use super::{Job, JobMeta};
use crate::model::JobId;

#[derive(Debug, thiserror::Error)]
pub enum JobWideError {
    #[error("no node holds job {0}")]
    Empty(JobId),
    #[error("node {node} holds job {found}, not job {expected}")]
    OtherJob {
        node: String,
        found: JobId,
        expected: JobId,
    },
    #[error(
        "rank {rank} of job {job} is held by two nodes, {first} and {other}: two daemons \
         profiled the same processes (give each node's daemon its own --cgroup), or the same \
         node's data was given twice"
    )]
    RankTwice {
        job: JobId,
        rank: u32,
        first: String,
        other: String,
    },
}

/// The job-wide job of the `parts` that nodes hold of it (see [`add_node_part`]).
pub fn merge_node_jobs(parts: Vec<Job>) -> Result<Job, JobWideError> {
    let mut parts = parts.into_iter();
    let mut job = parts
        .next()
        .ok_or_else(|| JobWideError::Empty(JobId(String::new())))?;
    for part in parts {
        add_node_part(&mut job, part)?;
    }
    Ok(job)
}

/// Adds to `job` the part of it another node holds: its ranks and bursts, its node named after
/// the others in `meta.node` (comma-separated), the larger world, the earliest start, and an end
/// only once every part has ended (it runs while it runs on one node).
pub fn add_node_part(job: &mut Job, part: Job) -> Result<(), JobWideError> {
    let meta = &part.meta;
    if meta.id != job.meta.id {
        return Err(JobWideError::OtherJob {
            node: meta.node.clone(),
            found: meta.id.clone(),
            expected: job.meta.id.clone(),
        });
    }
    if let Some(&rank) = part.ranks.keys().find(|r| job.ranks.contains_key(r)) {
        return Err(JobWideError::RankTwice {
            job: meta.id.clone(),
            rank,
            first: job.meta.node.clone(),
            other: meta.node.clone(),
        });
    }
    merge_meta(&mut job.meta, meta);
    job.ranks.extend(part.ranks);
    job.bursts.extend(part.bursts.iter().cloned());
    job.bursts_evicted += part.bursts_evicted;
    Ok(())
}

fn merge_meta(into: &mut JobMeta, part: &JobMeta) {
    if !into.node.split(',').any(|node| node == part.node) {
        into.node = format!("{},{}", into.node, part.node);
    }
    into.size = into.size.max(part.size);
    if into.build_id.is_none() {
        into.build_id.clone_from(&part.build_id);
    }
    // A Slurm cgroup is a node's path: the job-wide job has one only where all nodes agree.
    if into.cgroup != part.cgroup {
        into.cgroup = None;
    }
    for (module, path) in &part.modules {
        into.modules
            .entry(module.clone())
            .or_insert_with(|| path.clone());
    }
    into.first_seen_ns = into.first_seen_ns.min(part.first_seen_ns);
    into.ended_ns = into.ended_ns.zip(part.ended_ns).map(|(a, b)| a.max(b));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::RankRecord;
    use crate::test_support::JobMetaBuilder;

    fn part(node: &str, ranks: &[u32], first_seen_ns: u64, ended_ns: Option<u64>) -> Job {
        let meta = JobMetaBuilder::new("pmix:7")
            .size(4)
            .node(node)
            .first_seen_ns(first_seen_ns)
            .ended_ns(ended_ns)
            .build();
        let mut job = Job::new(meta);
        for &rank in ranks {
            job.ranks.insert(
                rank,
                RankRecord {
                    rank,
                    pid: 100 + rank,
                    first_seen_ns,
                    ended_ns,
                    totals: Default::default(),
                    functions: Default::default(),
                    call_sites: Vec::new(),
                    region: Default::default(),
                    probe_cost: None,
                },
            );
        }
        job
    }

    #[test]
    fn the_parts_of_a_job_make_one_job_with_all_ranks_and_every_node_named() {
        let job = merge_node_jobs(vec![
            part("a", &[0, 2], 20, Some(90)),
            part("b", &[1, 3], 10, Some(95)),
        ])
        .unwrap();
        assert_eq!(job.ranks.keys().copied().collect::<Vec<_>>(), [0, 1, 2, 3]);
        assert_eq!(job.meta.node, "a,b");
        assert_eq!((job.meta.first_seen_ns, job.meta.ended_ns), (10, Some(95)));
        let running = merge_node_jobs(vec![
            part("a", &[0], 20, Some(90)),
            part("b", &[1], 10, None),
        ]);
        assert_eq!(
            running.unwrap().meta.ended_ns,
            None,
            "one node still runs it"
        );
    }

    #[test]
    fn a_rank_held_twice_or_another_job_is_refused() {
        let twice = merge_node_jobs(vec![part("a", &[0, 1], 0, None), part("b", &[1], 0, None)]);
        assert!(
            matches!(&twice, Err(JobWideError::RankTwice { rank: 1, other, .. }) if other == "b"),
            "{twice:?}"
        );
        let mut other = part("b", &[1], 0, None);
        other.meta.id = JobId("pmix:8".into());
        let other = merge_node_jobs(vec![part("a", &[0], 0, None), other]);
        assert!(matches!(other, Err(JobWideError::OtherJob { .. })));
    }
}
