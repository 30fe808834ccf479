//! Address → call site: turns a return address seen by BPF into (module, file offset), which is
//! the same in every process and on every node running the same binary, unlike the address.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::model::{CallSite, Name};

use super::elf::build_id;
use super::error::DiscoveryError;

/// One line of `/proc/<pid>/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// File offset that `start` maps.
    pub offset: u64,
    pub inode: u64,
    /// The mapped file, or `None` for anonymous memory and pseudo mappings such as `[heap]`.
    pub path: Option<PathBuf>,
    /// The file was unlinked or replaced after it was mapped (an upgrade under a running job),
    /// so `path` now names a different file or none.
    pub deleted: bool,
}

/// Reads `/proc/<pid>/maps`.
pub fn read_maps(pid: u32) -> Result<Vec<Mapping>, DiscoveryError> {
    let path = format!("/proc/{pid}/maps");
    let text = std::fs::read(&path).map_err(|e| DiscoveryError::proc_read(pid, &path, e))?;
    parse_maps(&text).map_err(|detail| DiscoveryError::ProcFormat {
        path: path.into(),
        detail,
    })
}

/// Parses the text of a `/proc/<pid>/maps` file, one mapping a line:
/// `start-end perms offset major:minor inode [path]`, the numbers but the inode in hex. File
/// names are bytes, not necessarily UTF-8, and may contain spaces. The error names the line
/// and what is wrong with it.
pub fn parse_maps(text: &[u8]) -> Result<Vec<Mapping>, String> {
    text.split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.is_empty())
        .map(|(index, line)| {
            parse_line(line).ok_or_else(|| {
                format!(
                    "line {} is not `start-end perms offset device inode [path]`: {:?}",
                    index + 1,
                    String::from_utf8_lossy(&line[..line.len().min(120)])
                )
            })
        })
        .collect()
}

fn parse_line(line: &[u8]) -> Option<Mapping> {
    let mut fields = line.splitn(6, |&b| b == b' ');
    let mut field = || std::str::from_utf8(fields.next()?).ok();
    let (start, end) = field()?.split_once('-')?;
    let (start, end) = (hex(start)?, hex(end)?);
    let _perms = field()?;
    let offset = hex(field()?)?;
    let (major, minor) = field()?.split_once(':')?;
    hex(major)?;
    hex(minor)?;
    let inode = field()?.parse().ok()?;
    // The kernel pads the inode to a column before the path.
    let name = fields.next().unwrap_or_default().trim_ascii_start();
    // Anonymous memory has inode 0 and no path, pseudo mappings `[heap]`, `[stack]`, ...; only
    // a file has an absolute path. The kernel marks a file unlinked after it was mapped.
    let (name, deleted) = match name.strip_suffix(b" (deleted)") {
        Some(name) => (name, true),
        None => (name, false),
    };
    let is_file = inode != 0 && name.starts_with(b"/");
    let path = is_file.then(|| PathBuf::from(OsStr::from_bytes(name)));
    let deleted = deleted && is_file;
    Some(Mapping {
        start,
        end,
        offset,
        inode,
        path,
        deleted,
    })
}

fn hex(text: &str) -> Option<u64> {
    u64::from_str_radix(text, 16).ok()
}

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
    // The path is the one the process sees; through /proc/<pid>/root it also names the right file
    // for a process in another mount namespace (a container). It is built here because procfs
    // offers only the link's target (`Process::root`), which does not lead into that namespace.
    if !deleted {
        let in_process_root =
            Path::new(&format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap_or(path));
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

    /// One line of a maps file as `read_maps` turns it into a [`Mapping`].
    fn parse_line(line: &str) -> Option<Mapping> {
        let [map] = <[Mapping; 1]>::try_from(parse_maps(line.as_bytes()).ok()?).ok()?;
        Some(map)
    }

    #[test]
    fn parses_file_anonymous_and_deleted_lines() {
        let file = parse_line(
            "7f1c2a000000-7f1c2a028000 r-xp 00028000 fd:01 1311 /usr/lib/x86_64-linux-gnu/my lib.so",
        )
        .unwrap();
        assert_eq!(file.start, 0x7f1c2a000000);
        assert_eq!(file.end, 0x7f1c2a028000);
        assert_eq!(file.offset, 0x28000);
        assert_eq!(file.inode, 1311);
        assert_eq!(
            file.path.as_deref(),
            Some(Path::new("/usr/lib/x86_64-linux-gnu/my lib.so"))
        );
        assert!(!file.deleted);

        let heap = parse_line(
            "55d4c5a1b000-55d4c5a3c000 rw-p 00000000 00:00 0                          [heap]",
        )
        .unwrap();
        assert_eq!(heap.path, None);
        let anon = parse_line("7f1c2a100000-7f1c2a200000 rw-p 00000000 00:00 0 ").unwrap();
        assert_eq!(anon.path, None);

        let gone = parse_line("7f00-8f00 r-xp 00000000 fd:01 77 /tmp/libx.so (deleted)").unwrap();
        assert!(gone.deleted);
        assert_eq!(gone.path.as_deref(), Some(Path::new("/tmp/libx.so")));

        assert_eq!(parse_line("not a maps line"), None);
    }

    #[test]
    fn names_are_bytes_and_damaged_lines_are_errors() {
        // Found by the proc_maps fuzz target: procfs's parser read the key of a System V shared
        // memory name from bytes 5..13 of "/SYSV…" and panicked on a shorter name.
        let shm = parse_line("7f00-7f10 rw-s 00000000 00:01 32768  /SYSV0000").unwrap();
        assert_eq!(shm.path.as_deref(), Some(Path::new("/SYSV0000")));
        let latin1 =
            parse_maps(b"7f00-7f10 r-xp 00000000 fd:01 9 /opt/caf\xe9/libmpi.so\n").unwrap();
        assert_eq!(
            latin1[0].path.as_deref().map(|p| p.as_os_str().as_bytes()),
            Some(&b"/opt/caf\xe9/libmpi.so"[..])
        );
        let error =
            parse_maps(b"7f00-7f10 r-xp 00000000 fd:01 9 /lib.so\n7f00-x r-xp\n").unwrap_err();
        assert!(error.starts_with("line 2 is not"), "{error}");
        assert_eq!(parse_line("7f00-7f10 r-xp 0 fd:01 -1 /lib.so"), None);
        assert!(parse_maps(b"").unwrap().is_empty());
    }

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
