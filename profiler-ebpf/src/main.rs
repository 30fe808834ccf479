//! mpiburst BPF programs: one uprobe session program attached to every MPI entry point, or on
//! kernels without sessions a uprobe/uretprobe pair (the attach cookie says which function it
//! is), the raw sched_stat_runtime and sched_switch tracepoints
//! for per-thread on-CPU time and counter virtualisation, sched_process_exec to find new MPI
//! libraries, sched_process_exit for the exit of every thread (its slot of thread state is freed)
//! and of the MPI processes the daemon tracks, and the tracepoints of the file I/O system calls,
//! which count those of the tracked processes.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{
        bpf_perf_event_value, pt_regs, BPF_F_CURRENT_CPU, BPF_NOEXIST, BPF_RB_AVAIL_DATA,
        BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP,
    },
    helpers::{
        bpf_get_attach_cookie, bpf_get_current_pid_tgid, bpf_get_current_task,
        bpf_get_current_task_btf, bpf_ktime_get_ns, bpf_perf_event_read_value,
        bpf_probe_read_kernel, bpf_probe_read_user, bpf_task_pt_regs,
    },
    macros::{map, raw_tracepoint, tracepoint, uprobe, uretprobe},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, PerfEventArray, RingBuf},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext, TracePointContext},
    EbpfContext,
};
mod libraries;

use aya_log_ebpf::warn;
use profiler_common::{
    cookie, lost, mode, BurstRecord, BurstTotals, CpuSwitch, ExecRecord, FuncKey, FuncStats,
    Governance, IoTotals, RankRegion, Sample, StormEvent, TaskThread, ThreadFunc, ThreadLife,
    ThreadState, BURST_HAS_COUNTERS, GOVERNED_FUNCS, NO_FUNC, NUM_COUNTERS, OUTER_BURST_PENDING,
    OUTER_BYTES_DONE, OUTER_PEER_DONE, OUTER_POLLING, OUTER_REGION_START, OUTER_WORLD_PEER,
    STORM_WINDOW_NS, THREAD_SLOT_COUNT,
};

/// Bursts shorter than this are only summed in kernel. Set by the daemon at load time.
#[no_mangle]
static MIN_BURST_NS: u64 = 0;
/// A quarter of the BURSTS ring buffer's size, in bytes: from this much unread data on, every
/// record wakes the daemon.
#[no_mangle]
static RING_WAKE_BYTES: u64 = 0;
/// 1 when the daemon filled the counter arrays with per-CPU perf events.
#[no_mangle]
static COUNTERS_ENABLED: u32 = 0;
/// Field offsets of the classic tracepoints, read by the daemon from their tracefs `format`
/// files at load (they differ between kernel versions).
#[no_mangle]
static EXEC_PID_OFFSET: u64 = 0;
#[no_mangle]
static EXIT_GROUP_DEAD_OFFSET: u64 = 0;
/// The same for the system call tracepoints of the file I/O programs: the descriptor argument
/// of close's entry and the return value of the exits.
#[no_mangle]
static IO_FD_OFFSET: u64 = 0;
#[no_mangle]
static IO_RET_OFFSET: u64 = 0;

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
/// Kernel task (task_struct address) → thread, for the threads with a state: sched_stat_runtime
/// names the task, which may run on another CPU than the one accounting it.
#[map]
static TASK_THREADS: LruHashMap<u64, TaskThread> = LruHashMap::with_max_entries(65536, 0);
/// One bit per hash of the address of every task in TASK_THREADS (bits are never cleared): the
/// scheduler's updates of other tasks, the vast majority, leave after one array read instead
/// of a hash lookup.
#[map]
static TASK_FILTER: Array<u64> = Array::with_max_entries(TASK_FILTER_WORDS, 0);
const TASK_FILTER_BITS: u32 = 16;
const TASK_FILTER_WORDS: u32 = 1 << (TASK_FILTER_BITS - 6);
/// Byte offset of the size field inside an Open MPI datatype object, set by the daemon when it
/// attaches to the first Open MPI library (checked against the library's own predefined
/// datatypes); a map, not a load-time constant, because that library may come long after start.
#[map]
static OMPI_DTYPE_SIZE_OFFSET: Array<u64> = Array::with_max_entries(1, 0);
/// Open MPI datatype epoch, node-wide: 0 while no MPI_Type_free is probed (the probes then read
/// every call's datatype size from the datatype object), set to 1 by the daemon once one is, and
/// changed at every MPI_Type_free entry. A thread reuses the size it read for a datatype handle
/// only within one epoch: a datatype freed and made again can get the same address with another
/// size, but only after a free.
#[map]
static DTYPE_EPOCH: Array<u64> = Array::with_max_entries(1, 0);
#[map]
static FUNC_STATS: HashMap<FuncKey, FuncStats> = HashMap::with_max_entries(65536, 0);
#[map]
static BURST_TOTALS: HashMap<ThreadLife, BurstTotals> = HashMap::with_max_entries(65536, 0);
/// Region of interest per process (by pid).
#[map]
static REGIONS: HashMap<u32, RankRegion> = HashMap::with_max_entries(16384, 0);
/// The last context switch on each CPU.
#[map]
static CPU_SWITCH: PerCpuArray<CpuSwitch> = PerCpuArray::with_max_entries(1, 0);
/// How the governor has each polling function probed, by function id.
#[map]
static GOVERNANCE: Array<Governance> = Array::with_max_entries(GOVERNED_FUNCS, 0);
#[map]
static STORMS: RingBuf = RingBuf::with_byte_size(16 << 10, 0);
/// What the sampling windows of governed functions saw, per thread and function; the daemon
/// takes and deletes the entries after each window.
#[map]
static SAMPLES: HashMap<ThreadFunc, Sample> = HashMap::with_max_entries(4096, 0);
#[map]
static BURSTS: RingBuf = RingBuf::with_byte_size(4 << 20, 0);
/// The execs of every process on the node (16 bytes each: 8,192 per drain of the daemon).
#[map]
static EXECS: RingBuf = RingBuf::with_byte_size(128 << 10, 0);
/// The MPI processes the daemon identified, by pid: the value becomes the process's exit time
/// (0 while it runs).
#[map]
static TRACKED: HashMap<u32, u64> = HashMap::with_max_entries(16384, 0);
/// The same processes as one bit per pid (bit pid % 64 of word pid / 64, up to the kernel's
/// largest pid_max, 2^22), written only by the daemon: their file I/O is counted. Every process
/// on the node passes the test in the file I/O programs, and an array read is far cheaper than
/// a hash lookup.
#[map]
static TRACKED_PIDS: Array<u64> = Array::with_max_entries(1 << 16, 0);
/// (pid << 32 | fd) of the descriptors the tracked processes opened: the files whose reads and
/// writes count.
#[map]
static IO_FILES: LruHashMap<u64, u32> = LruHashMap::with_max_entries(65536, 0);
#[map]
static IO_TOTALS: HashMap<u32, IoTotals> = HashMap::with_max_entries(16384, 0);
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(lost::COUNT, 0);
/// Per-CPU counters, one array per counter: a perf-event array cannot be larger than the number
/// of CPUs.
#[map]
static COUNTER_INSTRUCTIONS: PerfEventArray<u32> = PerfEventArray::new(0);
#[map]
static COUNTER_CYCLES: PerfEventArray<u32> = PerfEventArray::new(0);

