//! The file I/O programs (`capture.file_io`): they sit on system call tracepoints and count the
//! reads, writes, opens and closes of the tracked MPI processes.
//!
//! While any system call tracepoint is attached, every system call on the node takes the kernel's
//! traced path, and every file call of every process builds the tracepoint's record before the
//! program can see that its process is not tracked (docs/performance.md, "System-call tax").
//! The programs count only tracked processes, so they are attached only while the daemon tracks
//! one: a node without MPI processes pays nothing for them.

use std::collections::HashSet;

use aya::{
    programs::{trace_point::TracePointLinkId, TracePoint},
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

/// The file I/O programs' links, present while the daemon tracks at least one process.
pub(super) struct FileIoTracepoints {
    /// Each attached (program, event) link; empty while no process is tracked.
    links: Vec<(&'static str, TracePointLinkId)>,
    /// The tracked processes, whose file calls the programs count.
    tracked: HashSet<u32>,
}

impl FileIoTracepoints {
    /// Loads the programs and attaches them once to every event, so that a kernel without one
    /// of the tracepoints fails here, at the daemon's start; then detaches them until the first
    /// process is tracked.
    pub(super) fn load(ebpf: &mut Ebpf) -> Result<FileIoTracepoints, CaptureError> {
        for (name, _) in IO_TRACEPOINTS {
            let program: &mut TracePoint = program_mut(ebpf, name)?;
            program.load().map_err(|source| CaptureError::Program {
                program: name,
                source,
            })?;
        }
        let mut io = FileIoTracepoints {
            links: Vec::new(),
            tracked: HashSet::new(),
        };
        io.attach(ebpf)?;
        io.detach(ebpf)?;
        Ok(io)
    }

    /// Whether the programs are attached (some process is tracked).
    pub(super) fn attached(&self) -> bool {
        !self.links.is_empty()
    }

    /// Counts `pid`'s file calls from now on: attaches the programs if it is the only process
    /// tracked (or if attaching failed before).
    pub(super) fn track(&mut self, ebpf: &mut Ebpf, pid: u32) -> Result<(), CaptureError> {
        self.tracked.insert(pid);
        if self.attached() {
            return Ok(());
        }
        self.attach(ebpf)
    }

    /// Stops counting the file calls of `pids` (ended processes); detaches the programs once no
    /// process is tracked.
    pub(super) fn forget(
        &mut self,
        ebpf: &mut Ebpf,
        pids: &HashSet<u32>,
    ) -> Result<(), CaptureError> {
        self.tracked.retain(|pid| !pids.contains(pid));
        if self.tracked.is_empty() {
            self.detach(ebpf)?;
        }
        Ok(())
    }

    fn attach(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        for (name, events) in IO_TRACEPOINTS {
            for event in events {
                let program: &mut TracePoint = program_mut(ebpf, name)?;
                match program.attach(CATEGORY, event) {
                    Ok(link) => self.links.push((name, link)),
                    Err(source) => {
                        // No half-attached set: the next tracked process tries them all again.
                        let _ = self.detach(ebpf);
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

    fn detach(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        for (name, link) in self.links.drain(..) {
            let program: &mut TracePoint = program_mut(ebpf, name)?;
            program
                .detach(link)
                .map_err(|source| CaptureError::Program {
                    program: name,
                    source,
                })?;
        }
        Ok(())
    }
}
