use super::*;
use crate::analysis::tracking::test_support::cluster_in_region;

/// A frame of clusters given as (id, ln instructions, region offset, time), each a small
/// cloud of 9 points at IPC 1, in one rank sequence cycling through them.
fn cloud_frame(clusters: &[(u32, f64, u64, u64)]) -> Frame {
    let total: u64 = clusters.iter().map(|c| c.3).sum();
    Frame {
        features: FeatureSet::InstructionsIpc,
        ranks: 1,
        spmd_score: 1.0,
        time_ns: total,
        clusters: clusters
            .iter()
            .map(|&(id, x, region, time_ns)| TrackedCluster {
                time_ns,
                time_share: time_ns as f64 / total as f64,
                centroid: vec![x, 1.0],
                points: (0..9)
                    .map(|k| [x + 0.01 * (k % 3) as f64, 1.0 + 0.01 * (k / 3) as f64, 0.0])
                    .collect(),
                point_regions: vec![0; 9],
                ..cluster_in_region(id, region, 9)
            })
            .collect(),
        simultaneous: Vec::new(),
        sequences: vec![clusters.iter().map(|c| c.0).collect::<Vec<_>>().repeat(4)],
    }
}

#[test]
fn a_phase_changing_at_a_window_start_moves_and_leaves_its_remnant_aside() {
    let mut tracker = Tracker::new(TrackingParams::default()).unwrap();
    tracker.update(
        0,
        &cloud_frame(&[(1, 10.0, 1, 100), (2, 12.0, 2, 100)]),
        true,
    );
    // Two bursts still ran the old way before the change; the bulk moved by ln 1.6.
    let changed = cloud_frame(&[
        (5, 10.0, 1, 2),
        (6, 10.0 + 1.6f64.ln(), 1, 98),
        (7, 12.0, 2, 100),
    ]);
    let update = tracker.update(1, &changed, true);
    assert_eq!(
        update.ids[&6], 1,
        "the bulk continues the phase: {:?}",
        update.ids
    );
    assert_eq!(update.ids[&7], 2);
    let kinds: Vec<(EventKind, Vec<StableId>)> = update
        .events
        .iter()
        .map(|e| (e.kind, e.from.clone()))
        .collect();
    assert_eq!(kinds, vec![(EventKind::Moved, vec![1])]);
}

/// The events of an update as (kind, from, to).
fn kinds(update: &TrackUpdate) -> Vec<(EventKind, Vec<StableId>, Vec<StableId>)> {
    update
        .events
        .iter()
        .map(|e| (e.kind, e.from.clone(), e.to.clone()))
        .collect()
}

#[test]
fn two_phases_merged_for_a_window_get_their_ids_back() {
    let mut tracker = Tracker::new(TrackingParams::default()).unwrap();
    let apart = |a: u32, b: u32| cloud_frame(&[(a, 10.0, 1, 60), (b, 10.5, 2, 40)]);
    let first = tracker.update(0, &apart(7, 8), true);
    assert_eq!(first.ids, BTreeMap::from([(7, 1), (8, 2)]));
    // The clustering merges both into one cluster running both regions.
    let mut merged = cloud_frame(&[(5, 10.25, 1, 100)]);
    let mut regions = merged.clusters[0].regions.clone();
    regions.push(apart(1, 2).clusters[1].regions[0].clone());
    merged.clusters[0].regions = regions;
    let second = tracker.update(1, &merged, true);
    assert_eq!(second.ids, BTreeMap::from([(5, 1)]));
    assert_eq!(
        kinds(&second),
        vec![
            (EventKind::Moved, vec![1], vec![1]),
            (EventKind::Merge, vec![1, 2], vec![1])
        ]
    );
    assert_eq!(tracker.dormant_ids().collect::<Vec<_>>(), vec![2]);
    // Apart again: the bigger part continues 1, the other revives 2.
    let third = tracker.update(2, &apart(3, 4), true);
    assert_eq!(third.ids, BTreeMap::from([(3, 1), (4, 2)]));
    assert_eq!(
        kinds(&third),
        vec![
            (EventKind::Moved, vec![1], vec![1]),
            (EventKind::Split, vec![1], vec![1, 2])
        ]
    );
    // Stable from then on.
    for window in 3..20 {
        let update = tracker.update(window, &apart(3, 4), true);
        assert!(update.events.is_empty());
    }
    assert_eq!(tracker.counts().total(), 6);
}

#[test]
fn a_partial_frame_never_makes_a_cluster_dormant() {
    let params = TrackingParams {
        vanish_after_windows: 1,
        ..TrackingParams::default()
    };
    let mut tracker = Tracker::new(params).unwrap();
    let both = cloud_frame(&[(1, 10.0, 1, 50), (2, 12.0, 2, 50)]);
    tracker.update(0, &both, true);
    // The open window has only reached the first phase.
    let partial = tracker.update(1, &cloud_frame(&[(1, 10.0, 1, 50)]), false);
    assert!(partial.events.is_empty());
    assert_eq!(tracker.active_ids().collect::<Vec<_>>(), vec![1, 2]);
    let closed = tracker.update(1, &both, true);
    assert!(closed.events.is_empty());
    assert_eq!(closed.ids, BTreeMap::from([(1, 1), (2, 2)]));
    // A closed window without phase 2 makes it vanish (after one window here).
    let gone = tracker.update(2, &cloud_frame(&[(1, 10.0, 1, 50)]), true);
    assert_eq!(gone.events.len(), 1);
    assert_eq!(gone.events[0].kind, EventKind::Vanish);
    assert_eq!(gone.events[0].last_seen_window, Some(1));
}
