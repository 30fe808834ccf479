//! The tracking parameters ([`TrackingParams`], read from the `[tracking]` table of the
//! configuration) and the errors of building a tracker or a frame.

use serde::{Deserialize, Serialize};

use super::TrackedCluster;
use crate::analysis::AnalysisError;

#[derive(Debug, thiserror::Error)]
pub enum TrackingError {
    #[error("invalid tracking parameter {name} = {value}: expected {expected}")]
    InvalidParameter {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error("cannot build a tracking frame: {0}")]
    Analysis(#[from] AnalysisError),
}

/// Everything the tracker can be told. Defaults in parentheses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrackingParams {
    /// Cells of every evaluator matrix below this share are outliers (0.05, Llort et al. (2013),
    /// §3).
    pub outlier_share: f64,
    /// Sampled bursts per cluster for cross-classification and in signatures (64).
    pub sample_points: usize,
    /// The SPMD evaluator is applied to a frame only when its global sequence score is at least
    /// this (0.5).
    pub spmd_min_score: f64,
    /// Longest distance in bursts from a pivot that a sequence context tells apart (16).
    pub sequence_steps: u32,
    /// A 1:1 relation whose centroid moved more than this in raw log space is a "moved" event
    /// (ln 1.25 ≈ 0.223: a 25 % change of instructions, IPC or on-CPU time).
    pub move_threshold: f64,
    /// Clusters below this share of their frame's time make no events (0.01).
    pub relevant_time_share: f64,
    /// Closed windows without a cluster after which it vanishes (10).
    pub vanish_after_windows: u32,
    /// Most ids kept alive (active and dormant) by a tracker; the dormant one seen longest ago
    /// vanishes first (256).
    pub max_phases: usize,
    /// Events kept in a tracker's list; counts stay exact (1024).
    pub max_events: usize,
    /// Ranks whose sequences a run signature keeps (16).
    pub signature_ranks: usize,
    /// Bursts per rank sequence a run signature keeps (512).
    pub signature_sequence_len: usize,
}

impl Default for TrackingParams {
    fn default() -> Self {
        TrackingParams {
            outlier_share: 0.05,
            sample_points: 64,
            spmd_min_score: 0.5,
            sequence_steps: 16,
            move_threshold: 1.25f64.ln(),
            relevant_time_share: 0.01,
            vanish_after_windows: 10,
            max_phases: 256,
            max_events: 1024,
            signature_ranks: 16,
            signature_sequence_len: 512,
        }
    }
}

impl TrackingParams {
    /// Whether `cluster` holds enough of its frame's time to make events.
    pub(super) fn is_relevant(&self, cluster: &TrackedCluster) -> bool {
        cluster.time_share >= self.relevant_time_share
    }

    pub fn validate(&self) -> Result<(), TrackingError> {
        let invalid = |name, value: String, expected| {
            Err(TrackingError::InvalidParameter {
                name,
                value,
                expected,
            })
        };
        let share = |x: f64| (0.0..=1.0).contains(&x);
        if !(share(self.outlier_share) && self.outlier_share > 0.0) {
            return invalid(
                "tracking.outlier_share",
                self.outlier_share.to_string(),
                "a share in (0, 1]",
            );
        }
        if self.sample_points == 0 {
            return invalid("tracking.sample_points", "0".into(), "at least 1");
        }
        if !share(self.spmd_min_score) {
            return invalid(
                "tracking.spmd_min_score",
                self.spmd_min_score.to_string(),
                "a score in [0, 1]",
            );
        }
        if !(self.move_threshold.is_finite() && self.move_threshold > 0.0) {
            return invalid(
                "tracking.move_threshold",
                self.move_threshold.to_string(),
                "a positive distance in log space",
            );
        }
        if !share(self.relevant_time_share) {
            return invalid(
                "tracking.relevant_time_share",
                self.relevant_time_share.to_string(),
                "a share in [0, 1]",
            );
        }
        if self.vanish_after_windows == 0 {
            return invalid("tracking.vanish_after_windows", "0".into(), "at least 1");
        }
        if self.max_phases == 0 {
            return invalid("tracking.max_phases", "0".into(), "at least 1");
        }
        Ok(())
    }
}
