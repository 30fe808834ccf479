//! Thread state: each thread's `ThreadState` from its first probed MPI call to its exit, in a slot
//! of THREAD_SLOTS or else in THREADS; the map from kernel tasks to threads (with its filter) that
//! the scheduler programs look up; and the burst totals an ended state leaves behind.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_task, bpf_ktime_get_ns},
    macros::map,
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
};
use profiler_common::{
    hold, lost, BurstTotals, TaskThread, ThreadLife, ThreadState, NO_FUNC, THREAD_SLOT_COUNT,
};

use crate::{
    call_stats::write_back_all,
    libraries::{hold_for, launched},
    oncpu::{account_start, scheduler_detached},
    shared::count_lost,
};

/// Thread states, one slot per tid modulo THREAD_SLOT_COUNT. Both probes of every MPI call look
/// their thread up: an array lookup is a few inlined instructions where a hash lookup is a
/// helper call of about 50 ns. A thread holds its slot from its first probed call to its exit; the
/// daemon reads the slots SLOT_OWNERS names.
#[map]
static THREAD_SLOTS: Array<ThreadState> = Array::with_max_entries(THREAD_SLOT_COUNT, 0);
/// Slot → the thread holding it. Inserting with BPF_NOEXIST claims a slot atomically, which a
/// store into the array cannot (the BPF target here has no compare-and-swap).
#[map]
static SLOT_OWNERS: HashMap<u32, u32> = HashMap::with_max_entries(THREAD_SLOT_COUNT, 0);
/// The states of threads whose slot another live thread holds.
#[map]
static THREADS: LruHashMap<u32, ThreadState> = LruHashMap::with_max_entries(THREAD_SLOT_COUNT, 0);
/// Where a state for THREADS is made before its insert (per CPU): a state is too large for the
/// BPF stack.
#[map]
static FRESH_STATE: PerCpuArray<ThreadState> = PerCpuArray::with_max_entries(1, 0);
/// Kernel task (task_struct address) → thread, for the threads with a state: sched_switch names
/// the task coming on a CPU.
#[map]
pub(crate) static TASK_THREADS: LruHashMap<u64, TaskThread> =
    LruHashMap::with_max_entries(65536, 0);
/// One byte per hash of the address of every task in TASK_THREADS, eight to a word (bytes are
/// never cleared): the scheduler's switches of other tasks, the vast majority, leave after one
/// array read instead of a hash lookup. A byte, not a bit: storing a thread's byte cannot undo
/// another CPU's store to a byte beside it, as a read-modify-write of a shared word could (the
/// BPF target here has no atomic OR), so it is stored once, at the thread's first call.
#[map]
static TASK_FILTER: Array<u64> = Array::with_max_entries(TASK_FILTER_WORDS, 0);
const TASK_FILTER_BITS: u32 = 16;
const TASK_FILTER_WORDS: u32 = 1 << (TASK_FILTER_BITS - 3);
/// The burst totals of ended thread states, by thread life (see `keep_totals`).
#[map]
static BURST_TOTALS: HashMap<ThreadLife, BurstTotals> = HashMap::with_max_entries(65536, 0);

/// The state of thread `tid`, if it has one: in its slot, else in THREADS.
#[inline(always)]
pub(crate) fn thread(tid: u32) -> Option<&'static mut ThreadState> {
    // Tid 0 is the idle task, never an MPI thread; it also matches a free slot.
    if tid == 0 {
        return None;
    }
    if let Some(p) = THREAD_SLOTS.get_ptr_mut(tid & (THREAD_SLOT_COUNT - 1)) {
        let st = unsafe { &mut *p };
        if st.tid == tid {
            return Some(st);
        }
    }
    THREADS.get_ptr_mut(tid).map(|p| unsafe { &mut *p })
}

/// The calling thread's state, made at its first probed call.
#[inline(always)]
pub(crate) fn thread_state(tid: u32, pid: u32) -> Option<&'static mut ThreadState> {
    let found = thread(tid);
    if let Some(st) = &found {
        if st.pid == pid {
            return found;
        }
    }
    // A new thread, or this tid's state is from a thread of another process whose exit went
    // unseen.
    if let Some(st) = found {
        keep_totals(st);
        start_state(st, tid, pid);
    } else {
        claim_state(tid, pid);
    }
    let task = unsafe { bpf_get_current_task() };
    mark_profiled(task);
    if TASK_THREADS
        .insert(&task, &TaskThread { tid, pid }, 0)
        .is_err()
    {
        count_lost(lost::THREAD_STATES);
    }
    // Read once the state is made: the daemon detaches the scheduler programs only if it finds
    // no thread state a while after it set the flag, so a new thread is either found or held
    // (if a launcher started its process: libraries.rs).
    if scheduler_detached() && launched(pid) {
        hold_for(pid, hold::FIRST_CALL);
    }
    thread(tid)
}

