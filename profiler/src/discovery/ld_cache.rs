//! glibc's dynamic-loader cache (/etc/ld.so.cache): which shared libraries the loader finds by
//! name, read from the cache file itself.

use std::path::{Path, PathBuf};

use super::error::DiscoveryError;

/// The cache the dynamic loader reads.
pub(super) const LD_CACHE: &str = "/etc/ld.so.cache";

/// Paths of the libraries listed in an ld.so cache file whose soname `wanted` accepts. Parsing
/// the file rather than running `ldconfig -p` keeps a root daemon from spawning programs found
/// through `PATH`.
pub(super) fn library_paths(
    cache: &Path,
    wanted: impl Fn(&str) -> bool,
) -> Result<Vec<PathBuf>, DiscoveryError> {
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
        let bytes = data
            .get(at..)
            .and_then(<[u8]>::first_chunk::<4>)
            .ok_or_else(|| error("truncated"))?;
        Ok(u32::from_ne_bytes(*bytes) as usize)
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
        if wanted(soname) {
            paths.push(PathBuf::from(string(u32_at(entry + 8)?)?));
        }
    }
    Ok(paths)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::test_support::tool;

    fn mpi_paths(cache: &Path) -> Result<Vec<PathBuf>, DiscoveryError> {
        library_paths(cache, |soname| soname.starts_with("libmpi"))
    }

    #[test]
    fn new_and_compat_ld_cache_formats_list_the_same_libraries() {
        let current = mpi_paths(Path::new(LD_CACHE)).unwrap();
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
        let mut from_compat = mpi_paths(&compat).unwrap();
        let mut current = current;
        from_compat.sort();
        current.sort();
        assert_eq!(from_compat, current);
        assert!(mpi_paths(Path::new("/nonexistent/ld.so.cache"))
            .unwrap()
            .is_empty());
    }
}
