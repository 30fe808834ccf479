//! A **frame** ([`Frame`]) is one clustering: a window of a running job, or a whole run. Its
//! clusters ([`TrackedCluster`]) carry what the evaluators need and nothing else: a bounded
//! sample of raw feature points, the centroid in raw (log) feature space, the code regions with
//! their burst counts, the statistics the trends are made of, plus the frame's per-rank cluster
//! sequences and its intra-frame simultaneity (which clusters share aligned columns). A frame is
//! serialisable; [`RunSignature`](super::RunSignature) is a frame plus the application's
//! identity, which a recording or the daemon stores per job.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{TrackingError, TrackingParams};
use crate::analysis::msa::Alignment;
use crate::analysis::points::Coords;
use crate::analysis::{
    prepare, sequence_score, Analysis, ClusterId, FeatureSet, Prepared, RegionCount, SequenceScore,
    NOISE,
};
use crate::model::{Burst, CallSite};

/// One cluster of a frame, as the evaluators see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrackedCluster {
    /// The cluster's id in its frame: the analysis's cluster number, or a stable id.
    pub id: u32,
    pub bursts: u64,
    pub time_ns: u64,
    /// Share of the frame's burst time (filtered bursts included).
    pub time_share: f64,
    /// Mean raw feature values (logs applied), as the analysis's feature report names them.
    pub centroid: Vec<f64>,
    /// A deterministic sample of the cluster's bursts in raw feature space (coordinates past the
    /// feature set's dimensions are 0).
    pub points: Vec<Coords>,
    /// For each sampled point, its code region as an index into `regions`.
    pub point_regions: Vec<u32>,
    /// Code regions, by decreasing burst count.
    pub regions: Vec<RegionCount>,
    pub instructions_mean: Option<f64>,
    pub ipc: Option<f64>,
    pub spmd_score: f64,
    pub lb_duration: f64,
}

/// Cluster `b` occupies `share` of the aligned columns that cluster `a` occupies.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Simultaneity {
    pub a: u32,
    pub b: u32,
    pub share: f64,
}

/// One clustering, reduced to what tracking needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Frame {
    pub features: FeatureSet,
    /// m, the number of ranks of the analysis.
    pub ranks: u32,
    /// Global Cluster Sequence Score of the clustering.
    pub spmd_score: f64,
    /// All burst time given to the analysis, filtered bursts included.
    pub time_ns: u64,
    /// By ascending id.
    pub clusters: Vec<TrackedCluster>,
    /// Pairs with a non-zero share, by (a, b).
    pub simultaneous: Vec<Simultaneity>,
    /// Per rank (by rank index), the ids of its clustered bursts in start order (noise omitted).
    pub sequences: Vec<Vec<u32>>,
}

impl Frame {
    /// The frame of an analysis of `bursts` (the same bursts, in the same order, that `analysis`
    /// was computed from). Re-runs the cheap preparation and one sequence alignment.
    pub fn from_analysis(
        analysis: &Analysis,
        bursts: &[Burst],
        params: &TrackingParams,
    ) -> Result<Frame, TrackingError> {
        let prepared = prepare(bursts, analysis.ranks, &analysis.params)?;
        let score = sequence_score(&kept_labels(analysis, &prepared), &prepared.sequences);
        Ok(Frame::from_prepared(
            analysis, bursts, &prepared, &score, params,
        ))
    }

    /// As [`Frame::from_analysis`], from the preparation of the same bursts and the alignment
    /// of their labels.
    pub(crate) fn from_prepared(
        analysis: &Analysis,
        bursts: &[Burst],
        prepared: &Prepared,
        score: &SequenceScore,
        params: &TrackingParams,
    ) -> Frame {
        let labels = kept_labels(analysis, prepared);
        let mut members: BTreeMap<ClusterId, Vec<usize>> = BTreeMap::new();
        for (point, &label) in labels.iter().enumerate() {
            if label != NOISE {
                members.entry(label).or_default().push(point);
            }
        }
        let raw = &prepared.features.raw;
        let clusters = analysis
            .clusters
            .iter()
            .map(|stats| {
                let points = members.get(&stats.id).map_or(&[][..], |m| &m[..]);
                let region_index: BTreeMap<(&CallSite, &CallSite), u32> = stats
                    .regions
                    .iter()
                    .enumerate()
                    .map(|(k, r)| ((&r.start, &r.end), k as u32))
                    .collect();
                let sample = sample_indices(points.len(), params.sample_points);
                TrackedCluster {
                    id: stats.id,
                    bursts: stats.bursts,
                    time_ns: stats.time_ns,
                    time_share: stats.time_share,
                    centroid: stats.centroid.clone(),
                    points: sample.iter().map(|&k| raw[points[k]]).collect(),
                    point_regions: sample
                        .iter()
                        .map(|&k| region_index[&bursts[prepared.kept[points[k]]].region()])
                        .collect(),
                    regions: stats.regions.clone(),
                    instructions_mean: stats.instructions_mean,
                    ipc: stats.ipc,
                    spmd_score: stats.spmd_score,
                    lb_duration: stats.lb_duration,
                }
            })
            .collect();
        let sequences = (0..prepared.sequences.ranks())
            .map(|r| {
                prepared
                    .sequences
                    .sequence(r)
                    .iter()
                    .map(|&p| labels[p])
                    .filter(|&l| l != NOISE)
                    .collect()
            })
            .collect();
        Frame {
            features: analysis.features.used,
            ranks: analysis.ranks,
            spmd_score: analysis.global_score,
            time_ns: analysis.filter.time_in_ns,
            clusters,
            simultaneous: simultaneity(score.alignment()),
            sequences,
        }
    }

