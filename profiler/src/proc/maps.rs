//! /proc/PID/maps: the memory mappings of a process, each with the file (if any) and the file
//! offset it maps.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use super::{read_process_file, ProcError};

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

/// A line of a maps file that is not a mapping.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line} is not `start-end perms offset device inode [path]`: {text:?}")]
pub struct MapsError {
    line: usize,
    /// The line's start, with bytes that are not UTF-8 replaced.
    text: String,
}

/// Reads `/proc/<pid>/maps`.
pub fn read_maps(pid: u32) -> Result<Vec<Mapping>, ProcError> {
    let text = read_process_file(pid, "maps")?;
    parse_maps(&text).map_err(|e| ProcError::Format {
        path: format!("/proc/{pid}/maps").into(),
        detail: e.to_string(),
    })
}

/// Parses the text of a `/proc/<pid>/maps` file, one mapping a line:
/// `start-end perms offset major:minor inode [path]`, the numbers but the inode in hex. File
/// names are bytes, not necessarily UTF-8, and may contain spaces. The error names the first
/// line that is not a mapping.
pub fn parse_maps(text: &[u8]) -> Result<Vec<Mapping>, MapsError> {
    text.split(|&b| b == b'\n')
        .enumerate()
        .filter(|(_, line)| !line.is_empty())
        .map(|(index, line)| {
            parse_line(line).ok_or_else(|| MapsError {
                line: index + 1,
                text: String::from_utf8_lossy(&line[..line.len().min(120)]).into_owned(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
        assert!(error.to_string().starts_with("line 2 is not"), "{error}");
        assert_eq!(parse_line("7f00-7f10 r-xp 0 fd:01 -1 /lib.so"), None);
        assert!(parse_maps(b"").unwrap().is_empty());
    }

    #[test]
    fn reads_the_maps_of_this_process() {
        let maps = read_maps(std::process::id()).unwrap();
        let code = mapping_of_this_function as *const () as usize as u64;
        assert!(maps
            .iter()
            .any(|m| m.start <= code && code < m.end && m.path.is_some()));
        assert!(matches!(
            read_maps(u32::MAX),
            Err(ProcError::ProcessGone { .. })
        ));
    }

    fn mapping_of_this_function() {}
}
