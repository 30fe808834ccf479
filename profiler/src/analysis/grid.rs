//! Uniform grid over a point set, with cells of side Eps/√d, so that two points in one cell are
//! always within Eps of each other and every Eps-neighbour of a point lies in a few nearby cells.

use super::hashing::FastMap;
use super::points::{Coords, PointSet, MAX_DIMS};

/// Cell of a point: its group and integer cell coordinates (zero past the point set's dims).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct CellKey {
    group: u32,
    cell: [i64; MAX_DIMS],
}

/// Beyond 2^52 cells per axis, f64 cell arithmetic no longer separates neighbouring cells.
const MAX_CELLS_PER_AXIS: f64 = (1u64 << 52) as f64;

pub(crate) struct Grid {
    /// Point indices ordered cell by cell; reordered within a cell by [`Grid::partition_cells`].
    pub order: Vec<u32>,
    /// Coordinates in `order`, kept next to each other for cache locality.
    pub coords: Vec<Coords>,
    /// Cell `c` holds positions `cell_start[c]..cell_start[c + 1]` of `order`.
    pub cell_start: Vec<u32>,
    /// Cells other than `c` that may hold Eps-neighbours of points in `c`:
    /// `neighbours[neighbour_start[c]..neighbour_start[c + 1]]`, ascending.
    neighbours: Vec<u32>,
    neighbour_start: Vec<u32>,
}

impl Grid {
    /// When Eps is zero, or so small against the data's extent that f64 cannot tell cells apart,
    /// cells are exact coordinates: the neighbourhood is then the set of identical points.
    pub fn new(points: &PointSet, eps: f64) -> Grid {
        let dims = points.dims();
        let side = eps / (dims as f64).sqrt();
        let mut lo = [f64::INFINITY; MAX_DIMS];
        let mut hi = [f64::NEG_INFINITY; MAX_DIMS];
        for c in points.coords() {
            for d in 0..dims {
                lo[d] = lo[d].min(c[d]);
                hi[d] = hi[d].max(c[d]);
            }
        }
        let extent = (0..dims).map(|d| hi[d] - lo[d]).fold(0.0, f64::max);
        let cells_per_axis = extent / side;
        let exact = cells_per_axis.is_nan() || cells_per_axis >= MAX_CELLS_PER_AXIS;

        let key_of = |i: usize| {
            let c = &points.coords()[i];
            let mut cell = [0i64; MAX_DIMS];
            for d in 0..dims {
                cell[d] = if exact {
                    // +0.0 turns -0.0 into 0.0 so that equal coordinates share a cell.
                    (c[d] + 0.0).to_bits() as i64
                } else {
                    ((c[d] - lo[d]) / side).floor() as i64
                };
            }
            CellKey {
                group: points.groups()[i],
                cell,
            }
        };
        let mut keyed: Vec<(CellKey, u32)> =
            (0..points.len()).map(|i| (key_of(i), i as u32)).collect();
        keyed.sort_unstable();

        let mut cell_keys: Vec<CellKey> = Vec::new();
        let mut cell_start: Vec<u32> = Vec::new();
        for (pos, (key, _)) in keyed.iter().enumerate() {
            if cell_keys.last() != Some(key) {
                cell_keys.push(*key);
                cell_start.push(pos as u32);
            }
        }
        cell_start.push(keyed.len() as u32);

        let lookup: FastMap<CellKey, u32> = cell_keys
            .iter()
            .enumerate()
            .map(|(c, k)| (*k, c as u32))
            .collect();
        let offsets = if exact {
            Vec::new()
        } else {
            neighbour_offsets(dims)
        };
        let mut neighbours = Vec::new();
        let mut neighbour_start = Vec::with_capacity(cell_keys.len() + 1);
        for key in &cell_keys {
            neighbour_start.push(neighbours.len() as u32);
            let first = neighbours.len();
            for offset in &offsets {
                let mut cell = key.cell;
                for d in 0..dims {
                    cell[d] += offset[d];
                }
                if let Some(&c) = lookup.get(&CellKey {
                    group: key.group,
                    cell,
                }) {
                    neighbours.push(c);
                }
            }
            neighbours[first..].sort_unstable();
        }
        neighbour_start.push(neighbours.len() as u32);

        let order: Vec<u32> = keyed.iter().map(|&(_, i)| i).collect();
        let coords = order.iter().map(|&i| points.coords()[i as usize]).collect();
        Grid {
            order,
            coords,
            cell_start,
            neighbours,
            neighbour_start,
        }
    }

