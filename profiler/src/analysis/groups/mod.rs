//! Rank groups: the few behaviour groups the ranks of an SPMD job fall into (a master and its
//! workers; corner, edge and interior ranks of a stencil; I/O ranks), each with a lead rank that
//! stands for its members, and the job's behaviour changes (ranks that take another role).
//!
//! The method is the CallPath+Parameter clustering of A. Bahmani and F. Mueller (ICS 2014), made
//! online as in their Chameleon; both are chapters 3 and 5 of A. Bahmani, *Scalable
//! Communication Tracing via Clustering*, PhD thesis, North Carolina State University, 2017.
//!
//! * **Signature** ([`signature`]): per rank, the MPI functions it called (its call path at
//!   function granularity) and, as parameters, the calls and the mean message size of each. All
//!   of it comes from the kernel's exact per-function counts, so it does not depend on the burst
//!   filter or on lost bursts. The thesis folds stack signatures (return addresses) into a 64-bit
//!   call-path hash; here the call site of an MPI call is only known for bursts long enough to be
//!   shipped, so call sites are not part of the signature (a site seen or not would split ranks
//!   of one role by chance). Peers are not captured: the relative SRC/DEST of the thesis are
//!   missing, which is also what lets the corners of a stencil form one group whatever their
//!   orientation.
//! * **Clustering** ([`cluster()`]): main groups by equal call path (never merged: a merged call
//!   path loses events); inside each, subgroups of ranks whose parameters agree within
//!   [`GroupParams::count_tolerance`] (5 %, the thesis' COUNT tolerance); at most `K` groups
//!   (K = 9 by default, raised to the number of call paths), each main group keeping ⌊K / call
//!   paths⌋ subgroups by farthest-first selection (Chameleon's K-Farthest) with Manhattan distance.
//!   The lead of a group is its lowest rank, as the start rank of the thesis' ranklist; a group
//!   that absorbed others to stay within K keeps its farthest-first head as lead.
//! * **Online** ([`online`]): windows aligned to Unix time; each closed window gives every rank
//!   its window call path; Chameleon's states AT (a rank's call path changed), C (stable again:
//!   re-cluster) and L (stable: keep the groups), with the fix that leaving L always leads to a
//!   re-clustering once the new behaviour is stable. A re-clustering in which ranks keep another
//!   call path than at the previous one is a behaviour change of the job.

pub mod cluster;
pub mod online;
pub mod signature;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

pub use cluster::{cluster, RankGroup};
pub use online::{BehaviourChange, GroupState, RankGroupTracker, RankGroupsView};
pub use signature::{FunctionUse, RankSignature};

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
}

impl Default for GroupParams {
    fn default() -> Self {
        GroupParams {
            k: 9,
            count_tolerance: 0.05,
        }
    }
}

impl GroupParams {
    pub fn validate(&self) -> Result<(), String> {
        if self.k == 0 {
            return Err("k must be at least 1".into());
        }
        if !(0.0..1.0).contains(&self.count_tolerance) {
            return Err(format!(
                "count_tolerance = {} must be at least 0 and below 1",
                self.count_tolerance
            ));
        }
        Ok(())
    }
}
