//! The resolver: call sites to names with blazesym (ELF symbol tables, DWARF, split debug files
//! found by build-id under /usr/lib/debug or by `.gnu_debuglink`), each module's file checked
//! against the build-id of the call site before it is read.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::names::function_name;
use super::{short_module_name, Frame, NameSource, SiteName, SiteNames};
use crate::discovery::{DynamicSymbols, LoadSegments};
use crate::model::{CallSite, Name};
use blazesym::symbolize::{
    source::{Elf, Source},
    Input, Sym, Symbolized, Symbolizer,
};

/// Upper bound on names kept; a job shows a few hundred call sites at most, and the bound keeps a
/// long-running daemon's memory independent of how many jobs it has served.
const NAME_CACHE_LIMIT: usize = 65_536;

/// A file's identity: device, inode and modification time. A file rebuilt in place or replaced
/// under the same path gets another one.
type FileKey = (u64, u64, i64, i64);

fn file_key(path: &Path) -> std::io::Result<FileKey> {
    let meta = std::fs::metadata(path)?;
    Ok((meta.dev(), meta.ino(), meta.mtime(), meta.mtime_nsec()))
}

/// What a module's file gave when it was last checked.
#[derive(Clone)]
enum ModuleFile {
    /// The file carries the module's build-id. `fortran`: it uses the GNU Fortran runtime;
    /// `debug_link`: it names its separate debug file (which blazesym then finds); `segments`
    /// turn its file offsets into the addresses a debug file found by build-id is keyed by.
    Usable {
        key: FileKey,
        fortran: bool,
        debug_link: bool,
        segments: Arc<LoadSegments>,
    },
    /// Why the file cannot name the module's sites.
    Unusable(String),
}

/// Resolves call sites to names. Resolved names are cached per call site: a build-id and an
/// offset name the same instruction for ever, so they never go stale. Each module's file is
/// checked once per file identity; the parsed debug information is kept only for one call of
/// [`SiteResolver::names`] (blazesym's symbolizer is bound to one thread).
#[derive(Default)]
pub struct SiteResolver {
    resolved: HashMap<CallSite, SiteName>,
    /// Per module id and path: the file identity seen at the last check and what it gave.
    files: HashMap<(Name, PathBuf), (Option<FileKey>, ModuleFile)>,
    /// Directories searched for split debug files; `None`: blazesym's defaults (/usr/lib/debug,
    /// /lib/debug, each with its `.build-id` tree).
    debug_dirs: Option<Vec<PathBuf>>,
}

impl SiteResolver {
    pub fn new() -> Self {
        Self::default()
    }

    /// A resolver that looks for split debug files in `dirs` (and next to each binary) only.
    pub fn with_debug_dirs(dirs: Vec<PathBuf>) -> Self {
        SiteResolver {
            debug_dirs: Some(dirs),
            ..Self::default()
        }
    }