#[inline(always)]
fn config<T: Copy>(v: &'static T) -> T {
    // The loader rewrites these globals; a volatile read keeps the compiler from folding the
    // compile-time defaults into the code.
    unsafe { core::ptr::read_volatile(v) }
}

#[inline(always)]
fn count_lost(index: u32) {
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
    // aya-log 0.2 writes to its own ring buffer and does not use the program context.
    warn!(
        (),
        "lost {}; further losses of this kind on this CPU are only counted", what
    );
}

#[inline(always)]
fn read_counter(array: &PerfEventArray<u32>) -> u64 {
    let mut value = bpf_perf_event_value {
        counter: 0,
        enabled: 0,
        running: 0,
    };
    let rc = unsafe {
        bpf_perf_event_read_value(
            array as *const _ as *mut _,
            BPF_F_CURRENT_CPU,
            &mut value,
            core::mem::size_of::<bpf_perf_event_value>() as u32,
        )
    };
    if rc == 0 {
        value.counter
    } else {
        0
    }
}

#[inline(always)]
fn read_counters() -> [u64; NUM_COUNTERS] {
    if config(&COUNTERS_ENABLED) == 0 {
        return [0; NUM_COUNTERS];
    }
    [
        read_counter(&COUNTER_INSTRUCTIONS),
        read_counter(&COUNTER_CYCLES),
    ]
}

/// On-CPU time and counter totals of the running thread (the caller's), up to `now`. The
/// scheduler's own accounting (which leaves out time a hypervisor stole from the virtual CPU,
/// as the thread's CLOCK_THREAD_CPUTIME_ID does) up to its last update, plus the wall time since
/// then or since the thread's switch-in, the last switch on this CPU, whichever is later (a
/// scheduler tick updates the accounting every few ms, so little is left to estimate).
#[inline(always)]
fn thread_now(st: &ThreadState, now: u64) -> (u64, [u64; NUM_COUNTERS]) {
    let mut counters = st.counters;
    let Some(cpu) = CPU_SWITCH.get(0) else {
        return (st.oncpu_ns, counters);
    };
    let since = st.oncpu_accounted_ns.max(cpu.last_switch_ns);
    // 0 until the first update after load: the time in progress is not counted.
    if since == 0 {
        return (st.oncpu_ns, counters);
    }
    if config(&COUNTERS_ENABLED) != 0 {
        let cur = read_counters();
        for i in 0..NUM_COUNTERS {
            counters[i] += cur[i].wrapping_sub(cpu.counters[i]);
        }
    }
    (st.oncpu_ns + now.saturating_sub(since), counters)
}

