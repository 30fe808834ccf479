//! The bounded samples of a job: each window's stratified sample, which is what a window's
//! clustering sees, and the cumulative sample of the whole job.
//!
//! **Bounded window sample** (stratified): the window is cut into
//! [`OnlineParams::window_slots`] equal time slots, and each (slot, rank) stratum keeps the first
//! max_window_bursts ÷ (slots × ranks) bursts that arrive for it. Every rank and every part of
//! the window is represented, and within a stratum the kept bursts are a contiguous stretch of
//! that rank's sequence, so the rank sequences (and hence the Cluster Sequence Score) stay
//! meaningful, which a uniform reservoir sample would destroy. The analysed statistics are
//! those of the sample; the window's totals (bursts and time seen, dropped by the bound) are
//! reported beside them.
//!
//! **Sample of ranks**: when the strata of all ranks do not fit, that is when a stratum would
//! keep fewer than [`MIN_STRATUM_BURSTS`] (window_slots × ranks × 16 > max_window_bursts: from
//! 157 ranks with the defaults), the window sample keeps the strata of max_window_bursts ÷
//! (window_slots × 16) ranks only ([`RankSample`]), 16 bursts each: those whose hash of the rank
//! number is smallest among the job's ranks. A stratum needs a stretch of bursts, not one:
//! the ranks of an SPMD job run in step, so the first burst of every rank's stratum is the same
//! phase (the one running at the slot's start), and one burst per stratum gave a window sample of
//! 8 phase positions repeated over the ranks, which missed phases of a 3-phase loop
//! (docs/performance.md); 16 bursts cover a few iterations of a loop of a few phases. The choice depends on the rank number and the
//! number of ranks alone, so every node of a job, the aggregator and one daemon seeing all ranks
//! keep the same ranks without talking, and a hash spreads them over the nodes whatever the
//! placement of the ranks (blocks or round robin). The clustering, the SPMD score and the rank
//! sequences are then those of the sampled ranks. A job whose strata fit keeps all its ranks.
//!
//! **Cumulative view** (whole job, bounded): a systematic sample of windows, each contributing
//! one chunk: the contiguous stretch of at most max_cumulative_bursts ÷ cumulative_chunks
//! bursts (all ranks) that starts at a slot chosen by a hash of the window index (so a phase
//! that runs at a fixed offset in every window is not always missed). Windows are taken with a
//! stride, 1 at first; when there are more chunks than [`OnlineParams::cumulative_chunks`],
//! the stride doubles and the chunks off the new stride are dropped. The sample thus always
//! spans the whole job evenly. It is re-clustered whenever a closing window adds a chunk
//! (every window at first, every stride-th one later; in between it has not changed). Its
//! clusters are keyed by the stable window phase that holds most of their time (the sampled
//! bursts keep the stable id their window gave them) and a part number (0 = most time) when one
//! phase shows several behaviours over the job, for example before and after a change.
//! Cumulative statistics describe the sample; counts are not job totals.
//!
//! [`OnlineParams::window_slots`]: super::OnlineParams::window_slots
//! [`OnlineParams::cumulative_chunks`]: super::OnlineParams::cumulative_chunks

use serde::{Deserialize, Serialize};

use super::OnlineParams;
use crate::analysis::hashing::{mix, FastMap};
use crate::analysis::{signature::live::RepetitionSums, tracking::StableId};
use crate::model::Burst;

/// Bursts a stratum keeps at least: fewer, and the window sample keeps a sample of the ranks
/// rather than shorter strata (see the module docs).
pub const MIN_STRATUM_BURSTS: usize = 16;

/// The ranks whose strata the window samples keep (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RankSample {
    /// The ranks of the job, which the sample is drawn from.
    ranks: u32,
    /// How many of them are kept.
    kept: u32,
    /// The last rank kept in (hash, rank) order; `None` when every rank is kept.
    last_kept: Option<(u64, u32)>,
}

