//! Re-clustering: when a job's samples are clustered (a window closes, or the provisional noise
//! rises), and how a clustering becomes the job's window and cumulative views, its stable ids,
//! its events and the next provisional model.
//!
//! **Re-clustering** happens when a window closes, and early when the provisional noise share
//! of the bursts classified since the model was built exceeds
//! [`OnlineParams::recluster_noise_share`] over at least [`OnlineParams::recluster_min_bursts`]
//! bursts (at most [`OnlineParams::max_early_reclusters`] times per window): the open window's
//! sample so far is clustered and tracked as a *partial* frame. The first window therefore gets a model as
//! soon as it has enough bursts, and a phase change is picked up within the window.
//!
//! **Errors**: an analysis failure (only possible with a fixed feature set whose counters are
//! missing) is reported as an event and in the snapshot, and the window is skipped.
//!
//! [`OnlineParams::recluster_noise_share`]: super::OnlineParams::recluster_noise_share
//! [`OnlineParams::recluster_min_bursts`]: super::OnlineParams::recluster_min_bursts
//! [`OnlineParams::max_early_reclusters`]: super::OnlineParams::max_early_reclusters

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::model::Model;
use super::{
    phase_keys, CumulativeCluster, CumulativeView, JobPhases, PhaseShare, PhaseView,
    ProvisionalCounts, RankSequence, WindowView,
};
use crate::analysis::tracking::{Frame, StableId, TrackingEvent};
use crate::analysis::{analyse, analyse_in_full, AnalysisInFull, ClusterId, ClusterStats, NOISE};
use crate::model::Burst;

/// Why a clustering ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReclusterReason {
    WindowClosed,
    /// Provisional noise share above the threshold (or no model yet).
    NoiseShare,
    /// A burst for a window beyond the open ones closed the oldest one early.
    OpenWindowLimit,
}

/// What a tick reports.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum PhaseEvent {
    Reclustered {
        window: u64,
        partial: bool,
        reason: ReclusterReason,
        bursts: u64,
        phases: usize,
        spmd_score: f64,
    },
    Tracking(TrackingEvent),
    AnalysisFailed {
        window: u64,
        error: String,
    },
}

impl JobPhases {
    /// Re-clusters the open window early when the provisional noise share asks for it.
    pub(super) fn recluster_early(&mut self, events: &mut Vec<PhaseEvent>) {
        let classified = self.provisional.classified();
        if classified >= self.params.recluster_min_bursts
            && self.provisional.noise_share() > self.params.recluster_noise_share
        {
            // The window being filled: the newest one.
            if let Some(window) = self.buffers.keys().next_back().copied() {
                let buffer = &self.buffers[&window];
                if buffer.early_reclusters < self.params.max_early_reclusters
                    && !buffer.bursts.is_empty()
                {
                    let buffer = self.buffers.get_mut(&window).expect("present");
                    buffer.early_reclusters += 1;
                    let (seen, seen_time, dropped) =
                        (buffer.seen, buffer.seen_time_ns, buffer.dropped);
                    let mut bursts = self.carry.clone();
                    bursts.extend(buffer.bursts.iter().cloned());
                    self.recluster(
                        window,
                        &bursts,
                        (seen, seen_time, dropped),
                        false,
                        ReclusterReason::NoiseShare,
                        events,
                    );
                } else {
                    // No more early re-clusterings in this window: start counting afresh so the
                    // check does not repeat on every tick.
                    let model_window = self.provisional.model_window;
                    self.provisional = ProvisionalCounts {
                        model_window,
                        ..Default::default()
                    };
                }
            }
        }
    }

