//! A job's bursts in memory: the batches of the drains as they came, each shared with the phase
//! analysis that reads it too, so that a burst is held once; the oldest go first when the node's
//! budget is reached.

use std::{
    collections::{vec_deque, VecDeque},
    sync::Arc,
};

use crate::model::Burst;

/// A job's most recent bursts, oldest first, in shared batches; the first batch may begin past
/// bursts already evicted, which stay in memory until the rest of their batch goes.
#[derive(Clone, Debug, Default)]
pub struct Bursts {
    batches: VecDeque<Arc<Vec<Burst>>>,
    /// Bursts of the first batch evicted already.
    skipped: usize,
    len: usize,
}

impl Bursts {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bursts, oldest first.
    pub fn iter(&self) -> Iter<'_> {
        let mut batches = self.batches.iter();
        let current = batches
            .next()
            .map_or([].iter(), |first| first[self.skipped..].iter());
        Iter { batches, current }
    }

    pub fn front(&self) -> Option<&Burst> {
        self.iter().next()
    }

    /// Appends a batch, which the caller may share on (the analysis reads it too).
    pub fn push_batch(&mut self, batch: Arc<Vec<Burst>>) {
        if batch.is_empty() {
            return;
        }
        self.len += batch.len();
        self.batches.push_back(batch);
    }

    /// Appends one burst (a recording's, read one by one): to the last batch unless it is
    /// shared.
    pub fn push_back(&mut self, burst: Burst) {
        self.len += 1;
        if let Some(last) = self.batches.back_mut().and_then(Arc::get_mut) {
            last.push(burst);
        } else {
            self.batches.push_back(Arc::new(vec![burst]));
        }
    }

    /// Drops the `n` oldest bursts, or all there are; returns how many went.
    pub fn evict_oldest(&mut self, n: usize) -> usize {
        let n = n.min(self.len);
        self.len -= n;
        let mut left = n;
        while left > 0 {
            let first = self.batches[0].len() - self.skipped;
            if left < first {
                self.skipped += left;
                break;
            }
            left -= first;
            self.batches.pop_front();
            self.skipped = 0;
        }
        n
    }
}

/// The bursts of [`Bursts`], oldest first.
pub struct Iter<'a> {
    batches: vec_deque::Iter<'a, Arc<Vec<Burst>>>,
    current: std::slice::Iter<'a, Burst>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a Burst;

    fn next(&mut self) -> Option<&'a Burst> {
        loop {
            if let Some(burst) = self.current.next() {
                return Some(burst);
            }
            self.current = self.batches.next()?.iter();
        }
    }
}

impl<'a> IntoIterator for &'a Bursts {
    type Item = &'a Burst;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl Extend<Burst> for Bursts {
    fn extend<I: IntoIterator<Item = Burst>>(&mut self, bursts: I) {
        for burst in bursts {
            self.push_back(burst);
        }
    }
}

impl FromIterator<Burst> for Bursts {
    fn from_iter<I: IntoIterator<Item = Burst>>(bursts: I) -> Self {
        let mut all = Bursts::default();
        all.extend(bursts);
        all
    }
}

/// The bursts in one vector (an ended job's, for its final clustering). Each batch is dropped
/// once copied, and the memory of those freed is given back every 4 MiB (`RELEASE_BYTES`), so
/// that a full budget is not held twice: the vector's pages become resident only as it fills.
impl From<Bursts> for Vec<Burst> {
    fn from(bursts: Bursts) -> Vec<Burst> {
        let mut all = Vec::with_capacity(bursts.len);
        let mut skip = bursts.skipped;
        let mut dropped = 0;
        for batch in bursts.batches {
            all.extend_from_slice(&batch[std::mem::take(&mut skip)..]);
            dropped += batch.len() * std::mem::size_of::<Burst>();
            drop(batch);
            if dropped >= RELEASE_BYTES {
                release_freed_memory();
                dropped = 0;
            }
        }
        if dropped > 0 {
            release_freed_memory();
        }
        all
    }
}

/// How much of the batches [`Vec::from`] drops between two returns of freed memory: each return
/// walks the allocator's free blocks, so one per batch would cost time in the square of their
/// number (a quiet job's drains bring small batches), and one at the end would let the peak
/// grow by the whole budget.
const RELEASE_BYTES: usize = 4 << 20;

/// Gives the memory of freed blocks back to the system. A drain's batch comes from the heap
/// (below the mapping threshold `bounded_heap` sets), and glibc keeps a freed block resident
/// until the heap's top is 64 MiB free: copying a full budget of 200,000 bursts into one vector
/// raised the daemon's peak by the budget's 22 MiB without this.
fn release_freed_memory() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free memory of the allocator's arenas to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Equal when they hold the same bursts in the same order, however batched.
impl PartialEq for Bursts {
    fn eq(&self, other: &Bursts) -> bool {
        self.len == other.len && self.iter().eq(other.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::synthetic::SyntheticJob;

    fn starts(bursts: &Bursts) -> Vec<u64> {
        bursts.iter().map(|b| b.start_ns).collect()
    }

    #[test]
    fn batches_are_held_shared_and_the_oldest_bursts_go_first_across_them() {
        let template = SyntheticJob::three_phases(1, 1, false).bursts()[0].clone();
        let batch = |range: std::ops::Range<u64>| {
            Arc::new(
                range
                    .map(|start_ns| Burst {
                        start_ns,
                        ..template.clone()
                    })
                    .collect::<Vec<_>>(),
            )
        };
        let mut bursts = Bursts::default();
        let first = batch(0..3);
        bursts.push_batch(first.clone());
        bursts.push_batch(batch(3..3));
        bursts.push_batch(batch(3..7));
        // Shared with the analysis: the batch is not copied.
        assert_eq!(Arc::strong_count(&first), 2);
        assert_eq!(starts(&bursts), [0, 1, 2, 3, 4, 5, 6]);

        assert_eq!(bursts.evict_oldest(2), 2);
        assert_eq!(starts(&bursts), [2, 3, 4, 5, 6]);
        assert_eq!(bursts.front().map(|b| b.start_ns), Some(2));
        assert_eq!(bursts.evict_oldest(2), 2);
        assert_eq!(Arc::strong_count(&first), 1, "the emptied batch is dropped");
        assert_eq!(starts(&bursts), [4, 5, 6]);

        // A burst read one by one goes into the last batch unless the analysis shares it.
        bursts.push_back(Burst {
            start_ns: 7,
            ..template.clone()
        });
        let own = batch(8..9);
        bursts.push_batch(own);
        bursts.push_back(Burst {
            start_ns: 9,
            ..template.clone()
        });
        assert_eq!(starts(&bursts), [4, 5, 6, 7, 8, 9]);
        assert_eq!(bursts.len(), 6);
        assert_eq!(
            bursts,
            (4..10)
                .map(|start_ns| Burst {
                    start_ns,
                    ..template.clone()
                })
                .collect()
        );
        assert_eq!(bursts.evict_oldest(10), 6);
        assert!(bursts.is_empty() && bursts.front().is_none());
        assert_eq!(Vec::from(bursts), Vec::<Burst>::new());
    }
}
