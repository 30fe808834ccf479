//! Discovery stage: which MPI libraries a node has and where their functions start (the probe
//! points capture attaches to), which job, rank and node a traced process is, and which code
//! location (module build-id or path, file offset) a traced address is.

mod addresses;
mod elf;
mod error;
mod file_cache;
mod interposers;
mod ld_cache;
mod libraries;
mod probes;
mod process;
#[cfg(test)]
pub(crate) mod test_support;

pub use addresses::AddressResolver;
pub use elf::{build_id, DynamicSymbols, ElfError, LoadSegments};
pub use error::DiscoveryError;
pub use interposers::process_interposers;
pub(crate) use libraries::is_mpi_library_name;
pub use libraries::{
    all_process_libraries, discover_libraries, process_libraries, Binding, MpiFlavor, MpiLibrary,
};
pub use probes::{openmpi_datatype_size_offset, probe_points, ProbePoints};
pub(crate) use process::{cgroups_match, is_launcher, job_cgroup_of, LaunchEnv};
pub use process::{hostname, identify, in_cgroup, IdentitySource, ProcessIdentity};
