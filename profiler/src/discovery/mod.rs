//! Discovery stage: which MPI libraries a node has and where their functions start (the probe
//! points capture attaches to), which job, rank and node a traced process is, and which code
//! location (module build-id or path, file offset) a traced address is.

mod error;
mod libraries;
mod maps;
mod process;
#[cfg(test)]
mod test_support;

pub use error::DiscoveryError;
pub use libraries::{
    all_process_libraries, build_id, discover_libraries, openmpi_datatype_size_offset,
    probe_points, process_libraries, Binding, MpiFlavor, MpiLibrary, ProbePoint, ProbePoints,
};
pub use maps::{read_maps, AddressResolver, Mapping};
pub use process::{hostname, identify, in_cgroup, IdentitySource, ProcessIdentity};
