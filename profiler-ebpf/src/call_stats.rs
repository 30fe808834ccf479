//! Per-thread call statistics: `FUNC_STATS`, by thread, function and call site, and in front of
//! it each thread's cache of some of its call sites (`ThreadState::call_cache`), which spares the
//! calls of a code's main loop the hash lookup.

use core::ptr::write_volatile;

use aya_ebpf::{macros::map, maps::HashMap};
use profiler_common::{lost, CachedCallStats, FuncKey, FuncStats, ThreadState, CALL_CACHE_WAYS};

use crate::shared::{count_lost, get_or_insert};

/// Calls, time, bytes and peers per thread, function and call site: the sites no thread's cache
/// holds, and those it held before (`CachedCallStats`).
#[map]
static FUNC_STATS: HashMap<FuncKey, FuncStats> = HashMap::with_max_entries(65536, 0);

/// One call site missing from a thread's cache in this many takes a way: the sites of a main
/// loop that has no more sites than ways are all in the cache after some tens of calls, and a
/// loop with more does not pay a write-back and a lookup at every call, as it would if every
/// missing site took a way.
const TAKE_ONE_IN: u64 = 8;

/// The statistics of the thread's calls of `func` at `site`: in its cache if the site is there or
/// takes a way now (the way's site goes back to `FUNC_STATS`, and the new one goes on from its
/// own `FUNC_STATS` entry, if it has one), else in `FUNC_STATS`. `now`, a clock reading in ns,
/// draws which missing site takes a way, and which way.
#[inline(always)]
pub(crate) fn call_stats(
    st: &mut ThreadState,
    func: u32,
    site: u64,
    now: u64,
) -> Option<&mut FuncStats> {
    let (tid, pid) = (st.tid, st.pid);
    let cached = (0..CALL_CACHE_WAYS).find(|&w| {
        let way = &st.call_cache[w];
        way.stats.calls != 0 && way.func == func && way.site == site
    });
    if let Some(w) = cached {
        return Some(&mut st.call_cache[w].stats);
    }
    let key = FuncKey { tid, func, site };
    let initial = FuncStats {
        pid,
        ..FuncStats::default()
    };
    // The low bits of a nanosecond clock, read a few hundred ns apart, are as good as random.
    if (now >> 4) % TAKE_ONE_IN != 0 {
        return get_or_insert(&FUNC_STATS, &key, initial);
    }
    let way = &mut st.call_cache[((now >> 8) as usize) & (CALL_CACHE_WAYS - 1)];
    write_back(tid, way);
    let stats = unsafe { FUNC_STATS.get(&key) }.copied().unwrap_or(initial);
    // The framed change of CachedCallStats, the daemon may be copying the state meanwhile:
    // volatile stores keep their order (a fence has no BPF instruction).
    let fill = way.fill.wrapping_add(1);
    unsafe {
        write_volatile(&mut way.fill_end, fill);
        write_volatile(&mut way.func, func);
        write_volatile(&mut way.site, site);
        write_volatile(&mut way.stats, stats);
        write_volatile(&mut way.fill, fill);
    }
    Some(&mut way.stats)
}

/// Writes every way of an ending thread's cache back to `FUNC_STATS`, before its state goes.
#[inline(always)]
pub(crate) fn write_back_all(st: &ThreadState) {
    for way in 0..CALL_CACHE_WAYS {
        write_back(st.tid, &st.call_cache[way]);
    }
}

/// Writes a way of thread `tid`'s cache, if it holds a site, to that site's `FUNC_STATS` entry.
#[inline(always)]
fn write_back(tid: u32, way: &CachedCallStats) {
    if way.stats.calls == 0 {
        return;
    }
    let key = FuncKey {
        tid,
        func: way.func,
        site: way.site,
    };
    if let Some(entry) = FUNC_STATS.get_ptr_mut(&key) {
        unsafe { *entry = way.stats };
    } else if FUNC_STATS.insert(&key, &way.stats, 0).is_err() {
        count_lost(lost::THREAD_STATS);
    }
}
