//! Progressive multiple sequence alignment over an arbitrary alphabet (cluster ids).
//!
//! 1. Identical sequences are aligned once: each distinct sequence is a leaf weighted by how many
//!    ranks have it, so a perfectly SPMD window costs no alignment at all.
//! 2. Guide tree: UPGMA over a 2-mer distance between the distinct sequences (shared counts of
//!    consecutive symbol pairs, as in MUSCLE's first stage; Kalign2, which González García (2013)
//!    modified, also uses a string-matching distance rather than alignments here). Pairwise
//!    Needleman–Wunsch distances would cost O(u²·L·band) for u distinct sequences of length L,
//!    which dominates everything else for a few dozen ranks; the tree only orders the merges.
//! 3. Profile alignment (Needleman–Wunsch on profiles) along the tree. Column score: the mean
//!    over all pairs of sequences (one from each side) of the substitution score, where the
//!    substitution matrix is a weighted identity: `match_score[x]` for x against x, 0 for any
//!    mismatch. Gaps cost [`GAP_PENALTY`] per column inside a sequence and nothing at either end,
//!    because a window edge cuts ranks' iterations at different points. The DP sums over the
//!    pairs instead of averaging (the same order of paths), in integers of 2^-20 of a score:
//!    exact sums, and half the time per cell of floating point in the daemon's window alignments
//!    during `bench daemon`'s two-rank storm.
//!
//! Costs are bounded by a band: the DP only visits cells within `h` of the straight line from
//! (0, 0) to (L_a, L_b), with h = |L_a − L_b| + [`BAND_SLACK`], so every path whose drift stays
//! between 0 and the length difference (plus the slack) is explored. The band is capped so that
//! one alignment never visits more than [`MAX_ALIGNMENT_CELLS`] cells; past that cap (ranks whose
//! burst counts differ by tens of thousands) the alignment is still valid, only possibly not
//! optimal. One alignment is O(L·h) time and memory; the whole MSA is
//! O(u·L·h + u²·k + u³) for k distinct 2-mers per sequence.

use std::collections::BTreeMap;

use super::ClusterId;

/// Cost of a gap column inside a sequence. A mismatch scores 0, so a pair of gaps (−2) always
/// loses against putting two different clusters in one column: a rank whose phase fell into
/// another cluster stays in that phase's column, which is what the sequence-based merge needs.
pub const GAP_PENALTY: f64 = 1.0;

/// Extra band width beyond the length difference: how far two ranks may drift apart, in
/// symbols, in both directions at once (for example a rank with extra bursts early and another
/// with extra bursts late).
pub const BAND_SLACK: usize = 32;

/// Steps per unit of score in the alignment's integer scores, at most: match scores (1 to 2)
/// are rounded to 2^-20.
const SCORE_STEPS: f64 = (1u64 << 20) as f64;
/// The largest sum of column scores a path may reach in integer steps (2^60, well inside i64).
const MAX_PATH_SCORE: f64 = (1u64 << 60) as f64;

/// Upper bound on DP cells (2 bits of traceback each) for one profile–profile alignment.
pub const MAX_ALIGNMENT_CELLS: usize = 1 << 24;

const STEP_DIAGONAL: u8 = 0;
const STEP_UP: u8 = 1;
const STEP_LEFT: u8 = 2;

/// The traceback of an alignment: the step into each DP cell, 2 bits per cell, so that an
/// alignment at the cell bound keeps 4 MB rather than 16. A cell is written once at most, and
/// one never written reads as a diagonal step.
struct Trace(Vec<u8>);

impl Trace {
    fn new(cells: usize) -> Self {
        Trace(vec![STEP_DIAGONAL; cells.div_ceil(4)])
    }

    fn set(&mut self, cell: usize, step: u8) {
        self.0[cell / 4] |= step << (2 * (cell % 4));
    }

