//! Phase keys: a name for a phase that is the same on every node of a job. Stable ids
//! ([`StableId`]) number phases in the order one node's tracker met them, so the same phase has
//! different ids on different nodes; a [`PhaseKey`] is derived from what the phase computes
//! instead, so that per-phase values of all of a job's nodes can be summed by key (the Prometheus
//! per-phase aggregates and their recording rules).
//!
//! **Key**: a hash of the phase's dominant code region (the region most of its bursts ran: start
//! and end call site, each a module build-id or path and a file offset, equal across processes
//! and nodes running the same binary), and a part number when several phases of one clustering
//! share that region: part 0 has the shortest mean burst duration, then 1, … The mean duration
//! orders them rather than the time or the burst count, which depend on how many ranks a node
//! has; an SPMD job's ranks run the same kind of bursts for about as long on every node.
//!
//! **Text**: twelve hex digits of the region's hash (48 bits: among the few phases of one job a
//! collision is unlikely, and the text stays short enough for a label and a report column), and
//! `.part` from part 1 on, e.g. `3fa2c1d09e7b` and `3fa2c1d09e7b.1`.
//!
//! [`StableId`]: crate::analysis::tracking::StableId

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::analysis::hashing::mix;
use crate::analysis::ClusterStats;
use crate::model::CallSite;

/// Bits of the region hash a key keeps: twelve hex digits.
const REGION_BITS: u32 = 48;

/// A phase's node-independent name (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct PhaseKey {
    /// The dominant region's hash, [`REGION_BITS`] bits.
    region: u64,
    /// Among the phases of the same region, by increasing mean burst duration.
    part: u32,
}

impl fmt::Display for PhaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:012x}", self.region)?;
        if self.part > 0 {
            write!(f, ".{}", self.part)?;
        }
        Ok(())
    }
}

/// A text that is not a phase key.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("`{0}` is not a phase key: expected twelve hex digits, optionally followed by `.` and a part number (e.g. 3fa2c1d09e7b.1)")]
pub struct PhaseKeyError(String);

impl FromStr for PhaseKey {
    type Err = PhaseKeyError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = || PhaseKeyError(text.to_string());
        let (region, part) = match text.split_once('.') {
            Some((region, part)) => (region, part.parse().map_err(|_| error())?),
            None => (text, 0),
        };
        if region.len() != 12 || !region.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(error());
        }
        let region = u64::from_str_radix(region, 16).map_err(|_| error())?;
        Ok(PhaseKey { region, part })
    }
}

impl From<PhaseKey> for String {
    fn from(key: PhaseKey) -> String {
        key.to_string()
    }
}

impl TryFrom<String> for PhaseKey {
    type Error = PhaseKeyError;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

impl PhaseKey {
    /// The key of the first phase whose dominant region is (`start`, `end`): the name a phase of
    /// the job's signature, which joins the phases of one region, has in the metrics.
    pub fn of_region(start: &CallSite, end: &CallSite) -> PhaseKey {
        PhaseKey {
            region: region_hash(start, end),
            part: 0,
        }
    }
}

/// A fixed hash of a call site pair: the same in every process and on every node (unlike std's
/// randomly seeded hasher). FNV-1a over the module names' bytes and the offsets, with
/// splitmix64's mixing at the end so that neighbouring offsets give unrelated keys.
fn region_hash(start: &CallSite, end: &CallSite) -> u64 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = FNV_OFFSET;
    for site in [start, end] {
        // The terminator keeps ("ab", "c") apart from ("a", "bc").
        let bytes = site.module.as_str().bytes().chain([0]);
        for byte in bytes.chain(site.offset.to_le_bytes()) {
            hash = (hash ^ u64::from(byte)).wrapping_mul(FNV_PRIME);
        }
    }
    mix(hash) >> (64 - REGION_BITS)
}

