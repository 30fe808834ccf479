//! mpiburst BPF programs: one uprobe session program attached to every MPI entry point, or on
//! kernels without sessions a uprobe/uretprobe pair (the attach cookie says which function it
//! is), the raw sched_switch tracepoint
//! for per-thread on-CPU time and counter virtualisation, sched_process_exec to find new MPI
//! libraries, sched_process_exit for the exit of every thread (its slot of thread state is freed)
//! and of the MPI processes the daemon tracks, and the tracepoints of the file I/O system calls,
//! which count those of the tracked processes.
//!
//! One module per program family:
//! - `mpi` (mpi.rs): the MPI probes `mpi_session`, `mpi_enter`/`mpi_exit` and the empty
//!   `floor_enter`/`floor_exit`, with bursts and per-call statistics; `mpi/arguments.rs` reads
//!   the calls' bytes and peers, `mpi/governor.rs` governs the polling functions.
//! - `scheduler` (scheduler.rs): `sched_switch`, and the empty
//!   `sched_switch_floor` the overhead bench measures it against.
//! - `lifecycle` (lifecycle.rs): `sched_process_exec` and `sched_process_exit`.
//! - `file_io` (file_io.rs): `io_read_exit`, `io_write_exit`, `io_open_exit`, `io_close_enter`.
//! - `libraries` (libraries.rs): `library_open_exit`, which holds a process opening an MPI
//!   library the daemon has not handled; the same hold at a thread's first probed call while the
//!   daemon has the scheduler programs detached.
//!
//! What they share: `threads` (threads.rs), the state of every thread with a probed MPI call;
//! `call_stats` (call_stats.rs), the call statistics per thread, function and call site;
//! `oncpu` (oncpu.rs), on-CPU time and hardware counters; `shared` (shared.rs), the load-time
//! globals, lost-event counts and get-or-insert on hash maps.
#![no_std]
#![no_main]

mod call_stats;
mod file_io;
mod libraries;
mod lifecycle;
mod mpi;
mod oncpu;
mod scheduler;
mod shared;
mod threads;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