impl RankSample {
    /// The sample of a job of `ranks` ranks, sized so that [`MIN_STRATUM_BURSTS`] per (slot,
    /// rank) stratum fit [`OnlineParams::max_window_bursts`](super::OnlineParams::max_window_bursts).
    pub fn new(ranks: u32, params: &OnlineParams) -> Self {
        let stratum_bursts = params.window_slots as usize * MIN_STRATUM_BURSTS;
        if stratum_bursts * ranks as usize <= params.max_window_bursts {
            return RankSample {
                ranks,
                kept: ranks,
                last_kept: None,
            };
        }
        // Fewer than `ranks` (their strata do not fit), and at least one.
        let kept = (params.max_window_bursts / stratum_bursts).max(1) as u32;
        let mut order: Vec<(u64, u32)> = (0..ranks).map(|r| (rank_hash(r), r)).collect();
        let (_, &mut last, _) = order.select_nth_unstable(kept as usize - 1);
        RankSample {
            ranks,
            kept,
            last_kept: Some(last),
        }
    }

    /// The ranks of the job the sample was drawn from.
    pub fn ranks(&self) -> u32 {
        self.ranks
    }

    /// How many of ranks 0..[`ranks`](Self::ranks) the sample keeps, and what it is sized for.
    pub fn kept(&self) -> u32 {
        self.kept
    }

    /// Whether the strata of `rank` are kept.
    pub fn keeps(&self, rank: u32) -> bool {
        match self.last_kept {
            None => true,
            // Also for rank numbers beyond `ranks`: a node's daemon counts its own ranks but
            // sees their world numbers. As the last kept hash of ranks 0..n can only fall as n
            // grows, it keeps at least the ranks that the sample of the whole job keeps.
            Some(last) => (rank_hash(rank), rank) <= last,
        }
    }

    /// Bursts kept per (slot, rank) stratum of a sampled rank.
    pub fn stratum_quota(&self, params: &OnlineParams) -> u32 {
        (params.max_window_bursts / (params.window_slots as usize * self.kept.max(1) as usize))
            .max(1) as u32
    }
}

/// The order ranks are sampled in: a hash, so that the sampled ranks are spread over the job
/// whatever its placement of ranks on nodes.
fn rank_hash(rank: u32) -> u64 {
    mix(u64::from(rank))
}

/// The bounded, stratified sample of one window.
#[derive(Clone, Debug, Default)]
pub(super) struct WindowBuffer {
    /// The bursts kept.
    pub(super) bursts: Vec<Burst>,
    /// Bursts kept per (slot, rank).
    strata: FastMap<(u32, u32), u32>,
    /// Bursts pushed for the window, their time, and those left out by the bound.
    pub(super) seen: u64,
    pub(super) seen_time_ns: u64,
    pub(super) dropped: u64,
    pub(super) early_reclusters: u32,
}

impl WindowBuffer {
    /// Counts `run` (bursts of one (`slot`, rank) stratum, `run_ns` long in all) as pushed for
    /// the window, and keeps its first bursts while the stratum holds fewer than `quota` and the
    /// sample fewer than `max`; returns how many it left out.
    pub(super) fn add(
        &mut self,
        run: &[Burst],
        run_ns: u64,
        slot: u32,
        quota: u32,
        max: usize,
    ) -> u64 {
        let Some(first) = run.first() else { return 0 };
        self.seen += run.len() as u64;
        self.seen_time_ns += run_ns;
        let stratum = self.strata.entry((slot, first.rank)).or_default();
        let room = (quota.saturating_sub(*stratum) as usize)
            .min(max.saturating_sub(self.bursts.len()))
            .min(run.len());
        *stratum += room as u32;
        self.bursts.extend_from_slice(&run[..room]);
        let dropped = (run.len() - room) as u64;
        self.dropped += dropped;
        dropped
    }
}

/// The sample of one closed window as this instance kept it, before any bursts carried from
/// smaller windows: what a node contributes to the job-wide analysis of that window
/// ([`super::merge`]). Windows are aligned to Unix time, so window k is the same on every node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowSample {
    pub window: u64,
    /// Bursts pushed for the window, their time, and those the bound left out.
    pub seen: u64,
    pub seen_time_ns: u64,
    pub dropped: u64,
    /// The kept bursts, by rank and then start time.
    pub bursts: Vec<Burst>,
    /// The repetitions of every burst of the node's ranks up to the window's end, for the job's
    /// signature.
    pub repetitions: RepetitionSums,
}

