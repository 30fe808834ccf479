//! ELF reading, for discovery and symbolization alike: a file's GNU build-id, and its dynamic
//! symbols with the loadable segments that turn a symbol's address into a file offset and back.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use object::read::ReadCache;
use object::{
    Object, ObjectSegment, ObjectSymbol, ObjectSymbolTable, RelocationFlags, RelocationTarget,
    SymbolKind,
};

use super::error::DiscoveryError;
use super::file_cache::{FileCache, FILES_CACHED};

/// A file that could not be read as ELF. Discovery names the config entry to fix
/// ([`DiscoveryError`]); symbolization shows the message as the reason a site has no name.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a readable ELF file: {source}")]
    Parse {
        path: PathBuf,
        #[source]
        source: object::Error,
    },
}

impl From<ElfError> for DiscoveryError {
    fn from(error: ElfError) -> Self {
        match error {
            ElfError::Read { path, source } => DiscoveryError::Read { path, source },
            ElfError::Parse { path, source } => DiscoveryError::Elf { path, source },
        }
    }
}

/// The GNU build-id of an ELF file in hex, or `None` if it has none. Read once per version of
/// the file (device, inode and modification time), whatever path reaches it.
pub fn build_id(path: &Path) -> Result<Option<String>, ElfError> {
    static BUILD_IDS: FileCache<Option<String>> = FileCache::new(FILES_CACHED);
    let meta = std::fs::metadata(path).map_err(|source| ElfError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    BUILD_IDS.get_or_read(&meta, || with_elf(path, |elf| Ok(elf.build_id()?.map(hex))))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn with_elf<T>(
    path: &Path,
    read: impl FnOnce(&object::File<'_, &ReadCache<WindowedFile>>) -> Result<T, object::Error>,
) -> Result<T, ElfError> {
    let file = File::open(path).map_err(|source| ElfError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    // ReadCache reads only the parts parsed (headers, dynamic symbols, notes), not the whole
    // file; libmpich alone is 40 MB.
    let cache = ReadCache::new(WindowedFile::new(file));
    object::File::parse(&cache)
        .and_then(|elf| read(&elf))
        .map_err(|source| ElfError::Parse {
            path: path.to_path_buf(),
            source,
        })
}

/// A file read through a window of WINDOW bytes. ReadCache reads each symbol name on its own, a
/// seek and a read per name (about 15,000 system calls for the files an Open MPI rank maps), and
/// the names of a string table lie together: through the window they cost a few reads.
struct WindowedFile {
    file: File,
    position: u64,
    window_start: u64,
    window: Vec<u8>,
}

const WINDOW: usize = 256 << 10;

impl WindowedFile {
    fn new(file: File) -> Self {
        WindowedFile {
            file,
            position: 0,
            window_start: 0,
            window: Vec::new(),
        }
    }
}

impl Read for WindowedFile {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        // A large read (a whole symbol table) goes straight to the file.
        if buf.len() >= WINDOW {
            let n = self.file.read_at(buf, self.position)?;
            self.position += n as u64;
            return Ok(n);
        }
        let end = self.window_start + self.window.len() as u64;
        if !(self.window_start..end).contains(&self.position) {
            self.window.resize(WINDOW, 0);
            let mut filled = 0;
            while filled < WINDOW {
                match self
                    .file
                    .read_at(&mut self.window[filled..], self.position + filled as u64)
                {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            self.window.truncate(filled);
            self.window_start = self.position;
        }
        let from = (self.position - self.window_start) as usize;
        let n = buf.len().min(self.window.len() - from);
        buf[..n].copy_from_slice(&self.window[from..from + n]);
        self.position += n as u64;
        Ok(n)
    }
}

impl Seek for WindowedFile {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let position = match to {
            SeekFrom::Start(p) => Some(p),
            SeekFrom::End(d) => self.file.metadata()?.len().checked_add_signed(d),
            SeekFrom::Current(d) => self.position.checked_add_signed(d),
        };
        self.position = position.ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "seek before the start")
        })?;
        Ok(self.position)
    }
}

/// The dynamic symbol table of an ELF file (stripped libraries keep only this one), its loadable
/// segments, which turn a symbol's address into a file offset, and what finds its debug
/// information: its build-id and whether it names a separate debug file.
pub struct DynamicSymbols {
    path: PathBuf,
    build_id: Option<String>,
    debug_link: bool,
    defined: HashMap<String, DefinedSymbol>,
    imported: HashSet<String>,
    segments: LoadSegments,
    /// Symbol name → address of its global offset table slot (R_X86_64_GLOB_DAT), which the
    /// loader fills with the symbol's address in the process, wherever the definition ended up.
    got_slots: HashMap<String, u64>,
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

/// The loadable segments of an ELF file: which file bytes are mapped at which address, as linked.
pub struct LoadSegments(Vec<LoadSegment>);

impl LoadSegments {
    /// The file offset of the `size` bytes at `address`, if one segment holds them all.
    fn file_offset(&self, address: u64, size: u64) -> Option<u64> {
        self.0
            .iter()
            .find(|s| s.address <= address && address + size <= s.address + s.file_size)
            .map(|s| address - s.address + s.file_offset)
    }

    /// The address, as linked, of the byte at `file_offset`, if a segment maps it.
    pub fn address(&self, file_offset: u64) -> Option<u64> {
        self.0
            .iter()
            .find(|s| s.file_offset <= file_offset && file_offset < s.file_offset + s.file_size)
            .map(|s| file_offset - s.file_offset + s.address)
    }
}

impl DynamicSymbols {
    pub fn read(path: &Path) -> Result<Self, ElfError> {
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
            let segments = LoadSegments(
                elf.segments()
                    .map(|s| {
                        let (file_offset, file_size) = s.file_range();
                        LoadSegment {
                            address: s.address(),
                            file_offset,
                            file_size,
                        }
                    })
                    .collect(),
            );
            let mut got_slots = HashMap::new();
            if let (Some(relocations), Some(table)) =
                (elf.dynamic_relocations(), elf.dynamic_symbol_table())
            {
                for (slot, relocation) in relocations {
                    let RelocationTarget::Symbol(index) = relocation.target() else {
                        continue;
                    };
                    if relocation.flags()
                        != (RelocationFlags::Elf {
                            r_type: object::elf::R_X86_64_GLOB_DAT,
                        })
                    {
                        continue;
                    }
                    if let Some(name) = table
                        .symbol_by_index(index)
                        .ok()
                        .and_then(|s| s.name().ok())
                    {
                        got_slots.insert(name.to_string(), slot);
                    }
                }
            }
            Ok(DynamicSymbols {
                path: path.to_path_buf(),
                build_id: elf.build_id()?.map(hex),
                debug_link: elf.section_by_name(".gnu_debuglink").is_some(),
                defined,
                imported,
                segments,
                got_slots,
            })
        })
    }

    /// Whether the file defines `name`, whatever kind of symbol it is.
    pub(crate) fn defines(&self, name: &str) -> bool {
        self.defined.contains_key(name)
    }

    /// Whether the file uses `name` from another library.
    pub(crate) fn imports(&self, name: &str) -> bool {
        self.imported.contains(name)
    }

    /// Whether the file uses any symbol whose name starts with `prefix` from another library.
    pub(crate) fn imports_any(&self, prefix: &str) -> bool {
        self.imported.iter().any(|name| name.starts_with(prefix))
    }

    /// Whether the file defines or uses any symbol whose name starts with `prefix`.
    pub fn mentions_any(&self, prefix: &str) -> bool {
        self.imports_any(prefix) || self.defined.keys().any(|name| name.starts_with(prefix))
    }

    /// The file's GNU build-id in hex, or `None` if it has none.
    pub fn build_id(&self) -> Option<&str> {
        self.build_id.as_deref()
    }

    /// Whether the file names its separate debug file (a `.gnu_debuglink` section).
    pub fn has_debug_link(&self) -> bool {
        self.debug_link
    }

    /// The file's loadable segments.
    pub fn into_segments(self) -> LoadSegments {
        self.segments
    }

    /// File offset of a defined function: its address minus the start of the loadable segment
    /// that contains it, plus that segment's offset in the file.
    pub(crate) fn function_offset(&self, name: &str) -> Option<u64> {
        self.defined
            .get(name)
            .filter(|s| s.function)
            .and_then(|s| self.segments.file_offset(s.address, 1))
    }

    /// The address of a defined symbol of any kind, as linked (before the library is moved).
    pub(crate) fn address(&self, name: &str) -> Option<u64> {
        self.defined.get(name).map(|s| s.address)
    }

    /// The address, as linked, of the global offset table slot through which the file reaches
    /// the data object `name`.
    pub(crate) fn got_slot(&self, name: &str) -> Option<u64> {
        self.got_slots.get(name).copied()
    }

    /// The initial contents of a defined data object, as stored in the file.
    pub(crate) fn data(&self, name: &str) -> Result<Vec<u8>, DiscoveryError> {
        let symbol = self
            .defined
            .get(name)
            .ok_or_else(|| DiscoveryError::MissingSymbol {
                path: self.path.clone(),
                symbol: name.to_string(),
            })?;
        let offset = self
            .segments
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