    pub fn cell_count(&self) -> usize {
        self.cell_start.len() - 1
    }

    pub fn cell(&self, c: usize) -> std::ops::Range<usize> {
        self.cell_start[c] as usize..self.cell_start[c + 1] as usize
    }

    pub fn neighbours(&self, c: usize) -> &[u32] {
        &self.neighbours[self.neighbour_start[c] as usize..self.neighbour_start[c + 1] as usize]
    }

    /// Reorders each cell so that the positions for which `first` holds come first, keeping
    /// their relative order; returns for each cell the end of that leading part.
    pub fn partition_cells(&mut self, first: &[bool]) -> Vec<u32> {
        let mut split = Vec::with_capacity(self.cell_count());
        let mut scratch: Vec<(u32, Coords)> = Vec::new();
        for c in 0..self.cell_count() {
            let range = self.cell(c);
            scratch.clear();
            scratch.extend(
                range
                    .clone()
                    .filter(|&p| first[p])
                    .map(|p| (self.order[p], self.coords[p])),
            );
            let leading = scratch.len();
            scratch.extend(
                range
                    .clone()
                    .filter(|&p| !first[p])
                    .map(|p| (self.order[p], self.coords[p])),
            );
            for (offset, &(index, coords)) in scratch.iter().enumerate() {
                self.order[range.start + offset] = index;
                self.coords[range.start + offset] = coords;
            }
            split.push((range.start + leading) as u32);
        }
        split
    }
}

/// Offsets of the cells that can hold a point within Eps of a point in the origin cell. With side
/// s = Eps/√d, cells o apart are at least s·sqrt(Σ max(|oᵢ|−1, 0)²) apart, which must not exceed
/// Eps = s·√d.
fn neighbour_offsets(dims: usize) -> Vec<[i64; MAX_DIMS]> {
    let reach = 1 + (dims as f64).sqrt().floor() as i64;
    let mut offsets = vec![[0i64; MAX_DIMS]];
    for d in 0..dims {
        offsets = offsets
            .into_iter()
            .flat_map(|o| {
                (-reach..=reach).map(move |step| {
                    let mut next = o;
                    next[d] = step;
                    next
                })
            })
            .collect();
    }
    offsets.retain(|o| {
        let gap: i64 = o.iter().map(|&x| (x.abs() - 1).max(0).pow(2)).sum();
        o.iter().any(|&x| x != 0) && gap <= dims as i64
    });
    offsets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_cover_exactly_the_reachable_cells() {
        assert_eq!(neighbour_offsets(1).len(), 4); // -2, -1, 1, 2
        assert_eq!(neighbour_offsets(2).len(), 24); // the 5×5 block without its centre
    }

    #[test]
    fn points_in_one_cell_are_within_eps() {
        let coords: Vec<Coords> = (0..100)
            .map(|i| [i as f64 * 0.013, (i * 7 % 13) as f64 * 0.02, 0.0])
            .collect();
        let points = PointSet::new(2, coords);
        let eps = 0.05;
        let grid = Grid::new(&points, eps);
        for c in 0..grid.cell_count() {
            for p in grid.cell(c) {
                for q in grid.cell(c) {
                    assert!(
                        super::super::points::distance2(&grid.coords[p], &grid.coords[q])
                            <= eps * eps
                    );
                }
            }
        }
    }

    #[test]
    fn zero_eps_puts_identical_points_in_one_cell() {
        let coords = vec![
            [0.5, 0.5, 0.0],
            [0.5, 0.5, 0.0],
            [0.5, 0.500001, 0.0],
            [-0.0, 0.0, 0.0],
            [0.0, 0.0, 0.0],
        ];
        let grid = Grid::new(&PointSet::new(2, coords), 0.0);
        assert_eq!(grid.cell_count(), 3);
        assert!((0..3).all(|c| grid.neighbours(c).is_empty()));
    }
}