/// One window's contribution to the cumulative sample: bursts with the stable id their window
/// gave them (0 for noise or filtered).
#[derive(Clone, Debug)]
pub(super) struct Chunk {
    pub(super) window: u64,
    bursts: Vec<Burst>,
    labels: Vec<StableId>,
}

#[derive(Clone, Debug, Default)]
pub(super) struct CumulativeSample {
    pub(super) chunks: Vec<Chunk>,
    first: Option<u64>,
    pub(super) stride: u64,
}

impl CumulativeSample {
    pub(super) fn held(&self) -> usize {
        self.chunks.iter().map(|c| c.bursts.len()).sum()
    }

    /// Offers a closed window's sample; returns whether a chunk was taken.
    pub(super) fn offer(
        &mut self,
        window: u64,
        bursts: &[Burst],
        labels: &[StableId],
        params: &OnlineParams,
        window_ns: u64,
    ) -> bool {
        let first = *self.first.get_or_insert(window);
        if self.stride == 0 {
            self.stride = 1;
        }
        if window < first || !(window - first).is_multiple_of(self.stride) || bursts.is_empty() {
            return false;
        }
        let quota = params.max_cumulative_bursts / params.cumulative_chunks;
        let mut order: Vec<usize> = (0..bursts.len()).collect();
        order.sort_by_key(|&i| {
            let b = &bursts[i];
            (b.start_ns, b.rank, b.tid, b.pid, i)
        });
        let slot = mix(window) % u64::from(params.window_slots);
        let slot_start = window * window_ns + slot * (window_ns / u64::from(params.window_slots));
        let begin = order
            .partition_point(|&i| bursts[i].start_ns < slot_start)
            .min(order.len().saturating_sub(quota));
        let taken = &order[begin..(begin + quota).min(order.len())];
        self.chunks.push(Chunk {
            window,
            bursts: taken.iter().map(|&i| bursts[i].clone()).collect(),
            labels: taken.iter().map(|&i| labels[i]).collect(),
        });
        while self.chunks.len() > params.cumulative_chunks {
            self.stride *= 2;
            let stride = self.stride;
            self.chunks
                .retain(|c| (c.window - first).is_multiple_of(stride));
        }
        true
    }

