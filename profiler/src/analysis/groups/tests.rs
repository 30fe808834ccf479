//! Unit tests of the rank groups on synthetic counts, with the oracles the CallPath+Parameter
//! and Chameleon evaluations give (Bahmani's 2017 thesis, tables 3.3 and 5.2).

use std::collections::BTreeMap;

use super::{signature::Counts, *};

fn uses(list: &[(&str, u64, u64)]) -> Counts {
    list.iter()
        .map(|&(f, calls, bytes)| (f.to_string(), FunctionUse { calls, bytes }))
        .collect()
}

fn signatures(ranks: impl IntoIterator<Item = (u32, Counts)>) -> BTreeMap<u32, RankSignature> {
    ranks
        .into_iter()
        .map(|(r, c)| (r, RankSignature::between(r, &c, None)))
        .collect()
}

fn memberships(groups: &[RankGroup]) -> Vec<(u32, Vec<u32>)> {
    groups.iter().map(|g| (g.lead, g.members.clone())).collect()
}

/// A 2-D stencil on px × py ranks that skips the sends of missing neighbours: each rank's
/// counts after `iterations`.
fn stencil(px: u32, py: u32, iterations: u64) -> BTreeMap<u32, Counts> {
    (0..px * py)
        .map(|r| {
            let (x, y) = (r % px, r / px);
            let neighbours = [x > 0, x + 1 < px, y > 0, y + 1 < py]
                .iter()
                .filter(|&&n| n)
                .count() as u64;
            let n = neighbours * iterations;
            let c = uses(&[
                ("MPI_Isend", n, n * 800),
                ("MPI_Irecv", n, n * 800),
                ("MPI_Waitall", iterations, 0),
                ("MPI_Allreduce", iterations / 10, iterations / 10 * 8),
            ]);
            (r, c)
        })
        .collect()
}

