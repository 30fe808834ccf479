//! The library's imports keep the layering its crate documentation states (profiler/src/lib.rs):
//! each top-level module imports only the modules listed before it, and within every folder the
//! files import each other one way, with no circle. Reads the sources as text: comments and test
//! code (`#[cfg(test)] mod …` blocks at the end of a file, tests.rs and test_support.rs files) do
//! not count.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// A module path below the crate root: `["store", "members"]`.
type ModPath = Vec<String>;

fn source_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiler/src")
}

/// Every non-test source file of the library, by module path.
fn modules() -> BTreeMap<ModPath, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![source_root()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let rel = path.strip_prefix(source_root()).unwrap();
            let name = rel.file_stem().unwrap().to_str().unwrap();
            if path.extension().is_none_or(|e| e != "rs")
                || ["tests", "test_support", "testing", "main"].contains(&name)
            {
                continue;
            }
            let mut module: ModPath = rel
                .parent()
                .unwrap()
                .components()
                .map(|c| c.as_os_str().to_str().unwrap().to_string())
                .collect();
            if !["mod", "lib"].contains(&name) {
                module.push(name.to_string());
            }
            out.insert(module, code_of(&std::fs::read_to_string(&path).unwrap()));
        }
    }
    out
}

/// A file's code without its comments and its test module.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod ") {
        Some(at) => &text[..at],
        None => text,
    };
    text.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split(" // ").next().unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths a file names through `crate::` and `super::`, from the crate root.
fn named_paths(module: &ModPath, is_mod_file: bool, code: &str) -> BTreeSet<ModPath> {
    // A mod.rs (or lib.rs) is its folder's module: its `super` is the folder's parent.
    let parent: ModPath = if is_mod_file || module.is_empty() {
        module
            .iter()
            .take(module.len().saturating_sub(1))
            .cloned()
            .collect()
    } else {
        module[..module.len() - 1].to_vec()
    };
    let mut paths = BTreeSet::new();
    for (prefix, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut rest = code;
        while let Some(at) = rest.find(prefix) {
            let before = rest[..at].chars().last();
            rest = &rest[at + prefix.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            for path in expand(rest) {
                let mut full = base.clone();
                full.extend(path);
                paths.insert(full);
            }
        }
    }
    paths
}

/// The paths of a `use` tree or a path expression starting at `text`: `a::b`, `a::{b, c::d}`.
fn expand(text: &str) -> Vec<ModPath> {
    let ident: String = text
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    let after = &text[ident.len()..];
    if ident.is_empty() {
        return match after.strip_prefix('{') {
            Some(group) => split_group(group).iter().flat_map(|g| expand(g)).collect(),
            None => Vec::new(),
        };
    }
    match after.strip_prefix("::") {
        Some(more) => {
            let tails = expand(more);
            if tails.is_empty() {
                vec![vec![ident]]
            } else {
                tails
                    .into_iter()
                    .map(|t| std::iter::once(ident.clone()).chain(t).collect())
                    .collect()
            }
        }
        None => vec![vec![ident]],
    }
}

/// The items of a brace group, up to its closing brace.
fn split_group(text: &str) -> Vec<&str> {
    let (mut depth, mut start, mut items) = (0, 0, Vec::new());
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(text[start..i].trim());
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(text[start..i].trim());
                start = i + 1;
            }
            _ => {}
        }
    }
    items
}

/// The top-level modules in the order lib.rs's layering table lists them: lines `//! N. name …`.
fn stated_layers() -> Vec<String> {
    let lib = std::fs::read_to_string(source_root().join("lib.rs")).unwrap();
    lib.lines()
        .filter_map(|l| l.strip_prefix("//! "))
        .filter_map(|l| {
            let (number, rest) = l.split_once(". ")?;
            number.trim().parse::<u32>().ok()?;
            let name = rest.trim_start_matches('`');
            Some(name.split(['`', ' ']).next()?.to_string())
        })
        .collect()
}

fn import_graph() -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let modules = modules();
    let root = source_root();
    modules
        .iter()
        .map(|(module, code)| {
            let dir = root.join(module.join("/"));
            let is_mod_file = dir.is_dir();
            let named = named_paths(module, is_mod_file, code);
            // Resolve each path to the longest prefix that is a module file.
            let imports = named
                .into_iter()
                .filter_map(|path| {
                    (1..=path.len())
                        .rev()
                        .map(|n| path[..n].to_vec())
                        .find(|p| modules.contains_key(p))
                })
                .filter(|p| p != module)
                .collect();
            (module.clone(), imports)
        })
        .collect()
}

#[test]
fn each_top_level_module_imports_only_the_layers_before_it() {
    let layers = stated_layers();
    assert!(
        layers.len() >= 10,
        "lib.rs states no layering table (lines `//! N. name …`): {layers:?}"
    );
    let rank = |name: &str| layers.iter().position(|l| l == name);
    let mut wrong = Vec::new();
    for (module, imports) in import_graph() {
        let Some(own) = module.first() else { continue };
        let Some(own_rank) = rank(own) else {
            wrong.push(format!("{own} is not in lib.rs's layering table"));
            continue;
        };
        for import in imports {
            let other = &import[0];
            if other == own {
                continue;
            }
            match rank(other) {
                Some(r) if r < own_rank => {}
                _ => wrong.push(format!(
                    "{} imports {} ({other} is not a layer below {own})",
                    module.join("::"),
                    import.join("::")
                )),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layering:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_files_of_each_folder_import_each_other_one_way() {
    let graph = import_graph();
    // Edges between siblings only: two files of one folder.
    let siblings: BTreeMap<&ModPath, Vec<&ModPath>> = graph
        .iter()
        .map(|(module, imports)| {
            let same_folder = imports
                .iter()
                .filter(|i| {
                    i.len() == module.len()
                        && !module.is_empty()
                        && i[..i.len() - 1] == module[..module.len() - 1]
                })
                .collect();
            (module, same_folder)
        })
        .collect();
    let mut circles = Vec::new();
    for start in siblings.keys() {
        // A depth-first walk from each file: a way back to it is a circle.
        let mut stack = vec![(*start, vec![*start])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in siblings.get(at).into_iter().flatten() {
                if next == start {
                    let names: Vec<String> = trail.iter().map(|m| m.join("::")).collect();
                    circles.push(format!("{} → {}", names.join(" → "), start.join("::")));
                } else if seen.insert(*next) {
                    let mut longer = trail.clone();
                    longer.push(next);
                    stack.push((next, longer));
                }
            }
        }
    }
    assert!(
        circles.is_empty(),
        "files that import each other:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_reader_finds_use_trees_and_paths() {
    let module = vec!["daemon".to_string(), "attach".to_string()];
    let paths = named_paths(
        &module,
        false,
        "use super::{a::B, c};\nuse crate::{store::{x, y::Z}, model};\nlet n = crate::capture::f();",
    );
    let names: BTreeSet<String> = paths.iter().map(|p| p.join("::")).collect();
    let expected = [
        "daemon::a::B",
        "daemon::c",
        "store::x",
        "store::y::Z",
        "model",
        "capture::f",
    ];
    assert_eq!(names, expected.iter().map(|s| s.to_string()).collect());
}