/// The state of thread `tid`, if it has one: in its slot, else in THREADS.
#[inline(always)]
fn thread(tid: u32) -> Option<&'static mut ThreadState> {
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
fn thread_state(tid: u32, pid: u32) -> Option<&'static mut ThreadState> {
    // Checked at every call, not only the first: the BPF target has no atomic OR, and another
    // CPU setting a bit of the same word at the same moment may undo this one until the next
    // call. Stored only when missing: a store at every call would keep the word's cache line
    // moving between the CPUs that read it at every scheduler update.
    let (word, bit) = task_filter_slot(unsafe { bpf_get_current_task() });
    if let Some(w) = TASK_FILTER.get_ptr_mut(word) {
        if unsafe { *w } & bit == 0 {
            unsafe { *w |= bit };
        }
    }
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
    if TASK_THREADS
        .insert(&task, &TaskThread { tid, pid }, 0)
        .is_err()
    {
        count_lost(lost::THREAD_STATES);
    }
    thread(tid)
}

/// Makes `st` the state of a thread seen for the first time, in place: a state is too large for
/// the BPF stack. Its run time counts from here: the scheduler's updates add to it from now on.
#[inline(always)]
fn start_state(st: &mut ThreadState, tid: u32, pid: u32) {
    let now = unsafe { bpf_ktime_get_ns() };
    unsafe { core::ptr::write_bytes(st as *mut ThreadState, 0, 1) };
    st.pid = pid;
    st.tid = tid;
    st.outer_func = NO_FUNC;
    st.burst_start_func = NO_FUNC;
    st.oncpu_accounted_ns = now;
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

/// The word and bit of a task address in TASK_FILTER (Fibonacci hashing: task_struct addresses
/// share their low bits).
#[inline(always)]
fn task_filter_slot(task: u64) -> (u32, u64) {
    let h = task.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - TASK_FILTER_BITS);
    ((h >> 6) as u32, 1 << (h & 63))
}

#[inline(always)]
fn get_or_insert<K, V>(map: &HashMap<K, V>, key: &K, initial: V) -> Option<&'static mut V> {
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

#[inline(always)]
fn arg(regs: &pt_regs, index: u64) -> u64 {
    // The verifier rejects a context load at a computed offset, which is what a plain match
    // compiles to: load every register at its fixed offset first, then select.
    let [a0, a1, a2, a3, a4, a5] = unsafe {
        use core::ptr::read_volatile as rv;
        [
            rv(&regs.rdi),
            rv(&regs.rsi),
            rv(&regs.rdx),
            rv(&regs.rcx),
            rv(&regs.r8),
            rv(&regs.r9),
        ]
    };
    match index {
        0 => a0,
        1 => a1,
        2 => a2,
        3 => a3,
        4 => a4,
        5 => a5,
        _ => 0,
    }
}

/// Argument `index` of a call at its entry: the first six in registers, the rest on the stack
/// above the return address.
#[inline(always)]
fn any_arg(regs: &pt_regs, index: u64) -> Option<u64> {
    if index < 6 {
        return Some(arg(regs, index));
    }
    let sp = unsafe { core::ptr::read_volatile(&regs.rsp) };
    unsafe { bpf_probe_read_user((sp + 8 * (index - 5)) as *const u64) }.ok()
}

/// The call's peer when it is a rank of MPI_COMM_WORLD: not MPI_ANY_SOURCE or MPI_PROC_NULL
/// (negative in both MPIs), and not a rank of another communicator, whose numbering differs.
#[inline(always)]
fn world_peer(st: &mut ThreadState, regs: &pt_regs, c: u64) -> Option<i64> {
    let peer = arg(regs, cookie::peer_arg(c)) as i32;
    if peer < 0 {
        return None;
    }
    let comm = any_arg(regs, cookie::comm_arg(c))?;
    let world = match cookie::comm(c) {
        cookie::COMM_MPICH => comm as u32 == 0x4400_0000,
        // At an entry probe the instruction pointer is the probe's address; the library's GOT
        // slot for ompi_mpi_comm_world lies at a fixed distance from it, which the daemon
        // measured from the probe's place in the function.
        cookie::COMM_OPENMPI => {
            let ip = unsafe { core::ptr::read_volatile(&regs.rip) };
            let slot = ip.wrapping_add(cookie::world_distance(c) as u64);
            if st.world_slot != slot {
                st.world_comm = unsafe { bpf_probe_read_user(slot as *const u64) }.ok()?;
                st.world_slot = slot;
            }
            comm == st.world_comm
        }
        _ => false,
    };
    world.then_some(peer as i64)
}

/// Bytes of a call's (count, datatype) pair, or None where the datatype size is unknown.
#[inline(always)]
fn call_bytes(st: &mut ThreadState, regs: &pt_regs, c: u64) -> Option<u64> {
    let count = arg(regs, cookie::count_arg(c)) as i32;
    let handle = arg(regs, cookie::dtype_arg(c));
    let size = match cookie::dtype(c) {
        cookie::DTYPE_OPENMPI => ompi_dtype_size(st, handle)?,
        // MPICH builtin datatypes: handle kind "builtin" (01) and object kind "datatype"
        // (0011) in the top six bits; the size sits in bits 8–15.
        cookie::DTYPE_MPICH if (handle as u32) & 0xfc00_0000 == 0x4c00_0000 => (handle >> 8) & 0xff,
        _ => return None,
    };
    if count < 0 {
        return None;
    }
    Some(count as u64 * size)
}

