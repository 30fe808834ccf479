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
    let n = points.len();
    let eps2 = eps * eps;
    let mut grid = Grid::new(points, eps);
    let cells = grid.cell_count();

    // Core points, by position in the grid's order.
    let mut core = vec![false; n];
    for c in 0..cells {
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
    let core_end = grid.partition_cells(&core);
    let core_range = |c: usize| grid.cell_start[c] as usize..core_end[c] as usize;

    // Bounding boxes of each cell's core points, to settle most cell pairs without distances.
    let mut lo = vec![[f64::INFINITY; MAX_DIMS]; cells];
    let mut hi = vec![[f64::NEG_INFINITY; MAX_DIMS]; cells];
    for c in 0..cells {
        for p in core_range(c) {
            for d in 0..MAX_DIMS {
                lo[c][d] = lo[c][d].min(grid.coords[p][d]);
                hi[c][d] = hi[c][d].max(grid.coords[p][d]);
            }
        }
    }

    // Clusters are the connected components of core cells.
    let mut components = UnionFind::new(cells);
    for a in 0..cells {
        if core_range(a).is_empty() {
            continue;
        }
        for &b in grid.neighbours(a) {
            let b = b as usize;
            if b < a || core_range(b).is_empty() || components.find(a) == components.find(b) {
                continue;
            }
            let linked = if boxes_distance2(&lo[a], &hi[a], &lo[b], &hi[b]) > eps2 {
                false
            } else if boxes_max_distance2(&lo[a], &hi[a], &lo[b], &hi[b]) <= eps2 {
                true
            } else {
                core_range(a).any(|p| {
                    let pc = &grid.coords[p];
                    box_distance2(pc, &lo[b], &hi[b]) <= eps2
                        && core_range(b).any(|q| distance2(pc, &grid.coords[q]) <= eps2)
                })
            };
            if linked {
                components.union(a, b);
            }
        }
    }

    // Per point index: its cell and whether it is core.
    let mut cell_of = vec![0u32; n];
    let mut is_core = vec![false; n];
    for c in 0..cells {
        for p in grid.cell(c) {
            cell_of[grid.order[p] as usize] = c as u32;
        }
        for p in core_range(c) {
            is_core[grid.order[p] as usize] = true;
        }
    }

    let mut id_of_component: Vec<ClusterId> = vec![NOISE; cells];
    let mut next_id: ClusterId = 1;
    let mut labels = vec![NOISE; n];
    for i in 0..n {
        if is_core[i] {
            let root = components.find(cell_of[i] as usize);
            if id_of_component[root] == NOISE {
                id_of_component[root] = next_id;
                next_id += 1;
            }
            labels[i] = id_of_component[root];
        }
    }

    for (c, &border_start) in core_end.iter().enumerate() {
        for p in border_start as usize..grid.cell_start[c + 1] as usize {
            let pc = grid.coords[p];
            let mut nearest: Option<(f64, u32, usize)> = None;
            for cell in std::iter::once(c as u32).chain(grid.neighbours(c).iter().copied()) {
                let cell = cell as usize;
                if box_distance2(&pc, &lo[cell], &hi[cell]) > eps2 {
                    continue;
                }
                for q in core_range(cell) {
                    let d2 = distance2(&pc, &grid.coords[q]);
                    let candidate = (d2, grid.order[q], cell);
                    if d2 <= eps2
                        && nearest.is_none_or(|best| (candidate.0, candidate.1) < (best.0, best.1))
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
    labels
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
