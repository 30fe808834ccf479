//! The launchers `mpi.launchers` may be missing. Between jobs, only the processes that a listed
//! launcher starts are held until the programs detached then are attached again; an MPI process
//! that anything else started (a wrapper script, a container runtime's starter, a launcher not in
//! the list, a shell) is not. The parent of each such process is named once, for the operator.

use std::collections::HashSet;

/// The command names of the parents already named.
#[derive(Default)]
pub(super) struct UnlistedLaunchers(HashSet<String>);

impl UnlistedLaunchers {
    /// MPI process `pid` (`comm`) was started by `parent`, not in `mpi.launchers`: says what
    /// that costs and what to do, once per parent's command name.
    pub(super) fn report(&mut self, pid: u32, ppid: u32, parent: String) {
        if self.0.contains(&parent) {
            return;
        }
        let comm = crate::proc::read_stat(pid).map_or_else(|_| "?".to_string(), |s| s.comm);
        tracing::warn!(
            "MPI process {pid} ({comm}) was started by pid {ppid} ({parent}), which is not in \
             mpi.launchers: between jobs such a process is not held, so its first bursts may \
             count wall time as on-CPU time, and its calls into an MPI library at a new path may \
             be missed. If {parent} starts MPI ranks (a wrapper script, a container starter, \
             another launcher), add \"{parent}\" to mpi.launchers; a program run by hand from a \
             shell is left unheld on purpose. Said once per parent command"
        );
        self.0.insert(parent);
    }
}