    /// The names of `sites`. `modules` maps a module id (a build-id in hex) to the path of its
    /// file as the job's processes mapped it ([`crate::model::CallSite::module`]); a module not
    /// in it, or whose file no longer carries its build-id, gives unresolved sites.
    pub fn names<'a>(
        &mut self,
        sites: impl IntoIterator<Item = &'a CallSite>,
        modules: &BTreeMap<String, String>,
    ) -> SiteNames {
        let mut names = SiteNames::default();
        let mut wanted: BTreeMap<Name, BTreeSet<&CallSite>> = BTreeMap::new();
        for site in sites {
            if names.contains(site) {
                continue;
            }
            match self.resolved.get(site) {
                Some(name) => names.insert(site.clone(), name.clone()),
                None => {
                    wanted.entry(site.module).or_default().insert(site);
                }
            }
        }
        if wanted.is_empty() {
            return names;
        }
        let symbolizer = self.symbolizer();
        for (module, sites) in wanted {
            let sites: Vec<&CallSite> = sites.into_iter().collect();
            let path = modules.get(module.as_ref()).map(PathBuf::from);
            let module_name = path.as_deref().and_then(Path::file_name).map_or_else(
                || short_module_name(&module),
                |n| n.to_string_lossy().into(),
            );
            let checked = match &path {
                Some(path) => self.check(&module, path),
                None => ModuleFile::Unusable(unknown_file_reason(&module)),
            };
            let resolved = match (&checked, &path) {
                (ModuleFile::Usable { key, fortran, .. }, Some(path)) => {
                    // The call is the instruction before the return address: see `symbolize`.
                    let offsets: Vec<u64> =
                        sites.iter().map(|s| s.offset.saturating_sub(1)).collect();
                    let input = Input::FileOffset(offsets.as_slice());
                    let file = FileToRead {
                        path,
                        key: *key,
                        fortran: *fortran,
                    };
                    symbolize(&symbolizer, &file, input, &sites, &module_name).map(|mut names| {
                        self.name_from_build_id_debug_file(
                            &symbolizer,
                            &module,
                            &checked,
                            &sites,
                            &mut names,
                        );
                        names
                    })
                }
                _ => None,
            };
            match (resolved, checked) {
                (Some(resolved), _) => {
                    if self.resolved.len() + resolved.len() > NAME_CACHE_LIMIT {
                        self.resolved.clear();
                    }
                    for (site, name) in sites.into_iter().zip(resolved) {
                        if name.is_resolved() {
                            self.resolved.insert(site.clone(), name.clone());
                        }
                        names.insert(site.clone(), name);
                    }
                }
                (None, checked) => {
                    let reason = match checked {
                        ModuleFile::Unusable(reason) => reason,
                        ModuleFile::Usable { .. } => {
                            "the file changed while it was read".to_string()
                        }
                    };
                    for site in sites {
                        let name = SiteName::unresolved(site, module_name.clone(), reason.clone());
                        names.insert(site.clone(), name);
                    }
                }
            }
        }
        names
    }

    /// Names the sites that `names` holds without debug information from the debug file
    /// `<debug dir>/.build-id/xx/yyyy.debug` of the module, when its binary has no debug link to
    /// it (a binary stripped without one): blazesym follows debug links only.
    fn name_from_build_id_debug_file(
        &self,
        symbolizer: &Symbolizer,
        module: &str,
        checked: &ModuleFile,
        sites: &[&CallSite],
        names: &mut [SiteName],
    ) {
        let ModuleFile::Usable {
            fortran,
            debug_link: false,
            segments,
            ..
        } = checked
        else {
            return;
        };
        let missing: Vec<usize> = (0..sites.len())
            .filter(|&i| names[i].source != NameSource::DebugInfo)
            .collect();
        if missing.is_empty() || module.len() < 3 {
            return;
        }
        let default_dirs = [PathBuf::from("/usr/lib/debug"), PathBuf::from("/lib/debug")];
        let dirs = self.debug_dirs.as_deref().unwrap_or(&default_dirs);
        let debug_file = dirs
            .iter()
            .map(|d| {
                d.join(".build-id")
                    .join(&module[..2])
                    .join(format!("{}.debug", &module[2..]))
            })
            .find(|p| p.is_file());
        let Some(path) = debug_file else {
            return;
        };
        let Ok(key) = file_key(&path) else {
            return;
        };
        if !matches!(DynamicSymbols::read(&path), Ok(elf) if elf.build_id() == Some(module)) {
            return;
        }
        let addresses: Option<Vec<u64>> = missing
            .iter()
            .map(|&i| segments.address(sites[i].offset.saturating_sub(1)))
            .collect();
        let Some(addresses) = addresses else {
            return;
        };
        let file = FileToRead {
            path: &path,
            key,
            fortran: *fortran,
        };
        let wanted: Vec<&CallSite> = missing.iter().map(|&i| sites[i]).collect();
        let input = Input::VirtOffset(addresses.as_slice());
        let module_name = names[missing[0]].module_name.clone();
        let Some(found) = symbolize(symbolizer, &file, input, &wanted, &module_name) else {
            return;
        };
        for (i, name) in missing.into_iter().zip(found) {
            if name.source == NameSource::DebugInfo {
                names[i] = name;
            }
        }
    }

    fn symbolizer(&self) -> Symbolizer {
        Symbolizer::builder()
            .enable_code_info(true)
            .enable_inlined_fns(true)
            .enable_demangling(true)
            .set_debug_dirs(self.debug_dirs.as_deref())
            .build()
    }

    /// Whether the file at `path` still is the module `module` names, checked again only when
    /// the file's identity changed since the last check.
    fn check(&mut self, module: &Name, path: &Path) -> ModuleFile {
        let key = file_key(path).ok();
        let entry = (*module, path.to_path_buf());
        if let Some((seen, verdict)) = self.files.get(&entry) {
            if *seen == key {
                return verdict.clone();
            }
        }
        let verdict = match key {
            None => ModuleFile::Unusable(format!(
                "{} is gone (deleted or not on this node)",
                path.display()
            )),
            Some(key) => check_file(module, path, key),
        };
        self.files.insert(entry, (key, verdict.clone()));
        verdict
    }
}

