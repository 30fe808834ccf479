//! The launchers `mpi.launchers` may be missing. Between jobs, only the processes that a listed
//! launcher starts are held until the programs detached then are attached again; an MPI process
//! that anything else started is not. Each such parent is named once: as a launcher to list when
//! a listed launcher started it (a wrapper script, a container runtime's starter), for the record
//! otherwise (a shell that ran a singleton, an init that adopted a rank).

use std::collections::HashSet;

use crate::capture::UnlistedParent;

/// The command names of the parents already named.
#[derive(Default)]
pub(super) struct UnlistedLaunchers(HashSet<String>);

impl UnlistedLaunchers {
    /// MPI process `pid` was started by a parent not in `mpi.launchers`: says what that costs,
    /// and what to list when the parent starts ranks for a launcher, once per parent's command
    /// name.
    pub(super) fn report(&mut self, pid: u32, unlisted: UnlistedParent) {
        let UnlistedParent {
            comm,
            ppid,
            parent,
            parent_launched,
        } = unlisted;
        if self.0.contains(&parent) {
            return;
        }
        if parent_launched {
            // The launcher's child is held at its exec, so its MPI libraries are attached in
            // time; only the scheduler programs may come late.
            tracing::warn!(
                "MPI process {pid} ({comm}) was started by pid {ppid} ({parent}), which an MPI \
                 launcher started and which is not in mpi.launchers: between jobs such a process \
                 is not held at its first MPI call, so its first bursts may count wall time as \
                 on-CPU time. If {parent} starts MPI ranks (a wrapper script, a container \
                 starter), add \"{parent}\" (its command name, as `ps -o comm` shows it) to \
                 mpi.launchers. Said once per command name"
            );
        } else {
            tracing::info!(
                "MPI process {pid} ({comm}) was started by pid {ppid} ({parent}), not by an MPI \
                 launcher of mpi.launchers: between jobs such a process is not held, so its first \
                 bursts may count wall time as on-CPU time, and its first calls into an MPI \
                 library at a new path may be missed until the scan after its exec attaches it. \
                 Said once per command name"
            );
        }
        self.0.insert(parent);
    }
}
