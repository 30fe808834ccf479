//! DBSCAN (Ester et al.) on a uniform grid, plus the k-dist values its parameters are chosen from.
//!
//! The grid has cells of side Eps/√d, so a cell holding MinPoints points makes all of them core
//! points without any distance computation, and two core cells are one cluster as soon as one pair
//! of their core points is within Eps. The cost is therefore near-linear even when a phase puts
//! tens of thousands of bursts on top of each other, where a neighbour-list DBSCAN (even one with
//! a k-d tree) becomes quadratic in the size of that phase.
//!
//! Semantics follow González García (2013) and ClusteringSuite: the neighbourhood includes the
//! point itself, distances are compared with `<=`, and a point is core when its neighbourhood
//! holds at least MinPoints points. A border point reachable from several clusters joins the
//! cluster of its nearest core point (ties: the core point with the lower index); the classic
//! expansion order would make that choice depend on the input order.

use super::grid::Grid;
use super::kdtree::KdTree;
use super::points::{box_distance2, boxes_distance2, distance2, Coords, PointSet, MAX_DIMS};
use super::{ClusterId, NOISE};

/// Labels every point with a cluster (1, 2, … in the order of each cluster's lowest point index)
/// or with [`NOISE`].
///
/// Panics when `eps` is negative or not finite, or when `min_points` is 0.
pub fn dbscan(points: &PointSet, eps: f64, min_points: usize) -> Vec<ClusterId> {
    assert!(
        eps.is_finite() && eps >= 0.0,
        "Eps must be finite and non-negative, got {eps}"
    );
    assert!(min_points >= 1, "MinPoints must be at least 1");
    let eps2 = eps * eps;
    let mut grid = Grid::new(points, eps);
    let core = core_points(&grid, eps2, min_points);
    let core_end = grid.partition_cells(&core);
    let cores = CoreCells::new(&grid, core_end, eps2);
    let mut components = cores.connect();
    let mut labels = vec![NOISE; points.len()];
    let id_of_component = cores.label_core_points(&mut components, &mut labels);
    cores.attach_borders(&mut components, &id_of_component, &mut labels);
    labels
}

/// Whether each point is a core point, by position in the grid's order.
fn core_points(grid: &Grid, eps2: f64, min_points: usize) -> Vec<bool> {
    let mut core = vec![false; grid.order.len()];
    for c in 0..grid.cell_count() {
        let range = grid.cell(c);
        if range.len() >= min_points {
            core[range].fill(true);
            continue;
        }
        for p in range.clone() {
            let mut count = range.len();
            'cells: for &nb in grid.neighbours(c) {
                for q in grid.cell(nb as usize) {
                    if distance2(&grid.coords[p], &grid.coords[q]) <= eps2 {
                        count += 1;
                        if count >= min_points {
                            break 'cells;
                        }
                    }
                }
            }
            core[p] = count >= min_points;
        }
    }
    core
}

/// The core points of each grid cell (first in the cell once the grid is partitioned) and their
/// bounding boxes, which settle most cell pairs without distances.
struct CoreCells<'g> {
    grid: &'g Grid,
    /// Cell `c`'s core points are at positions `cell_start[c]..core_end[c]`.
    core_end: Vec<u32>,
    lo: Vec<Coords>,
    hi: Vec<Coords>,
    eps2: f64,
}

impl<'g> CoreCells<'g> {
    fn new(grid: &'g Grid, core_end: Vec<u32>, eps2: f64) -> Self {
        let cells = grid.cell_count();
        let mut cores = CoreCells {
            grid,
            core_end,
            lo: vec![[f64::INFINITY; MAX_DIMS]; cells],
            hi: vec![[f64::NEG_INFINITY; MAX_DIMS]; cells],
            eps2,
        };
        for c in 0..cells {
            for p in cores.core_range(c) {
                for d in 0..MAX_DIMS {
                    cores.lo[c][d] = cores.lo[c][d].min(grid.coords[p][d]);
                    cores.hi[c][d] = cores.hi[c][d].max(grid.coords[p][d]);
                }
            }
        }
        cores
    }

