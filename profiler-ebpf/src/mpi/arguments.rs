//! What the MPI entry probes read from a call's arguments: the bytes of its (count, datatype)
//! pair, with the Open MPI datatype sizes each thread remembers and the epoch that makes them
//! stale, and its peer when that is a rank of MPI_COMM_WORLD.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_ktime_get_ns, bpf_probe_read_user},
    macros::map,
    maps::Array,
};
use profiler_common::{cookie, ThreadState, DTYPE_CACHE_WAYS};

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

/// Argument `index` (0 to 5) of a call at its entry, from its register; 0 for any other index.
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
pub(super) fn world_peer(st: &mut ThreadState, regs: &pt_regs, c: u64) -> Option<i64> {
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
pub(super) fn call_bytes(st: &mut ThreadState, regs: &pt_regs, c: u64, now: u64) -> Option<u64> {
    let count = arg(regs, cookie::count_arg(c)) as i32;
    let handle = arg(regs, cookie::dtype_arg(c));
    let size = match cookie::dtype(c) {
        cookie::DTYPE_OPENMPI => ompi_dtype_size(st, handle, now)?,
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
/// read costs more than the rest of the entry probe), or remembered from this thread's read of
/// the same handle in the same datatype epoch. A new size takes a way drawn from the low bits
/// of `now`: a code alternating a few datatypes soon has each in a way of its own.
#[inline(always)]
fn ompi_dtype_size(st: &mut ThreadState, handle: u64, now: u64) -> Option<u64> {
    // The epoch before the read: a free racing with the read raises it, and the next call reads
    // again.
    let epoch = unsafe { core::ptr::read_volatile(DTYPE_EPOCH.get_ptr(0)?) };
    if epoch != 0 && st.dtype_epoch == epoch && handle != 0 {
        for way in 0..DTYPE_CACHE_WAYS {
            if st.dtype_handles[way] == handle {
                return Some(st.dtype_sizes[way] as u64);
            }
        }
    }
    let addr = handle.checked_add(*OMPI_DTYPE_SIZE_OFFSET.get(0)?)?;
    let size = unsafe { bpf_probe_read_user(addr as *const u64) }.ok()?;
    if size > 1 << 20 {
        return None;
    }
    if st.dtype_epoch != epoch {
        // The sizes remembered in another epoch may belong to freed datatypes.
        st.dtype_handles = [0; DTYPE_CACHE_WAYS];
        st.dtype_epoch = epoch;
    }
    let way = (now as usize) & (DTYPE_CACHE_WAYS - 1);
    st.dtype_handles[way] = handle;
    st.dtype_sizes[way] = size as u32;
    Some(size)
}

/// Makes every thread's remembered datatype sizes stale (at an MPI_Type_free), unless none is
/// remembered because no free is probed. The new epoch is the time: a plain store, as the BPF
/// target has no atomic add, and two frees racing on two CPUs still each store a value no
/// thread has remembered yet.
#[inline(always)]
pub(super) fn raise_dtype_epoch() {
    if let Some(p) = DTYPE_EPOCH.get_ptr_mut(0) {
        if unsafe { core::ptr::read_volatile(p) } != 0 {
            unsafe { core::ptr::write_volatile(p, bpf_ktime_get_ns().max(1)) };
        }
    }
}
