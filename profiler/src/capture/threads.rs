//! The threads' states as the daemon reads them: the probes' array of thread states
//! (`THREAD_SLOTS`), and the burst totals and call statistics of live and ended threads put
//! together.
//!
//! Only the slots some thread holds are read, found through `SLOT_OWNERS`, one lookup each. The
//! array is not mapped into the daemon: a mapping of a BPF array is resident in full (the kernel
//! inserts every page at mmap), which would add the whole array, 16,384 states, to the daemon's
//! memory.

use std::collections::BTreeMap;

use aya::maps::{Array, HashMap, MapData};
use profiler_common::{
    BurstTotals, FuncKey, FuncStats, ThreadLife, ThreadState, THREAD_SLOT_COUNT,
};

/// The slot of `THREAD_SLOTS` a thread claims at its first call (the probes' rule).
pub(super) fn slot(tid: u32) -> u32 {
    tid & (THREAD_SLOT_COUNT - 1)
}

/// Copies of the states of the threads that hold a slot. The probes write them meanwhile, so a
/// copy may be caught between two fields' updates, as any lookup may; but not between two lives
/// of a thread: a new thread's state written over an ended one's during the copy could lend the
/// new life the old one's burst totals. A copy is kept once a second one shows the same life,
/// with no fewer bursts.
pub(super) fn held_states(
    owners: &HashMap<&MapData, u32, u32>,
    slots: &Array<&MapData, ThreadState>,
) -> Vec<ThreadState> {
    let mut held: BTreeMap<u32, ThreadState> = BTreeMap::new();
    // Keys met twice (the iteration starts over when the key it stands on is removed) are
    // read twice; a slot claimed during the iteration may be missed, but its thread has had no
    // time to add to its totals.
    for (slot, tid) in owners.iter().filter_map(Result::ok) {
        if let Some(state) = read(slots, slot, tid) {
            held.insert(slot, state);
        }
    }
    held.into_values().collect()
}

/// A copy of thread `tid`'s state in `slot`, if the thread holds it (see `held_states`).
pub(super) fn read(
    slots: &Array<&MapData, ThreadState>,
    slot: u32,
    tid: u32,
) -> Option<ThreadState> {
    for _ in 0..3 {
        let copy = slots.get(&slot, 0).ok()?;
        // Claimed but not yet written, or freed since: the thread's totals are not here.
        if copy.tid != tid {
            return None;
        }
        let again = slots.get(&slot, 0).ok()?;
        if again.tid == copy.tid
            && again.born_ns == copy.born_ns
            && again.totals.bursts >= copy.totals.bursts
        {
            return Some(copy);
        }
    }
    None
}

/// The burst totals of every life of a thread: the live ones from their states, the ended ones
/// from `BURST_TOTALS`. The states must be read first: a thread ending in between moves its
/// totals into the map before its state goes, so it is found in one place or both, and then the
/// read with more bursts, the later one, is kept.
pub(super) fn burst_totals_by_life(
    states: &[ThreadState],
    ended: impl IntoIterator<Item = (ThreadLife, BurstTotals)>,
) -> Vec<(ThreadLife, BurstTotals)> {
    // A state not yet made (born at 0) has no totals.
    let mut by_life: BTreeMap<ThreadLife, BurstTotals> = states
        .iter()
        .filter(|st| st.born_ns != 0)
        .map(|st| (st.life(), st.totals))
        .collect();
    for (life, totals) in ended {
        let kept = by_life.entry(life).or_default();
        if totals.bursts >= kept.bursts {
            *kept = totals;
        }
    }
    by_life.into_iter().collect()
}

/// The call statistics of every thread, function and call site: those in the threads' caches
/// (`CachedCallStats`) and those in `FUNC_STATS`. The states must be read first: a site leaving a
/// cache is written to the map before its way changes, so it is found in one place or both, and
/// then each statistic's larger value, the later one, is kept.
pub(super) fn call_stats_by_key(
    states: &[ThreadState],
    hashed: impl IntoIterator<Item = (FuncKey, FuncStats)>,
) -> Vec<(FuncKey, FuncStats)> {
    let mut by_key: BTreeMap<FuncKey, FuncStats> = states
        .iter()
        .flat_map(|st| st.call_cache.iter().filter_map(|way| way.entry(st.tid)))
        .collect();
    for (key, stats) in hashed {
        by_key
            .entry(key)
            .and_modify(|kept| *kept = later(kept, &stats))
            .or_insert(stats);
    }
    by_key.into_iter().collect()
}

