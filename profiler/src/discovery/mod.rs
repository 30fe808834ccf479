//! Discovery stage: which MPI libraries a node has and where their functions start (the probe
//! points capture attaches to), which job, rank and node a traced process is, and which code
//! location (module build-id or path, file offset) a traced address is.

mod elf;
mod error;
mod interposers;
mod ld_cache;
mod libraries;
mod maps;
mod probes;
mod process;
#[cfg(test)]
mod test_support;

pub use elf::build_id;
pub use error::DiscoveryError;
pub use interposers::process_interposers;
pub use libraries::{
    all_process_libraries, discover_libraries, in_process_root, process_libraries, Binding,
    MpiFlavor, MpiLibrary,
};
pub use maps::{read_maps, AddressResolver, Mapping};
pub use probes::{openmpi_datatype_size_offset, probe_points, ProbePoint, ProbePoints};
pub use process::{hostname, identify, in_cgroup, IdentitySource, ProcessIdentity};