    fn get(&self, cell: usize) -> u8 {
        (self.0[cell / 4] >> (2 * (cell % 4))) & 3
    }
}

/// The aligned sequences: per column, how many sequences hold which symbol, and per sequence the
/// column of each of its symbols.
#[derive(Clone, Debug)]
pub struct Alignment {
    sequences: usize,
    column_start: Vec<u32>,
    entries: Vec<(ClusterId, u32)>,
    leaf_of_sequence: Vec<usize>,
    leaf_positions: Vec<Vec<u32>>,
}

impl Alignment {
    pub fn columns(&self) -> usize {
        self.column_start.len() - 1
    }

    /// (symbol, number of sequences holding it) in column `j`, by symbol.
    pub fn column(&self, j: usize) -> &[(ClusterId, u32)] {
        &self.entries[self.column_start[j] as usize..self.column_start[j + 1] as usize]
    }

    /// Column of each symbol of sequence `s`.
    pub fn positions(&self, s: usize) -> &[u32] {
        &self.leaf_positions[self.leaf_of_sequence[s]]
    }

    /// The same columns filled with other symbols: `sequences[s]` must have the length of the
    /// aligned sequence s.
    pub fn with_symbols(&self, sequences: &[Vec<ClusterId>]) -> Alignment {
        assert_eq!(
            sequences.len(),
            self.sequences,
            "one symbol sequence per aligned sequence"
        );
        let mut placed: Vec<(u32, ClusterId)> = Vec::new();
        for (s, sequence) in sequences.iter().enumerate() {
            assert_eq!(
                sequence.len(),
                self.positions(s).len(),
                "sequence {s} changed length"
            );
            placed.extend(
                self.positions(s)
                    .iter()
                    .zip(sequence)
                    .map(|(&column, &symbol)| (column, symbol)),
            );
        }
        placed.sort_unstable();
        let mut column_start = vec![0u32; self.columns() + 1];
        let mut entries: Vec<(ClusterId, u32)> = Vec::new();
        for (i, &(column, symbol)) in placed.iter().enumerate() {
            if i > 0 && placed[i - 1] == (column, symbol) {
                entries.last_mut().expect("run started").1 += 1;
            } else {
                entries.push((symbol, 1));
            }
            column_start[column as usize + 1] = entries.len() as u32;
        }
        for j in 1..column_start.len() {
            column_start[j] = column_start[j].max(column_start[j - 1]);
        }
        Alignment {
            sequences: self.sequences,
            column_start,
            entries,
            leaf_of_sequence: self.leaf_of_sequence.clone(),
            leaf_positions: self.leaf_positions.clone(),
        }
    }
}

/// A set of aligned sequences.
struct Profile {
    weight: u32,
    column_start: Vec<u32>,
    entries: Vec<(ClusterId, u32)>,
    /// (leaf, column of each of its symbols).
    members: Vec<(usize, Vec<u32>)>,
}

impl Profile {
    fn leaf(leaf: usize, sequence: &[ClusterId], weight: u32) -> Profile {
        Profile {
            weight,
            column_start: (0..=sequence.len() as u32).collect(),
            entries: sequence.iter().map(|&s| (s, weight)).collect(),
            members: vec![(leaf, (0..sequence.len() as u32).collect())],
        }
    }

    fn columns(&self) -> usize {
        self.column_start.len() - 1
    }

    fn column(&self, j: usize) -> &[(ClusterId, u32)] {
        &self.entries[self.column_start[j] as usize..self.column_start[j + 1] as usize]
    }
}

