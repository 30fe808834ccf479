//! MPI library discovery: which files implement MPI on this node, and which MPI and language
//! binding each one is.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::elf::{build_id, DynamicSymbols};
use super::error::DiscoveryError;
use super::file_cache::{FileCache, FILES_CACHED};
use super::ld_cache::{self, LD_CACHE};
use crate::proc::{self, read_maps};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MpiFlavor {
    OpenMpi,
    Mpich,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Binding {
    C,
    Fortran,
    /// A library of the application's (often preloaded) that defines C MPI functions and calls
    /// the MPI library's PMPI_* ones: a PMPI interposer (a tool, a tracer, a wrapper).
    Interposer,
}

/// One MPI library file. Its identity is (`dev`, `inode`): the same file reached through several
/// names (symlinks, the ld.so cache, process maps, the config) is attached once.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MpiLibrary {
    /// Canonical path, symlinks resolved.
    pub path: PathBuf,
    pub dev: u64,
    pub inode: u64,
    pub flavor: MpiFlavor,
    pub binding: Binding,
    /// GNU build-id in hex.
    pub build_id: Option<String>,
}

/// by the Fortran `MPI_BOTTOM` common block, which `libmpi_mpifh` only imports (it lives in
/// `libmpi`), so for those a reference counts as much as a definition.
struct Signature {
    flavor: MpiFlavor,
    binding: Binding,
    symbol: &'static str,
}

/// C first: `libmpi.so` also defines the Open MPI Fortran signature.
const SIGNATURES: [Signature; 4] = [
    Signature {
        flavor: MpiFlavor::OpenMpi,
        binding: Binding::C,
        symbol: "ompi_mpi_comm_world",
    },
    Signature {
        flavor: MpiFlavor::Mpich,
        binding: Binding::C,
        symbol: "MPIR_Err_return_comm",
    },
    Signature {
        flavor: MpiFlavor::OpenMpi,
        binding: Binding::Fortran,
        symbol: "mpi_fortran_bottom_",
    },
    Signature {
        flavor: MpiFlavor::Mpich,
        binding: Binding::Fortran,
        symbol: "MPIR_F_MPI_BOTTOM",
    },
];

/// What a library file's contents say: which of SIGNATURES its dynamic symbols show, and its
/// build-id if it shows one. Read once per file version: every rank of a node maps the same
/// libraries, and the dynamic symbols of one take about a millisecond to read.
#[derive(Clone)]
struct Contents {
    shows: [bool; SIGNATURES.len()],
    build_id: Option<String>,
}

static CONTENTS: FileCache<Contents> = FileCache::new(FILES_CACHED);

impl Contents {
    fn read(path: &Path) -> Result<Self, DiscoveryError> {
        let symbols = DynamicSymbols::read(path)?;
        let shows = SIGNATURES.map(|s| match s.binding {
            Binding::C => symbols.defines(s.symbol),
            Binding::Fortran => symbols.defines(s.symbol) || symbols.imports(s.symbol),
            Binding::Interposer => false,
        });
        let build_id = if shows.contains(&true) {
            build_id(path)?
        } else {
            None
        };
        Ok(Contents { shows, build_id })
    }
}

