use std::path::PathBuf;

use procfs::{process::Process, ProcError};

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

    #[error("process {pid} exited before discovery could read {path}")]
    ProcessGone { pid: u32, path: PathBuf },

    #[error(
        "cannot read {path} of process {pid}: {source}; run mpiburst as root (or with \
         CAP_SYS_PTRACE) so it can read other users' processes"
    )]
    ProcRead {
        pid: u32,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("unexpected content in {path}: {detail}; is /proc a Linux procfs?")]
    ProcFormat { path: PathBuf, detail: String },

    #[error(
        "process {pid} has no MPI rank in its environment and maps no MPI library, so it is not \
         an MPI rank"
    )]
    NotMpiProcess { pid: u32 },

    #[error("cannot read the host name: {0}; set `daemon.node` in the config")]
    Hostname(#[source] std::io::Error),
}

impl DiscoveryError {
    /// Classifies a failed read of `path` (a file of process `pid` under /proc). ENOENT or ESRCH
    /// mean the process has gone, a normal race for a profiler, unlike a permission problem the
    /// operator must fix.
    pub(crate) fn proc_read(pid: u32, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound
            || source.raw_os_error() == Some(libc::ESRCH)
        {
            DiscoveryError::ProcessGone { pid, path }
        } else {
            DiscoveryError::ProcRead { pid, path, source }
        }
    }

    /// Classifies a failed read of `path` through procfs, as [`DiscoveryError::proc_read`] does
    /// a direct one.
    pub(crate) fn procfs(pid: u32, path: impl Into<PathBuf>, error: ProcError) -> Self {
        let path = path.into();
        match error {
            ProcError::NotFound(_) => DiscoveryError::ProcessGone { pid, path },
            ProcError::PermissionDenied(_) => DiscoveryError::ProcRead {
                pid,
                path,
                source: std::io::ErrorKind::PermissionDenied.into(),
            },
            ProcError::Io(source, _) => DiscoveryError::ProcRead { pid, path, source },
            // procfs reports a read that fails midway as incomplete data, as when the process
            // is reaped meanwhile.
            ProcError::Incomplete(_)
                if matches!(Process::new(pid as i32), Err(ProcError::NotFound(_))) =>
            {
                DiscoveryError::ProcessGone { pid, path }
            }
            ProcError::Incomplete(_) | ProcError::Other(_) | ProcError::InternalError(_) => {
                DiscoveryError::ProcFormat {
                    path,
                    detail: error.to_string(),
                }
            }
        }
    }
}