/// The size of the Open MPI datatype `handle` points at: read from the object (a user memory
/// read costs more than the rest of the entry probe), or remembered from this thread's last
/// read of the same handle in the same datatype epoch.
#[inline(always)]
fn ompi_dtype_size(st: &mut ThreadState, handle: u64) -> Option<u64> {
    // The epoch before the read: a free racing with the read raises it, and the next call reads
    // again.
    let epoch = unsafe { core::ptr::read_volatile(DTYPE_EPOCH.get_ptr(0)?) };
    if epoch != 0 && st.dtype_epoch == epoch && st.dtype_handle == handle {
        return Some(st.dtype_size);
    }
    let addr = handle.checked_add(*OMPI_DTYPE_SIZE_OFFSET.get(0)?)?;
    let size = unsafe { bpf_probe_read_user(addr as *const u64) }.ok()?;
    if size > 1 << 20 {
        return None;
    }
    st.dtype_handle = handle;
    st.dtype_size = size;
    st.dtype_epoch = epoch;
    Some(size)
}

/// Closes the open burst at the entry of the call that ends it: sums it into the thread's totals,
/// and keeps it for shipping at that call's return when it passes the filter.
#[inline(always)]
fn close_burst(st: &mut ThreadState, tid: u32, now: u64, end_func: u32) {
    if st.burst_start_ns == 0 {
        return;
    }
    let (oncpu_now, counters_now) = thread_now(st, now);
    let duration = now
        .saturating_sub(st.burst_start_ns)
        .saturating_sub(st.polled_ns);
    // The scheduler accounts runtime on its run-queue clock, a few microseconds behind this
    // clock, so the estimate can pass the wall time of a burst that ran throughout; a thread is
    // never on a CPU longer than the wall time.
    let oncpu = oncpu_now
        .saturating_sub(st.burst_start_oncpu)
        .saturating_sub(st.polled_oncpu)
        .min(duration);
    let start_ns = st.burst_start_ns;
    st.burst_start_ns = 0;

    // The totals are the thread's own, so plain adds are exact: one thread runs on one CPU at a
    // time.
    let totals = &mut st.totals;
    let counters_on = config(&COUNTERS_ENABLED) != 0;
    let mut counters = [0u64; NUM_COUNTERS];
    if counters_on {
        for i in 0..NUM_COUNTERS {
            counters[i] = counters_now[i]
                .wrapping_sub(st.burst_start_counters[i])
                .wrapping_sub(st.polled_counters[i]);
            totals.counters[i] += counters[i];
        }
    }
    totals.bursts += 1;
    totals.burst_ns += duration;
    totals.burst_oncpu_ns += oncpu;
    if duration < config(&MIN_BURST_NS) {
        totals.filtered_bursts += 1;
        totals.filtered_ns += duration;
        return;
    }
    st.pending = BurstRecord {
        pid: st.pid,
        tid,
        start_ns,
        duration_ns: duration,
        oncpu_ns: oncpu,
        counters,
        start_site: st.burst_start_site,
        end_site: 0,
        start_func: st.burst_start_func,
        end_func,
        polling_calls: st.polling_calls,
        flags: if counters_on { BURST_HAS_COUNTERS } else { 0 },
    };
    st.outer_flags |= OUTER_BURST_PENDING;
}

