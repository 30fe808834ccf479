//! What the daemon's loop waits on besides its timers: the kernel's ring buffers (bursts, the
//! opens of MPI libraries by held processes) and the signals that stop it.

use std::os::fd::OwnedFd;

use tokio::{
    io::unix::{AsyncFd, AsyncFdReadyGuard},
    signal::unix::{Signal, SignalKind},
};

use crate::capture::{Capture, CaptureError};

/// The library open ring, for the daemon's loop to wait on; `None` while no process is held.
pub(super) type LibraryOpensReady = Option<AsyncFd<OwnedFd>>;

/// The ring the loop waits on for library opens.
pub(super) fn library_opens_ready(capture: &Capture) -> Result<LibraryOpensReady, CaptureError> {
    let Some(fd) = capture.library_opens_wakeup().transpose()? else {
        return Ok(None);
    };
    readable(fd, "the library open ring buffer").map(Some)
}

/// Waits until a library open is reported; never, when none can be.
pub(super) async fn library_open_reported(
    ready: &LibraryOpensReady,
) -> std::io::Result<AsyncFdReadyGuard<'_, OwnedFd>> {
    match ready {
        Some(fd) => fd.readable().await,
        None => std::future::pending().await,
    }
}

/// A ring buffer's descriptor, for the loop to wait on.
pub(super) fn readable(fd: OwnedFd, what: &str) -> Result<AsyncFd<OwnedFd>, CaptureError> {
    // SAFETY: the AsyncFd owns the descriptor (an OwnedFd), which stays open and names the
    // same ring buffer for as long as the AsyncFd lives.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.map_err(|e| {
        CaptureError::Io {
            what: format!("waiting on {what}"),
            source: e.into(),
        }
    })
}

/// A stream of one signal.
pub(super) fn signal(kind: SignalKind, name: &str) -> Result<Signal, CaptureError> {
    tokio::signal::unix::signal(kind).map_err(|source| CaptureError::Io {
        what: format!("{name} handler"),
        source,
    })
}
