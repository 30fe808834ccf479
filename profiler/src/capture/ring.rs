//! The consumer side of the burst ring buffer, which publishes how far it has read once per run
//! of records rather than once per record.
//!
//! The kernel's ring buffer keeps the consumer position in a page of its own. A producer (the
//! probes, on the CPUs of the MPI ranks) reads that position at every reservation and at every
//! commit (the probes ask how full the ring is), so a consumer that stores it after each record
//! moves its cache line from one core to the other twice per record, on both sides. Here it is
//! stored after every [`PUBLISH_EVERY`] records and at the end of a drain.
//!
//! Layout (`kernel/bpf/ringbuf.c`): the consumer page at offset 0, writable; from one page on,
//! the producer page and then the data pages mapped twice in a row, read-only, so that a record
//! that wraps around the end reads as one slice. Each record starts with an 8-byte header whose
//! first word is its length, with a busy bit while it is written and a discard bit.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};

use super::mapping::Mapping;

const HEADER_BYTES: usize = 8;
const BUSY_BIT: u32 = 1 << 31;
const DISCARD_BIT: u32 = 1 << 30;
/// Records read between two stores of the consumer position: the space they held is free for
/// the producers again within one drain of a full ring.
const PUBLISH_EVERY: usize = 4096;

/// A BPF ring buffer map read by this process alone.
pub struct RecordRing {
    fd: OwnedFd,
    consumer: Mapping,
    /// The producer page, then the data pages twice.
    producer: Mapping,
    page: usize,
    mask: usize,
}

// SAFETY: the mappings are only reached through `&mut self` (drain) or read-only.
unsafe impl Send for RecordRing {}

impl RecordRing {
    /// Maps the ring buffer map `fd`, of `bytes` bytes (a power of two, in whole pages).
    pub fn new(fd: OwnedFd, bytes: usize) -> io::Result<Self> {
        // SAFETY: sysconf has no preconditions.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) })
            .map_err(|_| io::Error::other("no page size"))?;
        let consumer = Mapping::new(fd.as_fd(), page, libc::PROT_READ | libc::PROT_WRITE, 0)?;
        let producer = Mapping::new(fd.as_fd(), page + 2 * bytes, libc::PROT_READ, page)?;
        Ok(Self {
            fd,
            consumer,
            producer,
            page,
            mask: bytes - 1,
        })
    }

    fn consumer_pos(&self) -> &AtomicUsize {
        // SAFETY: the first word of the consumer page, aligned, alive as long as self.
        unsafe { self.consumer.ptr.cast::<AtomicUsize>().as_ref() }
    }

    fn producer_pos(&self) -> &AtomicUsize {
        // SAFETY: as above, for the producer page.
        unsafe { self.producer.ptr.cast::<AtomicUsize>().as_ref() }
    }

    /// Hands every committed record to `sink`, in order. Stops at a record still being written:
    /// it is read by the next drain.
    pub fn drain(&mut self, mut sink: impl FnMut(&[u8])) {
        // This process is the only writer of the consumer position.
        let mut pos = self.consumer_pos().load(Ordering::Relaxed);
        let mut published = pos;
        let mut unpublished = 0;
        // SAFETY: the data pages start one page into the producer mapping.
        let data = unsafe { self.producer.ptr.as_ptr().add(self.page) };
        'ring: loop {
            let end = self.producer_pos().load(Ordering::Acquire);
            if pos == end {
                break;
            }
            while pos != end {
                let offset = pos & self.mask;
                // SAFETY: the offset is within the first copy of the data pages, and a header is
                // 8-byte aligned. The kernel commits a record by clearing its busy bit with a
                // fully ordered exchange: Acquire makes the record's bytes visible after it.
                let header =
                    unsafe { (*data.add(offset).cast::<AtomicU32>()).load(Ordering::Acquire) };
                if header & BUSY_BIT != 0 {
                    break 'ring;
                }
                let len = (header & !(BUSY_BIT | DISCARD_BIT)) as usize;
                if header & DISCARD_BIT == 0 {
                    // SAFETY: a committed record is within the ring, and the data pages are
                    // mapped twice, so it is contiguous even where it wraps around.
                    sink(unsafe {
                        std::slice::from_raw_parts(data.add(offset + HEADER_BYTES), len)
                    });
                }
                pos += (HEADER_BYTES + len).next_multiple_of(8);
                unpublished += 1;
                if unpublished == PUBLISH_EVERY {
                    self.consumer_pos().store(pos, Ordering::Release);
                    published = pos;
                    unpublished = 0;
                }
            }
        }
        // Release: the kernel reuses the records' space only after it sees the new position.
        // Not stored when unchanged, which would take the line from the producers for nothing.
        if pos != published {
            self.consumer_pos().store(pos, Ordering::Release);
        }
    }
}

impl AsFd for RecordRing {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}