/// Makes `st` the state of a thread seen for the first time, in place: a state is too large for
/// the BPF stack. Its on-CPU time is the scheduler's from here on (oncpu.rs).
#[inline(always)]
fn start_state(st: &mut ThreadState, tid: u32, pid: u32) {
    let now = unsafe { bpf_ktime_get_ns() };
    unsafe { core::ptr::write_bytes(st as *mut ThreadState, 0, 1) };
    st.pid = pid;
    st.tid = tid;
    st.outer_func = NO_FUNC;
    st.burst_start_func = NO_FUNC;
    account_start(st, unsafe { bpf_get_current_task() }, now);
    st.born_ns = now;
    st.totals.pid = pid;
}

/// Stores a new thread's state: in its slot if no live thread holds it, else in THREADS.
#[inline(always)]
fn claim_state(tid: u32, pid: u32) {
    let slot = tid & (THREAD_SLOT_COUNT - 1);
    // The slot may still be this thread's own claim if a racing first call of another thread
    // of the same slot took THREADS' path.
    let claimed = SLOT_OWNERS.insert(&slot, &tid, BPF_NOEXIST as u64).is_ok()
        || unsafe { SLOT_OWNERS.get(&slot) } == Some(&tid);
    let slot_state = if claimed {
        THREAD_SLOTS.get_ptr_mut(slot)
    } else {
        None
    };
    if let Some(p) = slot_state {
        start_state(unsafe { &mut *p }, tid, pid);
        return;
    }
    let Some(fresh) = FRESH_STATE.get_ptr_mut(0) else {
        return;
    };
    let fresh = unsafe { &mut *fresh };
    start_state(fresh, tid, pid);
    if THREADS.insert(&tid, &*fresh, BPF_NOEXIST as u64).is_err()
        && THREADS.get_ptr_mut(tid).is_none()
    {
        // Another CPU may have inserted it in between; anything else is a full map.
        count_lost(lost::THREAD_STATES);
    }
}

/// The word of a task address in TASK_FILTER and its byte in that word (Fibonacci hashing:
/// task_struct addresses share their low bits).
#[inline(always)]
fn task_filter_slot(task: u64) -> (u32, u64) {
    let h = task.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - TASK_FILTER_BITS);
    ((h >> 3) as u32, h & 7)
}

/// Marks `task` in TASK_FILTER: the scheduler program looks it up from now on.
#[inline(always)]
fn mark_profiled(task: u64) {
    let (word, byte) = task_filter_slot(task);
    if let Some(w) = TASK_FILTER.get_ptr_mut(word) {
        unsafe { (w as *mut u8).add(byte as usize).write_volatile(1) };
    }
}

/// Whether `task` may be a profiled thread: its byte in TASK_FILTER (shared by a few others).
#[inline(always)]
pub(crate) fn maybe_profiled(task: u64) -> bool {
    let (word, byte) = task_filter_slot(task);
    TASK_FILTER
        .get(word)
        .is_some_and(|w| (w >> (byte * 8)) & 0xff != 0)
}

/// Ends the state of an exiting thread: keeps its burst totals, and frees its slot for the next
/// thread of its tid modulo THREAD_SLOT_COUNT (or its entry in THREADS). The slot empties before
/// its claim goes: a thread claiming in between finds it still held and keeps its state in
/// THREADS.
#[inline(always)]
pub(crate) fn release_state(tid: u32) {
    if tid == 0 {
        return;
    }
    let slot = tid & (THREAD_SLOT_COUNT - 1);
    if let Some(p) = THREAD_SLOTS.get_ptr_mut(slot) {
        let st = unsafe { &mut *p };
        if st.tid == tid {
            keep_totals(st);
            st.tid = 0;
            let _ = SLOT_OWNERS.remove(&slot);
            return;
        }
    }
    if let Some(p) = THREADS.get_ptr(tid) {
        keep_totals(unsafe { &*p });
        let _ = THREADS.remove(&tid);
    }
}

/// Moves the burst totals of a thread state about to end into BURST_TOTALS, and its cached call
/// statistics into FUNC_STATS, before the state goes: the daemon reads the states first and the
/// hashes after, so it sees them in one place or both (and takes the larger), never in neither.
#[inline(always)]
fn keep_totals(st: &ThreadState) {
    write_back_all(st);
    if st.totals.bursts == 0 && st.totals.dropped_bursts == 0 {
        return;
    }
    if BURST_TOTALS.insert(&st.life(), &st.totals, 0).is_err() {
        count_lost(lost::THREAD_STATS);
    }
}
