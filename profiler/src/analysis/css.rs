//! Cluster Sequence Score (González García (2013), ch. 5): how SPMD a clustering is.
//!
//! Each rank's bursts, in start-time order, give a sequence of cluster ids; the sequences are
//! aligned ([`super::msa`]) and a cluster scores, over the aligned columns it appears in, the mean
//! fraction of ranks that run it there (Eq. 5.1–5.5 with the corrected Eq. 5.2: the divisor is the
//! number of ranks m). A cluster that every rank runs in every column it appears in scores 1.
//!
//! Noise is a symbol of its own in the sequences (as in ClusteringSuite), so a rank whose
//! occurrence of a phase fell into noise keeps the noise burst in that phase's column and the
//! column shows m − 1 ranks for the phase. Noise gets a column score like any symbol but no
//! weight in the global score: the global score is Σ over clusters of (cluster time ÷ analysed
//! time, noise included) × score, so noise time counts as time without SPMD structure
//! (ClusteringSuite instead weights noise with its own column score, which rewards noise that
//! happens to line up).
//!
//! Substitution scores for the alignment: a cluster against itself scores 1 + its share of the
//! analysed time, so that where two alignments compete the more important cluster lines up
//! (the duration-weighted identity matrix of González García (2013)); noise against noise scores
//! 0, so noise never pulls sequences into place.

use std::collections::BTreeMap;

use super::msa::{align, Alignment};
use super::{ClusterId, NOISE};

/// Per-rank burst order of a point set: which points each rank ran, in start-time order.
#[derive(Clone, Debug)]
pub struct RankSequences {
    /// Point indices per rank, in start-time order. Ranks without points have empty sequences;
    /// their number still counts in m.
    sequences: Vec<Vec<usize>>,
    rank_of: Vec<u32>,
    durations: Vec<u64>,
}

impl RankSequences {
    /// `rank_of[i]` is the rank index (0..ranks) of point i; `start_ns` and `durations_ns` its
    /// start time and duration. Ties in start time keep the point order.
    pub fn new(ranks: usize, rank_of: Vec<u32>, start_ns: &[u64], durations_ns: Vec<u64>) -> Self {
        assert_eq!(rank_of.len(), start_ns.len(), "one start time per point");
        assert_eq!(rank_of.len(), durations_ns.len(), "one duration per point");
        let mut sequences = vec![Vec::new(); ranks];
        for (i, &rank) in rank_of.iter().enumerate() {
            sequences[rank as usize].push(i);
        }
        for sequence in &mut sequences {
            sequence.sort_by_key(|&i| (start_ns[i], i));
        }
        RankSequences {
            sequences,
            rank_of,
            durations: durations_ns,
        }
    }

    /// The number of ranks m.
    pub fn ranks(&self) -> usize {
        self.sequences.len()
    }

    pub fn points(&self) -> usize {
        self.rank_of.len()
    }

    pub fn sequence(&self, rank: usize) -> &[usize] {
        &self.sequences[rank]
    }

    pub fn rank_of(&self, point: usize) -> u32 {
        self.rank_of[point]
    }

    pub fn durations(&self) -> &[u64] {
        &self.durations
    }
}

/// Column counts of one symbol: in how many columns it appears, and how many sequence
/// positions it fills there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ColumnTally {
    pub columns: u64,
    pub hits: u64,
}

/// The score of a labelling.
#[derive(Clone, Debug)]
pub struct SequenceScore {
    ranks: usize,
    tallies: BTreeMap<ClusterId, ColumnTally>,
    time_ns: BTreeMap<ClusterId, u64>,
    total_time_ns: u64,
    alignment: Alignment,
}

impl SequenceScore {
    /// Score of a symbol (noise included) in (0, 1]; `None` when it does not occur.
    pub fn score(&self, id: ClusterId) -> Option<f64> {
        self.tallies
            .get(&id)
            .map(|t| t.hits as f64 / (t.columns as f64 * self.ranks as f64))
    }

    pub fn tally(&self, id: ClusterId) -> Option<ColumnTally> {
        self.tallies.get(&id).copied()
    }

    /// Exactly 1, decided on integer counts.
    pub fn is_perfect(&self, id: ClusterId) -> bool {
        self.tallies
            .get(&id)
            .is_some_and(|t| t.hits == t.columns * self.ranks as u64)
    }

    /// Σ over clusters (noise excluded) of time share × score; 0 without analysed time.
    pub fn global(&self) -> f64 {
        if self.total_time_ns == 0 {
            return 0.0;
        }
        self.time_ns
            .iter()
            .filter(|&(&id, _)| id != NOISE)
            .map(|(&id, &t)| t as f64 / self.total_time_ns as f64 * self.score(id).unwrap_or(0.0))
            .sum()
    }

    /// Symbols that occur, noise included, ascending.
    pub fn symbols(&self) -> impl Iterator<Item = ClusterId> + '_ {
        self.tallies.keys().copied()
    }

    pub fn alignment(&self) -> &Alignment {
        &self.alignment
    }
}

impl SequenceScore {
    /// The score of other labels on the same alignment, without aligning again: for labels that
    /// differ from the aligned ones only in a few places, such as absorbed noise.
    pub fn relabelled(&self, labels: &[ClusterId], sequences: &RankSequences) -> SequenceScore {
        scored(
            self.alignment
                .with_symbols(&symbol_sequences(labels, sequences)),
            labels,
            sequences,
        )
    }
}

