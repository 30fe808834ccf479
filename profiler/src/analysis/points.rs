//! Points in a low-dimensional feature space, split into groups that never share a cluster.

use super::ClusterId;

/// Feature spaces have at most this many dimensions. The grid behind DBSCAN visits 5^d cells per
/// query, which is only cheap for low d; every feature set we use has one or two dimensions.
pub const MAX_DIMS: usize = 3;

/// One point; coordinates past `dims` are zero so distances can always use all `MAX_DIMS`.
pub type Coords = [f64; MAX_DIMS];

/// Points with a group key each. Points of different groups are never neighbours: the duration
/// feature set clusters each code region on its own, and the group is the region.
#[derive(Clone, Debug)]
pub struct PointSet {
    dims: usize,
    coords: Vec<Coords>,
    groups: Vec<u32>,
    /// The groups are the code regions (start and end call site) of the bursts.
    by_region: bool,
    /// The end call site of each point's burst, as an index: what a computation leads to, which
    /// a perturbed occurrence of it shares (see [`super::roles::join_rare_variants`]).
    ends: Vec<u32>,
}

impl PointSet {
    /// All points in one group.
    pub fn new(dims: usize, coords: Vec<Coords>) -> Self {
        let groups = vec![0; coords.len()];
        Self::with_groups(dims, coords, groups)
    }

    /// Panics when `dims` is outside 1..=MAX_DIMS, when a coordinate is not finite or when a
    /// coordinate past `dims` is not zero: all three are programming errors of the caller.
    pub fn with_groups(dims: usize, coords: Vec<Coords>, groups: Vec<u32>) -> Self {
        assert!(
            (1..=MAX_DIMS).contains(&dims),
            "dimension {dims} outside 1..={MAX_DIMS}"
        );
        assert_eq!(coords.len(), groups.len(), "one group per point");
        for c in &coords {
            assert!(
                c[..dims].iter().all(|x| x.is_finite()),
                "non-finite coordinate {c:?}"
            );
            assert!(
                c[dims..].iter().all(|&x| x == 0.0),
                "coordinate past dimension {dims}: {c:?}"
            );
        }
        let ends = vec![0; coords.len()];
        PointSet {
            dims,
            coords,
            groups,
            by_region: false,
            ends,
        }
    }

    /// [`PointSet::with_groups`] where each group is one code region.
    pub fn with_regions(dims: usize, coords: Vec<Coords>, regions: Vec<u32>) -> Self {
        PointSet {
            by_region: true,
            ..Self::with_groups(dims, coords, regions)
        }
    }

    /// These points with the end call site of each one's burst, as an index (all 0 before).
    /// Panics when `ends` does not hold one per point, a programming error of the caller.
    pub fn with_ends(self, ends: Vec<u32>) -> Self {
        assert_eq!(ends.len(), self.len(), "one end call site per point");
        PointSet { ends, ..self }
    }

    /// Whether each group is one code region: two points of one group ran the same code.
    pub fn by_region(&self) -> bool {
        self.by_region
    }

    pub fn len(&self) -> usize {
        self.coords.len()
    }

    pub fn is_empty(&self) -> bool {
        self.coords.is_empty()
    }

    pub fn dims(&self) -> usize {
        self.dims
    }

    pub fn coords(&self) -> &[Coords] {
        &self.coords
    }

    pub fn groups(&self) -> &[u32] {
        &self.groups
    }

    /// The end call site of each point, as an index (see [`PointSet::with_ends`]).
    pub fn ends(&self) -> &[u32] {
        &self.ends
    }

    /// The points at `indices`, in that order.
    pub fn subset(&self, indices: &[usize]) -> PointSet {
        PointSet {
            dims: self.dims,
            coords: indices.iter().map(|&i| self.coords[i]).collect(),
            groups: indices.iter().map(|&i| self.groups[i]).collect(),
            by_region: self.by_region,
            ends: indices.iter().map(|&i| self.ends[i]).collect(),
        }
    }

    /// Point indices sorted by group (stable), and the index ranges of each group in that order.
    pub(crate) fn by_group(&self) -> (Vec<u32>, Vec<std::ops::Range<usize>>) {
        let mut order: Vec<u32> = (0..self.len() as u32).collect();
        order.sort_by_key(|&i| self.groups[i as usize]);
        let mut ranges = Vec::new();
        let mut start = 0;
        for end in 1..=order.len() {
            if end == order.len()
                || self.groups[order[end] as usize] != self.groups[order[start] as usize]
            {
                ranges.push(start..end);
                start = end;
            }
        }
        (order, ranges)
    }
}

/// Squared Euclidean distance over all `MAX_DIMS` coordinates (those past a set's dims are zero).
pub(crate) fn distance2(a: &Coords, b: &Coords) -> f64 {
    let mut sum = 0.0;
    for d in 0..MAX_DIMS {
        let diff = a[d] - b[d];
        sum += diff * diff;
    }
    sum
}

/// Squared distance from a point to an axis-aligned box (zero inside it).
pub(crate) fn box_distance2(p: &Coords, lo: &Coords, hi: &Coords) -> f64 {
    let mut sum = 0.0;
    for d in 0..MAX_DIMS {
        let diff = if p[d] < lo[d] {
            lo[d] - p[d]
        } else if p[d] > hi[d] {
            p[d] - hi[d]
        } else {
            0.0
        };
        sum += diff * diff;
    }
    sum
}

/// Squared distance between two axis-aligned boxes (zero when they overlap).
pub(crate) fn boxes_distance2(alo: &Coords, ahi: &Coords, blo: &Coords, bhi: &Coords) -> f64 {
    (0..MAX_DIMS)
        .map(|d| {
            let gap = (blo[d] - ahi[d]).max(alo[d] - bhi[d]).max(0.0);
            gap * gap
        })
        .sum()
}

/// The number of distinct clusters (noise excluded) in a labelling.
pub(crate) fn cluster_count(labels: &[ClusterId]) -> usize {
    let mut ids: Vec<ClusterId> = labels
        .iter()
        .copied()
        .filter(|&l| l != super::NOISE)
        .collect();
    ids.sort_unstable();
    ids.dedup();
    ids.len()
}
