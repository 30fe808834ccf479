//! The daemon's view of the probes' array of thread states (`THREAD_SLOTS`), mapped read-only:
//! finding the MPI calls in progress reads the slots in place instead of making one system call
//! per slot.

use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::BorrowedFd;

use profiler_common::{ThreadState, THREAD_SLOT_COUNT};

use super::mapping::Mapping;

// The kernel lays array elements out every value size rounded up to 8 bytes.
const _: () = assert!(size_of::<ThreadState>().is_multiple_of(8));

pub(super) struct ThreadSlots {
    map: Mapping,
}

// SAFETY: the mapping is only read, and the kernel keeps it alive while mapped.
unsafe impl Send for ThreadSlots {}

impl ThreadSlots {
    /// Maps the array map `fd` (created with BPF_F_MMAPABLE).
    pub(super) fn new(fd: BorrowedFd<'_>) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .map_err(|_| io::Error::other("no page size"))?;
        let len = (THREAD_SLOT_COUNT as usize * size_of::<ThreadState>()).next_multiple_of(page);
        Ok(Self {
            map: Mapping::new(fd, len, libc::PROT_READ, 0)?,
        })
    }

    /// Copies of the states of the threads that hold a slot. The probes write them meanwhile,
    /// so a state may be caught between two fields' updates, as a map lookup may.
    pub(super) fn held(&self) -> impl Iterator<Item = ThreadState> + '_ {
        let base = self.map.ptr.cast::<ThreadState>();
        (0..THREAD_SLOT_COUNT as usize).filter_map(move |i| {
            // SAFETY: slot i lies inside the mapping, which lives as long as self; volatile
            // reads, because the kernel writes the slots.
            unsafe {
                let slot = base.as_ptr().add(i);
                let tid = slot
                    .cast::<u8>()
                    .add(offset_of!(ThreadState, tid))
                    .cast::<u32>();
                (std::ptr::read_volatile(tid) != 0).then(|| std::ptr::read_volatile(slot))
            }
        })
    }
}