/// The keys of the phases of one clustering, in their order. Phases whose dominant regions are
/// the same get parts by increasing mean burst duration (ties by their order here).
pub fn phase_keys<'a>(phases: impl IntoIterator<Item = &'a ClusterStats>) -> Vec<PhaseKey> {
    let mut keyed: Vec<(usize, u64, f64)> = phases
        .into_iter()
        .enumerate()
        .map(|(i, stats)| {
            // A cluster has at least one burst, so at least one region; the hash of no region
            // still keys it.
            let region = stats
                .regions
                .first()
                .map_or(0, |r| region_hash(&r.start, &r.end));
            let mean = stats.time_ns as f64 / stats.bursts.max(1) as f64;
            (i, region, mean)
        })
        .collect();
    keyed.sort_by(|a, b| a.1.cmp(&b.1).then(a.2.total_cmp(&b.2)).then(a.0.cmp(&b.0)));
    let mut keys = vec![PhaseKey { region: 0, part: 0 }; keyed.len()];
    let mut previous: Option<PhaseKey> = None;
    for (i, region, _) in keyed {
        let part = match previous {
            Some(p) if p.region == region => p.part + 1,
            _ => 0,
        };
        keys[i] = PhaseKey { region, part };
        previous = Some(keys[i]);
    }
    keys
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::super::tests::{spmd, test_params, E1_PHASES, T0};
    use super::super::JobPhases;
    use super::*;
    use crate::analysis::tracking::StableId;
    use crate::analysis::{DurationQuantiles, RegionCount};
    use crate::model::Name;

    fn stats(offset: u64, bursts: u64, time_ns: u64) -> ClusterStats {
        let module = Name::new("3d1f0c9a7b2e4d5f");
        ClusterStats {
            id: 1,
            bursts,
            time_ns,
            time_share: 0.0,
            duration: DurationQuantiles {
                p10_ns: 0,
                p50_ns: 0,
                p90_ns: 0,
                p99_ns: 0,
                max_ns: 0,
            },
            instructions_mean: None,
            ipc: None,
            lb_duration: 1.0,
            lb_instructions: None,
            centroid: Vec::new(),
            regions: vec![RegionCount {
                start: CallSite { module, offset },
                end: CallSite {
                    module,
                    offset: offset + 1,
                },
                bursts,
            }],
            spmd_score: 1.0,
        }
    }

    #[test]
    fn phases_of_one_region_get_parts_by_mean_duration() {
        // Two phases of region 0x100: the one with the longer bursts has more bursts here, so
        // neither the order given nor the time orders them.
        let phases = [
            stats(0x100, 100, 500_000),
            stats(0x200, 10, 10),
            stats(0x100, 10, 1_000),
        ];
        let keys = phase_keys(&phases);
        assert_eq!(keys[0].region, keys[2].region);
        assert_ne!(keys[0].region, keys[1].region);
        assert_eq!((keys[2].part, keys[0].part, keys[1].part), (0, 1, 0));
        assert_eq!(keys[0].to_string(), format!("{:012x}.1", keys[0].region));
        assert_eq!(keys[1].to_string().len(), 12);
        for key in keys {
            assert_eq!(key.to_string().parse::<PhaseKey>(), Ok(key));
            let json = serde_json::to_string(&key).unwrap();
            assert_eq!(serde_json::from_str::<PhaseKey>(&json).unwrap(), key);
        }
        assert!("3fa2c1d09e7".parse::<PhaseKey>().is_err());
        assert!("3fa2c1d09e7b.x".parse::<PhaseKey>().is_err());
    }

    #[test]
    fn neighbouring_regions_get_unrelated_keys() {
        let keys = phase_keys(&[stats(0x100, 1, 1), stats(0x101, 1, 1)]);
        let differing = (keys[0].region ^ keys[1].region).count_ones();
        assert!(differing > 12, "{keys:?}");
    }

    /// The phases (by call site offset) of the last windows of `job`, with their stable id and key.
    fn last_phases(job: &JobPhases) -> BTreeMap<u64, (StableId, PhaseKey)> {
        let snapshot = job.snapshot();
        let window = snapshot.last_window.expect("a closed window");
        let cumulative = snapshot.cumulative.expect("a cumulative view");
        let in_window: BTreeMap<u64, (StableId, PhaseKey)> = window
            .phases
            .iter()
            .map(|p| (p.stats.regions[0].start.offset, (p.id, p.key)))
            .collect();
        // The cumulative view keys its clusters the same way.
        for cluster in &cumulative.clusters {
            let offset = cluster.stats.regions[0].start.offset;
            assert_eq!(in_window[&offset].1, cluster.key, "cumulative {offset:#x}");
        }
        in_window
    }

    #[test]
    fn two_nodes_with_other_ranks_and_other_ids_give_the_same_keys() {
        // One job of 8 ranks over two nodes of 4 ranks each. The second node's ranks skip the
        // longest phase in the first window, so its tracker meets the phases in another order
        // and numbers them otherwise.
        let mut nodes =
            [0..4, 4..8].map(|ranks| (ranks, JobPhases::new(4, test_params()).unwrap()));
        for (n, (ranks, job)) in nodes.iter_mut().enumerate() {
            let late = |window: u64, _: u64, phase: usize| {
                if n == 1 && window == 0 && phase == 2 {
                    0.0
                } else {
                    1.0
                }
            };
            spmd(8, true, &E1_PHASES, 1_000_000_000, 4.0, 7, late, |b| {
                if ranks.contains(&b.rank) {
                    job.push(&b);
                    job.tick(b.start_ns + b.duration_ns);
                }
            });
            job.tick(T0 + 6_000_000_000);
        }
        let (first, second) = (last_phases(&nodes[0].1), last_phases(&nodes[1].1));
        assert_eq!(first.len(), E1_PHASES.len(), "{first:?}");
        let keys = |phases: &BTreeMap<u64, (StableId, PhaseKey)>| -> Vec<PhaseKey> {
            phases.values().map(|(_, key)| *key).collect()
        };
        assert_eq!(keys(&first), keys(&second));
        let ids = |phases: &BTreeMap<u64, (StableId, PhaseKey)>| -> Vec<StableId> {
            phases.values().map(|(id, _)| *id).collect()
        };
        assert_ne!(ids(&first), ids(&second), "the stable ids differ");
    }
}
