//! The provisional model of a job: the last clustering of its bursts, frozen, against which each
//! pushed burst is classified, and the counts of those classifications.
//!
//! **Provisional classification** (ClusteringSuite's "cluster a sample, classify the rest",
//! option `-m` in González García (2013), Table B.2): a pushed burst is compared with the core
//! points of the last clustering in that clustering's frozen normalisation (its feature set,
//! min–max ranges and duration-filter threshold). It takes the stable id of the nearest core
//! point within Eps, else it is provisional noise; shorter than the threshold, it is
//! provisionally filtered. Eps is the last (largest) Eps the clustering used, core points are
//! the clustered points with MinPoints neighbours within it. To keep a push O(1) the core points
//! are thinned to a cover: a core point closer than Eps/4 to an already kept one of the same
//! cluster is dropped, so a burst within ¾ Eps of any core point is always classified, one
//! beyond Eps never is. Without a model yet, every burst counts as provisional noise. Only one
//! pushed burst in [`OnlineParams::classify_every`] is classified (deterministically, by arrival
//! count): the classification only feeds the noise share and the live counts, which a sample
//! estimates well, and the daemon's budget is about 100 ns per burst for everything.
//!
//! [`OnlineParams::classify_every`]: super::OnlineParams::classify_every

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::analysis::hashing::FastMap;
use crate::analysis::points::{distance2, Coords, MAX_DIMS};
use crate::analysis::tracking::StableId;
use crate::analysis::{features, k_distances, Analysis, FeatureSet, Prepared, NOISE};
use crate::model::{Burst, CallSite};

/// How a pushed burst was classified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Provisional {
    Filtered,
    Noise,
    Phase(StableId),
}

type CellKey = (u32, [i64; MAX_DIMS]);

/// The frozen model of the last clustering: normalisation, Eps and thinned core points.
#[derive(Clone, Debug)]
pub(super) struct Model {
    features: FeatureSet,
    dims: usize,
    lo: Coords,
    scale: Coords,
    eps: f64,
    side: f64,
    threshold_ns: u64,
    /// Region → point group, for the per-region feature set.
    groups: BTreeMap<(CallSite, CallSite), u32>,
    cells: FastMap<CellKey, Vec<(Coords, StableId)>>,
    /// Core points kept.
    pub(super) points: usize,
}

impl Model {
    /// The model of `analysis` (of `bursts`, prepared as `prepared`), with its clusters
    /// renamed through `ids`. `None` when nothing was clustered.
    pub(super) fn build(
        analysis: &Analysis,
        bursts: &[Burst],
        prepared: &Prepared,
        ids: &BTreeMap<u32, StableId>,
    ) -> Option<Model> {
        let eps = analysis.clustering.steps.last()?.eps;
        let points = &prepared.features.points;
        let dims = points.dims();
        let mut lo = [0.0; MAX_DIMS];
        let mut scale = [0.0; MAX_DIMS];
        for (d, range) in analysis.features.ranges.iter().enumerate().take(MAX_DIMS) {
            lo[d] = range.min;
            let span = range.max - range.min;
            scale[d] = if span > 0.0 { 1.0 / span } else { 0.0 };
        }
        let mut groups = BTreeMap::new();
        if analysis.features.used == FeatureSet::OnCpuTimePerRegion {
            for (p, &i) in prepared.kept.iter().enumerate() {
                let (start, end) = bursts[i].region();
                groups
                    .entry((start.clone(), end.clone()))
                    .or_insert(points.groups()[p]);
            }
        }
        let mut model = Model {
            features: analysis.features.used,
            dims,
            lo,
            scale,
            eps,
            side: if eps > 0.0 { eps } else { 1.0 },
            threshold_ns: analysis.filter.threshold_ns,
            groups,
            cells: FastMap::default(),
            points: 0,
        };
        let k_dist = k_distances(points, analysis.clustering.min_points);
        let cover2 = (eps / 4.0) * (eps / 4.0);
        for (p, &i) in prepared.kept.iter().enumerate() {
            let label = analysis.labels[i].expect("kept bursts are labelled");
            if label == NOISE || k_dist[p] > eps {
                continue;
            }
            let Some(&id) = ids.get(&label) else { continue };
            let group = points.groups()[p];
            let c = points.coords()[p];
            let covered = model
                .neighbourhood(group, &c)
                .any(|(q, qid)| qid == id && distance2(&q, &c) <= cover2);
            if !covered {
                let key = model.key(group, &c);
                model.cells.entry(key).or_default().push((c, id));
                model.points += 1;
            }
        }
        Some(model)
    }