    fn core_range(&self, c: usize) -> std::ops::Range<usize> {
        self.grid.cell_start[c] as usize..self.core_end[c] as usize
    }

    /// Whether a core point of cell `a` is within Eps of one of cell `b`.
    fn linked(&self, a: usize, b: usize) -> bool {
        let (lo, hi, eps2) = (&self.lo, &self.hi, self.eps2);
        if boxes_distance2(&lo[a], &hi[a], &lo[b], &hi[b]) > eps2 {
            false
        } else if boxes_max_distance2(&lo[a], &hi[a], &lo[b], &hi[b]) <= eps2 {
            true
        } else {
            self.core_range(a).any(|p| {
                let pc = &self.grid.coords[p];
                box_distance2(pc, &lo[b], &hi[b]) <= eps2
                    && self
                        .core_range(b)
                        .any(|q| distance2(pc, &self.grid.coords[q]) <= eps2)
            })
        }
    }

    /// Clusters are the connected components of core cells.
    fn connect(&self) -> UnionFind {
        let mut components = UnionFind::new(self.grid.cell_count());
        for a in 0..self.grid.cell_count() {
            if self.core_range(a).is_empty() {
                continue;
            }
            for &b in self.grid.neighbours(a) {
                let b = b as usize;
                if b < a
                    || self.core_range(b).is_empty()
                    || components.find(a) == components.find(b)
                {
                    continue;
                }
                if self.linked(a, b) {
                    components.union(a, b);
                }
            }
        }
        components
    }

    /// Labels every core point with its component's cluster, numbered in the order of each
    /// cluster's lowest point index; returns the cluster of each component by its root cell
    /// ([`NOISE`] for cells that root none).
    fn label_core_points(
        &self,
        components: &mut UnionFind,
        labels: &mut [ClusterId],
    ) -> Vec<ClusterId> {
        let mut core_cell_of = vec![None; labels.len()];
        for c in 0..self.grid.cell_count() {
            for p in self.core_range(c) {
                core_cell_of[self.grid.order[p] as usize] = Some(c);
            }
        }
        let mut id_of_component: Vec<ClusterId> = vec![NOISE; self.grid.cell_count()];
        let mut next_id: ClusterId = 1;
        for (label, cell) in labels.iter_mut().zip(core_cell_of) {
            if let Some(cell) = cell {
                let root = components.find(cell);
                if id_of_component[root] == NOISE {
                    id_of_component[root] = next_id;
                    next_id += 1;
                }
                *label = id_of_component[root];
            }
        }
        id_of_component
    }

    /// A border point joins the cluster of its nearest core point within Eps (ties: the lower
    /// point index).
    fn attach_borders(
        &self,
        components: &mut UnionFind,
        id_of_component: &[ClusterId],
        labels: &mut [ClusterId],
    ) {
        let grid = self.grid;
        for (c, &border_start) in self.core_end.iter().enumerate() {
            for p in border_start as usize..grid.cell_start[c + 1] as usize {
                let pc = grid.coords[p];
                let mut nearest: Option<(f64, u32, usize)> = None;
                for cell in std::iter::once(c as u32).chain(grid.neighbours(c).iter().copied()) {
                    let cell = cell as usize;
                    if box_distance2(&pc, &self.lo[cell], &self.hi[cell]) > self.eps2 {
                        continue;
                    }
                    for q in self.core_range(cell) {
                        let d2 = distance2(&pc, &grid.coords[q]);
                        let candidate = (d2, grid.order[q], cell);
                        if d2 <= self.eps2
                            && nearest
                                .is_none_or(|best| (candidate.0, candidate.1) < (best.0, best.1))
                        {
                            nearest = Some(candidate);
                        }
                    }
                }
                if let Some((_, _, cell)) = nearest {
                    labels[grid.order[p] as usize] = id_of_component[components.find(cell)];
                }
            }
        }
    }
}

