//! Rank groups: the few behaviour groups the ranks of an SPMD job fall into (a master and its
//! workers; corner, edge and interior ranks of a stencil; I/O ranks), each with a lead rank that
//! stands for its members, and the job's behaviour changes (ranks that take another role).
//!
//! The method is the CallPath+Parameter clustering of A. Bahmani and F. Mueller (ICS 2014), made
//! online as in their Chameleon; both are chapters 3 and 5 of A. Bahmani, *Scalable
//! Communication Tracing via Clustering*, PhD thesis, North Carolina State University, 2017.
//!
//! * **Signature** ([`signature`]): per rank, its call path (each MPI function at each call site,
//!   the return address of the outermost call as a module and offset, the same in every process
//!   of one build) and, as parameters of each step, the calls, the mean message size and the
//!   mean peer relative to the rank (the thesis' SRC/DEST, for peers in MPI_COMM_WORLD). All of
//!   it comes from the kernel's exact per-call-site counts, so it does not depend on the burst
//!   filter or on lost bursts. Where the sites are unknown (recordings made before they were
//!   counted), the steps are the functions.
//! * **Clustering** ([`cluster()`]): main groups by equal call path (never merged: a merged call
//!   path loses events); inside each, subgroups of ranks whose parameters agree within
//!   [`GroupParams::count_tolerance`] (5 %, the thesis' COUNT tolerance); at most `K` groups
//!   (K = 9 by default, raised to the number of call paths), each main group keeping ⌊K / call
//!   paths⌋ subgroups by farthest-first selection (Chameleon's K-Farthest) with Manhattan distance.
//!   Peers split subgroups only with [`GroupParams::split_by_peers`]: relative peers tell the
//!   orientation of a stencil's corners and edges and a worker's distance from its master, which
//!   the thesis counts as behaviours of their own (its LU and CG results) but a user looking for
//!   roles does not.
//!   The lead of a group is its lowest rank, as the start rank of the thesis' ranklist; a group
//!   that absorbed others to stay within K keeps its farthest-first head as lead.
//! * **Online** ([`online`]): windows aligned to Unix time; each closed window gives every rank
//!   its window call path; Chameleon's states AT (a rank's call path changed), C (stable again:
//!   re-cluster) and L (stable: keep the groups), with the fix that leaving L always leads to a
//!   re-clustering once the new behaviour is stable. A re-clustering in which ranks keep another
//!   call path than at the previous one is a behaviour change of the job.
//! * **Job-wide** ([`merge`]): the ranks' signatures of every node clustered together, and the
//!   nodes' behaviour changes merged into the job's.

pub mod cluster;
pub mod merge;
pub mod online;
pub mod signature;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use cluster::{cluster, RankGroup};
pub use online::{BehaviourChange, ChangeLeads, GroupState, RankGroupTracker, RankGroupsView};
pub use signature::{CallPathStep, FunctionUse, RankSignature};

/// How ranks are grouped (`[groups]` in the configuration file).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupParams {
    /// Most groups per job (9); raised to the number of distinct call paths, which are never
    /// merged.
    pub k: usize,
    /// Relative difference within which two ranks' calls of a function, or their mean message
    /// sizes, count as equal (0.05).
    pub count_tolerance: f64,
    /// Whether ranks whose mean relative peers differ (by more than half a rank) at a call
    /// site fall into different subgroups, as the thesis' SRC/DEST dimensions do (false). On,
    /// the corners of a 2-D stencil split by orientation, and the workers of a master split
    /// by their distance to it; off, the peers are shown in the signatures only.
    pub split_by_peers: bool,
}

impl Default for GroupParams {
    fn default() -> Self {
        GroupParams {
            k: 9,
            count_tolerance: 0.05,
            split_by_peers: false,
        }
    }
}

/// A rank group parameter out of its range; the message says the range.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum InvalidGroupParams {
    #[error("k must be at least 1")]
    NoGroups,
    #[error("count_tolerance = {0} must be at least 0 and below 1")]
    CountTolerance(f64),
}

impl GroupParams {
    pub fn validate(&self) -> Result<(), InvalidGroupParams> {
        if self.k == 0 {
            return Err(InvalidGroupParams::NoGroups);
        }
        if !(0.0..1.0).contains(&self.count_tolerance) {
            return Err(InvalidGroupParams::CountTolerance(self.count_tolerance));
        }
        Ok(())
    }
}