/// Aligns `sequences`; `match_score[x]` is the score of x against x (0 for symbols past its end).
pub fn align(sequences: &[Vec<ClusterId>], match_score: &[f64]) -> Alignment {
    let mut distinct: BTreeMap<&[ClusterId], Vec<usize>> = BTreeMap::new();
    for (s, sequence) in sequences.iter().enumerate() {
        distinct.entry(sequence).or_default().push(s);
    }
    let mut leaf_of_sequence = vec![0; sequences.len()];
    let mut profiles: Vec<Option<Profile>> = Vec::new();
    let mut kmers = Vec::new();
    for (leaf, (sequence, members)) in distinct.iter().enumerate() {
        for &s in members {
            leaf_of_sequence[s] = leaf;
        }
        profiles.push(Some(Profile::leaf(leaf, sequence, members.len() as u32)));
        kmers.push(pair_counts(sequence));
    }

    let leaves = profiles.len();
    let mut distance: Vec<Vec<f64>> = (0..leaves)
        .map(|a| {
            (0..leaves)
                .map(|b| kmer_distance(&kmers[a], &kmers[b]))
                .collect()
        })
        .collect();
    for _ in 1..leaves {
        let mut closest = (f64::INFINITY, 0, 0);
        for a in 0..leaves {
            if profiles[a].is_none() {
                continue;
            }
            for b in a + 1..leaves {
                if profiles[b].is_some() && distance[a][b] < closest.0 {
                    closest = (distance[a][b], a, b);
                }
            }
        }
        let (_, a, b) = closest;
        let pa = profiles[a].take().expect("active");
        let pb = profiles[b].take().expect("active");
        let (wa, wb) = (f64::from(pa.weight), f64::from(pb.weight));
        let merged: Vec<f64> = distance[a]
            .iter()
            .zip(&distance[b])
            .map(|(da, db)| (wa * da + wb * db) / (wa + wb))
            .collect();
        for (row, &value) in distance.iter_mut().zip(&merged) {
            row[a] = value;
        }
        distance[a] = merged;
        profiles[a] = Some(align_profiles(&pa, &pb, match_score));
    }

    let root = profiles.into_iter().flatten().next();
    let (column_start, entries, members) = match root {
        Some(p) => (p.column_start, p.entries, p.members),
        None => (vec![0], Vec::new(), Vec::new()),
    };
    let mut leaf_positions = vec![Vec::new(); leaves];
    for (leaf, positions) in members {
        leaf_positions[leaf] = positions;
    }
    Alignment {
        sequences: sequences.len(),
        column_start,
        entries,
        leaf_of_sequence,
        leaf_positions,
    }
}

/// Counts of consecutive symbol pairs, sorted by pair.
fn pair_counts(sequence: &[ClusterId]) -> Vec<((ClusterId, ClusterId), u32)> {
    let mut pairs: Vec<(ClusterId, ClusterId)> =
        sequence.windows(2).map(|w| (w[0], w[1])).collect();
    pairs.sort_unstable();
    let mut counts: Vec<((ClusterId, ClusterId), u32)> = Vec::new();
    for pair in pairs {
        match counts.last_mut() {
            Some((last, n)) if *last == pair => *n += 1,
            _ => counts.push((pair, 1)),
        }
    }
    counts
}

/// 1 − (shared pairs ÷ pairs in the shorter sequence).
fn kmer_distance(a: &[((ClusterId, ClusterId), u32)], b: &[((ClusterId, ClusterId), u32)]) -> f64 {
    let total = |counts: &[((ClusterId, ClusterId), u32)]| {
        counts.iter().map(|&(_, n)| u64::from(n)).sum::<u64>()
    };
    let shorter = total(a).min(total(b));
    if shorter == 0 {
        return 1.0;
    }
    let (mut i, mut j, mut shared) = (0, 0, 0u64);
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                shared += u64::from(a[i].1.min(b[j].1));
                i += 1;
                j += 1;
            }
        }
    }
    1.0 - shared as f64 / shorter as f64
}

/// Substitution score summed over all pairs of one sequence from each column, in the integer
/// steps of `match_score`.
fn column_score(a: &[(ClusterId, u32)], b: &[(ClusterId, u32)], match_score: &[i64]) -> i64 {
    let (mut i, mut j, mut sum) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].0.cmp(&b[j].0) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                let score = match_score.get(a[i].0 as usize).copied().unwrap_or(0);
                sum += i64::from(a[i].1) * i64::from(b[j].1) * score;
                i += 1;
                j += 1;
            }
        }
    }
    sum
}

