//! MPI library discovery: which files implement MPI on this node, which MPI and language binding
//! each one is, and where in the file each MPI function starts (what a uprobe attaches to).

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use object::read::ReadCache;
use object::{Object, ObjectSegment, ObjectSymbol, SymbolKind};
use serde::{Deserialize, Serialize};

use super::error::DiscoveryError;
use super::maps::read_maps;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum MpiFlavor {
    OpenMpi,
    Mpich,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Binding {
    C,
    Fortran,
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

/// Where one MPI function starts in a library file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbePoint {
    /// Canonical C name, e.g. `MPI_Send`, whichever binding the code belongs to.
    pub function: String,
    /// The exported symbol the offset was taken from, e.g. `mpi_send_` or `MPI_Send`.
    pub symbol: String,
    /// File offset of the entry point, as a uprobe needs it.
    pub file_offset: u64,
}

/// The probe points of one library, and the requested functions it does not have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbePoints {
    pub points: Vec<ProbePoint>,
    pub missing: Vec<String>,
}

/// A symbol whose presence proves what a library is. Open MPI's Fortran libraries are tied to it
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

impl MpiLibrary {
    /// Opens and classifies one library file. The name gives the binding and a first guess at
    /// the flavour; the dynamic symbols decide, because MPICH derivatives (MVAPICH, Intel MPI)
    /// ship their C library as `libmpi.so.12`.
    pub fn open(path: &Path) -> Result<Self, DiscoveryError> {
        let read_error = |source| DiscoveryError::Read {
            path: path.to_path_buf(),
            source,
        };
        let canonical = std::fs::canonicalize(path).map_err(read_error)?;
        let meta = std::fs::metadata(&canonical).map_err(read_error)?;
        let symbols = DynamicSymbols::read(&canonical)?;
        let guess = canonical
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(guess_from_name);
        let mut candidates: Vec<&Signature> = SIGNATURES
            .iter()
            .filter(|s| guess.is_none_or(|(_, binding)| s.binding == binding))
            .collect();
        if let Some((flavor, _)) = guess {
            candidates.sort_by_key(|s| s.flavor != flavor);
        }
        let found = candidates.into_iter().find(|s| match s.binding {
            Binding::C => symbols.defined.contains_key(s.symbol),
            Binding::Fortran => {
                symbols.defined.contains_key(s.symbol) || symbols.imported.contains(s.symbol)
            }
        });
        let Some(signature) = found else {
            return Err(DiscoveryError::NotMpi { path: canonical });
        };
        Ok(MpiLibrary {
            build_id: build_id(&canonical)?,
            path: canonical,
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
    match ld_cache_paths(Path::new(LD_CACHE)) {
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

const LD_CACHE: &str = "/etc/ld.so.cache";

/// Paths of the MPI libraries listed in an ld.so cache file. Parsing the file rather than running
/// `ldconfig -p` keeps a root daemon from spawning programs found through `PATH`.
fn ld_cache_paths(cache: &Path) -> Result<Vec<PathBuf>, DiscoveryError> {
    const NEW_MAGIC: &[u8] = b"glibc-ld.so.cache1.1";
    const OLD_MAGIC: &[u8] = b"ld.so-1.7.0\0";
    const HEADER: usize = 48;
    const ENTRY: usize = 24;
    let error = |detail: &str| DiscoveryError::LdCache {
        path: cache.to_path_buf(),
        detail: detail.into(),
    };
    let data = match std::fs::read(cache) {
        Ok(data) => data,
        // Systems without glibc's cache (musl, NixOS) are searched through processes and config.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(error(&e.to_string())),
    };
    let u32_at = |at: usize| -> Result<usize, DiscoveryError> {
        let bytes = data.get(at..at + 4).ok_or_else(|| error("truncated"))?;
        Ok(u32::from_ne_bytes(bytes.try_into().expect("4 bytes")) as usize)
    };
    // The compat format, the default before glibc 2.32 (RHEL 8), puts a table in the old format
    // first; the new table follows it, 8-byte aligned, with its strings relative to itself.
    let base = if data.starts_with(NEW_MAGIC) {
        0
    } else if data.starts_with(OLD_MAGIC) {
        (16 + 12 * u32_at(12)?).next_multiple_of(8)
    } else {
        return Err(error("unknown format"));
    };
    let table = data
        .get(base..)
        .filter(|t| t.starts_with(NEW_MAGIC))
        .ok_or_else(|| error("no glibc-ld.so.cache1.1 table"))?;
    let string = |offset: usize| -> Result<&str, DiscoveryError> {
        let bytes = table
            .get(offset..)
            .ok_or_else(|| error("string offset past the end"))?;
        let end = bytes
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| error("unterminated string"))?;
        std::str::from_utf8(&bytes[..end]).map_err(|_| error("string is not UTF-8"))
    };
    let mut paths = Vec::new();
    for i in 0..u32_at(base + 20)? {
        let entry = base + HEADER + i * ENTRY;
        let soname = string(u32_at(entry + 4)?)?;
        if guess_from_name(soname).is_some() {
            paths.push(PathBuf::from(string(u32_at(entry + 8)?)?));
        }
    }
    Ok(paths)
}

/// The MPI libraries mapped by one process. A mapped file whose path here names another file
/// (the process runs in a container, or the library was replaced under it) is skipped: a probe
/// attached through that path would not reach the process.
pub fn process_libraries(pid: u32) -> Result<Vec<MpiLibrary>, DiscoveryError> {
    let mut seen = HashSet::new();
    let mut libraries = Vec::new();
    for mapping in read_maps(pid)? {
        let Some(path) = mapping
            .path
            .filter(|p| !mapping.deleted && is_mpi_library_name(p))
        else {
            continue;
        };
        if !seen.insert(mapping.inode) {
            continue;
        }
        match MpiLibrary::open(&path) {
            Ok(lib) if lib.inode == mapping.inode => libraries.push(lib),
            Ok(_) => {
                tracing::debug!(pid, path = %path.display(), "mapped file is not the file at that path here")
            }
            Err(e) => tracing::debug!(pid, error = %e, "mapped library not usable"),
        }
    }
    Ok(libraries)
}

/// The MPI libraries mapped by any running process, each file once. Processes that exit or
/// cannot be read during the scan are skipped.
pub fn all_process_libraries() -> Vec<MpiLibrary> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut seen = HashSet::new();
    let mut libraries = Vec::new();
    for pid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        match process_libraries(pid) {
            Ok(libs) => {
                libraries.extend(libs.into_iter().filter(|l| seen.insert((l.dev, l.inode))))
            }
            Err(e) => tracing::debug!(pid, error = %e, "process not scanned for MPI libraries"),
        }
    }
    libraries
}

/// Finds the entry points of `functions` (canonical C names such as `MPI_Send`) in `lib`.
///
/// Every address gets one probe point even when several symbols alias it (`MPI_Send` and
/// `PMPI_Send`, `mpi_send_` and `mpi_send__`), since two uprobes on one address would count each
/// call twice. Distinct code for one function (`mpi_send_` and `mpi_send_f08_`) gets a point each.
pub fn probe_points(lib: &MpiLibrary, functions: &[String]) -> Result<ProbePoints, DiscoveryError> {
    let symbols = DynamicSymbols::read(&lib.path)?;
    let mut taken = HashSet::new();
    let mut points = Vec::new();
    let mut missing = Vec::new();
    for function in functions {
        let mut found = false;
        for symbol in symbol_names(lib.binding, function) {
            let Some(file_offset) = symbols.function_offset(&symbol) else {
                continue;
            };
            found = true;
            if taken.insert(file_offset) {
                points.push(ProbePoint {
                    function: function.clone(),
                    symbol,
                    file_offset,
                });
            }
        }
        if !found {
            missing.push(function.clone());
        }
    }
    Ok(ProbePoints { points, missing })
}

/// The exported names under which a binding may implement `function`, preferred name first.
///
/// Fortran compilers decorate names differently: gfortran appends `_` (or `__` to names that
/// already contain one under -fsecond-underscore), some compilers use no suffix or upper case.
/// The `mpi_f08` module has its own entry points: `mpi_send_f08_` and `pmpi_send_f08_` in Open
/// MPI, `mpi_send_f08ts_` (and `_large_` for MPI-4 large counts, which Fortran reaches through the
/// same generic name) in MPICH, whose profiling versions are `pmpir_send_f08ts_`.
fn symbol_names(binding: Binding, function: &str) -> Vec<String> {
    match binding {
        Binding::C => vec![function.to_string(), format!("P{function}")],
        Binding::Fortran => {
            const SUFFIXES: [&str; 7] = [
                "_",
                "__",
                "",
                "_f08_",
                "_f08ts_",
                "_f08_large_",
                "_f08ts_large_",
            ];
            let lower = function.to_ascii_lowercase();
            let upper = function.to_ascii_uppercase();
            let mut stems = vec![lower.clone(), format!("p{lower}")];
            if let Some((prefix, rest)) = lower.split_once('_') {
                stems.push(format!("p{prefix}r_{rest}"));
            }
            let mut names: Vec<String> = stems
                .iter()
                .flat_map(|stem| SUFFIXES.iter().map(move |suffix| format!("{stem}{suffix}")))
                .collect();
            names.push(format!("P{upper}"));
            names.push(upper);
            names
        }
    }
}

/// Byte offset of the `size` field inside Open MPI's datatype object, read from the predefined
/// datatypes in `lib` (Open MPI's C library). BPF reads a message's datatype size at
/// `handle + offset`; the offset is derived from the real file, so an Open MPI version with a
/// different layout is refused here rather than producing wrong byte counts.
pub fn openmpi_datatype_size_offset(lib: &MpiLibrary) -> Result<u64, DiscoveryError> {
    // Four different sizes, so that no other field can hold all of them by coincidence.
    const REFERENCE: [(&str, u64); 4] = [
        ("ompi_mpi_char", 1),
        ("ompi_mpi_short", 2),
        ("ompi_mpi_int", 4),
        ("ompi_mpi_double", 8),
    ];
    let symbols = DynamicSymbols::read(&lib.path)?;
    let objects = REFERENCE
        .iter()
        .map(|&(name, size)| Ok((symbols.data(name)?, size)))
        .collect::<Result<Vec<_>, DiscoveryError>>()?;
    let len = objects
        .iter()
        .map(|(bytes, _)| bytes.len())
        .min()
        .unwrap_or(0);
    let word = |bytes: &[u8], at: usize| {
        u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
    };
    // opal_datatype_t keeps size before true_lb, true_ub, lb and ub, and for a basic type the
    // upper bounds equal the size too, so the first matching word is the size field.
    (0..len.saturating_sub(7))
        .step_by(8)
        .find(|&at| objects.iter().all(|(bytes, size)| word(bytes, at) == *size))
        .map(|at| at as u64)
        .ok_or_else(|| DiscoveryError::DatatypeLayout {
            path: lib.path.clone(),
        })
}

/// Upper bound on cached build-ids; a node maps a few thousand distinct files at most, and the
/// bound keeps a long-running daemon's memory independent of how many binaries it has seen.
const BUILD_ID_CACHE_LIMIT: usize = 8192;

/// The GNU build-id of an ELF file in hex, or `None` if it has none. Cached by file identity and
/// modification time, so a file reached through several paths is read once and a file replaced in
/// place is read again.
pub fn build_id(path: &Path) -> Result<Option<String>, DiscoveryError> {
    type Key = (u64, u64, i64, i64);
    static CACHE: OnceLock<Mutex<HashMap<Key, Option<String>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let meta = std::fs::metadata(path).map_err(|source| DiscoveryError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let key = (meta.dev(), meta.ino(), meta.mtime(), meta.mtime_nsec());
    if let Some(id) = cache.lock().expect("build-id cache poisoned").get(&key) {
        return Ok(id.clone());
    }
    let id = with_elf(path, |elf| {
        Ok(elf
            .build_id()?
            .map(|bytes| bytes.iter().map(|b| format!("{b:02x}")).collect()))
    })?;
    let mut cache = cache.lock().expect("build-id cache poisoned");
    if cache.len() >= BUILD_ID_CACHE_LIMIT {
        cache.clear();
    }
    cache.insert(key, id.clone());
    Ok(id)
}

fn with_elf<T>(
    path: &Path,
    read: impl FnOnce(&object::File<'_, &ReadCache<File>>) -> Result<T, object::Error>,
) -> Result<T, DiscoveryError> {
    let file = File::open(path).map_err(|source| DiscoveryError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    // ReadCache reads only the parts parsed (headers, dynamic symbols, notes), not the whole
    // file; libmpich alone is 40 MB.
    let cache = ReadCache::new(file);
    object::File::parse(&cache)
        .and_then(|elf| read(&elf))
        .map_err(|source| DiscoveryError::Elf {
            path: path.to_path_buf(),
            source,
        })
}

/// The dynamic symbol table of a library (stripped libraries keep only this one) and its loadable
/// segments, which turn a symbol's address into a file offset.
pub(crate) struct DynamicSymbols {
    path: PathBuf,
    defined: HashMap<String, DefinedSymbol>,
    imported: HashSet<String>,
    segments: Vec<LoadSegment>,
}

struct DefinedSymbol {
    address: u64,
    size: u64,
    function: bool,
}

struct LoadSegment {
    address: u64,
    file_offset: u64,
    file_size: u64,
}

impl DynamicSymbols {
    pub(crate) fn read(path: &Path) -> Result<Self, DiscoveryError> {
        with_elf(path, |elf| {
            let mut defined = HashMap::new();
            let mut imported = HashSet::new();
            for symbol in elf.dynamic_symbols() {
                let Ok(name) = symbol.name() else { continue };
                if symbol.is_undefined() {
                    imported.insert(name.to_string());
                } else if symbol.is_definition() {
                    let function = symbol.kind() == SymbolKind::Text;
                    let entry = DefinedSymbol {
                        address: symbol.address(),
                        size: symbol.size(),
                        function,
                    };
                    defined.insert(name.to_string(), entry);
                }
            }
            let segments = elf
                .segments()
                .map(|s| {
                    let (file_offset, file_size) = s.file_range();
                    LoadSegment {
                        address: s.address(),
                        file_offset,
                        file_size,
                    }
                })
                .collect();
            Ok(DynamicSymbols {
                path: path.to_path_buf(),
                defined,
                imported,
                segments,
            })
        })
    }

    /// File offset of a defined function: its address minus the start of the loadable segment
    /// that contains it, plus that segment's offset in the file.
    pub(crate) fn function_offset(&self, name: &str) -> Option<u64> {
        self.defined
            .get(name)
            .filter(|s| s.function)
            .and_then(|s| self.file_offset(s.address, 1))
    }

    fn file_offset(&self, address: u64, size: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| s.address <= address && address + size <= s.address + s.file_size)
            .map(|s| address - s.address + s.file_offset)
    }

    /// The initial contents of a defined data object, as stored in the file.
    fn data(&self, name: &str) -> Result<Vec<u8>, DiscoveryError> {
        let symbol = self
            .defined
            .get(name)
            .ok_or_else(|| DiscoveryError::MissingSymbol {
                path: self.path.clone(),
                symbol: name.to_string(),
            })?;
        let offset = self
            .file_offset(symbol.address, symbol.size)
            .ok_or_else(|| DiscoveryError::SymbolNotInFile {
                path: self.path.clone(),
                symbol: name.to_string(),
                address: symbol.address,
            })?;
        let read_error = |source| DiscoveryError::Read {
            path: self.path.clone(),
            source,
        };
        let mut bytes = vec![0; symbol.size as usize];
        File::open(&self.path)
            .and_then(|f| f.read_exact_at(&mut bytes, offset))
            .map_err(read_error)?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::test_support::{Spawned, MPICH_C, OPENMPI_C};
    use std::process::Command;

    const OPENMPI_MPIFH: &str = "/usr/lib/x86_64-linux-gnu/libmpi_mpifh.so.40";
    const OPENMPI_F08: &str = "/usr/lib/x86_64-linux-gnu/libmpi_usempif08.so.40";
    const OPENMPI_TKR: &str = "/usr/lib/x86_64-linux-gnu/libmpi_usempi_ignore_tkr.so.40";
    const MPICH_FORT: &str = "/usr/lib/x86_64-linux-gnu/libmpichfort.so.12";

    fn open(path: &str) -> MpiLibrary {
        MpiLibrary::open(Path::new(path)).unwrap_or_else(|e| {
            panic!("{e} (install Open MPI and MPICH: libopenmpi-dev libmpich-dev)")
        })
    }

    fn functions(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn tool(program: &str, args: &[&str]) -> String {
        let out = Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        assert!(out.status.success(), "{program} {args:?} failed");
        String::from_utf8(out.stdout).unwrap()
    }

    /// File offset of a dynamic symbol as binutils computes it: `nm -D` gives the address,
    /// `readelf -lW` the LOAD segment that contains it.
    fn binutils_offset(path: &Path, symbol: &str) -> u64 {
        let path = path.to_str().unwrap();
        let nm = tool("nm", &["-D", "--defined-only", path]);
        let address = nm
            .lines()
            .find_map(|l| {
                let mut f = l.split_whitespace();
                let (addr, _, name) = (f.next()?, f.next()?, f.next()?);
                (name == symbol).then(|| u64::from_str_radix(addr, 16).unwrap())
            })
            .unwrap();
        let readelf = tool("readelf", &["-lW", path]);
        readelf
            .lines()
            .filter(|l| l.trim_start().starts_with("LOAD"))
            .find_map(|l| {
                let f: Vec<u64> = l
                    .split_whitespace()
                    .skip(1)
                    .take(5)
                    .map(|x| u64::from_str_radix(x.trim_start_matches("0x"), 16).unwrap())
                    .collect();
                let (offset, vaddr, filesz) = (f[0], f[1], f[3]);
                (vaddr <= address && address < vaddr + filesz).then(|| address - vaddr + offset)
            })
            .unwrap()
    }

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
            let lib = open(path);
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
    fn new_and_compat_ld_cache_formats_list_the_same_libraries() {
        let current = ld_cache_paths(Path::new(LD_CACHE)).unwrap();
        assert!(
            current.contains(&PathBuf::from("/lib/x86_64-linux-gnu/libmpich.so.12")),
            "{current:?}"
        );
        let dir = tempfile::tempdir().unwrap();
        let compat = dir.path().join("ld.so.cache");
        // -X leaves the library symlinks alone; only the cache file given by -C is written.
        tool(
            "ldconfig",
            &["-X", "-c", "compat", "-C", compat.to_str().unwrap()],
        );
        let mut from_compat = ld_cache_paths(&compat).unwrap();
        let mut current = current;
        from_compat.sort();
        current.sort();
        assert_eq!(from_compat, current);
        assert!(ld_cache_paths(Path::new("/nonexistent/ld.so.cache"))
            .unwrap()
            .is_empty());
    }

    #[test]
    fn c_probe_offsets_match_binutils_and_aliases_give_one_point() {
        for path in [OPENMPI_C, MPICH_C] {
            let lib = open(path);
            let points = probe_points(
                &lib,
                &functions(&["MPI_Send", "MPI_Allreduce", "MPI_Bogus"]),
            )
            .unwrap();
            let send: Vec<_> = points
                .points
                .iter()
                .filter(|p| p.function == "MPI_Send")
                .collect();
            assert_eq!(
                send.len(),
                1,
                "MPI_Send and PMPI_Send alias one address in {path}"
            );
            assert_eq!(send[0].symbol, "MPI_Send");
            assert_eq!(
                send[0].file_offset,
                binutils_offset(&lib.path, "MPI_Send"),
                "{path}"
            );
            assert_eq!(
                send[0].file_offset,
                binutils_offset(&lib.path, "PMPI_Send"),
                "{path}"
            );
            assert!(points.points.iter().any(|p| p.function == "MPI_Allreduce"));
            assert_eq!(points.missing, ["MPI_Bogus"]);
        }
    }

    #[test]
    fn fortran_libraries_give_points_for_each_distinct_entry() {
        let symbols = |path: &str| -> Vec<String> {
            let points = probe_points(&open(path), &functions(&["MPI_Send"])).unwrap();
            assert!(points.points.iter().all(|p| p.function == "MPI_Send"));
            for p in &points.points {
                assert_eq!(
                    p.file_offset,
                    binutils_offset(&open(path).path, &p.symbol),
                    "{p:?}"
                );
            }
            points.points.into_iter().map(|p| p.symbol).collect()
        };
        // mpi_send, mpi_send__, MPI_SEND, pmpi_* and MPI_Send_f08 alias mpi_send_ there.
        assert_eq!(symbols(OPENMPI_MPIFH), ["mpi_send_"]);
        assert_eq!(symbols(OPENMPI_F08), ["mpi_send_f08_", "pmpi_send_f08_"]);
        assert_eq!(
            symbols(MPICH_FORT),
            [
                "mpi_send_",
                "mpi_send_f08ts_",
                "mpi_send_f08ts_large_",
                "pmpir_send_f08ts_",
                "pmpir_send_f08ts_large_"
            ]
        );
        let tkr = probe_points(&open(OPENMPI_TKR), &functions(&["MPI_Send"])).unwrap();
        assert!(
            tkr.points.is_empty(),
            "the ignore-TKR module calls libmpi_mpifh"
        );
        assert_eq!(tkr.missing, ["MPI_Send"]);
    }

    #[test]
    fn open_mpi_datatype_size_offset_is_read_from_the_library() {
        assert_eq!(openmpi_datatype_size_offset(&open(OPENMPI_C)).unwrap(), 24);
        let err = openmpi_datatype_size_offset(&open(MPICH_C)).unwrap_err();
        assert!(matches!(err, DiscoveryError::MissingSymbol { .. }), "{err}");
    }

    #[test]
    fn libraries_mapped_by_a_process_are_found() {
        let mut cmd = Command::new("sleep");
        cmd.arg("10").env("LD_PRELOAD", "libmpich.so.12");
        let child = Spawned::start(cmd);
        let mpich = std::fs::canonicalize(MPICH_C).unwrap();
        let found = child.wait_until(|| {
            let libs = process_libraries(child.pid()).ok()?;
            libs.into_iter().find(|l| l.path == mpich)
        });
        assert_eq!(
            (found.flavor, found.binding),
            (MpiFlavor::Mpich, Binding::C)
        );
        assert!(all_process_libraries().iter().any(|l| l.path == mpich));
    }
}
