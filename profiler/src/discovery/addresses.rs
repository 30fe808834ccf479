//! Address → call site: turns a return address seen by BPF into (module, file offset), which is
//! the same in every process and on every node running the same binary, unlike the address.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::model::{CallSite, Name};
use crate::proc::{self, read_maps, Mapping};

use super::elf::build_id;

/// A mapping reduced to what resolution needs; the module id is computed once per file.
struct Region {
    start: u64,
    end: u64,
    offset: u64,
    module: Option<Name>,
}

/// Resolves addresses of MPI processes to call sites, caching each process's maps.
///
/// The cache of a process is re-read when an address falls outside every cached mapping, because
/// libraries loaded after the first read (dlopen, late plugins) are otherwise invisible. Call
/// [`AddressResolver::forget`] when a process exits; the maps of an exited process stay usable
/// until then, so bursts drained after the exit still resolve.
#[derive(Default)]
pub struct AddressResolver {
    processes: HashMap<u32, Vec<Region>>,
    /// Module id per mapped file, keyed by inode and path; libraries are shared by every rank
    /// of a job, so each build-id is read once.
    modules: HashMap<(u64, PathBuf), Name>,
    /// The path each build-id was last mapped from, for symbolization.
    paths: HashMap<Name, PathBuf>,
    /// The last call sites resolved, direct-mapped by pid and address: a rank's bursts start and
    /// end at the same few return addresses, and under a burst storm the search of the maps was
    /// a fifth of the daemon's time.
    recent: Vec<Option<(u32, u64, CallSite)>>,
}

/// Slots of [`AddressResolver::recent`] (a power of 2).
const RECENT_SLOTS: usize = 256;

fn recent_slot(pid: u32, address: u64) -> usize {
    let key = address ^ (u64::from(pid) << 32) ^ (address >> 17);
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as usize % RECENT_SLOTS
}

impl AddressResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// The call site of `address` in process `pid`: module build-id (hex) or path, and the file
    /// offset. Anonymous memory, and processes that exited before their maps were read, give
    /// [`CallSite::unknown`].
    pub fn resolve(&mut self, pid: u32, address: u64) -> CallSite {
        if self.recent.is_empty() {
            self.recent = vec![None; RECENT_SLOTS];
        }
        let slot = recent_slot(pid, address);
        if let Some((p, a, site)) = &self.recent[slot] {
            if (*p, *a) == (pid, address) {
                return site.clone();
            }
        }
        let site = self.search(pid, address);
        if !site.is_unknown() {
            self.recent[slot] = Some((pid, address, site.clone()));
        }
        site
    }

    /// [`AddressResolver::resolve`] through the cached maps, read again on a miss.
    fn search(&mut self, pid: u32, address: u64) -> CallSite {
        if let Some(site) = self.lookup(pid, address) {
            return site;
        }
        match read_maps(pid) {
            Ok(maps) => {
                let regions = maps.iter().map(|m| self.region(pid, m)).collect();
                self.processes.insert(pid, regions);
            }
            Err(e) => {
                tracing::debug!(pid, error = %e, "cannot read maps; call site unknown");
                return CallSite::unknown(address);
            }
        }
        self.lookup(pid, address)
            .unwrap_or_else(|| CallSite::unknown(address))
    }

    /// The path a module with a build-id was mapped from, as the process saw it; `None` for a
    /// module the resolver has not seen or whose id is its path.
    pub fn path_of(&self, module: &str) -> Option<&Path> {
        self.paths.get(module).map(PathBuf::as_path)
    }

    /// Drops the cached maps of a process that has exited.
    pub fn forget(&mut self, pid: u32) {
        self.processes.remove(&pid);
        for slot in &mut self.recent {
            if slot.as_ref().is_some_and(|(p, _, _)| *p == pid) {
                *slot = None;
            }
        }
    }

    /// `None` when no cached mapping contains the address, so the maps must be read again.
    fn lookup(&self, pid: u32, address: u64) -> Option<CallSite> {
        let regions = self.processes.get(&pid)?;
        let i = regions.partition_point(|r| r.end <= address);
        let region = regions.get(i).filter(|r| r.start <= address)?;
        Some(match &region.module {
            Some(module) => CallSite {
                module: *module,
                offset: address - region.start + region.offset,
            },
            None => CallSite::unknown(address),
        })
    }

    fn region(&mut self, pid: u32, m: &Mapping) -> Region {
        let module = m.path.as_ref().map(|path| {
            let id = *self
                .modules
                .entry((m.inode, path.clone()))
                .or_insert_with(|| module_id(pid, path, m.deleted));
            if *id != *path.to_string_lossy() {
                self.paths.insert(id, path.clone());
            }
            id
        });
        Region {
            start: m.start,
            end: m.end,
            offset: m.offset,
            module,
        }
    }
}

