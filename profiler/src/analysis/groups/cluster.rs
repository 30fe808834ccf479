//! CallPath+Parameter clustering of rank signatures into at most K groups with a lead each
//! (Bahmani and Mueller, ICS 2014; the bound and its split over call paths as in Chameleon).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{signature::StepUse, FunctionUse, GroupParams, RankSignature};

/// One group of ranks and the behaviour its lead stands for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankGroup {
    /// 1, 2, … in the order of the leads.
    pub id: u32,
    /// The rank that represents the group: its lowest rank, or for a group that absorbed
    /// others to stay within K, the rank selected as the farthest-first head.
    pub lead: u32,
    /// The ranks of the group, ascending.
    pub members: Vec<u32>,
    pub signature: GroupSignature,
}

/// The signature a group stands for: its lead's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GroupSignature {
    /// The main group, i.e. the call path, the group belongs to: 1, 2, … in the order of their
    /// lowest ranks. Groups of one main group differ in their parameters only.
    pub main_group: u32,
    /// The steps of the lead's call path (lifecycle calls left out): each MPI function with
    /// its call site (module+offset) where known.
    pub call_path: Vec<String>,
    /// The lead's calls and bytes of each function.
    pub functions: BTreeMap<String, FunctionUse>,
    /// The lead's calls, bytes and mean relative peer at each call path step.
    pub call_sites: Vec<StepUse>,
}

/// Ranks of one call path whose parameters agree within the tolerance with their lead's.
struct Subgroup {
    lead: u32,
    members: Vec<u32>,
}

/// Groups the ranks by call path, then by parameters, keeping at most max(K, call paths) groups.
pub fn cluster(signatures: &BTreeMap<u32, RankSignature>, params: &GroupParams) -> Vec<RankGroup> {
    // Level 1: equal call paths. Ranks come in ascending order, so each list is sorted and
    // starts with its lowest rank.
    let mut paths: BTreeMap<Vec<String>, Vec<u32>> = BTreeMap::new();
    for (&rank, s) in signatures {
        paths.entry(s.call_path()).or_default().push(rank);
    }
    let mut mains: Vec<Vec<u32>> = paths.into_values().collect();
    mains.sort_by_key(|ranks| ranks[0]);
    // Never fewer groups than call paths: a merged call path would lose events.
    let k = params.k.max(mains.len()).max(1);
    let total_subgroups: Vec<Vec<Subgroup>> = mains
        .iter()
        .map(|ranks| subgroups(ranks, signatures, params))
        .collect();
    let over = total_subgroups.iter().map(Vec::len).sum::<usize>() > k;
    let local_k = (k / mains.len().max(1)).max(1);
    let mut groups: Vec<RankGroup> = Vec::new();
    for (main, subs) in total_subgroups.into_iter().enumerate() {
        let subs = if over && subs.len() > local_k {
            farthest_first(subs, local_k, signatures, params.split_by_peers)
        } else {
            subs
        };
        for sub in subs {
            let lead = &signatures[&sub.lead];
            groups.push(RankGroup {
                id: 0,
                lead: sub.lead,
                members: sub.members,
                signature: GroupSignature {
                    main_group: main as u32 + 1,
                    call_path: lead.call_path(),
                    functions: lead.functions.clone(),
                    call_sites: lead.call_sites.clone(),
                },
            });
        }
    }
    groups.sort_by_key(|g| g.lead);
    for (i, g) in groups.iter_mut().enumerate() {
        g.id = i as u32 + 1;
    }
    groups
}

/// Level 2: in rank order, each rank joins the first subgroup whose lead it agrees with, or
/// leads a new one. Agreement within a tolerance is not transitive; comparing with the lead
/// only keeps every member within the tolerance of the rank that represents it.
fn subgroups(
    ranks: &[u32],
    signatures: &BTreeMap<u32, RankSignature>,
    params: &GroupParams,
) -> Vec<Subgroup> {
    let mut subs: Vec<Subgroup> = Vec::new();
    for &rank in ranks {
        let s = &signatures[&rank];
        match subs
            .iter_mut()
            .find(|g| signatures[&g.lead].agrees(s, params.count_tolerance, params.split_by_peers))
        {
            Some(g) => g.members.push(rank),
            None => subs.push(Subgroup {
                lead: rank,
                members: vec![rank],
            }),
        }
    }
    subs
}

/// K-Farthest (Chameleon's top-K selection): the first subgroup (lowest lead) is a head; then the
/// subgroup farthest from every head so far, until `k` heads; the others join their nearest
/// head. Ties go to the lower lead, so the result is deterministic.
fn farthest_first(
    subs: Vec<Subgroup>,
    k: usize,
    signatures: &BTreeMap<u32, RankSignature>,
    peers: bool,
) -> Vec<Subgroup> {
    let distance =
        |a: &Subgroup, b: &Subgroup| signatures[&a.lead].distance(&signatures[&b.lead], peers);
    let mut heads: Vec<usize> = vec![0];
    while heads.len() < k.min(subs.len()) {
        let next = (0..subs.len())
            .filter(|i| !heads.contains(i))
            .map(|i| {
                let nearest = heads
                    .iter()
                    .map(|&h| distance(&subs[i], &subs[h]))
                    .fold(f64::INFINITY, f64::min);
                (i, nearest)
            })
            .fold(None, |best: Option<(usize, f64)>, (i, d)| match best {
                Some((_, bd)) if bd >= d => best,
                _ => Some((i, d)),
            });
        match next {
            Some((i, _)) => heads.push(i),
            None => break,
        }
    }
    let mut members: BTreeMap<usize, Vec<u32>> = heads.iter().map(|&h| (h, Vec::new())).collect();
    for (i, sub) in subs.iter().enumerate() {
        let home = if heads.contains(&i) {
            i
        } else {
            *heads
                .iter()
                .min_by(|&&a, &&b| {
                    distance(sub, &subs[a])
                        .total_cmp(&distance(sub, &subs[b]))
                        .then(a.cmp(&b))
                })
                .expect("at least one head")
        };
        members.get_mut(&home).expect("a head").extend(&sub.members);
    }
    members
        .into_iter()
        .map(|(h, mut m)| {
            m.sort_unstable();
            Subgroup {
                lead: subs[h].lead,
                members: m,
            }
        })
        .collect()
}