fn merge_columns(a: &[(ClusterId, u32)], b: &[(ClusterId, u32)], out: &mut Vec<(ClusterId, u32)>) {
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if j == b.len() || (i < a.len() && a[i].0 < b[j].0) {
            out.push(a[i]);
            i += 1;
        } else if i == a.len() || b[j].0 < a[i].0 {
            out.push(b[j]);
            j += 1;
        } else {
            out.push((a[i].0, a[i].1 + b[j].1));
            i += 1;
            j += 1;
        }
    }
}

/// Banded Needleman–Wunsch between two profiles (rows: `a`'s columns, band along `b`).
fn align_profiles(a: &Profile, b: &Profile, match_score: &[f64]) -> Profile {
    let band = Band::new(a.columns(), b.columns());
    let (match_score, gap_penalty) = integer_scores(a, b, match_score, &band);
    let trace = fill(a, b, &band, &match_score, gap_penalty);
    let steps = trace_back(&trace, &band);
    merge_along(a, b, steps)
}

/// The band of the alignment matrix that is filled: row i (of `la` + 1) covers `width` columns
/// of `b` from [`Band::base`] (clipped to 0..=`lb`).
struct Band {
    la: usize,
    lb: usize,
    half_width: usize,
    width: usize,
}

impl Band {
    fn new(la: usize, lb: usize) -> Self {
        let rows = la + 1;
        let wanted = la.abs_diff(lb) + BAND_SLACK;
        let half_width = wanted
            .min((MAX_ALIGNMENT_CELLS / rows).saturating_sub(1) / 2)
            .max(lb.div_ceil(la.max(1)));
        Band {
            la,
            lb,
            half_width,
            width: 2 * half_width + 1,
        }
    }

    fn rows(&self) -> usize {
        self.la + 1
    }

    /// The first column of `b` row `i` covers.
    fn base(&self, i: usize) -> i64 {
        (i * self.lb / self.la.max(1)) as i64 - self.half_width as i64
    }
}

/// Integer scores, summed over the pairs rather than averaged (the same order of paths, no
/// division per cell): `scale` steps per unit of score, as fine as no path's sum can overflow.
/// Returns the match scores and the gap penalty.
fn integer_scores(a: &Profile, b: &Profile, match_score: &[f64], band: &Band) -> (Vec<i64>, i64) {
    let pairs = i64::from(a.weight) * i64::from(b.weight);
    let largest = match_score.iter().copied().fold(GAP_PENALTY, f64::max);
    let path_bound = pairs as f64 * largest * (band.la + band.lb + 1) as f64;
    let scale = (MAX_PATH_SCORE / path_bound)
        .min(SCORE_STEPS)
        .floor()
        .max(1.0);
    let match_score: Vec<i64> = match_score
        .iter()
        .map(|s| (s * scale).round() as i64)
        .collect();
    let gap_penalty = (GAP_PENALTY * scale).round() as i64 * pairs;
    (match_score, gap_penalty)
}

