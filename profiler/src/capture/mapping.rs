//! Shared memory mappings of BPF maps: the burst ring buffer is read in place, without a system
//! call per record.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

/// One shared mapping of a BPF map's descriptor, unmapped on drop.
pub(super) struct Mapping {
    pub(super) ptr: NonNull<u8>,
    len: usize,
}

impl Mapping {
    pub(super) fn new(
        fd: BorrowedFd<'_>,
        len: usize,
        prot: libc::c_int,
        offset: usize,
    ) -> io::Result<Self> {
        let offset = libc::off_t::try_from(offset).map_err(io::Error::other)?;
        // SAFETY: a fresh shared mapping of a descriptor we hold; nothing else refers to it.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast()).ok_or_else(|| io::Error::other("mmap returned 0"))?;
        Ok(Self { ptr, len })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer referred to.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
