//! The errors of discovery.

use std::path::PathBuf;

use crate::proc::ProcError;

/// Everything that can go wrong while finding MPI libraries, their probe points and the identity
/// of MPI processes. Each message names the cause and what the operator can do about it.
#[derive(Debug, thiserror::Error)]
pub enum DiscoveryError {
    #[error(
        "cannot read {path}: {source}; if it is listed in `mpi.libraries` in the config, \
         correct or remove it there"
    )]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error(
        "{path} is not a readable ELF file ({source}); only shared libraries can be probed, \
         remove it from `mpi.libraries` in the config"
    )]
    Elf {
        path: PathBuf,
        #[source]
        source: object::Error,
    },

    #[error(
        "{path} defines none of the symbols that identify Open MPI or MPICH \
         (ompi_mpi_comm_world, MPIR_Err_return_comm, mpi_fortran_bottom_, MPIR_F_MPI_BOTTOM), \
         so it is not an MPI library mpiburst can probe; remove it from `mpi.libraries` in the config"
    )]
    NotMpi { path: PathBuf },

    #[error(
        "no MPI library found in the ld.so cache, in running processes or in `mpi.libraries`; \
         install Open MPI or MPICH, or list the library files in `mpi.libraries` in the config"
    )]
    NoLibraries,

    #[error(
        "cannot parse the ld.so cache {path}: {detail}; run `ldconfig` to rebuild it, or list the \
         MPI libraries in `mpi.libraries` in the config"
    )]
    LdCache { path: PathBuf, detail: String },

    #[error(
        "{path} does not define `{symbol}` in its dynamic symbol table; this Open MPI build is \
         not supported for datatype sizes (message sizes will be reported as unknown)"
    )]
    MissingSymbol { path: PathBuf, symbol: String },

    #[error(
        "`{symbol}` in {path} lies at {address:#x}, outside the file-backed part of the library; \
         the file is damaged or not a supported Open MPI build"
    )]
    SymbolNotInFile {
        path: PathBuf,
        symbol: String,
        address: u64,
    },

    #[error(
        "the predefined datatypes in {path} do not store their size at a common offset; this \
         Open MPI version has a datatype layout mpiburst does not know (message sizes will be \
         reported as unknown)"
    )]
    DatatypeLayout { path: PathBuf },

    #[error(transparent)]
    Proc(#[from] ProcError),

    #[error(
        "process {pid} has no MPI rank in its environment and maps no MPI library, so it is not \
         an MPI rank"
    )]
    NotMpiProcess { pid: u32 },

    #[error("cannot read the host name: {0}; set `daemon.node` in the config")]
    Hostname(#[source] std::io::Error),
}
