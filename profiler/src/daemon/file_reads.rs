//! File-system reads for the daemon's loop, each on a thread of the blocking pool with a
//! deadline: a file on a hung NFS or FUSE mount blocks the thread that reads it, never the loop,
//! which goes on draining bursts, answering HTTP and resuming held processes.
//!
//! A read blocked in the kernel cannot be cancelled. Past its deadline it is given up (the loop
//! goes on without its result) and counted stuck until it returns; every later read gets a thread
//! of its own. At most [`MAX_STUCK`] reads are stuck at once: beyond, none is started (each would
//! take a thread for good) until one returns, and the caller goes on without the file.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use tokio::{
    sync::mpsc,
    time::{sleep_until, Instant},
};

/// Reads given up and still running at most, each holding a thread of the blocking pool.
pub(super) const MAX_STUCK: usize = 16;

/// Where a read is: the process and the file it reads now, for the warning when it does not
/// return and for remembering the file as hung.
#[derive(Clone, Default)]
pub(super) struct ReadProgress(Arc<Mutex<Option<(u32, PathBuf)>>>);

impl ReadProgress {
    /// Notes that the read now reaches `path` for process `pid`.
    pub(super) fn reading(&self, pid: u32, path: &Path) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some((pid, path.to_path_buf()));
    }

    fn at(&self) -> Option<(u32, PathBuf)> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// How a read ended, as [`FileReads::next`] reports it.
pub(super) enum Finished<C, T> {
    /// It returned within its deadline, with its result.
    Done(C, T),
    /// Its deadline passed: it is given up, and stuck until it returns.
    TimedOut {
        context: C,
        /// The process and file it was reading, if it had come to one.
        at: Option<(u32, PathBuf)>,
    },
    /// A stuck read returned at last (its file system answers again); its result is dropped.
    Returned {
        at: Option<(u32, PathBuf)>,
        /// From its start to its return.
        took: Duration,
    },
}

struct Pending<C> {
    context: C,
    due: Instant,
    progress: ReadProgress,
}

struct Stuck {
    at: Option<(u32, PathBuf)>,
    since: Instant,
}

/// Reads started by the loop: `C` is what the loop needs back about each one (returned with its
/// result, or at its deadline), `T` a read's result.
pub(super) struct FileReads<C, T> {
    deadline: Duration,
    next_id: u64,
    pending: HashMap<u64, Pending<C>>,
    stuck: HashMap<u64, Stuck>,
    finished_tx: mpsc::UnboundedSender<(u64, T)>,
    finished_rx: mpsc::UnboundedReceiver<(u64, T)>,
}

