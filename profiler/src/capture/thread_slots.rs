//! The daemon's view of the probes' array of thread states (`THREAD_SLOTS`), mapped read-only:
//! finding the MPI calls in progress reads the slots in place instead of making one system call
//! per slot.

use std::io;
use std::mem::{offset_of, size_of};
use std::os::fd::BorrowedFd;

use profiler_common::{BurstTotals, ThreadState, THREAD_SLOT_COUNT};

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
    /// so a copy may be caught between two fields' updates, as a map lookup may; but not
    /// between two lives of a thread: a new thread's state written over an ended one's during
    /// the copy could lend the new life the old one's burst totals. A copy is kept once the
    /// slot still holds the same life afterwards, with no fewer bursts.
    pub(super) fn held(&self) -> impl Iterator<Item = ThreadState> + '_ {
        (0..THREAD_SLOT_COUNT as usize).filter_map(move |i| self.read(i))
    }

    fn read(&self, index: usize) -> Option<ThreadState> {
        // SAFETY: slot `index` lies inside the mapping, which lives as long as self; volatile
        // reads, because the kernel writes the slots.
        unsafe {
            let slot = self.map.ptr.cast::<ThreadState>().as_ptr().add(index);
            let field = |offset: usize| slot.cast::<u8>().add(offset);
            let tid = field(offset_of!(ThreadState, tid)).cast::<u32>();
            let born_ns = field(offset_of!(ThreadState, born_ns)).cast::<u64>();
            let bursts = field(offset_of!(ThreadState, totals) + offset_of!(BurstTotals, bursts))
                .cast::<u64>();
            for _ in 0..3 {
                if std::ptr::read_volatile(tid) == 0 {
                    return None;
                }
                let copy = std::ptr::read_volatile(slot);
                if std::ptr::read_volatile(tid) == copy.tid
                    && std::ptr::read_volatile(born_ns) == copy.born_ns
                    && std::ptr::read_volatile(bursts) >= copy.totals.bursts
                {
                    return Some(copy);
                }
            }
            None
        }
    }
}
