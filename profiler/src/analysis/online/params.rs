//! The online analysis parameters ([`OnlineParams`], read from the `[online]` table of the
//! configuration, with the clustering and tracking parameters nested in them) and their check.

use serde::{Deserialize, Serialize};

use crate::analysis::tracking::{TrackingError, TrackingParams};
use crate::analysis::{analyse, AnalysisError, AnalysisParams};

#[derive(Debug, thiserror::Error)]
pub enum OnlineError {
    #[error("invalid online analysis parameter {name} = {value}: expected {expected}")]
    InvalidParameter {
        name: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(transparent)]
    Tracking(#[from] TrackingError),
    #[error("analysis of the cumulative sample failed: {0}")]
    Analysis(#[from] AnalysisError),
}

/// Online analysis parameters. Defaults in parentheses.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OnlineParams {
    /// Window length in seconds; windows are aligned to Unix time (30).
    pub window_s: f64,
    /// Seconds after a window's end before it is closed, for bursts still in flight (3).
    pub lateness_s: f64,
    /// Re-cluster the open window early when more than this share of the bursts classified
    /// since the last clustering is provisional noise (0.2)…
    pub recluster_noise_share: f64,
    /// …over at least this many classified bursts (200, i.e. 1600 pushed ones with the default
    /// `classify_every`).
    pub recluster_min_bursts: u64,
    /// Early re-clusterings per window at most (2).
    pub max_early_reclusters: u32,
    /// Provisional classification of one pushed burst in this many (8): enough for the noise
    /// share and the live counts, at an eighth of the cost.
    pub classify_every: u32,
    /// Bursts kept per window for clustering (20 000).
    pub max_window_bursts: usize,
    /// A window whose sample holds fewer bursts is not clustered on its own: its bursts are
    /// carried into the next window (100).
    pub min_window_bursts: usize,
    /// Time slots of the stratified window sample (8).
    pub window_slots: u32,
    /// Bursts kept for the cumulative view of the whole job (20 000).
    pub max_cumulative_bursts: usize,
    /// Windows (chunks) the cumulative sample is spread over at most (32).
    pub cumulative_chunks: usize,
    /// How each window and the cumulative sample are clustered.
    pub analysis: AnalysisParams,
    /// How clusters are tracked across windows.
    pub tracking: TrackingParams,
}

impl Default for OnlineParams {
    fn default() -> Self {
        OnlineParams {
            window_s: 30.0,
            lateness_s: 3.0,
            recluster_noise_share: 0.2,
            recluster_min_bursts: 200,
            max_early_reclusters: 2,
            classify_every: 8,
            max_window_bursts: 20_000,
            min_window_bursts: 100,
            window_slots: 8,
            max_cumulative_bursts: 20_000,
            cumulative_chunks: 32,
            analysis: AnalysisParams::default(),
            tracking: TrackingParams::default(),
        }
    }
}

impl OnlineParams {
    pub fn validate(&self) -> Result<(), OnlineError> {
        let invalid = |name, value: String, expected| {
            Err(OnlineError::InvalidParameter {
                name,
                value,
                expected,
            })
        };
        // At least a microsecond, and small enough that window indices fit comfortably.
        if !(self.window_s.is_finite() && self.window_s >= 1e-6 && self.window_s <= 1e7) {
            return invalid(
                "online.window_s",
                self.window_s.to_string(),
                "seconds in [1e-6, 1e7]",
            );
        }
        if !(self.lateness_s.is_finite() && self.lateness_s >= 0.0 && self.lateness_s <= 1e7) {
            return invalid(
                "online.lateness_s",
                self.lateness_s.to_string(),
                "seconds in [0, 1e7]",
            );
        }
        if !(self.recluster_noise_share >= 0.0 && self.recluster_noise_share <= 1.0) {
            return invalid(
                "online.recluster_noise_share",
                self.recluster_noise_share.to_string(),
                "a share in [0, 1]",
            );
        }
        if self.recluster_min_bursts == 0 {
            return invalid("online.recluster_min_bursts", "0".into(), "at least 1");
        }
        if self.classify_every == 0 {
            return invalid("online.classify_every", "0".into(), "at least 1");
        }
        if self.window_slots == 0 {
            return invalid("online.window_slots", "0".into(), "at least 1");
        }
        if self.max_window_bursts < self.window_slots as usize {
            return invalid(
                "online.max_window_bursts",
                self.max_window_bursts.to_string(),
                "at least window_slots",
            );
        }
        if self.min_window_bursts > self.max_window_bursts {
            return invalid(
                "online.min_window_bursts",
                self.min_window_bursts.to_string(),
                "at most max_window_bursts",
            );
        }
        if self.cumulative_chunks == 0 {
            return invalid("online.cumulative_chunks", "0".into(), "at least 1");
        }
        if self.max_cumulative_bursts < self.cumulative_chunks {
            return invalid(
                "online.max_cumulative_bursts",
                self.max_cumulative_bursts.to_string(),
                "at least cumulative_chunks",
            );
        }
        // The clustering parameters are checked by the analysis itself; check them now so a bad
        // configuration fails at start rather than at the first window.
        let probe = analyse(&[], 0, &self.analysis);
        if let Err(e) = probe {
            return invalid(
                "online.analysis",
                e.to_string(),
                "valid analysis parameters",
            );
        }
        self.tracking.validate()?;
        Ok(())
    }
}