/// For every point, the distance to its k-th nearest neighbour within its group, the point itself
/// counted as the first: the smallest Eps at which the point is a core point for MinPoints = k.
/// Infinite for points whose group has fewer than k points, which are never core.
pub fn k_distances(points: &PointSet, k: usize) -> Vec<f64> {
    let mut out = vec![f64::INFINITY; points.len()];
    each_k_distance(points, k, 1, |i, d| out[i] = d);
    out
}

/// The k-distances of about `max_queries` of the points, every ⌈n / max_queries⌉-th of each
/// group (all of them when n ≤ `max_queries`), in no particular order. Each is exact, as
/// [`k_distances`] computes it against every point of its group: only fewer points ask. For
/// ACR's Eps list, which reads quantiles of the k-dist curve, a few thousand values draw the curve
/// as well as a full window's tens of thousands, and the queries were most of a window's
/// clustering time.
pub fn k_distances_sample(points: &PointSet, k: usize, max_queries: usize) -> Vec<f64> {
    let stride = points.len().div_ceil(max_queries.max(1)).max(1);
    let mut out = Vec::with_capacity(points.len() / stride + 1);
    each_k_distance(points, k, stride, |_, d| out.push(d));
    out
}

/// Calls `found(point, k-distance)` for every `stride`-th point of each group.
fn each_k_distance(points: &PointSet, k: usize, stride: usize, mut found: impl FnMut(usize, f64)) {
    let (order, groups) = points.by_group();
    for range in groups {
        let tree = KdTree::new(
            points.coords(),
            points.dims(),
            order[range.clone()].to_vec(),
        );
        for &i in order[range].iter().step_by(stride) {
            found(
                i as usize,
                tree.kth_distance(&points.coords()[i as usize], k),
            );
        }
    }
}

fn boxes_max_distance2(alo: &Coords, ahi: &Coords, blo: &Coords, bhi: &Coords) -> f64 {
    (0..MAX_DIMS)
        .map(|d| {
            let span = (bhi[d] - alo[d]).max(ahi[d] - blo[d]);
            span * span
        })
        .sum()
}

struct UnionFind {
    parent: Vec<u32>,
}