#[test]
fn distributor_workers_and_collector_are_three_groups_led_by_their_lowest_rank() {
    let mut ranks = vec![(
        0,
        uses(&[("MPI_Send", 40, 40 * 4096), ("MPI_Barrier", 1, 0)]),
    )];
    for w in 1..=4 {
        ranks.push((
            w,
            uses(&[
                ("MPI_Recv", 10, 10 * 4096),
                ("MPI_Send", 10, 10 * 64),
                ("MPI_Barrier", 1, 0),
            ]),
        ));
    }
    ranks.push((5, uses(&[("MPI_Recv", 40, 40 * 64), ("MPI_Barrier", 1, 0)])));
    let groups = cluster(&signatures(ranks), &GroupParams::default());
    assert_eq!(
        memberships(&groups),
        vec![(0, vec![0]), (1, vec![1, 2, 3, 4]), (5, vec![5])]
    );
    assert_eq!(groups.iter().map(|g| g.id).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(
        groups[1].signature.call_path,
        ["MPI_Barrier", "MPI_Recv", "MPI_Send"]
    );
}

#[test]
fn stencils_fall_into_corner_edge_and_interior_ranks() {
    // 3 × 3: corners 0 2 6 8, edges 1 3 5 7, interior 4; all of one call path, so one main
    // group and three parameter subgroups.
    let groups = cluster(&signatures(stencil(3, 3, 200)), &GroupParams::default());
    assert_eq!(
        memberships(&groups),
        vec![(0, vec![0, 2, 6, 8]), (1, vec![1, 3, 5, 7]), (4, vec![4])]
    );
    assert!(groups.iter().all(|g| g.signature.main_group == 1));
    let groups = cluster(&signatures(stencil(4, 4, 200)), &GroupParams::default());
    assert_eq!(
        memberships(&groups),
        vec![
            (0, vec![0, 3, 12, 15]),
            (1, vec![1, 2, 4, 7, 8, 11, 13, 14]),
            (5, vec![5, 6, 9, 10])
        ]
    );
}

#[test]
fn counts_within_the_tolerance_agree_and_one_call_always_does() {
    let one = |calls, bytes| RankSignature::between(0, &uses(&[("MPI_Send", calls, bytes)]), None);
    assert!(one(100, 100_000).agrees(&one(104, 104_000), 0.05, true));
    assert!(!one(100, 100_000).agrees(&one(110, 110_000), 0.05, true));
    assert!(
        one(3, 300).agrees(&one(4, 400), 0.05, true),
        "one call apart"
    );
    assert!(
        !one(100, 100 * 1000).agrees(&one(100, 100 * 1200), 0.05, true),
        "message size"
    );
    // Not transitive: 100 ~ 104 ~ 108 but 100 ≁ 108. Each rank is compared with its
    // subgroup's lead, so 108 leads a subgroup of its own.
    let s = signatures([
        (0, uses(&[("MPI_Send", 100, 0)])),
        (1, uses(&[("MPI_Send", 104, 0)])),
        (2, uses(&[("MPI_Send", 108, 0)])),
    ]);
    let groups = cluster(&s, &GroupParams::default());
    assert_eq!(memberships(&groups), vec![(0, vec![0, 1]), (2, vec![2])]);
}

/// IS: rank 0 receives no largest key and rank P−1 sends none, so three call-path clusters
/// {0}, {P−1}, {1..P−2} with one parameter cluster each (thesis table 3.3, any valid P).
#[test]
fn integer_sort_gives_three_main_groups_at_every_size() {
    for p in [4u32, 8, 16] {
        let s = signatures((0..p).map(|r| {
            let mut list = vec![
                ("MPI_Alltoall", 11, 11 * 4 * p as u64),
                ("MPI_Alltoallv", 11, 0),
            ];
            if r > 0 {
                list.push(("MPI_Irecv", 1, 4));
            }
            if r + 1 < p {
                list.push(("MPI_Send", 1, 4));
            }
            (r, uses(&list))
        }));
        let groups = cluster(&s, &GroupParams::default());
        assert_eq!(
            memberships(&groups),
            vec![
                (0, vec![0]),
                (1, (1..p - 1).collect()),
                (p - 1, vec![p - 1])
            ],
            "P = {p}"
        );
        let mains: Vec<u32> = groups.iter().map(|g| g.signature.main_group).collect();
        assert_eq!(mains, [1, 2, 3], "three distinct call paths at P = {p}");
    }
}

/// LU on 4 × 4 ranks: which of the four neighbours exist decides the calls made, so nine
/// call-path clusters (table 3.3); K below that is raised, since a merged call path loses
/// events (section 4.4.6).
#[test]
fn lu_on_sixteen_ranks_keeps_nine_call_paths_whatever_k() {
    let s = signatures((0..16u32).map(|r| {
        let (x, y) = (r % 4, r / 4);
        let mut list = vec![("MPI_Allreduce", 5, 40)];
        for (exists, f) in [
            (x > 0, "MPI_Send"),
            (x < 3, "MPI_Recv"),
            (y > 0, "MPI_Isend"),
            (y < 3, "MPI_Irecv"),
        ] {
            if exists {
                list.push((f, 250, 250 * 40));
            }
        }
        (r, uses(&list))
    }));
    for k in [9, 4, 1] {
        let groups = cluster(
            &s,
            &GroupParams {
                k,
                ..GroupParams::default()
            },
        );
        assert_eq!(groups.len(), 9, "K = {k}");
        let leads: Vec<u32> = groups.iter().map(|g| g.lead).collect();
        assert_eq!(leads, [0, 1, 3, 4, 5, 7, 12, 13, 15], "K = {k}");
    }
}

/// Above K, each call path keeps ⌊K / call paths⌋ subgroups (Chameleon, algorithm 8), chosen
/// farthest-first; the others join their nearest head.
#[test]
fn above_k_each_call_path_keeps_its_share_chosen_farthest_first() {
    // Call path A: twelve message sizes 1 KiB · 2^i; call path B: one rank.
    let mut ranks: Vec<(u32, Counts)> = (0..12u32)
        .map(|r| (r, uses(&[("MPI_Send", 10, 10 * (1024u64 << r))])))
        .collect();
    ranks.push((12, uses(&[("MPI_Recv", 120, 0)])));
    let s = signatures(ranks);
    let groups = cluster(&s, &GroupParams::default());
    // K = 9 over two call paths: four subgroups for A, one for B.
    assert_eq!(groups.len(), 5);
    let a: Vec<(u32, Vec<u32>)> = memberships(&groups)
        .into_iter()
        .filter(|(lead, _)| *lead < 12)
        .collect();
    // Heads: rank 0 first, then the farthest (11), then the one farthest from both (6: ranks 5
    // and 6 are 5 steps of ln 2 from their nearest head, and ln(1 + x) puts 6 a hair farther),
    // then 3 (3 steps from 0 and from 6); every rank joins its nearest head.
    let heads: Vec<u32> = a.iter().map(|(lead, _)| *lead).collect();
    assert_eq!(heads, [0, 3, 6, 11], "{a:?}");
    assert_eq!(a[1].1, [2, 3, 4]);
    let all: Vec<u32> = a
        .iter()
        .flat_map(|(_, m)| m.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(
        all,
        (0..12).collect::<Vec<_>>(),
        "every rank in exactly one group"
    );
    assert_eq!(a.iter().map(|(_, m)| m.len()).sum::<usize>(), 12);
    // With K large enough nothing is merged.
    let groups = cluster(
        &s,
        &GroupParams {
            k: 13,
            ..GroupParams::default()
        },
    );
    assert_eq!(groups.len(), 13);
}

/// Counts by call site: (function, site offset in one module, calls, sum of world peers,
/// calls with a world peer).
fn sited(list: &[(&str, u64, u64, u64, u64)]) -> Counts {
    let mut c = Counts::default();
    for &(f, offset, calls, peer_sum, peer_calls) in list {
        let fu = c.functions.entry(f.to_string()).or_default();
        fu.calls += calls;
        let step = CallPathStep {
            function: f.to_string(),
            site: Some(crate::model::CallSite {
                module: "5c67a17bd1d52349ce751c5c8d839c532fd49ed4".into(),
                offset,
            }),
        };
        c.sites.insert(
            step,
            signature::SiteUse {
                calls,
                bytes: 0,
                world_peer_calls: peer_calls,
                world_peer_sum: peer_sum,
            },
        );
    }
    c
}

#[test]
fn the_same_function_from_another_call_site_is_another_call_path() {
    // Ranks 0 and 1 reduce at one line, ranks 2 and 3 at another: equal function counts, two
    // call paths.
    let ranks = (0..4u32).map(|r| {
        let site = if r < 2 { 0x11a0 } else { 0x11f4 };
        (r, sited(&[("MPI_Allreduce", site, 100, 0, 0)]))
    });
    let groups = cluster(&signatures(ranks), &GroupParams::default());
    assert_eq!(memberships(&groups), vec![(0, vec![0, 1]), (2, vec![2, 3])]);
    assert_eq!(
        groups[1].signature.call_path,
        ["MPI_Allreduce@5c67a17bd1d5+0x11f4"]
    );
    assert_eq!(groups[1].signature.main_group, 2);
}

#[test]
fn relative_peers_are_shown_and_split_subgroups_only_when_asked() {
    // Pairs: rank r exchanges with r ^ 1 from one call site, so even ranks send to +1 and odd
    // ranks to -1 with otherwise equal counts.
    let ranks: Vec<(u32, Counts)> = (0..4u32)
        .map(|r| {
            (
                r,
                sited(&[("MPI_Send", 0x1234, 50, 50 * (r ^ 1) as u64, 50)]),
            )
        })
        .collect();
    let s = signatures(ranks);
    let groups = cluster(&s, &GroupParams::default());
    assert_eq!(memberships(&groups), vec![(0, vec![0, 1, 2, 3])]);
    assert_eq!(groups[0].signature.call_sites[0].relative_peer, Some(1.0));
    let split = GroupParams {
        split_by_peers: true,
        ..GroupParams::default()
    };
    let groups = cluster(&s, &split);
    assert_eq!(memberships(&groups), vec![(0, vec![0, 2]), (1, vec![1, 3])]);
    assert_eq!(groups[1].signature.call_sites[0].relative_peer, Some(-1.0));
}

#[test]
fn split_by_peers_a_3x3_stencil_has_nine_src_dest_patterns() {
    // The thesis' 2-D stencil with one call path: every rank of a 3 × 3 grid has peers of its
    // own relative to it (9 SRC/DEST sub-clusters), and K = 9 keeps them all.
    let ranks = (0..9u32).map(|r| {
        let (x, y) = (r % 3, r / 3);
        let peers: Vec<u32> = [
            (x > 0).then(|| r - 1),
            (x < 2).then(|| r + 1),
            (y > 0).then(|| r - 3),
            (y < 2).then(|| r + 3),
        ]
        .into_iter()
        .flatten()
        .collect();
        let (n, sum) = (
            peers.len() as u64 * 200,
            peers.iter().sum::<u32>() as u64 * 200,
        );
        (
            r,
            sited(&[
                ("MPI_Isend", 0x1300, n, sum, n),
                ("MPI_Irecv", 0x12c0, n, sum, n),
            ]),
        )
    });
    let split = GroupParams {
        split_by_peers: true,
        ..GroupParams::default()
    };
    let groups = cluster(&signatures(ranks), &split);
    assert_eq!(groups.len(), 9);
    assert!(groups.iter().all(|g| g.members == [g.lead]));
    // Corner 0 sends east (+1) and south (+3): mean +2.
    assert_eq!(groups[0].signature.call_sites[0].relative_peer, Some(2.0));
}

/// Feeds a tracker windows of per-rank window counts (added up as the kernel would), one
/// reading per window, 1 s windows; returns the tracker.
fn run_windows(windows: &[Vec<Counts>]) -> RankGroupTracker {
    run_node_windows(windows, |_| true, 0)
}

/// [`run_windows`] on the ranks a node holds, its readings `skew_ns` after the others'.
fn run_node_windows(
    windows: &[Vec<Counts>],
    holds: impl Fn(u32) -> bool,
    skew_ns: u64,
) -> RankGroupTracker {
    let mut tracker = RankGroupTracker::new(GroupParams::default(), 1.0);
    let mut cumulative: BTreeMap<u32, Counts> = BTreeMap::new();
    let second = 1_000_000_000u64;
    tracker.observe(100 * second + skew_ns, &cumulative);
    for (i, window) in windows.iter().enumerate() {
        for (r, counts) in window.iter().enumerate() {
            if !holds(r as u32) {
                continue;
            }
            let c = cumulative.entry(r as u32).or_default();
            for (f, u) in &counts.functions {
                let e = c.functions.entry(f.clone()).or_default();
                e.calls += u.calls;
                e.bytes += u.bytes;
            }
        }
        assert!(tracker.observe((101 + i as u64) * second + 5 + skew_ns, &cumulative));
    }
    tracker
}

fn producer() -> Counts {
    uses(&[("MPI_Send", 50, 50 * 1024), ("MPI_Allreduce", 50, 400)])
}

fn consumer() -> Counts {
    uses(&[("MPI_Recv", 50, 50 * 1024), ("MPI_Allreduce", 50, 400)])
}

/// A stable program: AT, C, then L in every further window; exactly one clustering (table 5.2).
#[test]
fn a_stable_program_is_clustered_once() {
    let window = vec![producer(), consumer(), producer(), consumer()];
    let tracker = run_windows(&vec![window; 10]);
    let view = tracker.view();
    assert_eq!(view.clusterings, 1);
    assert_eq!(view.state, GroupState::Lead);
    assert!(view.changes.is_empty());
    assert_eq!(
        memberships(&view.groups),
        vec![(0, vec![0, 2]), (1, vec![1, 3])]
    );
}

/// Ranks that swap roles half-way: one behaviour change, in the window that held the switch,
/// and the groups of the new roles. The literal algorithm 6 of the thesis would never
/// re-cluster after leaving L; the prose (and this tracker) does.
#[test]
fn a_persistent_role_switch_is_one_change_in_its_window() {
    let before = vec![producer(), consumer(), producer(), consumer()];
    let after = vec![consumer(), producer(), consumer(), producer()];
    let tracker = run_windows(&switch_windows(before, after));
    let view = tracker.view();
    assert_eq!(view.changes.len(), 1, "{:?}", view.changes);
    let change = &view.changes[0];
    assert_eq!(change.window, 105, "the sixth window, 105–106 s");
    assert_eq!(change.ranks, [0, 1, 2, 3]);
    assert_eq!(view.clusterings, 2);
    assert_eq!(view.state, GroupState::Lead);
    // The groups cover the new behaviour only: rank 1 now leads the producers.
    assert_eq!(
        memberships(&view.groups),
        vec![(0, vec![0, 2]), (1, vec![1, 3])]
    );
    assert_eq!(
        view.groups[1].signature.call_path,
        ["MPI_Allreduce", "MPI_Send"]
    );
    // From the first of the two windows that confirmed it (106–107 s).
    assert_eq!(view.since_ns, 106 * 1_000_000_000 + 5);
}

/// One odd window (say a checkpoint) leaves AT, re-clusters to the same call paths and is no
/// change of the job.
#[test]
fn a_transient_window_is_no_change() {
    let normal = vec![producer(), consumer()];
    let odd = vec![uses(&[("MPI_File_write", 1, 1 << 20)]), consumer()];
    let mut windows = vec![normal.clone(); 4];
    windows.push(odd);
    windows.extend(vec![normal; 4]);
    let view = run_windows(&windows).view().clone();
    assert!(view.changes.is_empty(), "{:?}", view.changes);
    assert_eq!(view.clusterings, 2);
}

#[test]
fn a_job_shorter_than_a_window_is_grouped_at_its_end() {
    let mut tracker = RankGroupTracker::new(GroupParams::default(), 30.0);
    let ranks: BTreeMap<u32, Counts> = [(0, producer()), (1, consumer()), (2, consumer())].into();
    assert!(!tracker.observe(1_000, &BTreeMap::new()));
    assert!(!tracker.observe(2_000, &ranks));
    tracker.finish(3_000, &ranks);
    assert_eq!(
        memberships(&tracker.view().groups),
        vec![(0, vec![0]), (1, vec![1, 2])]
    );
    assert_eq!(tracker.view().windows_closed, 1);
}

/// The job's closing calls fall in its last, partial window: no change (nothing confirms it),
/// and the groups end with the exact final counts.
#[test]
fn the_closing_calls_of_a_job_are_no_change_and_the_groups_end_exact() {
    let mut tracker = run_windows(&vec![vec![producer(), consumer()]; 4]);
    let closing = |mut counts: Counts| {
        for u in counts.functions.values_mut() {
            u.calls *= 4;
            u.bytes *= 4;
        }
        counts
            .functions
            .insert("MPI_Barrier".into(), FunctionUse { calls: 1, bytes: 0 });
        counts
    };
    let last: BTreeMap<u32, Counts> = [(0, closing(producer())), (1, closing(consumer()))].into();
    tracker.finish(105 * 1_000_000_000 + 500, &last);
    let view = tracker.view();
    assert!(view.changes.is_empty(), "{:?}", view.changes);
    assert_eq!(memberships(&view.groups), vec![(0, vec![0]), (1, vec![1])]);
    let sends = &view.groups[0].signature.functions["MPI_Send"];
    assert_eq!(
        (sends.calls, view.groups[0].signature.call_path.len()),
        (200, 3)
    );
}

/// The windows of a role switch: `before` for 5 windows, one window of both, then `after`.
fn switch_windows(before: Vec<Counts>, after: Vec<Counts>) -> Vec<Vec<Counts>> {
    let mixed: Vec<Counts> = before
        .iter()
        .zip(&after)
        .map(|(a, b)| {
            let mut m = a.clone();
            m.functions.extend(b.functions.clone());
            m
        })
        .collect();
    let mut windows = vec![before; 5];
    windows.push(mixed);
    windows.extend(vec![after; 5]);
    windows
}

/// Each node's tracker of `windows`, node `n` holding the ranks r with r mod `nodes` = n and
/// reading a millisecond after node n - 1, as the merge gets them.
fn node_groups(windows: &[Vec<Counts>], nodes: u32) -> Vec<merge::NodeRankGroups> {
    (0..nodes)
        .map(|n| {
            let tracker = run_node_windows(windows, |r| r % nodes == n, u64::from(n) * 1_000_000);
            merge::NodeRankGroups::of(&format!("node-{n}"), tracker.view())
        })
        .collect()
}

/// A role switch of every rank, its ranks on 2 and on 4 nodes: the merge finds the groups, the
/// change and the span of one tracker that sees all ranks.
#[test]
fn the_nodes_groups_and_changes_merge_into_those_of_one_tracker() {
    let before = vec![producer(), consumer(), producer(), consumer()];
    let after = vec![consumer(), producer(), consumer(), producer()];
    let windows = switch_windows(before, after);
    let whole = run_windows(&windows).view().clone();
    for nodes in [2, 4] {
        let (job, longer) =
            merge::merge_nodes(&node_groups(&windows, nodes), &GroupParams::default()).unwrap();
        assert_eq!(memberships(&job.groups), memberships(&whole.groups));
        assert_eq!(job.groups, whole.groups, "{nodes} nodes");
        assert_eq!(job.changes.len(), 1, "{:?}", job.changes);
        let (change, expected) = (&job.changes[0], &whole.changes[0]);
        assert_eq!(
            (change.window, &change.ranks),
            (expected.window, &expected.ranks)
        );
        // Each node has one group before and after; the job two, as one tracker counts.
        assert_eq!(
            (change.groups_before, change.groups_after),
            (expected.groups_before, expected.groups_after)
        );
        assert_eq!((change.groups_before, change.groups_after), (2, 2));
        let names: Vec<String> = (0..nodes).map(|n| format!("node-{n}")).collect();
        assert_eq!(change.nodes, names);
        assert_eq!((job.clusterings, job.state), (2, GroupState::Lead));
        // The span starts at the last node's reading of the window that began it.
        let skew = u64::from(nodes - 1) * 1_000_000;
        assert_eq!(job.since_ns, whole.since_ns + skew);
        assert!(longer.is_empty(), "{longer:?}");
    }
}

/// Only the ranks of one node switch: the job's change is theirs, and the node that saw none is
/// named, its groups covering its longer span.
#[test]
fn a_change_on_some_nodes_names_the_nodes_whose_groups_cover_more() {
    let before = vec![producer(), consumer(), producer(), consumer()];
    let after = vec![producer(), consumer(), consumer(), producer()];
    let windows = switch_windows(before, after);
    let nodes: Vec<merge::NodeRankGroups> = [[0u32, 1], [2, 3]]
        .iter()
        .enumerate()
        .map(|(n, held)| {
            let tracker = run_node_windows(&windows, |r| held.contains(&r), 0);
            merge::NodeRankGroups::of(&format!("node-{n}"), tracker.view())
        })
        .collect();
    let (job, longer) = merge::merge_nodes(&nodes, &GroupParams::default()).unwrap();
    assert_eq!(job.changes.len(), 1, "{:?}", job.changes);
    assert_eq!(job.changes[0].ranks, [2, 3]);
    assert_eq!(job.changes[0].nodes, ["node-1"]);
    // Node 0's groups cover its 11 windows, the job's the last 5 (from the window after the
    // switch's).
    assert_eq!(longer.len(), 1, "{longer:?}");
    assert_eq!(
        (longer[0].node.as_str(), longer[0].since_ns),
        ("node-0", 100 * 1_000_000_000)
    );
    assert!((longer[0].scale - 5.0 / 11.0).abs() < 1e-6, "{longer:?}");
    // Ranks 0 and 3 produce, 1 and 2 consume, at the same rate: one group each, as one tracker
    // of all ranks finds.
    let whole = run_windows(&windows).view().clone();
    assert_eq!(memberships(&job.groups), memberships(&whole.groups));
    assert_eq!(
        memberships(&job.groups),
        vec![(0, vec![0, 3]), (1, vec![1, 2])]
    );
}

/// Changes of two nodes a window apart, the second before the first was confirmed, are one
/// change of the job; a change after the confirmation is another.
#[test]
fn changes_of_nodes_merge_while_the_first_is_unconfirmed() {
    let change = |window: u64, ranks: Vec<u32>| BehaviourChange {
        window,
        start_ns: window * 1_000_000_000,
        end_ns: (window + 1) * 1_000_000_000,
        confirmed_ns: (window + 2) * 1_000_000_000 + 5,
        ranks,
        groups_before: 1,
        groups_after: 2,
        nodes: Vec::new(),
        leads: ChangeLeads::default(),
    };
    let node = |name: &str, changes: Vec<BehaviourChange>| merge::NodeRankGroups {
        node: name.into(),
        view: RankGroupsView {
            changes,
            window_s: 1.0,
            ..RankGroupsView::default()
        },
        signatures: BTreeMap::new(),
        change_leads: Vec::new(),
    };
    let nodes = [
        node("a", vec![change(10, vec![0, 1]), change(20, vec![1])]),
        node("b", vec![change(11, vec![2]), change(22, vec![3])]),
    ];
    let (job, _) = merge::merge_nodes(&nodes, &GroupParams::default()).unwrap();
    let summary: Vec<(u64, Vec<u32>, Vec<String>, u64)> = job
        .changes
        .iter()
        .map(|c| (c.window, c.ranks.clone(), c.nodes.clone(), c.confirmed_ns))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                10,
                vec![0, 1, 2],
                vec!["a".into(), "b".into()],
                13_000_000_005
            ),
            (20, vec![1], vec!["a".into()], 22_000_000_005),
            (22, vec![3], vec!["b".into()], 24_000_000_005),
        ]
    );
    let mismatched = [node("a", Vec::new()), {
        let mut b = node("b", Vec::new());
        b.view.window_s = 30.0;
        b
    }];
    let error = merge::merge_nodes(&mismatched, &GroupParams::default()).unwrap_err();
    assert!(
        error.to_string().contains("give every daemon the same"),
        "{error}"
    );
}