/// Why a module without a known file cannot be resolved.
fn unknown_file_reason(module: &str) -> String {
    if module == "?" {
        "the address was in no mapped file".to_string()
    } else if module.starts_with('/') {
        "the file has no build-id to check it against (or was deleted while the job ran)"
            .to_string()
    } else {
        "the recording does not say where the module's file was".to_string()
    }
}

/// Whether the file at `path` carries the build-id `module`, and what symbolization needs of it.
fn check_file(module: &str, path: &Path, key: FileKey) -> ModuleFile {
    match DynamicSymbols::read(path) {
        Err(e) => ModuleFile::Unusable(e.to_string()),
        Ok(elf) if elf.build_id() == Some(module) => ModuleFile::Usable {
            key,
            fortran: elf.mentions_any("_gfortran_"),
            debug_link: elf.has_debug_link(),
            segments: Arc::new(elf.into_segments()),
        },
        Ok(elf) if elf.build_id().is_some() => ModuleFile::Unusable(format!(
            "{} was rebuilt or replaced since the job ran (another build-id)",
            path.display()
        )),
        Ok(_) => ModuleFile::Unusable(format!(
            "{} was replaced since the job ran (it has no build-id now)",
            path.display()
        )),
    }
}

/// A file to read names from: its path, its identity when it was checked, and whether its
/// binary uses the GNU Fortran runtime.
struct FileToRead<'a> {
    path: &'a Path,
    key: FileKey,
    fortran: bool,
}

/// Names of `sites` in `file`, in their order, from `input`: the addresses of the calls (a call
/// site is a return address: the call is the instruction before it, and the address itself may
/// already belong to the next line or, after a call that does not return, to the next function).
/// `None` when the file changed while it was read, so that no name from another file is returned.
fn symbolize(
    symbolizer: &Symbolizer,
    file: &FileToRead<'_>,
    input: Input<&[u64]>,
    sites: &[&CallSite],
    module_name: &str,
) -> Option<Vec<SiteName>> {
    let (path, fortran) = (file.path, file.fortran);
    let source = Source::Elf(Elf::new(path));
    let results = symbolizer.symbolize(&source, input);
    if file_key(path).ok() != Some(file.key) {
        return None;
    }
    let names = match results {
        Ok(results) => sites
            .iter()
            .zip(results)
            .map(|(site, result)| match result {
                Symbolized::Sym(sym) => site_name(site, module_name, sym, fortran),
                Symbolized::Unknown(reason) => {
                    SiteName::unresolved(site, module_name.to_string(), reason.to_string())
                }
            })
            .collect(),
        Err(e) => sites
            .iter()
            .map(|site| {
                let reason = format!("cannot read the symbols of {}: {e}", path.display());
                SiteName::unresolved(site, module_name.to_string(), reason)
            })
            .collect(),
    };
    Some(names)
}

fn site_name(site: &CallSite, module_name: &str, sym: Sym<'_>, fortran: bool) -> SiteName {
    let function = |name: &str| function_name(name, fortran);
    let source = if sym.code_info.is_some() {
        NameSource::DebugInfo
    } else {
        NameSource::SymbolTable
    };
    if source == NameSource::SymbolTable && sym.size.is_none() {
        // A symbol without a size is extended to the next one by blazesym: the address may lie
        // past its end, in code no symbol names.
        let reason = format!(
            "no sized symbol covers the address; nearest before it is {}",
            sym.name
        );
        return SiteName::unresolved(site, module_name.to_string(), reason);
    }
    let code = |info: Option<&blazesym::symbolize::CodeInfo<'_>>| {
        (
            info.map(|c| c.to_path().to_string_lossy().into_owned()),
            info.and_then(|c| c.line),
        )
    };
    let (file, line) = code(sym.code_info.as_deref());
    let mut frames = vec![Frame {
        function: function(&sym.name),
        file,
        line,
    }];
    for inlined in sym.inlined.iter() {
        let (file, line) = code(inlined.code_info.as_ref());
        frames.push(Frame {
            function: function(&inlined.name),
            file,
            line,
        });
    }
    // The symbolized address is the return address less one.
    let function_offset = Some(sym.offset as u64 + 1);
    SiteName::resolved(
        site,
        module_name.to_string(),
        source,
        frames,
        function_offset,
    )
}