impl UnionFind {
    fn new(n: usize) -> Self {
        UnionFind {
            parent: (0..n as u32).collect(),
        }
    }

    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] as usize != x {
            let grandparent = self.parent[self.parent[x] as usize];
            self.parent[x] = grandparent;
            x = grandparent as usize;
        }
        x
    }

    /// The lower root becomes the parent, so roots do not depend on the order of unions.
    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.find(a), self.find(b));
        let (low, high) = if ra < rb { (ra, rb) } else { (rb, ra) };
        self.parent[high] = low as u32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points_1d(xs: &[f64]) -> PointSet {
        PointSet::new(1, xs.iter().map(|&x| [x, 0.0, 0.0]).collect())
    }

    /// Textbook DBSCAN with linear range queries, for comparison.
    fn reference(points: &PointSet, eps: f64, min_points: usize) -> Vec<ClusterId> {
        let c = points.coords();
        let g = points.groups();
        let neighbours = |p: usize| -> Vec<usize> {
            (0..c.len())
                .filter(|&q| g[q] == g[p] && distance2(&c[p], &c[q]) <= eps * eps)
                .collect()
        };
        let core: Vec<bool> = (0..c.len())
            .map(|p| neighbours(p).len() >= min_points)
            .collect();
        let mut labels = vec![NOISE; c.len()];
        let mut next = 1;
        for p in 0..c.len() {
            if !core[p] || labels[p] != NOISE {
                continue;
            }
            labels[p] = next;
            let mut stack = vec![p];
            while let Some(q) = stack.pop() {
                for r in neighbours(q) {
                    if core[r] && labels[r] == NOISE {
                        labels[r] = next;
                        stack.push(r);
                    }
                }
            }
            next += 1;
        }
        for p in 0..c.len() {
            if !core[p] {
                let nearest = neighbours(p)
                    .into_iter()
                    .filter(|&q| core[q])
                    .min_by(|&a, &b| {
                        distance2(&c[p], &c[a])
                            .total_cmp(&distance2(&c[p], &c[b]))
                            .then(a.cmp(&b))
                    });
                if let Some(q) = nearest {
                    labels[p] = labels[q];
                }
            }
        }
        labels
    }

    #[test]
    fn core_border_and_noise() {
        // 0.0, 0.1, 0.2 are core (each has 2+ neighbours within 0.1 besides itself for
        // MinPoints 3 at the middle only); 0.3 is border of 0.2; 0.9 is noise.
        let points = points_1d(&[0.0, 0.1, 0.2, 0.3, 0.9]);
        // Neighbourhoods at Eps 0.1 (self included): 0.0:{0,.1} 0.1:{0,.1,.2} 0.2:{.1,.2,.3} 0.3:{.2,.3} 0.9:{.9}.
        // MinPoints 3: core = 0.1, 0.2; border = 0.0 (near 0.1), 0.3 (near 0.2); noise = 0.9.
        assert_eq!(dbscan(&points, 0.1 + 1e-12, 3), vec![1, 1, 1, 1, NOISE]);
        // MinPoints 4: nobody is core.
        assert_eq!(dbscan(&points, 0.1 + 1e-12, 4), vec![NOISE; 5]);
        // MinPoints 1: every point is core; the gap 0.3 → 0.9 splits two clusters.
        assert_eq!(dbscan(&points, 0.1 + 1e-12, 1), vec![1, 1, 1, 1, 2]);
    }

    #[test]
    fn border_point_joins_the_nearest_core_point() {
        // Two groups of six and a point between them: 0.14 from the left group's edge, 0.11 from
        // the right one's. With Eps 0.145 and MinPoints 7 it is not core but reaches core points
        // of both clusters; the right cluster's core point is nearer.
        let mut xs: Vec<f64> = (0..6).map(|i| i as f64 * 0.01).collect();
        xs.push(0.19);
        xs.extend((0..6).map(|i| 0.30 + i as f64 * 0.01));
        let labels = dbscan(&points_1d(&xs), 0.145, 7);
        let mut expected = vec![1; 6];
        expected.extend([2; 7]);
        assert_eq!(labels, expected);
    }

    #[test]
    fn groups_never_share_a_cluster() {
        let coords = vec![[0.5, 0.0, 0.0]; 6];
        let points = PointSet::with_groups(1, coords, vec![0, 0, 0, 1, 1, 1]);
        assert_eq!(dbscan(&points, 0.1, 2), vec![1, 1, 1, 2, 2, 2]);
        assert_eq!(k_distances(&points, 3), vec![0.0; 6]);
        assert_eq!(k_distances(&points, 4), vec![f64::INFINITY; 6]);
    }

    #[test]
    fn zero_eps_clusters_identical_points() {
        let points = points_1d(&[0.2, 0.2, 0.3, 0.2, 0.3000001]);
        assert_eq!(dbscan(&points, 0.0, 2), vec![1, 1, NOISE, 1, NOISE]);
    }

    #[test]
    fn matches_textbook_dbscan_on_random_sets() {
        let mut state = 42u64;
        let mut next = || {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        for round in 0..20 {
            let n = 50 + round * 20;
            let coords: Vec<Coords> = (0..n)
                .map(|i| {
                    let centre = (i % 3) as f64 * 0.3;
                    [centre + next() * 0.2, next() * 0.3, 0.0]
                })
                .collect();
            let groups = (0..n).map(|i| (i % 2) as u32).collect();
            let points = PointSet::with_groups(2, coords, groups);
            for (eps, min_points) in [(0.01, 2), (0.03, 3), (0.05, 5), (0.2, 10)] {
                assert_eq!(
                    dbscan(&points, eps, min_points),
                    reference(&points, eps, min_points),
                    "round {round}, eps {eps}"
                );
            }
        }
    }
}