/// Two reads of one key's call statistics put together: every statistic only grows.
fn later(a: &FuncStats, b: &FuncStats) -> FuncStats {
    FuncStats {
        pid: a.pid,
        _pad: 0,
        calls: a.calls.max(b.calls),
        time_ns: a.time_ns.max(b.time_ns),
        bytes: a.bytes.max(b.bytes),
        sized_calls: a.sized_calls.max(b.sized_calls),
        world_peer_calls: a.world_peer_calls.max(b.world_peer_calls),
        world_peer_sum: a.world_peer_sum.max(b.world_peer_sum),
    }
}

#[cfg(test)]
mod tests {
    use profiler_common::CachedCallStats;

    use super::*;

    fn state(pid: u32, tid: u32, born_ns: u64, bursts: u64) -> ThreadState {
        ThreadState {
            pid,
            tid,
            born_ns,
            totals: totals(pid, bursts),
            ..ThreadState::default()
        }
    }

    fn totals(pid: u32, bursts: u64) -> BurstTotals {
        BurstTotals {
            pid,
            bursts,
            burst_ns: bursts * 1000,
            ..BurstTotals::default()
        }
    }

    fn life(tid: u32, born_ns: u64) -> ThreadLife {
        ThreadLife {
            tid,
            _pad: 0,
            born_ns,
        }
    }

    #[test]
    fn a_thread_read_alive_and_ended_counts_once_with_its_later_totals() {
        let merged = burst_totals_by_life(&[state(7, 70, 5, 10)], [(life(70, 5), totals(7, 12))]);
        assert_eq!(merged, vec![(life(70, 5), totals(7, 12))]);
    }

    #[test]
    fn each_life_of_a_reused_tid_counts_for_its_own_process() {
        let merged = burst_totals_by_life(
            &[state(8, 70, 9, 3)],
            [(life(70, 5), totals(7, 12)), (life(71, 6), totals(7, 1))],
        );
        assert_eq!(
            merged,
            vec![
                (life(70, 5), totals(7, 12)),
                (life(70, 9), totals(8, 3)),
                (life(71, 6), totals(7, 1)),
            ]
        );
    }

    #[test]
    fn a_state_not_yet_made_adds_nothing() {
        let merged = burst_totals_by_life(&[state(0, 0, 0, 0)], []);
        assert!(merged.is_empty());
    }

    fn calls(pid: u32, calls: u64, time_ns: u64) -> FuncStats {
        FuncStats {
            pid,
            calls,
            time_ns,
            ..FuncStats::default()
        }
    }

    fn cached(func: u32, site: u64, stats: FuncStats) -> CachedCallStats {
        CachedCallStats {
            fill: 3,
            func,
            site,
            stats,
            fill_end: 3,
            _pad: 0,
        }
    }

    fn key(tid: u32, func: u32, site: u64) -> FuncKey {
        FuncKey { tid, func, site }
    }

    #[test]
    fn a_call_site_read_in_a_cache_and_in_the_map_counts_once_with_its_later_statistics() {
        let mut st = state(7, 70, 5, 1);
        st.call_cache[0] = cached(2, 0x40, calls(7, 12, 900));
        st.call_cache[1] = cached(3, 0x80, calls(7, 5, 50));
        let merged = call_stats_by_key(
            &[st],
            [
                // Written back after the state was read: newer than its copy.
                (key(70, 3, 0x80), calls(7, 6, 60)),
                // Written back before the site came back into the cache: older.
                (key(70, 2, 0x40), calls(7, 10, 700)),
                (key(71, 2, 0x40), calls(7, 1, 10)),
            ],
        );
        assert_eq!(
            merged,
            vec![
                (key(70, 2, 0x40), calls(7, 12, 900)),
                (key(70, 3, 0x80), calls(7, 6, 60)),
                (key(71, 2, 0x40), calls(7, 1, 10)),
            ]
        );
    }

    #[test]
    fn empty_ways_and_ways_copied_while_another_site_took_them_are_left_out() {
        let mut st = state(7, 70, 5, 1);
        st.call_cache[0] = cached(2, 0x40, calls(7, 12, 900));
        // Caught midway: the new site's fill_end is written, its fill not yet.
        st.call_cache[1] = CachedCallStats {
            fill_end: 4,
            ..cached(3, 0x80, calls(7, 5, 50))
        };
        let merged = call_stats_by_key(&[st], []);
        assert_eq!(merged, vec![(key(70, 2, 0x40), calls(7, 12, 900))]);
    }
}
