//! What every program family uses: reading the globals the daemon sets at load, counting lost
//! events (and logging the first of each kind), and get-or-insert on hash maps.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use aya_log_ebpf::warn;
use profiler_common::lost;

/// Lost events by kind (`profiler_common::lost`), per CPU.
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(lost::COUNT, 0);

/// The value of a global the daemon sets at load time.
#[inline(always)]
pub(crate) fn config<T: Copy>(v: &'static T) -> T {
    // The loader rewrites these globals; a volatile read keeps the compiler from folding the
    // compile-time defaults into the code.
    unsafe { core::ptr::read_volatile(v) }
}

/// Counts one lost event of kind `index` (`profiler_common::lost`) on this CPU.
#[inline(always)]
pub(crate) fn count_lost(index: u32) {
    if let Some(p) = LOST.get_ptr_mut(index) {
        let count = unsafe { *p } + 1;
        unsafe { *p = count };
        if count == 1 {
            log_first_loss(index);
        }
    }
}

/// Logs the first loss of a kind on this CPU through aya-log (the daemon forwards the record to
/// its log); later ones are only counted (`mpiburst_lost_events_total`). Not inlined: the
/// logging code is one subprogram, out of the probes that call `count_lost`.
#[inline(never)]
fn log_first_loss(index: u32) {
    let what = match index {
        lost::BURSTS => {
            "a burst record: the ring buffer BURSTS is full (raise capture.ring_buffer_mib)"
        }
        lost::EXECS => "an exec notification: the ring buffer EXECS is full",
        lost::THREAD_STATES => "a thread's state: the maps THREADS or TASK_THREADS are full",
        _ => "a thread's statistics: FUNC_STATS, BURST_TOTALS, REGIONS or IO_TOTALS is full",
    };
    // aya-log 0.2 writes to its own ring buffer and does not use the program context. The
    // target, which the daemon's log shows, names the BPF object rather than this module.
    warn!(
        (),
        target: "profiler",
        "lost {}; further losses of this kind on this CPU are only counted", what
    );
}

/// The entry of `key` in `map`, inserted with `initial` if it has none; a full map counts a lost
/// statistic.
#[inline(always)]
pub(crate) fn get_or_insert<K, V>(
    map: &HashMap<K, V>,
    key: &K,
    initial: V,
) -> Option<&'static mut V> {
    if let Some(p) = map.get_ptr_mut(key) {
        return Some(unsafe { &mut *p });
    }
    let _ = map.insert(key, initial, BPF_NOEXIST as u64);
    let p = map.get_ptr_mut(key);
    if p.is_none() {
        count_lost(lost::THREAD_STATS);
    }
    p.map(|p| unsafe { &mut *p })
}