/// Ships the burst kept by `close_burst`, now that its end call site is known.
#[inline(always)]
fn ship_pending(st: &mut ThreadState, site: u64) {
    st.pending.end_site = site;
    let Some(mut entry) = BURSTS.reserve::<BurstRecord>(0) else {
        st.totals.dropped_bursts += 1;
        count_lost(lost::BURSTS);
        return;
    };
    entry.write(st.pending);
    // No wakeup per record: the daemon drains on a timer, and a wakeup costs more than the
    // probe. Once the ring is a quarter full, a burst storm could fill it before the next tick:
    // then every record wakes the daemon until it has drained.
    let filling = BURSTS.query(BPF_RB_AVAIL_DATA as u64) >= config(&RING_WAKE_BYTES);
    let wakeup = if filling {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    entry.submit(wakeup as u64);
}

/// Entry of a probed call, with the thread's state: the outermost call (depth 0) ends the open
/// burst; the first C-level call inside it gives its bytes and peer. Returns whether the call
/// is the outermost one. The caller keeps the depth.
#[inline(always)]
fn enter(st: &mut ThreadState, regs: &pt_regs, c: u64, now: u64, tid: u32, pid: u32) -> bool {
    if c & cookie::DTYPE_FREE != 0 {
        raise_dtype_epoch();
    }
    let outermost = st.depth == 0;
    if outermost {
        st.outer_entry_sp = unsafe { core::ptr::read_volatile(&regs.rsp) };
        st.outer_func = cookie::func(c);
        st.outer_entry_ns = now;
        st.outer_bytes = 0;
        if c & cookie::REGION_END != 0 {
            set_region(pid, |r| r.finalize_entry_ns = now);
        }
        if cookie::polling(c) {
            st.outer_flags = OUTER_POLLING;
            let (oncpu, counters) = thread_now(st, now);
            st.poll_entry_oncpu = oncpu;
            st.poll_entry_counters = counters;
        } else {
            st.outer_flags = if c & cookie::REGION_START != 0 {
                OUTER_REGION_START
            } else {
                0
            };
            close_burst(st, tid, now, cookie::func(c));
        }
    }
    // Bytes come from the first C-level call inside the outermost one (a Fortran wrapper passes
    // pointers; the C call it makes has the values).
    if st.outer_flags & OUTER_BYTES_DONE == 0 && cookie::dtype(c) != cookie::DTYPE_NONE {
        st.outer_flags |= OUTER_BYTES_DONE;
        if let Some(bytes) = call_bytes(st, regs, c) {
            st.outer_bytes = bytes;
        } else {
            st.outer_flags &= !OUTER_BYTES_DONE;
        }
    }
    if st.outer_flags & OUTER_PEER_DONE == 0 && cookie::comm(c) != cookie::COMM_NONE {
        st.outer_flags |= OUTER_PEER_DONE;
        if let Some(peer) = world_peer(st, regs, c) {
            st.outer_peer = peer;
            st.outer_flags |= OUTER_WORLD_PEER;
        }
    }
    outermost
}

/// Return of the outermost call in progress (the depth is back at 0): sums the call, ships the
/// burst it closed and opens the next one at `site`, the return address.
#[inline(always)]
fn outermost_return(st: &mut ThreadState, tid: u32, now: u64, site: u64) {
    let elapsed = now.saturating_sub(st.outer_entry_ns);
    if st.outer_flags & OUTER_REGION_START != 0 {
        set_region(st.pid, |r| r.init_return_ns = now);
    }
    let key = FuncKey {
        tid,
        func: st.outer_func,
        site,
    };
    let initial = FuncStats {
        pid: st.pid,
        ..FuncStats::default()
    };
    if let Some(s) = get_or_insert(&FUNC_STATS, &key, initial) {
        s.calls += 1;
        s.time_ns += elapsed;
        if st.outer_flags & OUTER_BYTES_DONE != 0 {
            s.bytes += st.outer_bytes;
            s.sized_calls += 1;
        }
        if st.outer_flags & OUTER_WORLD_PEER != 0 {
            s.world_peer_calls += 1;
            s.world_peer_sum += st.outer_peer as u64;
        }
    }
    if st.outer_flags & OUTER_POLLING != 0 {
        // A polling call stays inside the burst; only its time is taken out of it.
        let (oncpu, counters) = thread_now(st, now);
        st.polled_ns += elapsed;
        st.polled_oncpu += oncpu.saturating_sub(st.poll_entry_oncpu);
        for i in 0..NUM_COUNTERS {
            st.polled_counters[i] += counters[i].wrapping_sub(st.poll_entry_counters[i]);
        }
        st.polling_calls += 1;
        return;
    }
    if st.outer_flags & OUTER_BURST_PENDING != 0 {
        ship_pending(st, site);
    }
    let (oncpu, counters) = thread_now(st, now);
    st.burst_start_ns = now;
    st.burst_start_func = st.outer_func;
    st.burst_start_site = site;
    st.burst_start_oncpu = oncpu;
    st.burst_start_counters = counters;
    st.polled_ns = 0;
    st.polled_oncpu = 0;
    st.polled_counters = [0; NUM_COUNTERS];
    st.polling_calls = 0;
}

/// The instruction pointer at a return probe: the return address, i.e. the call site. User
/// stacks cannot be walked without frame pointers, but this needs none.
#[inline(always)]
fn return_site(regs: &pt_regs) -> u64 {
    unsafe { core::ptr::read_volatile(&regs.rip) }
}

/// What a probe reads first: the time, and the calling thread and process.
#[inline(always)]
fn probe_start() -> (u64, u32, u32) {
    let now = unsafe { bpf_ktime_get_ns() };
    let id = bpf_get_current_pid_tgid();
    (now, id as u32, (id >> 32) as u32)
}

/// The attach cookie of the probe: which function it is and how to read its arguments.
#[inline(always)]
fn attach_cookie(ctx: &ProbeContext) -> u64 {
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }
}

/// Entry of every probed call where the kernel has no uprobe sessions (before 6.13), paired
/// with `mpi_exit`: the depth counts every call in progress, nested ones included.
#[uprobe]
pub fn mpi_enter(ctx: ProbeContext) -> u32 {
    let (now, tid, pid) = probe_start();
    let Some(st) = thread_state(tid, pid) else {
        return 0;
    };
    enter(
        st,
        unsafe { &*ctx.regs },
        attach_cookie(&ctx),
        now,
        tid,
        pid,
    );
    st.depth += 1;
    0
}

#[uretprobe]
pub fn mpi_exit(ctx: RetProbeContext) -> u32 {
    let now = unsafe { bpf_ktime_get_ns() };
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(st) = thread(tid) else {
        return 0;
    };
    // Depth 0 here means the daemon attached while this call was already running.
    if st.depth == 0 {
        return 0;
    }
    st.depth -= 1;
    if st.depth == 0 {
        outermost_return(st, tid, now, return_site(unsafe { &*ctx.regs }));
    }
    0
}

