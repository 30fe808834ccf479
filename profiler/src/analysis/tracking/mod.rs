//! Cluster tracking across time windows of one job and across runs of one application, after Llort
//! et al. (2013): G. Llort, H. Servat, J. Giménez and J. Labarta, "On the usefulness of object
//! tracking techniques in performance analysis", SC 2013 ("the paper" below).
//!
//! * [`frame`]: a clustering reduced to what tracking needs ([`Frame`]); a run's frame with the
//!   application's identity is a [`RunSignature`].
//! * [`relations`]: which clusters of two frames are the same phase ([`relate`]), the paper's
//!   evaluators in its combination order with every gap it leaves filled.
//! * [`live`]: stable ids across the windows of one job ([`Tracker`]) and the events between
//!   them.
//! * [`runs`]: phase-for-phase matching of two runs of one application ([`match_runs`]) with the
//!   trend of each phase.
//! * [`params`]: what all of them can be told ([`TrackingParams`]).

pub mod frame;
pub mod live;
pub mod params;
pub mod relations;
pub mod runs;
#[cfg(test)]
mod test_support;

pub use frame::{Frame, Simultaneity, TrackedCluster};
pub use live::{EventCounts, EventKind, StableId, TrackUpdate, Tracker, TrackingEvent};
pub use params::{TrackingError, TrackingParams};
pub use relations::{relate, Edge, EdgeSource, Pairing, Relation};
pub use runs::{
    match_runs, AppIdentity, InstructionScaling, MatchKind, PhaseMatch, PhaseMetrics, PhaseTrend,
    RunMatch, RunSignature,
};
