//! Rank groups as the exports see them: a job's exact per-rank counts as the groups' input,
//! the groups of a recorded job replayed from its readings, and the report's text section.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    analysis::groups::{
        signature::Counts, CallPathStep, FunctionUse, GroupParams, RankGroupTracker, RankGroupsView,
    },
    model::is_lifecycle_function,
    store::{Job, RankRecord},
};

/// A rank's cumulative calls and bytes per MPI function and per call site, without MPI_Init and
/// MPI_Finalize (every rank calls them once, whatever its role).
pub fn counts(record: &RankRecord) -> Counts {
    let mut counts: Counts = record
        .functions
        .iter()
        .filter(|(name, _)| !is_lifecycle_function(name))
        .map(|(name, s)| {
            let u = FunctionUse {
                calls: s.calls,
                bytes: s.bytes,
            };
            (name.clone(), u)
        })
        .collect();
    for s in &record.call_sites {
        if is_lifecycle_function(&s.function) {
            continue;
        }
        // A site the daemon could not resolve (its process gone first) is a raw address, which
        // ASLR makes differ between ranks: such calls count by function.
        let step = CallPathStep {
            function: s.function.clone(),
            site: (!s.site.is_unknown()).then(|| s.site.clone()),
        };
        let u = counts.sites.entry(step).or_default();
        u.calls += s.calls;
        u.bytes += s.bytes;
        u.world_peer_calls += s.world_peer_calls;
        u.world_peer_sum = u.world_peer_sum.wrapping_add(s.world_peer_sum);
    }
    counts
}

/// Every rank's [`counts`].
pub fn job_counts(job: &Job) -> BTreeMap<u32, Counts> {
    job.ranks.iter().map(|(&r, rec)| (r, counts(rec))).collect()
}

/// The groups of a recorded job: the readings the daemon kept at each window it closed, in
/// order, then the final counts at the job's end (or at `end_ns` when the recording lost it).
pub fn replay(
    job: &Job,
    readings: &[(u64, RankRecord)],
    params: &GroupParams,
    window_s: f64,
    end_ns: u64,
) -> RankGroupsView {
    let mut tracker = RankGroupTracker::for_job(params.clone(), window_s, job.meta.first_seen_ns);
    let mut at: BTreeMap<u64, BTreeMap<u32, Counts>> = BTreeMap::new();
    for (t, record) in readings {
        at.entry(*t)
            .or_default()
            .insert(record.rank, counts(record));
    }
    for (t, ranks) in &at {
        tracker.observe(*t, ranks);
    }
    tracker.finish(job.meta.ended_ns.unwrap_or(end_ns), &job_counts(job));
    tracker.view().clone()
}

/// Ranks as a short list: runs of consecutive ranks as a–b.
pub fn rank_list(ranks: &[u32]) -> String {
    // So that a group of thousands stays one line.
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j > i + 1 {
            format!("{}-{}", ranks[i], ranks[j])
        } else if j == i + 1 {
            format!("{},{}", ranks[i], ranks[j])
        } else {
            ranks[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

/// The "rank groups" section of a job's report; change windows are shown in seconds since
/// `job_start_ns` (Unix), when the daemon first saw the job.
pub fn render(view: &RankGroupsView, job_start_ns: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "   rank groups: {} (CallPath+Parameter clustering; {} windows of {} s closed, {} clustering{})",
        view.groups.len(),
        view.windows_closed,
        view.window_s,
        view.clusterings,
        if view.clusterings == 1 { "" } else { "s" }
    );
    for g in &view.groups {
        let functions: Vec<String> = g
            .signature
            .functions
            .iter()
            .map(|(f, u)| {
                let size = if u.bytes > 0 {
                    format!(" ×{} B", u.bytes / u.calls.max(1))
                } else {
                    String::new()
                };
                let steps: Vec<_> = g
                    .signature
                    .call_sites
                    .iter()
                    .filter(|s| &s.step.function == f)
                    .collect();
                let sites = if steps.len() > 1 {
                    format!(" from {} sites", steps.len())
                } else {
                    String::new()
                };
                let peers: Vec<String> = steps
                    .iter()
                    .filter_map(|s| s.relative_peer)
                    .map(|p| format!("{p:+.1}"))
                    .collect();
                let peers = if peers.is_empty() {
                    String::new()
                } else {
                    format!(" peer {}", peers.join("/"))
                };
                format!("{f} {}{size}{sites}{peers}", u.calls)
            })
            .collect();
        let _ = writeln!(
            out,
            "   group {} (call path {}): lead {}, {} rank{} [{}]: {}",
            g.id,
            g.signature.main_group,
            g.lead,
            g.members.len(),
            if g.members.len() == 1 { "" } else { "s" },
            rank_list(&g.members),
            if functions.is_empty() {
                "no MPI calls".to_string()
            } else {
                functions.join(", ")
            }
        );
    }
    for c in &view.changes {
        let since = |ns: u64| ns.saturating_sub(job_start_ns) as f64 * 1e-9;
        let _ = writeln!(
            out,
            "   behaviour change between {:.1} s and {:.1} s (window {}): ranks [{}] took another \
             call path; {} → {} groups{}",
            since(c.start_ns),
            since(c.end_ns),
            c.window,
            rank_list(&c.ranks),
            c.groups_before,
            c.groups_after,
            if c.nodes.is_empty() {
                String::new()
            } else {
                format!(" (seen on {})", c.nodes.join(", "))
            }
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_section_lists_groups_and_changes_in_seconds_since_the_job_started() {
        use crate::analysis::groups::{cluster, BehaviourChange};
        let counts = |f: &str| -> Counts {
            [(
                f.to_string(),
                FunctionUse {
                    calls: 10,
                    bytes: 10_240,
                },
            )]
            .into_iter()
            .collect()
        };
        let signatures = [
            (0, counts("MPI_Send")),
            (1, counts("MPI_Recv")),
            (2, counts("MPI_Recv")),
        ]
        .into_iter()
        .map(|(r, c)| {
            (
                r,
                crate::analysis::groups::RankSignature::between(r, &c, None),
            )
        })
        .collect();
        let view = RankGroupsView {
            groups: cluster(&signatures, &GroupParams::default()),
            changes: vec![BehaviourChange {
                window: 7,
                start_ns: 14_000_000_000,
                end_ns: 16_000_000_000,
                confirmed_ns: 20_000_000_000,
                ranks: vec![0, 1, 2],
                groups_before: 2,
                groups_after: 2,
                nodes: vec!["node-1".into(), "node-2".into()],
                leads: Default::default(),
            }],
            windows_closed: 9,
            clusterings: 2,
            window_s: 2.0,
            ..RankGroupsView::default()
        };
        let text = render(&view, 10_000_000_000);
        assert!(text.contains("rank groups: 2 (CallPath+Parameter clustering; 9 windows of 2 s closed, 2 clusterings)"), "{text}");
        assert!(
            text.contains("group 2 (call path 2): lead 1, 2 ranks [1,2]: MPI_Recv 10 ×1024 B"),
            "{text}"
        );
        assert!(
            text.contains(
                "behaviour change between 4.0 s and 6.0 s (window 7): ranks [0-2] took another \
                 call path; 2 → 2 groups (seen on node-1, node-2)"
            ),
            "{text}"
        );
    }

    #[test]
    fn rank_lists_collapse_runs() {
        assert_eq!(rank_list(&[0, 1, 2, 3, 5, 7, 8, 12]), "0-3,5,7,8,12");
        assert_eq!(rank_list(&[]), "");
    }
}