/// Entry and return of every probed call in one program, attached as a uprobe session (kernel
/// 6.13 and later): an entry that returns 1 has the kernel skip that call's return, so a call
/// nested in another probed call (a Fortran wrapper calling C, an interposer calling PMPI)
/// costs one trap instead of two. Only the outermost call's return runs, and it is told from an
/// entry by the stack pointer: 16-byte aligned, the outermost entry's with the return address
/// popped.
///
/// Not declared with `#[uprobe]`: that macro's wrapper returns 0 whatever the function returns,
/// and the kernel reads a session program's return value.
#[no_mangle]
#[link_section = "uprobe"]
pub fn mpi_session(ctx: *mut core::ffi::c_void) -> u32 {
    session(ProbeContext::new(ctx))
}

/// The body of `mpi_session`: 1 when the kernel is to skip this call's return.
#[inline(always)]
fn session(ctx: ProbeContext) -> u32 {
    let (now, tid, pid) = probe_start();
    let regs = unsafe { &*ctx.regs };
    let sp = unsafe { core::ptr::read_volatile(&regs.rsp) };
    // The ABI keeps the stack 16-byte aligned at every call: an entry sees the stack pointer at
    // the return address, 8 bytes off, and a return sees it back at the caller's, aligned.
    if sp & 15 == 0 {
        // Only the outermost call's return runs; a thread without a state here (its process
        // forked inside the call, say) has no call to end.
        if let Some(st) = thread(tid) {
            if st.depth != 0 && sp == st.outer_entry_sp.wrapping_add(8) {
                st.depth = 0;
                outermost_return(st, tid, now, return_site(regs));
            }
        }
        return 0;
    }
    let Some(st) = thread_state(tid, pid) else {
        return 1;
    };
    // Read at entries only: a return needs none of it.
    let c = attach_cookie(&ctx);
    // An entry from a frame above the call in progress: that call was left without returning
    // (an error handler's longjmp, say), and this one is the outermost. An entry at the same
    // stack pointer is nested: a tail call (a PMPI interposer's `return PMPI_Send(...)`).
    if st.depth != 0 && sp > st.outer_entry_sp {
        st.depth = 0;
    }
    if st.depth == 0 && cookie::polling(c) && governed_entry(st, sp, c, now, tid, pid) {
        return 1;
    }
    if enter(st, regs, c, now, tid, pid) {
        st.depth = 1;
        0
    } else {
        1
    }
}

/// The entry of an outermost polling call, as the governor has the function probed: watches the
/// thread's rate of polling calls, and where the function is not probed in full, counts the call
/// here, at its entry, at the call site the return address at `sp` names. Whether the call was
/// counted (its return is then not probed).
#[inline(always)]
fn governed_entry(st: &mut ThreadState, sp: u64, c: u64, now: u64, tid: u32, pid: u32) -> bool {
    let func = cookie::func(c);
    let governance = GOVERNANCE.get(func).copied().unwrap_or_default();
    let mode = governance.mode;
    if mode != mode::FULL && c & cookie::WRAPPER != 0 {
        // Not counted: the C call it makes is, at its own entry (the depth stays 0 here).
        return true;
    }
    watch_storm(st, func, governance, now, tid, pid);
    if mode == mode::FULL {
        return false;
    }
    let site = unsafe { bpf_probe_read_user(sp as *const u64) }.unwrap_or(0);
    let key = FuncKey { tid, func, site };
    let initial = FuncStats {
        pid,
        ..FuncStats::default()
    };
    if let Some(s) = get_or_insert(&FUNC_STATS, &key, initial) {
        s.calls += 1;
    }
    st.polling_calls += 1;
    if mode == mode::SAMPLED {
        let key = ThreadFunc { tid, func };
        let first = Sample {
            calls: 0,
            first_ns: now,
            last_ns: now,
        };
        if let Some(s) = get_or_insert(&SAMPLES, &key, first) {
            s.calls += 1;
            s.last_ns = now;
        }
    }
    true
}

/// Counts an outermost polling call in the thread's storm watch window, and tells the daemon
/// when the window reaches the function's limit for its mode; a count-only function's window
/// that reaches the limit of full probes is stamped in its `GOVERNANCE` entry. Sampled functions
/// are not watched: the daemon sees their rate in each window.
#[inline(always)]
fn watch_storm(st: &mut ThreadState, func: u32, g: Governance, now: u64, tid: u32, pid: u32) {
    let (mode, limit) = (g.mode, g.storm_calls);
    if limit == 0 || mode == mode::SAMPLED {
        return;
    }
    if now.wrapping_sub(st.storm_start_ns) >= STORM_WINDOW_NS {
        st.storm_start_ns = now;
        st.storm_reported = 0;
        st.storm_calls = 0;
    }
    st.storm_calls += 1;
    // Reached once per window: no more than one store per thread every 10 ms.
    if mode == mode::COUNT_ONLY && st.storm_calls == g.full_storm_calls {
        if let Some(p) = GOVERNANCE.get_ptr_mut(func) {
            unsafe { core::ptr::write_volatile(core::ptr::addr_of_mut!((*p).full_storm_ns), now) };
        }
    }
    // Once per window and mode: a thread that polls two functions in two modes counts both.
    let bit = 1 << (mode & 31);
    if st.storm_calls >= limit && st.storm_reported & bit == 0 {
        st.storm_reported |= bit;
        let event = StormEvent {
            pid,
            tid,
            func,
            mode,
            calls: st.storm_calls,
            _pad: 0,
            window_start_ns: st.storm_start_ns,
            at_ns: now,
        };
        let _ = STORMS.output::<StormEvent>(&event, BPF_RB_FORCE_WAKEUP as u64);
    }
}

