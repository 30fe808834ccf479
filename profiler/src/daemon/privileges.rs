//! The capabilities the daemon needs, checked before it loads anything: a daemon without them
//! would otherwise fail later with a bare EPERM from the kernel, or worse, run and quietly see
//! only part of the node (another user's processes unreadable).
//!
//! The set is the one the systemd unit (packaging/systemd/mpiburst.service) grants; root with
//! the full set passes. docs/deploy.md says what fails without each.

/// One capability the daemon needs, and what for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capability {
    /// Bit number in the capability sets (linux/capability.h).
    pub bit: u32,
    pub name: &'static str,
    pub purpose: &'static str,
}

/// Every capability the daemon needs, and no other: CAP_SYS_ADMIN is not among them.
pub const REQUIRED: [Capability; 5] = [
    Capability {
        bit: 39,
        name: "CAP_BPF",
        purpose: "create the BPF maps and load the BPF programs",
    },
    Capability {
        bit: 38,
        name: "CAP_PERFMON",
        purpose: "load tracing programs and attach them to the MPI libraries' uprobes and the \
                  scheduler tracepoints",
    },
    Capability {
        bit: 19,
        name: "CAP_SYS_PTRACE",
        purpose: "read other users' /proc/PID/maps, exe and root, to find the MPI libraries their \
                  processes map and the program each job runs",
    },
    Capability {
        bit: 2,
        name: "CAP_DAC_READ_SEARCH",
        purpose: "read the tracepoints' id and format files in tracefs (/sys/kernel/tracing is \
                  root's alone) and other users' /proc/PID/environ (mode 0400), where the MPI \
                  launcher names the job and the rank",
    },
    Capability {
        bit: CAP_KILL,
        name: "CAP_KILL",
        purpose: "resume (SIGCONT) another user's process that was held at its open of an MPI \
                  library at a new path while the library's probes were attached \
                  (`mpi.hold_new_libraries`), or at a thread's first MPI call while the \
                  scheduler programs were attached again (`capture.scheduler_on_demand`)",
    },
];

const CAP_KILL: u32 = 5;

/// The daemon lacks capabilities it needs; the message names each and what it is for.
#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error(
        "missing capabilities:\n{}\nrun the daemon as root, or as the service user with these \
         capabilities as its systemd unit grants them (packaging/systemd/mpiburst.service, \
         AmbientCapabilities=); see docs/deploy.md",
        list(.0)
    )]
    Missing(Vec<Capability>),
    #[error("cannot read the daemon's capabilities from /proc/self/status: {0}")]
    Unreadable(String),
}

fn list(missing: &[Capability]) -> String {
    missing
        .iter()
        .map(|c| format!("  {}: needed to {}", c.name, c.purpose))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Passes when this process's effective set holds every capability in [`REQUIRED`].
pub fn check(holds_processes: bool) -> Result<(), PrivilegeError> {
    let status =
        crate::proc::own_status().map_err(|e| PrivilegeError::Unreadable(e.to_string()))?;
    let effective = effective_set(&status)
        .ok_or_else(|| PrivilegeError::Unreadable("no CapEff line".into()))?;
    let missing = missing(effective, holds_processes);
    if missing.is_empty() {
        Ok(())
    } else {
        Err(PrivilegeError::Missing(missing))
    }
}

/// Whether this process may resume other users' processes (CAP_KILL is in its effective set).
pub fn can_resume_others() -> bool {
    crate::proc::own_status()
        .ok()
        .and_then(|status| effective_set(&status))
        .is_some_and(|effective| effective & (1 << CAP_KILL) != 0)
}

/// The effective capability set of a /proc/PID/status text (`CapEff:` in hexadecimal).
fn effective_set(status: &str) -> Option<u64> {
    let hex = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))?
        .trim();
    u64::from_str_radix(hex, 16).ok()
}

/// The required capabilities not in `effective`. CAP_KILL only resumes held processes: without
/// `mpi.hold_new_libraries` it is not needed (`capture.scheduler_on_demand` then uses it only
/// where it is there).
fn missing(effective: u64, holds_processes: bool) -> Vec<Capability> {
    REQUIRED
        .into_iter()
        .filter(|c| holds_processes || c.bit != CAP_KILL)
        .filter(|c| effective & (1 << c.bit) == 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_effective_set_from_the_status_text() {
        let status = "Name:\tmpiburst\nCapInh:\t0000000000000000\nCapPrm:\t000000c000080004\n\
                      CapEff:\t000000c000080004\nCapBnd:\t000000c000080004\n";
        assert_eq!(effective_set(status), Some(0xc0_0008_0004));
        assert_eq!(effective_set("Name:\tx\n"), None);
    }

    #[test]
    fn the_unit_set_passes_and_each_missing_capability_is_named() {
        // The set the unit grants (bits 2, 5, 19, 38, 39), and root's full set.
        assert!(missing(0xc0_0008_0024, true).is_empty());
        assert!(missing(0x1ff_ffff_ffff, true).is_empty());
        let names = |set, holds| {
            missing(set, holds)
                .iter()
                .map(|c| c.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names(0xc0_0000_0024, true), ["CAP_SYS_PTRACE"]);
        assert_eq!(names(0, true), REQUIRED.map(|c| c.name));
        // Without holding, CAP_KILL is not asked for.
        assert_eq!(names(0xc0_0008_0004, true), ["CAP_KILL"]);
        assert!(names(0xc0_0008_0004, false).is_empty());
        let text = PrivilegeError::Missing(missing(0x80_0008_0024, true)).to_string();
        assert!(
            text.contains("CAP_PERFMON: needed to load tracing programs"),
            "{text}"
        );
        assert!(text.contains("docs/deploy.md"), "{text}");
    }
}
