//! A static k-d tree for k-nearest-neighbour distances (the sorted k-dist curve of ACR).
//! DBSCAN itself uses the grid; the k-dist curve needs distances at unknown scales, which a tree
//! answers without a cell size.

use super::points::{box_distance2, distance2, Coords, MAX_DIMS};

/// Below this many points a node is scanned linearly.
const LEAF_SIZE: usize = 16;

struct Node {
    lo: Coords,
    hi: Coords,
    /// Positions `start..end` of `KdTree::items`.
    start: usize,
    end: usize,
    /// Indices of the two children in `KdTree::nodes`; `None` for a leaf.
    children: Option<(usize, usize)>,
}

pub(crate) struct KdTree<'a> {
    coords: &'a [Coords],
    items: Vec<u32>,
    nodes: Vec<Node>,
}

impl<'a> KdTree<'a> {
    /// A tree over `items` (indices into `coords`); splits only along the first `dims` axes.
    pub fn new(coords: &'a [Coords], dims: usize, items: Vec<u32>) -> Self {
        let mut tree = KdTree {
            coords,
            items,
            nodes: Vec::new(),
        };
        if !tree.items.is_empty() {
            tree.build(0, tree.items.len(), dims);
        }
        tree
    }

    fn build(&mut self, start: usize, end: usize, dims: usize) -> usize {
        let mut lo = [0.0; MAX_DIMS];
        let mut hi = [0.0; MAX_DIMS];
        for d in 0..dims {
            lo[d] = f64::INFINITY;
            hi[d] = f64::NEG_INFINITY;
        }
        for &i in &self.items[start..end] {
            let c = &self.coords[i as usize];
            for d in 0..dims {
                lo[d] = lo[d].min(c[d]);
                hi[d] = hi[d].max(c[d]);
            }
        }
        let node = self.nodes.len();
        self.nodes.push(Node {
            lo,
            hi,
            start,
            end,
            children: None,
        });
        if end - start > LEAF_SIZE {
            let axis = (0..dims)
                .max_by(|&a, &b| (hi[a] - lo[a]).total_cmp(&(hi[b] - lo[b])))
                .unwrap_or(0);
            let mid = start + (end - start) / 2;
            let coords = self.coords;
            self.items[start..end].select_nth_unstable_by(mid - start, |&a, &b| {
                coords[a as usize][axis].total_cmp(&coords[b as usize][axis])
            });
            let left = self.build(start, mid, dims);
            let right = self.build(mid, end, dims);
            self.nodes[node].children = Some((left, right));
        }
        node
    }

    /// Distance from `query` to its k-th nearest item, the query itself included when it is an
    /// item (so k = 1 gives 0 for an item). Infinite when the tree holds fewer than k items.
    pub fn kth_distance(&self, query: &Coords, k: usize) -> f64 {
        if k == 0 || self.items.len() < k {
            return f64::INFINITY;
        }
        // Ascending squared distances of the k best so far.
        let mut best: Vec<f64> = Vec::with_capacity(k + 1);
        self.search(0, query, k, &mut best);
        best[k - 1].sqrt()
    }

    fn search(&self, node: usize, query: &Coords, k: usize, best: &mut Vec<f64>) {
        let n = &self.nodes[node];
        // `>=` rather than `>`: once k points are found at distance 0, nothing can improve and
        // dense duplicates are not revisited.
        if best.len() == k && box_distance2(query, &n.lo, &n.hi) >= best[k - 1] {
            return;
        }
        match n.children {
            None => {
                for &i in &self.items[n.start..n.end] {
                    let d2 = distance2(query, &self.coords[i as usize]);
                    if best.len() < k || d2 < best[k - 1] {
                        let at = best.partition_point(|&b| b <= d2);
                        best.insert(at, d2);
                        best.truncate(k);
                    }
                }
            }
            Some((left, right)) => {
                let dl = box_distance2(query, &self.nodes[left].lo, &self.nodes[left].hi);
                let dr = box_distance2(query, &self.nodes[right].lo, &self.nodes[right].hi);
                let (near, far) = if dl <= dr {
                    (left, right)
                } else {
                    (right, left)
                };
                self.search(near, query, k, best);
                self.search(far, query, k, best);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kth_distance_matches_brute_force() {
        let mut state = 7u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let coords: Vec<Coords> = (0..500)
            .map(|_| [next(), (next() * 4.0).floor() / 4.0, 0.0])
            .collect();
        let tree = KdTree::new(&coords, 2, (0..coords.len() as u32).collect());
        for k in [1, 2, 5, 40] {
            for q in coords.iter().take(50) {
                let mut all: Vec<f64> = coords.iter().map(|c| distance2(q, c)).collect();
                all.sort_by(f64::total_cmp);
                assert_eq!(tree.kth_distance(q, k), all[k - 1].sqrt());
            }
        }
        assert_eq!(tree.kth_distance(&coords[0], 501), f64::INFINITY);
    }
}