/// Makes every thread's remembered datatype sizes stale (at an MPI_Type_free), unless none is
/// remembered because no free is probed. The new epoch is the time: a plain store, as the BPF
/// target has no atomic add, and two frees racing on two CPUs still each store a value no
/// thread has remembered yet.
#[inline(always)]
fn raise_dtype_epoch() {
    if let Some(p) = DTYPE_EPOCH.get_ptr_mut(0) {
        if unsafe { core::ptr::read_volatile(p) } != 0 {
            unsafe { core::ptr::write_volatile(p, bpf_ktime_get_ns().max(1)) };
        }
    }
}

/// Records a region boundary of a process (the first thread to reach it sets it).
#[inline(always)]
fn set_region(pid: u32, set: impl FnOnce(&mut RankRegion)) {
    let Some(region) = get_or_insert(&REGIONS, &pid, RankRegion::default()) else {
        return;
    };
    set(region);
}

/// Empty programs: the bare uprobe + uretprobe cost that `cargo xtask bench overhead` compares
/// the real probes against, on the same function in the same run.
#[uprobe]
pub fn floor_enter(_ctx: ProbeContext) -> u32 {
    0
}

#[uretprobe]
pub fn floor_exit(_ctx: RetProbeContext) -> u32 {
    0
}

// The scheduler programs are raw tracepoints: the kernel skips a classic tracepoint's program
// whenever another BPF program or a BPF map system call is active on the CPU, which would lose
// run time; a raw tracepoint's program is only skipped when it would re-enter itself.

/// Every time the scheduler accounts run time to a task (at every tick, switch, yield and
/// wake-up that updates it, possibly from another CPU): add it to the thread's on-CPU time.
/// It runs for every task on the node, hundreds of thousands of times a second beside processes
/// that poll with sched_yield, hence the filter in front of the lookup.
#[raw_tracepoint(tracepoint = "sched_stat_runtime")]
pub fn sched_stat_runtime(ctx: RawTracePointContext) -> i32 {
    let task: u64 = ctx.arg(0);
    let runtime: u64 = ctx.arg(1);
    let (word, bit) = task_filter_slot(task);
    if TASK_FILTER.get(word).is_none_or(|w| w & bit == 0) {
        return 0;
    }
    let Some(thread) = (unsafe { TASK_THREADS.get(&task) }) else {
        return 0;
    };
    if let Some(st) = self::thread(thread.tid) {
        st.oncpu_ns += runtime;
        st.oncpu_accounted_ns = unsafe { bpf_ktime_get_ns() };
    }
    0
}

/// Every context switch: the thread coming in starts its time on this CPU now. With counters,
/// the per-CPU counts since the last switch belong to the thread leaving (the current task).
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn sched_switch(_ctx: RawTracePointContext) -> i32 {
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(cpu) = CPU_SWITCH.get_ptr_mut(0) else {
        return 0;
    };
    let cpu = unsafe { &mut *cpu };
    let counters_now = read_counters();
    if config(&COUNTERS_ENABLED) != 0 {
        let prev = bpf_get_current_pid_tgid() as u32;
        if let Some(st) = thread(prev) {
            for i in 0..NUM_COUNTERS {
                st.counters[i] += counters_now[i].wrapping_sub(cpu.counters[i]);
            }
        }
    }
    cpu.last_switch_ns = now;
    cpu.counters = counters_now;
    0
}

#[tracepoint]
pub fn sched_process_exec(ctx: TracePointContext) -> u32 {
    let pid: u32 = unsafe { ctx.read_at(config(&EXEC_PID_OFFSET) as usize) }.unwrap_or(0);
    // A new program image: what the thread read from the old one's memory no longer holds.
    if let Some(st) = thread(bpf_get_current_pid_tgid() as u32) {
        st.world_slot = 0;
        // Epochs start at 1: no datatype size is reused until the next read.
        st.dtype_epoch = 0;
    }
    let record = ExecRecord {
        pid,
        _pad: 0,
        exec_ns: unsafe { bpf_ktime_get_ns() },
    };
    if EXECS
        .output::<ExecRecord>(&record, BPF_RB_NO_WAKEUP as u64)
        .is_err()
    {
        count_lost(lost::EXECS);
    }
    0
}

/// The exit of a thread; `group_dead` says it is the last thread of its process.
#[tracepoint]
pub fn sched_process_exit(ctx: TracePointContext) -> u32 {
    release_state(bpf_get_current_pid_tgid() as u32);
    let group_dead: u8 =
        unsafe { ctx.read_at(config(&EXIT_GROUP_DEAD_OFFSET) as usize) }.unwrap_or(0);
    if group_dead == 0 {
        return 0;
    }
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if let Some(exit) = TRACKED.get_ptr_mut(pid) {
        unsafe { *exit = bpf_ktime_get_ns() };
    }
    0
}

