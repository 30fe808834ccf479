//! PMPI interposers: libraries (often preloaded with LD_PRELOAD) that define MPI functions and
//! call the MPI library's PMPI_* versions from them, as tracing and checking tools do.
//!
//! The application calls the interposer's MPI_Send, which calls PMPI_Send in the MPI library.
//! Probed at the MPI library alone, the call's return address would be inside the interposer,
//! and every call site would be the interposer's. Probed at the interposer's MPI_* exports too,
//! with the same function ids, the interposer's entry is the outermost MPI call of the thread
//! (the BPF programs count only that one; the PMPI call nested in it is not counted again) and
//! its return address is in the application.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::proc::{self, read_maps};

use super::elf::{build_id, DynamicSymbols};
use super::libraries::{is_mpi_library_name, Binding, MpiFlavor, MpiLibrary};
use super::DiscoveryError;

/// The interposers process `pid` maps, for an MPI library of `flavor`: the mapped files, other
/// than MPI libraries, that define one of `functions` and use a PMPI_* symbol. `first_look` is
/// asked with each file's (device, inode) and says whether it was not looked at before
/// (interposer or not): each file is read once however many processes map it. A file for which
/// `may_read` (asked with the mapped path before the file is touched) says no is skipped.
pub fn process_interposers(
    pid: u32,
    flavor: MpiFlavor,
    functions: &[String],
    first_look: &dyn Fn((u64, u64)) -> bool,
    may_read: &dyn Fn(&Path) -> bool,
) -> Result<Vec<MpiLibrary>, DiscoveryError> {
    let mut interposers = Vec::new();
    let mut seen = HashSet::new();
    for mapping in read_maps(pid)? {
        let Some(path) = mapping
            .path
            .filter(|p| !mapping.deleted && !is_mpi_library_name(p))
        else {
            continue;
        };
        if !seen.insert(mapping.inode) || !may_read(&path) {
            continue;
        }
        // The host's path when it is the mapped file, else the one in the process's root.
        let access = [path.clone(), proc::in_root(pid, &path)]
            .into_iter()
            .find(|p| std::fs::metadata(p).is_ok_and(|m| m.ino() == mapping.inode));
        let Some(access) = access else { continue };
        let Ok(meta) = std::fs::metadata(&access) else {
            continue;
        };
        if !first_look((meta.dev(), meta.ino())) {
            continue;
        }
        match is_interposer(&access, functions) {
            Ok(true) => interposers.push(MpiLibrary {
                // An unreadable build-id must not end the scan of the other mapped files.
                build_id: build_id(&access).ok().flatten(),
                path: access,
                dev: meta.dev(),
                inode: meta.ino(),
                flavor,
                binding: Binding::Interposer,
            }),
            Ok(false) => {}
            Err(e) => tracing::debug!(pid, error = %e, "mapped file not checked for MPI functions"),
        }
    }
    Ok(interposers)
}

/// Whether the file defines one of `functions` and calls a PMPI_* function of another library.
fn is_interposer(path: &Path, functions: &[String]) -> Result<bool, DiscoveryError> {
    let symbols = DynamicSymbols::read(path)?;
    Ok(symbols.imports_any("PMPI_")
        && functions
            .iter()
            .any(|f| symbols.function_offset(f).is_some()))
}
