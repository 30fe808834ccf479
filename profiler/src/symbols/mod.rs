//! Symbolization: turns call sites (module and file offset, see [`CallSite`]) into the function
//! that made the MPI call and, where the binary has debug information, its source file and line,
//! with the functions inlined at the call.
//!
//! A stage between the store and the export: reports resolve the call sites they show once, off
//! the daemon's burst path, from the binaries the job ran. A module's file is trusted only while
//! its GNU build-id still matches the id the call site carries, so a binary rebuilt, replaced or
//! deleted since the job ran gives an unresolved site (module name and offset), never a wrong
//! name. This module depends on the model only.

mod names;
mod resolve;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::model::{CallSite, Name};

pub use resolve::SiteResolver;

/// What a call site's name was found in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NameSource {
    /// DWARF debug information (in the binary or its separate debug file): function, file, line
    /// and inlined functions.
    DebugInfo,
    /// The ELF symbol tables only: the function, without source lines.
    SymbolTable,
    /// No name: see [`SiteName::reason`].
    Unresolved,
}

/// One function of a call site: the function that made the call, or one inlined into it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame {
    /// Demangled (C++, Rust) or, for Fortran, the routine's own name (`mod::proc`).
    pub function: String,
    /// Source file of the call as the debug information names it (often an absolute path).
    pub file: Option<String>,
    pub line: Option<u32>,
}

impl Frame {
    /// `file.c:42 function`, or the function alone without a source line.
    fn label(&self) -> String {
        match self.location() {
            Some(location) => format!("{location} {}", self.function),
            None => self.function.clone(),
        }
    }

    /// `file.c:42`: the file name without its directories.
    fn location(&self) -> Option<String> {
        let file = self.file.as_deref()?;
        let name = file.rsplit('/').next().unwrap_or(file);
        Some(match self.line {
            Some(line) => format!("{name}:{line}"),
            None => name.to_string(),
        })
    }
}

/// The name of one call site, with the raw site it names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteName {
    /// The raw call site: module id (build-id in hex, or a path) and file offset of the return
    /// address of the MPI call.
    pub module: Name,
    pub offset: u64,
    /// File name of the executable or library, or the short build-id when its path is not known.
    pub module_name: String,
    pub source: NameSource,
    /// Why the site is unresolved; `None` when it is resolved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The function that made the call, then the functions inlined into it down to the one whose
    /// code made the call: outermost first, the call's own frame last. Empty when unresolved.
    pub frames: Vec<Frame>,
    /// Offset of the return address from the start of the outermost function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub function_offset: Option<u64>,
    /// How reports show the site ([`SiteName::label`]); written out for scripts.
    pub label: String,
}

impl SiteName {
    /// A site without a name, shown as its module's name and offset.
    pub fn unresolved(site: &CallSite, module_name: String, reason: impl Into<String>) -> Self {
        let mut name = SiteName {
            module: site.module,
            offset: site.offset,
            module_name,
            source: NameSource::Unresolved,
            reason: Some(reason.into()),
            frames: Vec::new(),
            function_offset: None,
            label: String::new(),
        };
        name.label = name.compute_label();
        name
    }

    /// A resolved site.
    fn resolved(
        site: &CallSite,
        module_name: String,
        source: NameSource,
        frames: Vec<Frame>,
        function_offset: Option<u64>,
    ) -> Self {
        let mut name = SiteName {
            module: site.module,
            offset: site.offset,
            module_name,
            source,
            reason: None,
            frames,
            function_offset,
            label: String::new(),
        };
        name.label = name.compute_label();
        name
    }

    pub fn is_resolved(&self) -> bool {
        self.source != NameSource::Unresolved
    }

    /// How the site is shown: `solver.f90:512 smooth` (the frame that made the call, with
    /// ` in outer` when it was inlined into another function), `smooth+0x3c` from a symbol table,
    /// or `libfoo.so+0x1f3c (unresolved)`.
    pub fn label(&self) -> &str {
        &self.label
    }

    fn compute_label(&self) -> String {
        let (Some(outer), Some(inner)) = (self.frames.first(), self.frames.last()) else {
            return format!("{} (unresolved)", self.raw());
        };
        match self.source {
            NameSource::SymbolTable => match self.function_offset {
                Some(offset) => format!("{}+{offset:#x}", outer.function),
                None => outer.function.clone(),
            },
            _ if self.frames.len() > 1 => format!("{} in {}", inner.label(), outer.function),
            _ => inner.label(),
        }
    }

    /// `module+0xoffset`, the raw site with the module's name.
    pub fn raw(&self) -> String {
        format!("{}+{:#x}", self.module_name, self.offset)
    }

    /// The frame whose code made the call.
    fn caller(&self) -> Option<&Frame> {
        self.frames.last()
    }
}

/// Names of the call sites a report shows; a site missing from the table is shown unresolved.
#[derive(Clone, Debug, Default)]
pub struct SiteNames {
    names: HashMap<CallSite, SiteName>,
}

impl SiteNames {
    /// The name of `site`, or an unresolved one when the table does not hold it.
    pub fn name(&self, site: &CallSite) -> std::borrow::Cow<'_, SiteName> {
        match self.names.get(site) {
            Some(name) => std::borrow::Cow::Borrowed(name),
            None => std::borrow::Cow::Owned(SiteName::unresolved(
                site,
                short_module_name(&site.module),
                "not symbolized",
            )),
        }
    }

    pub fn label(&self, site: &CallSite) -> String {
        self.name(site).label().to_string()
    }

    /// A code region as `start → end`: `solver.f90:512 smooth → solver.f90:563`, the end's
    /// function left out when the region starts and ends in the same function of the same file,
    /// and one `(unresolved)` mark when neither end is resolved.
    pub fn region(&self, start: &CallSite, end: &CallSite) -> String {
        let (a, b) = (self.name(start), self.name(end));
        if !a.is_resolved() && !b.is_resolved() {
            return format!("{} → {} (unresolved)", a.raw(), b.raw());
        }
        let end_label = match (a.caller(), b.caller()) {
            (Some(x), Some(y))
                if x.function == y.function && x.file.is_some() && x.file == y.file =>
            {
                y.location().unwrap_or_else(|| b.label().to_string())
            }
            _ => b.label().to_string(),
        };
        format!("{} → {end_label}", a.label())
    }

    /// Every name held, ordered by module and offset.
    pub fn entries(&self) -> Vec<&SiteName> {
        let mut entries: Vec<&SiteName> = self.names.values().collect();
        entries.sort_by(|a, b| (&a.module, a.offset).cmp(&(&b.module, b.offset)));
        entries
    }

    fn contains(&self, site: &CallSite) -> bool {
        self.names.contains_key(site)
    }

    fn insert(&mut self, site: CallSite, name: SiteName) {
        self.names.insert(site, name);
    }
}

/// The name a module is shown by when its path is not known: the file name of a path, the first
/// 12 digits of a build-id.
pub fn short_module_name(module: &str) -> String {
    let name = module.rsplit('/').next().unwrap_or(module);
    if name.len() > 12 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
        name[..12].to_string()
    } else {
        name.to_string()
    }
}