/// Ends the state of an exiting thread: keeps its burst totals, and frees its slot for the next
/// thread of its tid modulo THREAD_SLOT_COUNT (or its entry in THREADS). The slot empties before
/// its claim goes: a thread claiming in between finds it still held and keeps its state in
/// THREADS.
#[inline(always)]
fn release_state(tid: u32) {
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

/// Moves the burst totals of a thread state about to end into BURST_TOTALS, before the state
/// goes: the daemon reads the states first and BURST_TOTALS after, so it sees the totals in one
/// place or both (and takes the larger), never in neither.
#[inline(always)]
fn keep_totals(st: &ThreadState) {
    if st.totals.bursts == 0 && st.totals.dropped_bursts == 0 {
        return;
    }
    if BURST_TOTALS.insert(&st.life(), &st.totals, 0).is_err() {
        count_lost(lost::THREAD_STATS);
    }
}

// The file I/O programs sit on the per-syscall tracepoints of the calls they count (attached by
// the daemon, see `capture::IO_TRACEPOINTS`), so no other system call runs any of them. Every
// process on the node makes those calls: the first test, whether the caller's process is
// tracked, is one bit of an array. Reads and writes are counted at their exit alone, which has
// both the descriptor (in the registers the call was made with) and the bytes: an entry
// tracepoint would be a second program run per call, and the kernel copies the data of write
// and pwrite64 into their entry records before any program runs.

/// Whether the calling thread's process is tracked, and its (pid, tid).
#[inline(always)]
fn tracked_caller() -> Option<(u32, u32)> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let word = TRACKED_PIDS.get(pid >> 6)?;
    (word & (1 << (pid & 63)) != 0).then_some((pid, tid))
}

/// The calling thread's I/O totals (its process is tracked).
#[inline(always)]
fn io_totals(pid: u32, tid: u32) -> Option<&'static mut IoTotals> {
    get_or_insert(
        &IO_TOTALS,
        &tid,
        IoTotals {
            pid,
            ..IoTotals::default()
        },
    )
}

/// The IO_FILES key of a descriptor of process `pid`, if it is a counted file.
#[inline(always)]
fn counted_file(pid: u32, fd: u64) -> Option<u64> {
    if fd > u32::MAX as u64 {
        return None;
    }
    let key = ((pid as u64) << 32) | fd;
    unsafe { IO_FILES.get(&key) }?;
    Some(key)
}

/// The value a system call returned, from its exit record.
#[inline(always)]
fn syscall_ret(ctx: &TracePointContext) -> i64 {
    unsafe { ctx.read_at(config(&IO_RET_OFFSET) as usize) }.unwrap_or(-1)
}

/// Exit of a read or write of a tracked process: on a counted file, adds what it returned. The
/// descriptor is the first argument, still in the registers the call was made with.
#[inline(always)]
fn io_exit(ctx: &TracePointContext, write: bool) {
    let Some((pid, tid)) = tracked_caller() else {
        return;
    };
    let regs = unsafe { bpf_task_pt_regs(bpf_get_current_task_btf()) } as *const pt_regs;
    let Ok(fd) = (unsafe { bpf_probe_read_kernel(core::ptr::addr_of!((*regs).rdi)) }) else {
        return;
    };
    if counted_file(pid, fd).is_none() {
        return;
    }
    let ret = syscall_ret(ctx);
    if ret < 0 {
        return;
    }
    let Some(t) = io_totals(pid, tid) else { return };
    if write {
        t.write_bytes += ret as u64;
        t.write_calls += 1;
    } else {
        t.read_bytes += ret as u64;
        t.read_calls += 1;
    }
}

/// Exit of read, pread64, readv, preadv and preadv2.
#[tracepoint]
pub fn io_read_exit(ctx: TracePointContext) -> u32 {
    io_exit(&ctx, false);
    0
}

/// Exit of write, pwrite64, writev, pwritev and pwritev2.
#[tracepoint]
pub fn io_write_exit(ctx: TracePointContext) -> u32 {
    io_exit(&ctx, true);
    0
}

/// Exit of open, creat, openat and openat2: the new descriptor is a file whose reads and writes
/// count.
#[tracepoint]
pub fn io_open_exit(ctx: TracePointContext) -> u32 {
    let Some((pid, tid)) = tracked_caller() else {
        return 0;
    };
    let ret = syscall_ret(&ctx);
    if ret < 0 {
        return 0;
    }
    if let Some(t) = io_totals(pid, tid) {
        t.opens += 1;
    }
    let _ = IO_FILES.insert(&(((pid as u64) << 32) | ret as u64), &1, 0);
    0
}

/// Entry of close: a counted descriptor stops counting (its number may be reused for a pipe).
/// At the entry, not the exit: once closed, the number may already belong to a file another
/// thread opened.
#[tracepoint]
pub fn io_close_enter(ctx: TracePointContext) -> u32 {
    let Some((pid, tid)) = tracked_caller() else {
        return 0;
    };
    let Ok(fd) = (unsafe { ctx.read_at::<u64>(config(&IO_FD_OFFSET) as usize) }) else {
        return 0;
    };
    let Some(key) = counted_file(pid, fd) else {
        return 0;
    };
    let _ = IO_FILES.remove(&key);
    if let Some(t) = io_totals(pid, tid) {
        t.closes += 1;
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