/// Scores `labels` (one per point of `sequences`).
pub fn sequence_score(labels: &[ClusterId], sequences: &RankSequences) -> SequenceScore {
    assert_eq!(labels.len(), sequences.points(), "one label per point");
    let time_ns = time_per_label(labels, sequences);
    let total_time_ns: u64 = time_ns.values().sum();
    let largest = labels.iter().copied().max().unwrap_or(NOISE) as usize;
    let mut match_score = vec![0.0; largest + 1];
    for (&id, &t) in &time_ns {
        if id != NOISE {
            match_score[id as usize] = 1.0
                + if total_time_ns == 0 {
                    0.0
                } else {
                    t as f64 / total_time_ns as f64
                };
        }
    }
    scored(
        align(&symbol_sequences(labels, sequences), &match_score),
        labels,
        sequences,
    )
}

fn symbol_sequences(labels: &[ClusterId], sequences: &RankSequences) -> Vec<Vec<ClusterId>> {
    (0..sequences.ranks())
        .map(|r| sequences.sequence(r).iter().map(|&p| labels[p]).collect())
        .collect()
}

fn time_per_label(labels: &[ClusterId], sequences: &RankSequences) -> BTreeMap<ClusterId, u64> {
    let mut time_ns: BTreeMap<ClusterId, u64> = BTreeMap::new();
    for (&label, &duration) in labels.iter().zip(sequences.durations()) {
        *time_ns.entry(label).or_default() += duration;
    }
    time_ns
}

fn scored(alignment: Alignment, labels: &[ClusterId], sequences: &RankSequences) -> SequenceScore {
    let time_ns = time_per_label(labels, sequences);
    let mut tallies: BTreeMap<ClusterId, ColumnTally> = BTreeMap::new();
    for j in 0..alignment.columns() {
        for &(id, count) in alignment.column(j) {
            let tally = tallies.entry(id).or_default();
            tally.columns += 1;
            tally.hits += u64::from(count);
        }
    }
    SequenceScore {
        ranks: sequences.ranks(),
        tallies,
        total_time_ns: time_ns.values().sum(),
        time_ns,
        alignment,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sequences given directly as labels per rank, one time unit per burst unless `durations`.
    fn score_of(per_rank: &[Vec<ClusterId>], ranks: usize) -> SequenceScore {
        let mut labels = Vec::new();
        let mut rank_of = Vec::new();
        let mut start = Vec::new();
        for (rank, sequence) in per_rank.iter().enumerate() {
            for (position, &label) in sequence.iter().enumerate() {
                labels.push(label);
                rank_of.push(rank as u32);
                start.push(position as u64);
            }
        }
        let durations = vec![1; labels.len()];
        sequence_score(
            &labels,
            &RankSequences::new(ranks, rank_of, &start, durations),
        )
    }

    #[test]
    fn identical_sequences_score_one() {
        let score = score_of(&vec![vec![1, 2, 3, 1, 2, 3]; 8], 8);
        for id in 1..=3 {
            assert_eq!(score.score(id), Some(1.0));
            assert!(score.is_perfect(id));
        }
        assert!((score.global() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn one_rank_missing_one_occurrence() {
        // 4 ranks, 5 iterations of 1 2 3; rank 3 lacks the 2 of iteration 2. Cluster 2 appears in
        // 5 columns, one of them with 3 of 4 ranks: (4 · 1 + 3/4) / 5 = 0.95.
        let full: Vec<ClusterId> = [1, 2, 3].repeat(5);
        let mut short = full.clone();
        short.remove(4);
        let score = score_of(&[full.clone(), full.clone(), full.clone(), short], 4);
        assert_eq!(score.score(1), Some(1.0));
        assert_eq!(score.score(2), Some(0.95));
        assert_eq!(score.score(3), Some(1.0));
        assert!(!score.is_perfect(2));
        // Time shares: 20, 19 and 20 of 59 bursts.
        let expected = (20.0 + 19.0 * 0.95 + 20.0) / 59.0;
        assert!((score.global() - expected).abs() < 1e-12);
    }

    #[test]
    fn a_subgroup_cluster_scores_its_share_of_ranks() {
        // Rank 0 runs cluster 4 where the other three run cluster 2 (the WRF 236/256 pattern).
        let majority: Vec<ClusterId> = [1, 2, 3].repeat(4);
        let minority: Vec<ClusterId> = [1, 4, 3].repeat(4);
        let score = score_of(&[minority, majority.clone(), majority.clone(), majority], 4);
        assert_eq!(score.score(2), Some(0.75));
        assert_eq!(score.score(4), Some(0.25));
        assert_eq!(score.score(1), Some(1.0));
    }

    #[test]
    fn ranks_without_bursts_count_in_m_and_noise_has_no_weight() {
        let score = score_of(&[vec![1, 1], vec![1, 1]], 4);
        assert_eq!(score.score(1), Some(0.5));
        let with_noise = score_of(&[vec![1, 2], vec![1, NOISE]], 2);
        assert_eq!(with_noise.score(2), Some(0.5));
        assert_eq!(with_noise.score(NOISE), Some(0.5));
        // Cluster 1: 2/4 of the time at score 1; cluster 2: 1/4 at 0.5; noise: 1/4 at nothing.
        assert!((with_noise.global() - 0.625).abs() < 1e-12);
    }
}