    /// Clusters one window's sample, tracks it, installs the new model; returns the stable id
    /// of each burst (0 for noise and filtered), or `None` when the analysis failed.
    pub(super) fn recluster(
        &mut self,
        window: u64,
        bursts: &[Burst],
        (seen, seen_time_ns, dropped): (u64, u64, u64),
        closed: bool,
        reason: ReclusterReason,
        events: &mut Vec<PhaseEvent>,
    ) -> Option<Vec<StableId>> {
        match reason {
            ReclusterReason::WindowClosed => self.totals.reclusters_window += 1,
            ReclusterReason::NoiseShare => self.totals.reclusters_noise += 1,
            ReclusterReason::OpenWindowLimit => self.totals.reclusters_forced += 1,
        }
        let ranks = self.analysis_ranks();
        let AnalysisInFull {
            analysis,
            prepared,
            score,
        } = match analyse_in_full(bursts, ranks, &self.params.analysis) {
            Ok(x) => x,
            Err(e) => {
                self.totals.analysis_failures += 1;
                let error = e.to_string();
                self.last_error = Some(format!("window {window}: {error}"));
                events.push(PhaseEvent::AnalysisFailed { window, error });
                return None;
            }
        };
        let frame =
            Frame::from_prepared(&analysis, bursts, &prepared, &score, &self.params.tracking);
        let update = self.tracker.update(window, &frame, closed);
        self.model = Model::build(&analysis, bursts, &prepared, &update.ids);
        self.provisional = ProvisionalCounts {
            model_window: Some(window),
            ..Default::default()
        };

        let labels: Vec<StableId> = analysis
            .labels
            .iter()
            .map(|l| match l {
                Some(l) if *l != NOISE => update.ids[l],
                _ => 0,
            })
            .collect();
        let keys = phase_keys(&analysis.clusters);
        let mut phases: Vec<PhaseView> = analysis
            .clusters
            .iter()
            .zip(keys)
            .map(|(stats, key)| {
                let id = update.ids[&stats.id];
                PhaseView {
                    id,
                    key,
                    time_rank: stats.id,
                    stats: ClusterStats {
                        id,
                        ..stats.clone()
                    },
                }
            })
            .collect();
        phases.sort_by_key(|p| p.id);
        let mut sequences: BTreeMap<u32, Vec<StableId>> = BTreeMap::new();
        for &i in &prepared.kept {
            sequences.entry(bursts[i].rank).or_default().push(labels[i]);
        }
        events.push(PhaseEvent::Reclustered {
            window,
            partial: !closed,
            reason,
            bursts: bursts.len() as u64,
            phases: phases.len(),
            spmd_score: analysis.global_score,
        });
        events.extend(update.events.into_iter().map(PhaseEvent::Tracking));
        self.last = Some(WindowView {
            window,
            start_ns: window * self.window_ns,
            end_ns: (window + 1).saturating_mul(self.window_ns),
            partial: !closed,
            bursts_seen: seen,
            time_seen_ns: seen_time_ns,
            bursts_analysed: bursts.len() as u64,
            bursts_dropped: dropped,
            ranks_sampled: ranks,
            time_filtered_share: analysis.filter.time_filtered_share,
            features: analysis.features,
            filter: analysis.filter,
            clustering: analysis.clustering,
            spmd_score: analysis.global_score,
            phases,
            noise: analysis.noise,
            sequences: sequences
                .into_iter()
                .map(|(rank, phases)| RankSequence { rank, phases })
                .collect(),
        });
        Some(labels)
    }

    /// Clusters the cumulative sample and keys its clusters by the window phases.
    pub(super) fn recluster_cumulative(&mut self, events: &mut Vec<PhaseEvent>) {
        let (bursts, window_labels) = self.cumulative.bursts();
        let analysis = match analyse(&bursts, self.analysis_ranks(), &self.params.analysis) {
            Ok(a) => a,
            Err(e) => {
                self.totals.analysis_failures += 1;
                let error = format!("cumulative sample: {e}");
                self.last_error = Some(error.clone());
                let window = self.cumulative.chunks.last().map_or(0, |c| c.window);
                events.push(PhaseEvent::AnalysisFailed { window, error });
                return;
            }
        };
        let mut votes: BTreeMap<ClusterId, BTreeMap<StableId, u64>> = BTreeMap::new();
        for ((label, burst), &phase) in analysis.labels.iter().zip(&bursts).zip(&window_labels) {
            if let Some(label) = label.filter(|&l| l != NOISE) {
                *votes.entry(label).or_default().entry(phase).or_default() += burst.duration_ns;
            }
        }
        let keys = phase_keys(&analysis.clusters);
        let mut clusters: Vec<CumulativeCluster> = analysis
            .clusters
            .iter()
            .zip(keys)
            .map(|(stats, key)| {
                let votes = votes.remove(&stats.id).unwrap_or_default();
                let total: u64 = votes.values().sum();
                let phase = votes
                    .iter()
                    .filter(|(&id, _)| id != 0)
                    .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                    .map_or(0, |(&id, _)| id);
                CumulativeCluster {
                    phase,
                    part: 0,
                    key,
                    window_phases: votes
                        .iter()
                        .map(|(&id, &t)| PhaseShare {
                            id,
                            share: if total == 0 {
                                0.0
                            } else {
                                t as f64 / total as f64
                            },
                        })
                        .collect(),
                    stats: stats.clone(),
                }
            })
            .collect();
        // Within a phase, parts by decreasing time (the analysis ids are by decreasing time).
        clusters.sort_by_key(|c| (c.phase, c.stats.id));
        for k in 1..clusters.len() {
            if clusters[k].phase == clusters[k - 1].phase {
                clusters[k].part = clusters[k - 1].part + 1;
            }
        }
        self.cumulative_view = Some(CumulativeView {
            windows_sampled: self.cumulative.chunks.len(),
            first_window: self.cumulative.chunks.first().map_or(0, |c| c.window),
            last_window: self.cumulative.chunks.last().map_or(0, |c| c.window),
            stride: self.cumulative.stride,
            bursts_analysed: bursts.len() as u64,
            features: analysis.features,
            filter: analysis.filter,
            spmd_score: analysis.global_score,
            clusters,
            noise: analysis.noise,
        });
    }
}
