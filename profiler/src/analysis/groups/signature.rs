//! A rank's signature over a span of its run: the MPI functions it called there (its call path)
//! with their calls and bytes, from the kernel's exact per-function counts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Calls and bytes of one MPI function: cumulative counts of a rank, or their difference over a
/// span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionUse {
    pub calls: u64,
    pub bytes: u64,
}

/// A rank's cumulative counts by function name (the lifecycle calls left out by the caller).
pub type Counts = BTreeMap<String, FunctionUse>;

/// What a rank did over a span: the functions it called at least once there.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankSignature {
    pub functions: BTreeMap<String, FunctionUse>,
}

impl RankSignature {
    /// The signature of the span between two cumulative readings of one rank; `since` is `None`
    /// from the rank's start. Functions without a call in the span are left out.
    pub fn between(now: &Counts, since: Option<&Counts>) -> RankSignature {
        let functions = now
            .iter()
            .filter_map(|(name, n)| {
                let before = since.and_then(|s| s.get(name)).copied().unwrap_or_default();
                let calls = n.calls.saturating_sub(before.calls);
                (calls > 0).then(|| {
                    let bytes = n.bytes.saturating_sub(before.bytes);
                    (name.clone(), FunctionUse { calls, bytes })
                })
            })
            .collect();
        RankSignature { functions }
    }

    /// The call path: the names of the functions called, in order.
    pub fn call_path(&self) -> Vec<String> {
        self.functions.keys().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// The parameters the subgroups are formed on, per function: calls and mean bytes per call.
    fn parameters(&self) -> impl Iterator<Item = (f64, f64)> + '_ {
        self.functions.values().map(|u| {
            let mean = if u.calls == 0 {
                0.0
            } else {
                u.bytes as f64 / u.calls as f64
            };
            (u.calls as f64, mean)
        })
    }

    /// Whether two signatures of the same call path agree on every parameter within `tolerance`
    /// (relative to the larger value). One call more or less always agrees, so that ranks a
    /// window cuts one iteration apart stay together.
    pub fn agrees(&self, other: &RankSignature, tolerance: f64) -> bool {
        self.parameters()
            .zip(other.parameters())
            .all(|((ca, ba), (cb, bb))| {
                ((ca - cb).abs() <= 1.0 || close(ca, cb, tolerance)) && close(ba, bb, tolerance)
            })
    }

    /// Manhattan distance over the parameters of the same call path, each on a log scale so that
    /// a factor counts the same for small and large values.
    pub fn distance(&self, other: &RankSignature) -> f64 {
        self.parameters()
            .zip(other.parameters())
            .map(|((ca, ba), (cb, bb))| {
                (ca.ln_1p() - cb.ln_1p()).abs() + (ba.ln_1p() - bb.ln_1p()).abs()
            })
            .sum()
    }
}

fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * a.abs().max(b.abs())
}