/// Fills the band row by row, keeping two rows of scores, and returns the step taken into each
/// cell. Gaps at either end of a profile cost nothing.
fn fill(a: &Profile, b: &Profile, band: &Band, match_score: &[i64], gap_penalty: i64) -> Trace {
    let (la, lb, width) = (band.la, band.lb, band.width);
    let rows = band.rows();
    // No cell: paths score within ±2^60, and one that starts from here stays below −2^61 and
    // far above i64::MIN, whatever it adds or takes off on the way.
    const NONE: i64 = i64::MIN / 2;

    let mut previous = vec![NONE; width];
    let mut current = vec![NONE; width];
    let mut trace = Trace::new(rows * width);
    for i in 0..rows {
        current.fill(NONE);
        let row_base = band.base(i);
        let previous_base = if i > 0 { band.base(i - 1) } else { 0 };
        for k in 0..width {
            let j = row_base + k as i64;
            if j < 0 || j > lb as i64 {
                continue;
            }
            let j = j as usize;
            if i == 0 && j == 0 {
                current[k] = 0;
                continue;
            }
            let mut best = NONE;
            let mut step = STEP_DIAGONAL;
            let in_previous = |column: usize| {
                let offset = column as i64 - previous_base;
                (0..width as i64)
                    .contains(&offset)
                    .then_some(offset as usize)
            };
            if i > 0 && j > 0 {
                if let Some(p) = in_previous(j - 1) {
                    best =
                        previous[p] + column_score(a.column(i - 1), b.column(j - 1), match_score);
                }
            }
            if i > 0 {
                if let Some(p) = in_previous(j) {
                    let gap = if j == 0 || j == lb { 0 } else { gap_penalty };
                    if previous[p] - gap > best {
                        best = previous[p] - gap;
                        step = STEP_UP;
                    }
                }
            }
            if j > 0 && k > 0 {
                let gap = if i == 0 || i == la { 0 } else { gap_penalty };
                if current[k - 1] - gap > best {
                    best = current[k - 1] - gap;
                    step = STEP_LEFT;
                }
            }
            current[k] = best;
            trace.set(i * width + k, step);
        }
        std::mem::swap(&mut previous, &mut current);
    }

    trace
}

/// The steps of the best path, from the start of both profiles.
fn trace_back(trace: &Trace, band: &Band) -> Vec<u8> {
    let (mut i, mut j) = (band.la, band.lb);
    let mut steps = Vec::with_capacity(i + j);
    while i > 0 || j > 0 {
        let step = if i == 0 {
            STEP_LEFT
        } else if j == 0 {
            STEP_UP
        } else {
            trace.get(i * band.width + (j as i64 - band.base(i)) as usize)
        };
        steps.push(step);
        match step {
            STEP_DIAGONAL => {
                i -= 1;
                j -= 1;
            }
            STEP_UP => i -= 1,
            _ => j -= 1,
        }
    }
    steps.reverse();
    steps
}

