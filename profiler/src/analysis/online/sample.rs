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
use crate::analysis::tracking::StableId;
use crate::model::Burst;

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