    pub(super) fn cluster(&self, id: u32) -> Option<&TrackedCluster> {
        self.clusters
            .binary_search_by_key(&id, |c| c.id)
            .ok()
            .map(|k| &self.clusters[k])
    }

    /// The same frame with every id replaced through `map` (ids missing from it are dropped
    /// from the sequences and simultaneities, clusters keep their sample).
    pub fn relabelled(&self, map: &BTreeMap<u32, u32>) -> Frame {
        let mut clusters: Vec<TrackedCluster> = self
            .clusters
            .iter()
            .filter_map(|c| map.get(&c.id).map(|&id| TrackedCluster { id, ..c.clone() }))
            .collect();
        clusters.sort_by_key(|c| c.id);
        let mut simultaneous: Vec<Simultaneity> = self
            .simultaneous
            .iter()
            .filter_map(|s| {
                Some(Simultaneity {
                    a: *map.get(&s.a)?,
                    b: *map.get(&s.b)?,
                    share: s.share,
                })
            })
            .collect();
        simultaneous.sort_by_key(|s| (s.a, s.b));
        Frame {
            features: self.features,
            ranks: self.ranks,
            spmd_score: self.spmd_score,
            time_ns: self.time_ns,
            clusters,
            simultaneous,
            sequences: self
                .sequences
                .iter()
                .map(|s| s.iter().filter_map(|id| map.get(id).copied()).collect())
                .collect(),
        }
    }

    /// Only the clusters in `keep`, with their sequences and simultaneities.
    pub(super) fn restricted(&self, keep: &BTreeSet<u32>) -> Frame {
        let map = keep.iter().map(|&id| (id, id)).collect();
        self.relabelled(&map)
    }

    /// The frame's scalar fields, without clusters, sequences or simultaneities.
    pub(super) fn clone_header(&self) -> Frame {
        Frame {
            features: self.features,
            ranks: self.ranks,
            spmd_score: self.spmd_score,
            time_ns: self.time_ns,
            clusters: Vec::new(),
            simultaneous: Vec::new(),
            sequences: Vec::new(),
        }
    }
}

/// `n` indices spread evenly over `0..len`, or all of them.
fn sample_indices(len: usize, n: usize) -> Vec<usize> {
    if len <= n {
        (0..len).collect()
    } else {
        (0..n).map(|k| k * len / n).collect()
    }
}

/// The label of each prepared point.
fn kept_labels(analysis: &Analysis, prepared: &Prepared) -> Vec<ClusterId> {
    prepared
        .kept
        .iter()
        .map(|&i| analysis.labels[i].expect("a kept burst has a label"))
        .collect()
}

/// Intra-frame simultaneity from the alignment of the rank sequences (noise ignored).
fn simultaneity(alignment: &Alignment) -> Vec<Simultaneity> {
    let mut columns: BTreeMap<u32, u64> = BTreeMap::new();
    let mut together: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for j in 0..alignment.columns() {
        let ids: Vec<u32> = alignment
            .column(j)
            .iter()
            .map(|&(id, _)| id)
            .filter(|&id| id != NOISE)
            .collect();
        for &a in &ids {
            *columns.entry(a).or_default() += 1;
            for &b in &ids {
                if a != b {
                    *together.entry((a, b)).or_default() += 1;
                }
            }
        }
    }
    together
        .into_iter()
        .map(|((a, b), n)| Simultaneity {
            a,
            b,
            share: n as f64 / columns[&a] as f64,
        })
        .collect()
}