/// The profile of `a` and `b` aligned along `steps`: a diagonal step merges a column of each,
/// a vertical one takes `a`'s column, a horizontal one `b`'s.
fn merge_along(a: &Profile, b: &Profile, steps: Vec<u8>) -> Profile {
    let (la, lb) = (a.columns(), b.columns());
    let mut column_start = vec![0u32];
    let mut entries = Vec::with_capacity(a.entries.len() + b.entries.len());
    let mut column_of_a = Vec::with_capacity(la);
    let mut column_of_b = Vec::with_capacity(lb);
    let (mut i, mut j) = (0, 0);
    for (column, step) in steps.into_iter().enumerate() {
        let column = column as u32;
        match step {
            STEP_DIAGONAL => {
                merge_columns(a.column(i), b.column(j), &mut entries);
                column_of_a.push(column);
                column_of_b.push(column);
                i += 1;
                j += 1;
            }
            STEP_UP => {
                entries.extend_from_slice(a.column(i));
                column_of_a.push(column);
                i += 1;
            }
            _ => {
                entries.extend_from_slice(b.column(j));
                column_of_b.push(column);
                j += 1;
            }
        }
        column_start.push(entries.len() as u32);
    }
    let remap = |members: &[(usize, Vec<u32>)], map: &[u32]| -> Vec<(usize, Vec<u32>)> {
        members
            .iter()
            .map(|(leaf, positions)| (*leaf, positions.iter().map(|&p| map[p as usize]).collect()))
            .collect()
    };
    let mut members = remap(&a.members, &column_of_a);
    members.extend(remap(&b.members, &column_of_b));
    Profile {
        weight: a.weight + b.weight,
        column_start,
        entries,
        members,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aligned_rows(sequences: &[Vec<ClusterId>]) -> Vec<String> {
        let alignment = align(sequences, &[0.0, 1.5, 1.3, 1.2, 1.1]);
        (0..sequences.len())
            .map(|s| {
                let mut row = vec!['-'; alignment.columns()];
                for (&symbol, &column) in sequences[s].iter().zip(alignment.positions(s)) {
                    row[column as usize] = char::from_digit(symbol, 10).unwrap();
                }
                row.into_iter().collect()
            })
            .collect()
    }

    #[test]
    fn identical_sequences_need_no_gaps() {
        let rows = aligned_rows(&vec![vec![1, 2, 3, 1, 2, 3]; 4]);
        assert_eq!(rows, vec!["123123"; 4]);
    }

    #[test]
    fn a_missing_occurrence_becomes_a_gap() {
        let rows = aligned_rows(&[
            vec![1, 2, 3, 1, 2, 3, 1, 2, 3],
            vec![1, 2, 3, 1, 3, 1, 2, 3],
            vec![1, 2, 3, 1, 2, 3, 1, 2, 3],
        ]);
        assert_eq!(rows, vec!["123123123", "1231-3123", "123123123"]);
    }

    #[test]
    fn a_different_cluster_shares_the_column_instead_of_opening_gaps() {
        let rows = aligned_rows(&[
            vec![1, 2, 3, 1, 2, 3],
            vec![1, 4, 3, 1, 4, 3],
            vec![1, 2, 3, 1, 2, 3],
        ]);
        assert_eq!(rows, vec!["123123", "143143", "123123"]);
    }

    #[test]
    fn ends_shift_without_cost() {
        // The second rank's window starts one phase later.
        let rows = aligned_rows(&[vec![1, 2, 3, 1, 2, 3], vec![2, 3, 1, 2, 3, 1]]);
        assert_eq!(rows, vec!["123123-", "-231231"]);
    }

    #[test]
    fn empty_and_no_sequences() {
        let alignment = align(&[vec![], vec![1, 2]], &[0.0, 1.0, 1.0]);
        assert_eq!(alignment.columns(), 2);
        assert_eq!(alignment.column(0), &[(1, 1)]);
        assert_eq!(align(&[], &[]).columns(), 0);
    }

    #[test]
    fn profiles_of_many_ranks_align_as_profiles_of_one() {
        // Weights whose pair count (2^40) leaves the integer scores a coarser step than 2^-20:
        // the same columns as with one rank on each side.
        let a: Vec<ClusterId> = vec![1, 2, 3, 1, 2, 3, 1, 2, 3];
        let b: Vec<ClusterId> = vec![1, 2, 3, 1, 3, 1, 2, 3];
        let score = [0.0, 1.5, 1.3, 1.2];
        let columns = |weight: u32| {
            let merged = align_profiles(
                &Profile::leaf(0, &a, weight),
                &Profile::leaf(1, &b, weight),
                &score,
            );
            (merged.columns(), merged.members)
        };
        assert_eq!(columns(1 << 20), columns(1));
        assert_eq!(columns(1).0, 9);
    }

    #[test]
    fn long_sequences_with_different_lengths_stay_within_the_band() {
        // 2 000 symbols against the same with 300 removed from the middle: the band must reach.
        let long: Vec<ClusterId> = (0..2000).map(|i| (i % 4 + 1) as ClusterId).collect();
        let mut short = long.clone();
        short.drain(1000..1300);
        let alignment = align(&[long.clone(), short], &[0.0, 1.0, 1.0, 1.0, 1.0]);
        assert_eq!(alignment.columns(), 2000);
        let full = (0..alignment.columns())
            .filter(|&j| alignment.column(j).iter().map(|e| e.1).sum::<u32>() == 2)
            .count();
        assert_eq!(full, 1700);
    }
}
