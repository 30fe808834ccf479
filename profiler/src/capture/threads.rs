//! The threads' states as the daemon reads them: the probes' array of thread states
//! (`THREAD_SLOTS`), and the burst totals of live and ended threads put together.
//!
//! Only the slots some thread holds are read, found through `SLOT_OWNERS`, one lookup each. The
//! array is not mapped into the daemon: a mapping of a BPF array is resident in full (the kernel
//! inserts every page at mmap), which would add the whole array, 16,384 states, to the daemon's
//! memory.

use std::collections::BTreeMap;

use aya::maps::{Array, HashMap, MapData};
use profiler_common::{BurstTotals, ThreadLife, ThreadState};

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

fn read(slots: &Array<&MapData, ThreadState>, slot: u32, tid: u32) -> Option<ThreadState> {
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

#[cfg(test)]
mod tests {
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
}