impl<C, T: Send + 'static> FileReads<C, T> {
    pub(super) fn new(deadline: Duration) -> Self {
        let (finished_tx, finished_rx) = mpsc::unbounded_channel();
        FileReads {
            deadline,
            next_id: 0,
            pending: HashMap::new(),
            stuck: HashMap::new(),
            finished_tx,
            finished_rx,
        }
    }

    /// The deadline of every read.
    pub(super) fn deadline(&self) -> Duration {
        self.deadline
    }

    /// Reads given up and still running.
    pub(super) fn stuck(&self) -> usize {
        self.stuck.len()
    }

    /// Starts `read` on a thread of its own; gives `context` back when [`MAX_STUCK`] reads are
    /// stuck already. Needs the tokio runtime.
    pub(super) fn start(
        &mut self,
        context: C,
        read: impl FnOnce(&ReadProgress) -> T + Send + 'static,
    ) -> Result<(), C> {
        if self.stuck.len() >= MAX_STUCK {
            return Err(context);
        }
        let id = self.next_id;
        self.next_id += 1;
        let progress = ReadProgress::default();
        let (finished, noted) = (self.finished_tx.clone(), progress.clone());
        // The handle is dropped: a read is never awaited, its result comes through the channel.
        drop(tokio::task::spawn_blocking(move || {
            // The receiver lives as long as the daemon's loop.
            let _ = finished.send((id, read(&noted)));
        }));
        self.pending.insert(
            id,
            Pending {
                context,
                due: Instant::now() + self.deadline,
                progress,
            },
        );
        Ok(())
    }

    /// The next read to return, pass its deadline, or return after it; pending for good while
    /// none runs. Cancel safe: state changes only as it returns.
    pub(super) async fn next(&mut self) -> Finished<C, T> {
        loop {
            let first_due = self
                .pending
                .iter()
                .map(|(id, read)| (*id, read.due))
                .min_by_key(|(_, due)| *due);
            let deadline = self.deadline;
            tokio::select! {
                Some((id, result)) = self.finished_rx.recv() => {
                    if let Some(read) = self.pending.remove(&id) {
                        return Finished::Done(read.context, result);
                    }
                    if let Some(stuck) = self.stuck.remove(&id) {
                        return Finished::Returned {
                            at: stuck.at,
                            took: stuck.since.elapsed(),
                        };
                    }
                }
                () = sleep_until(first_due.map_or_else(Instant::now, |(_, due)| due)),
                    if first_due.is_some() =>
                {
                    let Some((id, _)) = first_due else { continue };
                    let Some(read) = self.pending.remove(&id) else { continue };
                    let at = read.progress.at();
                    self.stuck.insert(
                        id,
                        Stuck {
                            at: at.clone(),
                            since: read.due - deadline,
                        },
                    );
                    return Finished::TimedOut {
                        context: read.context,
                        at,
                    };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read that blocks until the test sends on its channel, as one on a hung mount does.
    fn blocked_read(
        pid: u32,
        file: &'static str,
    ) -> (
        std::sync::mpsc::Sender<()>,
        impl FnOnce(&ReadProgress) -> u32 + Send + 'static,
    ) {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let read = move |progress: &ReadProgress| {
            progress.reading(pid, Path::new(file));
            let _ = released.recv();
            pid
        };
        (release, read)
    }

    #[tokio::test]
    async fn a_stuck_read_times_out_while_later_reads_return_and_is_reported_when_it_returns() {
        let deadline = Duration::from_secs(1);
        let mut reads = FileReads::<&str, u32>::new(deadline);
        let (release, read) = blocked_read(7, "/hung/libmpi.so");
        let started = Instant::now();
        reads
            .start("hung", read)
            .unwrap_or_else(|_| panic!("refused"));
        reads
            .start("healthy", |_| 8)
            .unwrap_or_else(|_| panic!("refused"));
        match reads.next().await {
            Finished::Done(context, result) => assert_eq!((context, result), ("healthy", 8)),
            _ => panic!("the healthy read did not return first"),
        }
        match reads.next().await {
            Finished::TimedOut { context, at } => {
                assert_eq!(context, "hung");
                assert_eq!(at, Some((7, PathBuf::from("/hung/libmpi.so"))));
                assert!(started.elapsed() >= deadline);
            }
            _ => panic!("the blocked read did not time out"),
        }
        assert_eq!(reads.stuck(), 1);
        // Another read while the first is stuck gets a thread of its own.
        reads
            .start("later", |_| 9)
            .unwrap_or_else(|_| panic!("refused"));
        assert!(matches!(reads.next().await, Finished::Done("later", 9)));
        release.send(()).unwrap();
        match reads.next().await {
            Finished::Returned { at, took } => {
                assert_eq!(at, Some((7, PathBuf::from("/hung/libmpi.so"))));
                assert!(took >= deadline && took <= started.elapsed());
            }
            _ => panic!("the stuck read's return was not reported"),
        }
        assert_eq!(reads.stuck(), 0);
    }

    #[tokio::test]
    async fn no_read_starts_while_the_most_reads_are_stuck() {
        let mut reads = FileReads::<usize, u32>::new(Duration::from_millis(200));
        let mut releases = Vec::new();
        for i in 0..MAX_STUCK {
            let (release, read) = blocked_read(i as u32, "/hung/libmpi.so");
            releases.push(release);
            reads.start(i, read).unwrap_or_else(|_| panic!("refused"));
        }
        for _ in 0..MAX_STUCK {
            assert!(matches!(reads.next().await, Finished::TimedOut { .. }));
        }
        assert!(matches!(reads.start(99, |_| 0), Err(99)));
        releases[0].send(()).unwrap();
        assert!(matches!(reads.next().await, Finished::Returned { .. }));
        reads
            .start(100, |_| 1)
            .unwrap_or_else(|_| panic!("refused"));
        assert!(matches!(reads.next().await, Finished::Done(100, 1)));
        for release in releases {
            let _ = release.send(());
        }
    }
}
