//! The file I/O programs (`capture.file_io`): they sit on system call tracepoints and count the
//! reads, writes, opens and closes of the tracked MPI processes.
//!
//! While any system call tracepoint is attached, every system call on the node takes the kernel's
//! traced path, and every file call of every process builds the tracepoint's record before the
//! program can see that its process is not tracked (docs/performance.md, "System-call tax").
//! The programs count only tracked processes, so they are attached only while the daemon tracks
//! one (and for a few seconds after, for the next job): a node without MPI processes pays
//! nothing for them.

use std::{
    collections::HashSet,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use aya::{
    programs::{trace_point::TracePointLink, TracePoint},
    Ebpf,
};

use super::{program_mut, tracefs, CaptureError};

/// The file I/O programs and the system call tracepoints each attaches to. Per-syscall
/// tracepoints, not the raw `sys_enter` and `sys_exit` of every system call, so that no other
/// call (sched_yield, poll, futex: the polling of MPI libraries) runs a program. The calls are
/// those of x86_64 that read, write, open or close a file descriptor.
pub(super) const IO_TRACEPOINTS: [(&str, &[&str]); 4] = [
    (
        "io_read_exit",
        &[
            "sys_exit_read",
            "sys_exit_pread64",
            "sys_exit_readv",
            "sys_exit_preadv",
            "sys_exit_preadv2",
        ],
    ),
    (
        "io_write_exit",
        &[
            "sys_exit_write",
            "sys_exit_pwrite64",
            "sys_exit_writev",
            "sys_exit_pwritev",
            "sys_exit_pwritev2",
        ],
    ),
    (
        "io_open_exit",
        &[
            "sys_exit_open",
            "sys_exit_creat",
            "sys_exit_openat",
            "sys_exit_openat2",
        ],
    ),
    ("io_close_enter", &["sys_enter_close"]),
];
const CATEGORY: &str = "syscalls";

/// The offsets of the descriptor argument in the records of the entry tracepoints and of the
/// return value in those of the exit tracepoints of IO_TRACEPOINTS. The programs read each at
/// one offset, so every tracepoint must agree (they share the kernel's record layout).
pub(super) fn field_offsets() -> Result<(u64, u64), CaptureError> {
    let mut fd = None;
    let mut ret = None;
    for event in IO_TRACEPOINTS.iter().flat_map(|(_, events)| events.iter()) {
        let (field, seen) = if event.starts_with("sys_enter_") {
            ("fd", &mut fd)
        } else {
            ("ret", &mut ret)
        };
        let offset = tracefs::field_offset(CATEGORY, event, field)?;
        match *seen {
            None => *seen = Some((event, offset)),
            Some((first, o)) if o != offset => {
                return Err(CaptureError::TracepointFormat {
                    event: format!("{CATEGORY}/{event}"),
                    detail: format!(
                        "field {field} at offset {offset}, but at {o} in {CATEGORY}/{first}; \
                         run with `capture.file_io = false` on this kernel"
                    ),
                })
            }
            Some(_) => {}
        }
    }
    let offset = |seen: Option<(&&str, u64)>| seen.map_or(0, |(_, o)| o);
    Ok((offset(fd), offset(ret)))
}

/// How long the node must have had no tracked process before the programs are detached: jobs
/// often follow each other within seconds, and attaching takes about 1 ms where detaching takes
/// about 1 s.
const DETACH_AFTER: Duration = Duration::from_secs(10);

/// The file I/O programs' links, present while the daemon tracks a process and for
/// DETACH_AFTER after the last one ended.
pub(super) struct FileIoTracepoints {
    /// Each attached (program, event) link; empty while detached.
    links: Vec<TracePointLink>,
    /// The tracked processes, whose file calls the programs count.
    tracked: HashSet<u32>,
    /// Since when no process is tracked, while the links are attached.
    idle_since: Option<Instant>,
    /// The thread that drops the last links, which may still run.
    detaching: Option<JoinHandle<()>>,
}

impl FileIoTracepoints {
    /// Loads the programs, to be attached at the first tracked process. Every event exists: the
    /// capture read each one's format (`field_offsets`).
    pub(super) fn load(ebpf: &mut Ebpf) -> Result<FileIoTracepoints, CaptureError> {
        for (name, _) in IO_TRACEPOINTS {
            let program: &mut TracePoint = program_mut(ebpf, name)?;
            program.load().map_err(|source| CaptureError::Program {
                program: name,
                source,
            })?;
        }
        Ok(FileIoTracepoints {
            links: Vec::new(),
            tracked: HashSet::new(),
            idle_since: None,
            detaching: None,
        })
    }

    /// Whether the programs are attached.
    pub(super) fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// Counts `pid`'s file calls from now on: attaches the programs if they are not (or if
    /// attaching failed before).
    pub(super) fn track(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), CaptureError> {
        self.tracked.insert(pid);
        self.idle_since = None;
        if self.attached() {
            return Ok(());
        }
        // A program attaches to an event once: the links being dropped must be gone first.
        if let Some(detaching) = self.detaching.take() {
            let _ = detaching.join();
        }
        self.attach(ebpf)
    }

    /// Stops counting the file calls of `pids` (ended processes).
    pub(super) fn forget(&mut self, pids: &HashSet<u32>) {
        self.tracked.retain(|pid| !pids.contains(pid));
        if self.tracked.is_empty() && self.attached() && self.idle_since.is_none() {
            self.idle_since = Some(Instant::now());
        }
    }

    /// Detaches the programs once no process has been tracked for DETACH_AFTER.
    pub(super) fn detach_if_idle(&mut self) {
        if self
            .idle_since
            .is_some_and(|since| since.elapsed() >= DETACH_AFTER)
        {
            self.idle_since = None;
            self.detach();
        }
    }

    fn attach(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        for (name, events) in IO_TRACEPOINTS {
            let program: &mut TracePoint = program_mut(ebpf, name)?;
            for event in events {
                let link = program
                    .attach(CATEGORY, event)
                    .and_then(|id| program.take_link(id));
                match link {
                    Ok(link) => self.links.push(link),
                    Err(source) => {
                        // No half-attached set: the next tracked process tries them all again.
                        self.detach();
                        return Err(CaptureError::Program {
                            program: name,
                            source,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// Drops the links on a thread of their own: the kernel waits for a grace period of the
    /// system call tracepoints at each (about 1 s for them all here), which would stall the
    /// daemon's loop.
    fn detach(&mut self) {
        let links = std::mem::take(&mut self.links);
        if links.is_empty() {
            return;
        }
        // Named like every thread of the daemon (never held at an open of an MPI library).
        let spawned = std::thread::Builder::new()
            .name("mpiburst-detach".into())
            .spawn(move || drop(links));
        match spawned {
            Ok(handle) => self.detaching = Some(handle),
            Err(e) => tracing::warn!(
                "cannot start a thread to detach the file I/O programs ({e}): they were detached \
                 in the daemon's loop"
            ),
        }
    }
}