    pub(super) fn bursts(&self) -> (Vec<Burst>, Vec<StableId>) {
        let mut bursts = Vec::with_capacity(self.held());
        let mut labels = Vec::with_capacity(self.held());
        for chunk in &self.chunks {
            bursts.extend(chunk.bursts.iter().cloned());
            labels.extend(chunk.labels.iter().copied());
        }
        (bursts, labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CallSite, Name};

    fn burst(rank: u32) -> Burst {
        Burst {
            pid: 1,
            tid: 1,
            rank,
            start_ns: 0,
            duration_ns: 10,
            oncpu_ns: 10,
            counters: None,
            start_func: Name::new("MPI_Barrier"),
            end_func: Name::new("MPI_Barrier"),
            start_site: CallSite::unknown(1),
            end_site: CallSite::unknown(2),
        }
    }

    #[test]
    fn small_jobs_keep_every_rank_and_large_ones_a_sample_that_fits_the_bound() {
        let params = OnlineParams::default();
        for ranks in [0, 1, 4, 156] {
            let sample = RankSample::new(ranks, &params);
            assert_eq!(sample.kept(), ranks);
            assert!((0..ranks + 10).all(|r| sample.keeps(r)));
        }
        assert_eq!(RankSample::new(4, &params).stratum_quota(&params), 625);
        for ranks in [157, 2_500, 128_000, 1_000_000] {
            let sample = RankSample::new(ranks, &params);
            let kept = (0..ranks).filter(|&r| sample.keeps(r)).count() as u32;
            assert_eq!(kept, sample.kept(), "{ranks} ranks");
            let slots = params.window_slots as usize;
            let fill = kept as usize * slots * sample.stratum_quota(&params) as usize;
            assert!(fill <= params.max_window_bursts, "{ranks} ranks: {fill}");
            assert!(
                fill > params.max_window_bursts - slots * MIN_STRATUM_BURSTS,
                "{ranks} ranks: {fill}"
            );
        }
    }

    #[test]
    fn a_node_with_more_ranks_than_fit_keeps_every_rank_the_job_wide_sample_keeps() {
        let params = OnlineParams::default();
        let job = RankSample::new(128_000, &params);
        // Node 3 of a job of 500-rank nodes: its daemon counts 500 ranks, numbered 1500….
        let node = RankSample::new(500, &params);
        assert_eq!(node.kept(), job.kept());
        let ranks = 1_500..2_000;
        assert!(ranks
            .clone()
            .filter(|&r| job.keeps(r))
            .all(|r| node.keeps(r)));
        let kept = ranks.filter(|&r| node.keeps(r)).count();
        assert!((100..220).contains(&kept), "{kept} of the node's ranks");
    }

    #[test]
    fn every_node_finds_the_same_rank_sample_spread_over_the_nodes() {
        let params = OnlineParams::default();
        let (nodes, per_node) = (2_000u32, 64u32);
        let world = nodes * per_node;
        let aggregator = RankSample::new(world, &params);
        // Ranks placed in blocks (node n runs n·64 …) or round robin (node n runs n, n + 2000, …).
        for placement in [|n, k| n * 64 + k, |n, k| k * 2_000 + n] {
            let mut with_sampled = 0;
            let mut most = 0;
            for n in 0..nodes {
                // A pure function of the rank count: what any node computes is the aggregator's
                // (checked on a few nodes, each draw costing a pass over all ranks).
                if n % 500 == 0 {
                    assert_eq!(RankSample::new(world, &params), aggregator);
                }
                let sampled = (0..per_node)
                    .filter(|&k| aggregator.keeps(placement(n, k)))
                    .count();
                with_sampled += usize::from(sampled > 0);
                most = most.max(sampled);
            }
            // 156 of 128,000 ranks: on about 150 nodes, rarely two on one.
            assert!(with_sampled > 140, "{with_sampled} nodes");
            assert!(most <= 3, "{most} sampled ranks on one node");
        }
    }

    #[test]
    fn a_stratum_keeps_its_quota_and_the_sample_its_bound() {
        let mut buffer = WindowBuffer::default();
        let kept = |b: &mut WindowBuffer, slot, rank, quota| {
            b.add(&[burst(rank)], 10, slot, quota, 100) == 0
        };
        assert!(kept(&mut buffer, 0, 0, 2));
        assert!(kept(&mut buffer, 0, 0, 2));
        assert!(!kept(&mut buffer, 0, 0, 2));
        assert!(!kept(&mut buffer, 0, 0, 2));
        assert!(!kept(&mut buffer, 0, 0, 1), "a smaller quota: still full");
        assert!(kept(&mut buffer, 1, 0, 2), "another slot");
        assert!(kept(&mut buffer, 0, 7, 2), "another rank");
        assert!(kept(&mut buffer, 0, 0, 3), "a larger quota makes room");
        assert!(!kept(&mut buffer, 0, 0, 3));
        assert_eq!(
            (buffer.bursts.len(), buffer.dropped, buffer.seen),
            (5, 4, 9)
        );
        // A run keeps what its stratum has room for, and counts the rest as left out.
        let run = vec![burst(3); 5];
        assert_eq!(buffer.add(&run, 50, 2, 3, 100), 2);
        assert_eq!(buffer.add(&run, 50, 2, 3, 100), 5);
        assert_eq!(
            (buffer.bursts.len(), buffer.dropped, buffer.seen),
            (8, 11, 19)
        );
        assert_eq!(buffer.seen_time_ns, 90 + 100);
        // The sample's bound holds whatever the strata.
        let mut small = WindowBuffer::default();
        assert_eq!(small.add(&[burst(0)], 10, 0, 10, 1), 0);
        assert_eq!(small.add(&[burst(1), burst(1)], 20, 0, 10, 1), 2);
        assert_eq!(small.bursts.len(), 1);
    }
}
