//! A rank's signature over a span of its run: its call path (the MPI functions it called, each
//! at its call sites) with calls, bytes and peers, from the kernel's exact per-call-site counts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::CallSite;

/// Calls and bytes of one MPI function: cumulative counts of a rank, or their difference over a
/// span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionUse {
    pub calls: u64,
    pub bytes: u64,
}

/// One step of a call path: an MPI function called from one call site. The site is `None` where
/// it is not known (a recording made before call sites were counted, or a process gone before
/// its memory map was read), so that the function still counts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct CallPathStep {
    pub function: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<CallSite>,
}

impl std::fmt::Display for CallPathStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.site {
            Some(site) => write!(f, "{}@{site}", self.function),
            None => f.write_str(&self.function),
        }
    }
}

/// Cumulative calls, bytes and peers of one call path step of a rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteUse {
    pub calls: u64,
    pub bytes: u64,
    /// Calls whose peer was a rank of MPI_COMM_WORLD, and the sum of those peers.
    pub world_peer_calls: u64,
    pub world_peer_sum: u64,
}

/// A rank's cumulative counts (the lifecycle calls left out by the caller): by function, and by
/// call path step when the call sites are known.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub functions: BTreeMap<String, FunctionUse>,
    pub sites: BTreeMap<CallPathStep, SiteUse>,
}

impl FromIterator<(String, FunctionUse)> for Counts {
    /// Counts by function alone, without call sites.
    fn from_iter<I: IntoIterator<Item = (String, FunctionUse)>>(iter: I) -> Self {
        Counts {
            functions: iter.into_iter().collect(),
            sites: BTreeMap::new(),
        }
    }
}

impl Counts {
    /// The call path steps with their counts: by call site where the sites are known, else by
    /// function.
    fn steps(&self) -> BTreeMap<CallPathStep, SiteUse> {
        if !self.sites.is_empty() {
            return self.sites.clone();
        }
        self.functions
            .iter()
            .map(|(function, u)| {
                let step = CallPathStep {
                    function: function.clone(),
                    site: None,
                };
                let site = SiteUse {
                    calls: u.calls,
                    bytes: u.bytes,
                    ..SiteUse::default()
                };
                (step, site)
            })
            .collect()
    }
}

/// One call path step of a rank over a span.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StepUse {
    #[serde(flatten)]
    pub step: CallPathStep,
    pub calls: u64,
    pub bytes: u64,
    /// The mean peer (destination or source) relative to the rank, over the calls whose peer
    /// was a rank of MPI_COMM_WORLD; `None` without such calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relative_peer: Option<f64>,
}

/// What a rank did over a span: the functions and call path steps it called at least once.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RankSignature {
    pub functions: BTreeMap<String, FunctionUse>,
    pub call_sites: Vec<StepUse>,
}

impl RankSignature {
    /// The signature of rank `rank` over the span between two cumulative readings; `since` is
    /// `None` from the rank's start. Steps without a call in the span are left out.
    pub fn between(rank: u32, now: &Counts, since: Option<&Counts>) -> RankSignature {
        let functions = now
            .functions
            .iter()
            .filter_map(|(name, n)| {
                let before = since
                    .and_then(|s| s.functions.get(name))
                    .copied()
                    .unwrap_or_default();
                let calls = n.calls.saturating_sub(before.calls);
                (calls > 0).then(|| {
                    let bytes = n.bytes.saturating_sub(before.bytes);
                    (name.clone(), FunctionUse { calls, bytes })
                })
            })
            .collect();
        let before = since.map(Counts::steps).unwrap_or_default();
        let call_sites = now
            .steps()
            .into_iter()
            .filter_map(|(step, n)| {
                let b = before.get(&step).copied().unwrap_or_default();
                let calls = n.calls.saturating_sub(b.calls);
                let peer_calls = n.world_peer_calls.saturating_sub(b.world_peer_calls);
                let peer_sum = n.world_peer_sum.wrapping_sub(b.world_peer_sum);
                (calls > 0).then(|| StepUse {
                    step,
                    calls,
                    bytes: n.bytes.saturating_sub(b.bytes),
                    relative_peer: (peer_calls > 0)
                        .then(|| peer_sum as f64 / peer_calls as f64 - rank as f64),
                })
            })
            .collect();
        RankSignature {
            functions,
            call_sites,
        }
    }

    /// The call path: its steps, in order.
    pub fn call_path(&self) -> Vec<String> {
        self.call_sites.iter().map(|s| s.step.to_string()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.call_sites.is_empty()
    }

    /// The signature with its calls and bytes multiplied by `scale` (rounded): a span's counts
    /// estimated from another span's, at the same rate.
    pub fn scaled(&self, scale: f64) -> RankSignature {
        let times = |n: u64| (n as f64 * scale).round() as u64;
        RankSignature {
            functions: self
                .functions
                .iter()
                .map(|(f, u)| {
                    let u = FunctionUse {
                        calls: times(u.calls),
                        bytes: times(u.bytes),
                    };
                    (f.clone(), u)
                })
                .collect(),
            call_sites: self
                .call_sites
                .iter()
                .map(|u| StepUse {
                    calls: times(u.calls),
                    bytes: times(u.bytes),
                    ..u.clone()
                })
                .collect(),
        }
    }

    /// The parameters the subgroups are formed on, per step: calls, mean bytes per call and,
    /// with `peers`, the mean relative peer.
    fn parameters(&self, peers: bool) -> impl Iterator<Item = (f64, f64, f64)> + '_ {
        self.call_sites.iter().map(move |u| {
            let mean = if u.calls == 0 {
                0.0
            } else {
                u.bytes as f64 / u.calls as f64
            };
            let peer = if peers {
                u.relative_peer.unwrap_or(0.0)
            } else {
                0.0
            };
            (u.calls as f64, mean, peer)
        })
    }

    /// Whether two signatures of the same call path agree on every parameter: calls and bytes
    /// within `tolerance` (relative to the larger value; one call more or less always agrees,
    /// so that ranks a window cuts one iteration apart stay together) and, with `peers`, mean
    /// relative peers within half a rank.
    pub fn agrees(&self, other: &RankSignature, tolerance: f64, peers: bool) -> bool {
        self.parameters(peers)
            .zip(other.parameters(peers))
            .all(|((ca, ba, pa), (cb, bb, pb))| {
                ((ca - cb).abs() <= 1.0 || close(ca, cb, tolerance))
                    && close(ba, bb, tolerance)
                    && (pa - pb).abs() <= 0.5
            })
    }

    /// Manhattan distance over the parameters of the same call path: calls and bytes on a log
    /// scale, so that a factor counts the same for small and large values, and peers in ranks.
    pub fn distance(&self, other: &RankSignature, peers: bool) -> f64 {
        self.parameters(peers)
            .zip(other.parameters(peers))
            .map(|((ca, ba, pa), (cb, bb, pb))| {
                (ca.ln_1p() - cb.ln_1p()).abs() + (ba.ln_1p() - bb.ln_1p()).abs() + (pa - pb).abs()
            })
            .sum()
    }
}

fn close(a: f64, b: f64, tolerance: f64) -> bool {
    (a - b).abs() <= tolerance * a.abs().max(b.abs())
}