fn module_id(pid: u32, path: &Path, deleted: bool) -> Name {
    // The path is the one the process sees; through the process's root it also names the right
    // file for a process in another mount namespace (a container).
    if !deleted {
        let in_process_root = proc::in_root(pid, path);
        match build_id(&in_process_root) {
            Ok(Some(id)) => return Name::new(&id),
            Ok(None) => {}
            Err(e) => tracing::debug!(pid, path = %path.display(), error = %e, "no build-id"),
        }
    }
    Name::new(&path.to_string_lossy())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::elf::DynamicSymbols;

    #[test]
    fn libc_function_resolves_to_its_symbol_offset_and_libc_build_id() {
        let pid = std::process::id();
        let address = libc::getpid as *const () as usize as u64;
        let maps = read_maps(pid).unwrap();
        let libc_path = maps
            .iter()
            .find(|m| m.start <= address && address < m.end)
            .and_then(|m| m.path.clone())
            .expect("getpid lies in a file mapping");

        let mut resolver = AddressResolver::new();
        let site = resolver.resolve(pid, address);

        let symbols = DynamicSymbols::read(&libc_path).unwrap();
        let expected_offset = symbols
            .function_offset("getpid")
            .expect("libc exports getpid");
        let expected_module = build_id(&libc_path)
            .unwrap()
            .expect("Debian's libc has a build-id");
        assert_eq!(site.offset, expected_offset);
        assert_eq!(&*site.module, expected_module.as_str());
    }

    #[test]
    fn anonymous_memory_and_exited_processes_are_unknown() {
        let mut resolver = AddressResolver::new();
        let heap = Box::new(0u64);
        let address = &*heap as *const u64 as u64;
        assert_eq!(
            resolver.resolve(std::process::id(), address),
            CallSite::unknown(address)
        );

        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(resolver.resolve(pid, 0x1000), CallSite::unknown(0x1000));
    }

    #[test]
    fn libraries_loaded_after_the_first_read_are_found() {
        let pid = std::process::id();
        let mut resolver = AddressResolver::new();
        resolver.resolve(pid, libc::getpid as *const () as usize as u64);

        // zlib is not linked into the test binary, so it appears only after this dlopen.
        let name = std::ffi::CString::new("libz.so.1").unwrap();
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        assert!(
            !handle.is_null(),
            "zlib (libz.so.1) must be installed for this test"
        );
        let symbol = std::ffi::CString::new("zlibVersion").unwrap();
        let address = unsafe { libc::dlsym(handle, symbol.as_ptr()) } as u64;

        let site = resolver.resolve(pid, address);
        let zlib = read_maps(pid)
            .unwrap()
            .into_iter()
            .find(|m| m.start <= address && address < m.end)
            .and_then(|m| m.path)
            .unwrap();
        let expected = DynamicSymbols::read(&zlib)
            .unwrap()
            .function_offset("zlibVersion")
            .unwrap();
        assert_eq!(&*site.module, build_id(&zlib).unwrap().unwrap().as_str());
        assert_eq!(site.offset, expected);
        resolver.forget(pid);
        assert!(resolver.processes.is_empty());
    }
}
