use super::*;
use crate::analysis::tracking::test_support::cluster_in_region;

/// A frame from per-rank sequences of cluster ids, one region per cluster (region = id), all
/// clusters at the same point in feature space (so displacement cannot tell them apart).
fn sequence_frame(sequences: Vec<Vec<u32>>) -> Frame {
    let ids: BTreeSet<u32> = sequences.iter().flatten().copied().collect();
    Frame {
        features: FeatureSet::InstructionsIpc,
        ranks: sequences.len() as u32,
        spmd_score: 1.0,
        time_ns: 0,
        clusters: ids
            .iter()
            .map(|&id| TrackedCluster {
                time_share: 0.1,
                centroid: vec![10.0, 1.0],
                points: vec![[10.0, 1.0, 0.0]],
                point_regions: vec![0],
                ..cluster_in_region(id, u64::from(id), 10)
            })
            .collect(),
        simultaneous: Vec::new(),
        sequences,
    }
}

#[test]
fn fig5_sequence_pivots() {
    // Llort et al. (2013), Fig. 5: A = 1 2 3 1 2 3, B = 2 3 4 2 3 4, pivot 1 → 2: then 2 → 3
    // and 3 → 4.
    let a = sequence_frame(vec![vec![1, 2, 3, 1, 2, 3]]);
    let b = sequence_frame(vec![vec![2, 3, 4, 2, 3, 4]]);
    let ca = contexts(&a, &BTreeMap::from([(1, 0)]), 16);
    let cb = contexts(&b, &BTreeMap::from([(2, 0)]), 16);
    assert_eq!(context_overlap(&ca[&2], &cb[&3]), 1.0);
    assert_eq!(context_overlap(&ca[&3], &cb[&4]), 1.0);
    assert_eq!(context_overlap(&ca[&2], &cb[&4]), 0.0);
    assert_eq!(context_overlap(&ca[&3], &cb[&3]), 0.0);
}

#[test]
fn sequence_splits_a_wide_relation() {
    // The A11/A12 → B12/B15 case of Llort et al. (2013), §3.1: displacement relates everything
    // to everything (all clusters sit on one point), and code does not separate 2 and 3 from
    // 20 and 30 (shared regions), but the sequence with pivot 1 ≡ 10 does.
    let mut a = sequence_frame(vec![vec![1, 2, 3, 1, 2, 3]; 2]);
    let mut b = sequence_frame(vec![vec![10, 20, 30, 10, 20, 30]; 2]);
    let region = |frame: &Frame, id: u32| frame.cluster(id).unwrap().regions.clone();
    let (r1, r2) = (region(&a, 1), region(&a, 2));
    let shared = vec![r2[0].clone(), region(&a, 3)[0].clone()];
    for c in &mut a.clusters {
        c.regions = if c.id == 1 {
            r1.clone()
        } else {
            shared.clone()
        };
    }
    for c in &mut b.clusters {
        c.regions = if c.id == 10 {
            r1.clone()
        } else {
            shared.clone()
        };
    }
    // Make 1 and 10 a clean pivot: move them apart from the rest in feature space.
    for frame in [&mut a, &mut b] {
        for c in &mut frame.clusters {
            if c.id == 1 || c.id == 10 {
                c.points = vec![[20.0, 3.0, 0.0]];
                c.centroid = vec![20.0, 3.0];
            }
        }
    }
    let pairing = relate(&a, &b, &TrackingParams::default(), 0.0);
    let relations: Vec<(Vec<u32>, Vec<u32>)> = pairing
        .relations
        .iter()
        .map(|r| (r.a.clone(), r.b.clone()))
        .collect();
    assert_eq!(
        relations,
        vec![
            (vec![1], vec![10]),
            (vec![2], vec![20]),
            (vec![3], vec![30])
        ]
    );
}