    fn key(&self, group: u32, c: &Coords) -> CellKey {
        let mut cell = [0i64; MAX_DIMS];
        for d in 0..self.dims {
            cell[d] = (c[d] / self.side).floor() as i64;
        }
        (group, cell)
    }

    /// Points in the 3^dims cells around `c`.
    fn neighbourhood<'m>(
        &'m self,
        group: u32,
        c: &Coords,
    ) -> impl Iterator<Item = (Coords, StableId)> + 'm {
        let (_, centre) = self.key(group, c);
        let dims = self.dims;
        (0..3usize.pow(dims as u32)).flat_map(move |n| {
            let mut cell = centre;
            let mut rest = n;
            for item in cell.iter_mut().take(dims) {
                *item = item.saturating_add((rest % 3) as i64 - 1);
                rest /= 3;
            }
            self.cells
                .get(&(group, cell))
                .into_iter()
                .flat_map(|v| v.iter().copied())
        })
    }

    pub(super) fn classify(&self, burst: &Burst) -> Provisional {
        if features::filtered_duration_ns(burst) < self.threshold_ns {
            return Provisional::Filtered;
        }
        let mut raw = [0.0; MAX_DIMS];
        let group = match self.features {
            FeatureSet::InstructionsIpc => {
                let Some(c) = burst.counters.filter(|c| c.cycles > 0) else {
                    return Provisional::Noise;
                };
                raw[0] = (c.instructions.max(1) as f64).ln();
                raw[1] = c.instructions as f64 / c.cycles as f64;
                0
            }
            FeatureSet::OnCpuTimePerRegion => {
                raw[0] = (burst.oncpu_ns.max(1) as f64).ln();
                let key = (burst.start_site.clone(), burst.end_site.clone());
                match self.groups.get(&key) {
                    Some(&g) => g,
                    None => return Provisional::Noise,
                }
            }
        };
        let mut c = [0.0; MAX_DIMS];
        for d in 0..self.dims {
            c[d] = (raw[d] - self.lo[d]) * self.scale[d];
        }
        let eps2 = self.eps * self.eps;
        let mut best: Option<(f64, StableId)> = None;
        for (q, id) in self.neighbourhood(group, &c) {
            let d2 = distance2(&q, &c);
            if d2 <= eps2 && best.is_none_or(|(b, _)| d2 < b) {
                best = Some((d2, id));
            }
        }
        best.map_or(Provisional::Noise, |(_, id)| Provisional::Phase(id))
    }
}

/// Provisional classification of the bursts pushed since the current model was built (one in
/// [`OnlineParams::classify_every`](super::OnlineParams::classify_every)).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ProvisionalCounts {
    /// Window whose clustering the model comes from (`None`: no model yet).
    pub model_window: Option<u64>,
    pub phases: BTreeMap<StableId, u64>,
    pub noise: u64,
    pub filtered: u64,
}

impl ProvisionalCounts {
    pub(super) fn classified(&self) -> u64 {
        self.noise + self.phases.values().sum::<u64>()
    }

    /// Noise share of the bursts above the filter threshold (0 without any).
    pub fn noise_share(&self) -> f64 {
        let n = self.classified();
        if n == 0 {
            0.0
        } else {
            self.noise as f64 / n as f64
        }
    }
}
