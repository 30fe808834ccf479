//! Values read from files, kept per version of each file: every rank of a node maps the same
//! few libraries, and reading one's symbols takes about a millisecond.

use std::collections::HashMap;
use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;
use std::sync::{Mutex, OnceLock, PoisonError};

/// A file's version: its identity (device, inode) and modification time. A file reached through
/// several paths has one version; a file rewritten in place (inode kept) gets a new one.
type Version = (u64, u64, i64, i64);

/// The bound of a cache: a node maps a few thousand distinct files, and the bound keeps a
/// long-running daemon's memory independent of how many it has seen.
pub(super) const FILES_CACHED: usize = 8192;

fn version(meta: &Metadata) -> Version {
    (meta.dev(), meta.ino(), meta.mtime(), meta.mtime_nsec())
}

/// Values read from files, by file version, at most `limit` (when full, it starts again empty).
pub(super) struct FileCache<T> {
    limit: usize,
    entries: OnceLock<Mutex<HashMap<Version, T>>>,
}

impl<T: Clone> FileCache<T> {
    pub(super) const fn new(limit: usize) -> Self {
        Self {
            limit,
            entries: OnceLock::new(),
        }
    }

    /// The value of the file that `meta` describes: the one kept for its version, else what
    /// `read` returns, kept if it is not an error. The lock is not held while `read` runs.
    pub(super) fn get_or_read<E>(
        &self,
        meta: &Metadata,
        read: impl FnOnce() -> Result<T, E>,
    ) -> Result<T, E> {
        let entries = self.entries.get_or_init(Default::default);
        let key = version(meta);
        let kept = entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned();
        if let Some(value) = kept {
            return Ok(value);
        }
        let value = read()?;
        let mut entries = entries.lock().unwrap_or_else(PoisonError::into_inner);
        if entries.len() >= self.limit {
            entries.clear();
        }
        entries.insert(key, value.clone());
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::{Duration, SystemTime};

    use super::*;

    #[test]
    fn a_file_is_read_once_per_version_and_errors_are_not_kept() {
        let file = tempfile::NamedTempFile::new().unwrap();
        let reads = Cell::new(0);
        let cache = FileCache::new(8);
        let read = |value: u32| {
            reads.set(reads.get() + 1);
            Ok::<_, ()>(value)
        };
        let meta = || file.path().metadata().unwrap();
        assert_eq!(cache.get_or_read(&meta(), || read(1)), Ok(1));
        // Through another path (a hard link), the same version.
        let link = file.path().with_extension("link");
        std::fs::hard_link(file.path(), &link).unwrap();
        assert_eq!(
            cache.get_or_read(&link.metadata().unwrap(), || read(2)),
            Ok(1)
        );
        std::fs::remove_file(&link).unwrap();
        assert_eq!(reads.get(), 1);
        // Rewritten in place: a new modification time, read again.
        let later = SystemTime::now() + Duration::from_secs(5);
        file.as_file().set_modified(later).unwrap();
        assert_eq!(cache.get_or_read(&meta(), || read(3)), Ok(3));
        assert_eq!(reads.get(), 2);
        // A failed read is tried again next time.
        file.as_file()
            .set_modified(later + Duration::from_secs(1))
            .unwrap();
        assert_eq!(cache.get_or_read(&meta(), || Err::<u32, ()>(())), Err(()));
        assert_eq!(cache.get_or_read(&meta(), || read(4)), Ok(4));
    }

    #[test]
    fn a_full_cache_starts_again_empty() {
        let files: Vec<_> = (0..3)
            .map(|_| tempfile::NamedTempFile::new().unwrap())
            .collect();
        let cache = FileCache::new(2);
        for (i, f) in files.iter().enumerate() {
            let meta = f.path().metadata().unwrap();
            assert_eq!(cache.get_or_read(&meta, || Ok::<_, ()>(i)), Ok(i));
        }
        let len = cache.entries.get().unwrap().lock().unwrap().len();
        assert_eq!(len, 1, "the third file found the cache full");
    }
}
