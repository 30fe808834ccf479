//! Fixtures shared by the tracking tests.

use super::TrackedCluster;
use crate::analysis::RegionCount;
use crate::model::CallSite;

/// A cluster of `bursts` bursts of 1 ns each, all in the code region of module "app" from call
/// site `region` to call site 0, perfectly SPMD and balanced, without counters and without
/// points: tests set the feature-space fields they need.
pub(super) fn cluster_in_region(id: u32, region: u64, bursts: u64) -> TrackedCluster {
    let site = |offset| CallSite {
        module: "app".into(),
        offset,
    };
    TrackedCluster {
        id,
        bursts,
        time_ns: bursts,
        time_share: 0.0,
        centroid: Vec::new(),
        points: Vec::new(),
        point_regions: Vec::new(),
        regions: vec![RegionCount {
            start: site(region),
            end: site(0),
            bursts,
        }],
        instructions_mean: None,
        ipc: None,
        spmd_score: 1.0,
        lb_duration: 1.0,
    }
}