impl MpiLibrary {
    /// Opens and classifies one library file. The name gives the binding and a first guess at
    /// the flavour; the dynamic symbols decide, because MPICH derivatives (MVAPICH, Intel MPI)
    /// ship their C library as `libmpi.so.12`.
    pub fn open(path: &Path) -> Result<Self, DiscoveryError> {
        let canonical = std::fs::canonicalize(path).map_err(|source| DiscoveryError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::open_as(&canonical, &canonical)
    }

    /// Opens and classifies the file at `access`, a path used as it is: /proc/PID/fd/FD or
    /// /proc/PID/root/PATH reach the file a process opened or maps in its own mount namespace
    /// (a container), where resolving the path first would lead back into the daemon's. `name`
    /// is the file's name as the process knows it, for the flavour and binding it suggests.
    pub fn open_as(access: &Path, name: &Path) -> Result<Self, DiscoveryError> {
        let meta = std::fs::metadata(access).map_err(|source| DiscoveryError::Read {
            path: access.to_path_buf(),
            source,
        })?;
        let contents = CONTENTS.get_or_read(&meta, || Contents::read(access))?;
        let guess = name
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(guess_from_name);
        let mut candidates: Vec<&Signature> = SIGNATURES
            .iter()
            .zip(contents.shows)
            .filter(|&(s, shown)| shown && guess.is_none_or(|(_, binding)| s.binding == binding))
            .map(|(s, _)| s)
            .collect();
        if let Some((flavor, _)) = guess {
            candidates.sort_by_key(|s| s.flavor != flavor);
        }
        let Some(signature) = candidates.first() else {
            return Err(DiscoveryError::NotMpi {
                path: access.to_path_buf(),
            });
        };
        Ok(MpiLibrary {
            build_id: contents.build_id,
            path: access.to_path_buf(),
            dev: meta.dev(),
            inode: meta.ino(),
            flavor: signature.flavor,
            binding: signature.binding,
        })
    }
}

/// Flavour and binding suggested by a file name such as `libmpich.so.12.2.2`, or `None` when the
/// name is not one of the MPI library names looked for automatically. `libmpichcxx` and
/// `libmpi_cxx` are left out: the C++ bindings call the C library, which is probed anyway.
fn guess_from_name(file_name: &str) -> Option<(MpiFlavor, Binding)> {
    let stem = file_name
        .strip_suffix(".so")
        .or_else(|| file_name.split_once(".so.").map(|(stem, _)| stem))?;
    match stem {
        "libmpi" => Some((MpiFlavor::OpenMpi, Binding::C)),
        "libmpi_mpifh" | "libmpi_usempif08" | "libmpi_usempi_ignore_tkr" | "libmpi_usempi" => {
            Some((MpiFlavor::OpenMpi, Binding::Fortran))
        }
        "libmpich" => Some((MpiFlavor::Mpich, Binding::C)),
        "libmpichfort" | "libmpifort" | "libmpichf90" => Some((MpiFlavor::Mpich, Binding::Fortran)),
        _ => None,
    }
}

/// Whether a mapped file is named like an MPI library, without opening it.
pub(crate) fn is_mpi_library_name(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(guess_from_name)
        .is_some()
}

/// All MPI libraries on this node: those in `extra` (from the config), those the ld.so cache
/// knows, and those mapped by running processes, each file once. A path in `extra` that is not
/// an MPI library is an error, since the operator asked for it; unusable files found
/// automatically are only logged.
pub fn discover_libraries(extra: &[PathBuf]) -> Result<Vec<MpiLibrary>, DiscoveryError> {
    let mut found = extra
        .iter()
        .map(|p| MpiLibrary::open(p))
        .collect::<Result<Vec<_>, _>>()?;
    let is_mpi_soname = |soname: &str| guess_from_name(soname).is_some();
    match ld_cache::library_paths(Path::new(LD_CACHE), is_mpi_soname) {
        Ok(paths) => {
            for path in paths {
                match MpiLibrary::open(&path) {
                    Ok(lib) => found.push(lib),
                    Err(e) => tracing::warn!(error = %e, "skipping library from the ld.so cache"),
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "ld.so cache not searched"),
    }
    found.extend(all_process_libraries());
    let mut seen = HashSet::new();
    found.retain(|lib| seen.insert((lib.dev, lib.inode)));
    if found.is_empty() {
        return Err(DiscoveryError::NoLibraries);
    }
    Ok(found)
}

/// The MPI libraries mapped by one process. A mapped file is reached by its path on the host;
/// where that path names another file or none (the process runs in its own mount namespace, a
/// container), through the process's root, /proc/PID/root/PATH, which a probe attached by path
/// reaches as well. A file replaced under the process (deleted) is skipped, and so is one for
/// which `may_read` (asked with the mapped path before the file is touched) says no.
pub fn process_libraries(
    pid: u32,
    may_read: &dyn Fn(&Path) -> bool,
) -> Result<Vec<MpiLibrary>, DiscoveryError> {
    let mut seen = HashSet::new();
    let mut libraries = Vec::new();
    for mapping in read_maps(pid)? {
        let Some(path) = mapping
            .path
            .filter(|p| !mapping.deleted && is_mpi_library_name(p))
        else {
            continue;
        };
        if !seen.insert(mapping.inode) || !may_read(&path) {
            continue;
        }
        let opened = MpiLibrary::open(&path)
            .ok()
            .filter(|lib| lib.inode == mapping.inode)
            .map(Ok)
            .unwrap_or_else(|| MpiLibrary::open_as(&proc::in_root(pid, &path), &path));
        match opened {
            Ok(lib) if lib.inode == mapping.inode => libraries.push(lib),
            Ok(_) => {
                tracing::debug!(pid, path = %path.display(), "mapped file is not the file at that path in the process's root")
            }
            Err(e) => tracing::debug!(pid, error = %e, "mapped library not usable"),
        }
    }
    Ok(libraries)
}

/// The MPI libraries mapped by any running process, each file once. Processes that exit or
/// cannot be read during the scan are skipped.
pub fn all_process_libraries() -> Vec<MpiLibrary> {
    let Ok(pids) = proc::pids() else {
        return Vec::new();
    };
    let mut seen = HashSet::new();
    let mut libraries = Vec::new();
    for pid in pids {
        match process_libraries(pid, &|_| true) {
            Ok(libs) => {
                libraries.extend(libs.into_iter().filter(|l| seen.insert((l.dev, l.inode))))
            }
            Err(e) => tracing::debug!(pid, error = %e, "process not scanned for MPI libraries"),
        }
    }
    libraries
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::test_support::{
        tool, Spawned, MPICH_C, MPICH_FORT, OPENMPI_C, OPENMPI_F08, OPENMPI_MPIFH, OPENMPI_TKR,
    };
    use std::process::Command;

    #[test]
    fn classifies_every_installed_mpi_library() {
        let expected = [
            (OPENMPI_C, MpiFlavor::OpenMpi, Binding::C),
            (OPENMPI_MPIFH, MpiFlavor::OpenMpi, Binding::Fortran),
            (OPENMPI_F08, MpiFlavor::OpenMpi, Binding::Fortran),
            (OPENMPI_TKR, MpiFlavor::OpenMpi, Binding::Fortran),
            (MPICH_C, MpiFlavor::Mpich, Binding::C),
            (MPICH_FORT, MpiFlavor::Mpich, Binding::Fortran),
        ];
        for (path, flavor, binding) in expected {
            let lib = MpiLibrary::open(Path::new(path)).unwrap_or_else(|e| {
                panic!("{e} (install Open MPI and MPICH: libopenmpi-dev libmpich-dev)")
            });
            assert_eq!((lib.flavor, lib.binding), (flavor, binding), "{path}");
            assert_eq!(lib.path, std::fs::canonicalize(path).unwrap());
            let readelf = tool("readelf", &["-nW", path]);
            let build_id = readelf
                .split("Build ID: ")
                .nth(1)
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            assert_eq!(lib.build_id.as_deref(), Some(build_id), "{path}");
        }
    }

    #[test]
    fn discovery_finds_the_installed_libraries_once_each() {
        // Given again through a symlink: the same file must not appear twice.
        let symlink = PathBuf::from("/usr/lib/x86_64-linux-gnu/openmpi/lib/libmpi.so");
        let libs = discover_libraries(&[symlink]).unwrap();
        let mut names: Vec<&str> = libs
            .iter()
            .map(|l| l.path.file_name().unwrap().to_str().unwrap())
            .collect();
        names.sort();
        let before = names.len();
        names.dedup();
        assert_eq!(names.len(), before, "a library was listed twice: {libs:?}");
        for expected in [
            OPENMPI_C,
            OPENMPI_MPIFH,
            OPENMPI_F08,
            OPENMPI_TKR,
            MPICH_C,
            MPICH_FORT,
        ] {
            let canonical = std::fs::canonicalize(expected).unwrap();
            assert!(
                libs.iter().any(|l| l.path == canonical),
                "{expected} not found in {libs:?}"
            );
        }
    }

    #[test]
    fn configured_paths_that_are_not_mpi_are_refused() {
        let not_mpi = "/usr/lib/x86_64-linux-gnu/libz.so.1";
        let err = discover_libraries(&[PathBuf::from(not_mpi)]).unwrap_err();
        assert!(matches!(err, DiscoveryError::NotMpi { .. }), "{err}");
        assert!(err.to_string().contains("mpi.libraries"));
        let err = MpiLibrary::open(Path::new("/nonexistent/libmpi.so.40")).unwrap_err();
        assert!(matches!(err, DiscoveryError::Read { .. }), "{err}");
    }

    #[test]
    fn a_library_is_classified_through_a_process_without_resolving_the_path() {
        let file = std::fs::File::open(MPICH_C).unwrap();
        let by_fd = PathBuf::from(format!("/proc/self/fd/{}", {
            use std::os::fd::AsRawFd;
            file.as_raw_fd()
        }));
        let lib = MpiLibrary::open_as(&by_fd, Path::new(MPICH_C)).unwrap();
        let real = MpiLibrary::open(Path::new(MPICH_C)).unwrap();
        assert_eq!((lib.flavor, lib.binding), (MpiFlavor::Mpich, Binding::C));
        assert_eq!((lib.dev, lib.inode), (real.dev, real.inode));
        // Kept as given: resolving /proc/PID/fd or /proc/PID/root would leave the process's
        // mount namespace.
        assert_eq!(lib.path, by_fd);
        let root = proc::in_root(std::process::id(), Path::new(MPICH_C));
        assert!(root.starts_with(format!("/proc/{}/root/usr", std::process::id())));
        let lib = MpiLibrary::open_as(&root, &root).unwrap();
        assert_eq!((lib.dev, lib.inode), (real.dev, real.inode));
    }

    #[test]
    fn libraries_mapped_by_a_process_are_found() {
        let mut cmd = Command::new("sleep");
        cmd.arg("10").env("LD_PRELOAD", "libmpich.so.12");
        let child = Spawned::start(cmd);
        let mpich = std::fs::canonicalize(MPICH_C).unwrap();
        let found = child.wait_until(|| {
            let libs = process_libraries(child.pid(), &|_| true).ok()?;
            libs.into_iter().find(|l| l.path == mpich)
        });
        assert_eq!(
            (found.flavor, found.binding),
            (MpiFlavor::Mpich, Binding::C)
        );
        assert!(all_process_libraries().iter().any(|l| l.path == mpich));
    }
}
