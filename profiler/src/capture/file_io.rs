//! The file I/O programs (`capture.file_io`): they sit on system call tracepoints and count the
//! reads, writes, opens and closes of the tracked MPI processes.
//!
//! While any system call tracepoint is attached, every system call on the node takes the kernel's
//! traced path, and every file call of every process builds the tracepoint's record before the
//! program can see that its process is not tracked (docs/performance.md, "System-call tax").
//! The programs count only tracked processes, so they are attached only while the daemon tracks
//! one (and for a few seconds after, for the next job): a node without MPI processes pays
//! nothing for them.

use std::time::{Duration, Instant};

use aya::{
    programs::{trace_point::TracePointLink, TracePoint},
    Ebpf,
};

use super::{
    on_demand::{self, OnDemandLinks},
    tracefs, CaptureError,
};

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

/// The file I/O programs, attached while the daemon tracks a process and for
/// `capture.detach_idle_after_s` after the last one ended.
pub(super) struct FileIoTracepoints {
    links: OnDemandLinks<TracePointLink>,
}

impl FileIoTracepoints {
    /// Loads the programs, to be attached at the first tracked process. Every event exists: the
    /// capture read each one's format (`field_offsets`).
    pub(super) fn load(ebpf: &mut Ebpf) -> Result<FileIoTracepoints, CaptureError> {
        let names = IO_TRACEPOINTS.map(|(name, _)| name);
        on_demand::load_programs(ebpf, names, TracePoint::load)?;
        Ok(FileIoTracepoints {
            links: OnDemandLinks::new("file I/O programs"),
        })
    }

    /// Whether the programs are attached.
    pub(super) fn attached(&self) -> bool {
        self.links.attached()
    }

    /// Attaches the programs, unless they are: a process is tracked.
    pub(super) fn attach(&mut self, ebpf: &mut Ebpf) -> Result<(), CaptureError> {
        let places = IO_TRACEPOINTS
            .iter()
            .flat_map(|&(name, events)| events.iter().map(move |&event| (name, event)));
        self.links
            .attach(ebpf, places, |p: &mut TracePoint, event| {
                p.attach(CATEGORY, event).and_then(|id| p.take_link(id))
            })
    }

    /// Detaches the programs once no process has been tracked for `idle_after` (`tracking`:
    /// whether one is now).
    pub(super) fn detach_if_idle(&mut self, tracking: bool, idle_after: Duration, now: Instant) {
        if self.links.idle_long_enough(tracking, now, idle_after) {
            self.links.detach();
        }
    }
}
