//! /proc/PID/stat: `pid (comm) state ppid ...`, the fields proc_pid_stat(5) numbers from 1. The
//! command name is whatever the process called itself (up to 15 bytes, any but NUL, spaces and
//! parentheses included), so the fields after it start after the last `)`.

use super::{read_process_file, ProcError};

/// What is wrong with a /proc/PID/stat text.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum StatError {
    #[error("no '(' before the command name")]
    NoCommandStart,
    #[error("no ')' after the command name")]
    NoCommandEnd,
    #[error("field 1 (pid) is not a number")]
    Pid,
    #[error("the fields after the command name are not text")]
    NotText,
    #[error("field {0} is not a number")]
    NotANumber(usize),
    #[error("field {field} ({name}) is out of range")]
    OutOfRange { field: usize, name: &'static str },
}

/// One /proc/PID/stat text, split into its fields.
#[derive(Debug)]
pub struct StatFields<'a> {
    pub pid: u32,
    /// The command name, with bytes that are not UTF-8 replaced.
    pub comm: String,
    /// Fields 3 (state) onwards.
    rest: Vec<&'a str>,
}

impl<'a> StatFields<'a> {
    /// Splits a stat text.
    pub fn parse(text: &'a [u8]) -> Result<StatFields<'a>, StatError> {
        let open = text
            .iter()
            .position(|&b| b == b'(')
            .ok_or(StatError::NoCommandStart)?;
        let close = text
            .iter()
            .rposition(|&b| b == b')')
            .filter(|&close| close > open)
            .ok_or(StatError::NoCommandEnd)?;
        let pid = std::str::from_utf8(&text[..open])
            .ok()
            .and_then(|pid| pid.trim().parse().ok())
            .ok_or(StatError::Pid)?;
        let rest = std::str::from_utf8(&text[close + 1..]).map_err(|_| StatError::NotText)?;
        Ok(StatFields {
            pid,
            comm: String::from_utf8_lossy(&text[open + 1..close]).into_owned(),
            rest: rest.split_ascii_whitespace().collect(),
        })
    }

    /// Field `n` (n ≥ 3) as a number.
    pub fn number(&self, n: usize) -> Result<u64, StatError> {
        n.checked_sub(3)
            .and_then(|i| self.rest.get(i))
            .and_then(|v| v.parse().ok())
            .ok_or(StatError::NotANumber(n))
    }
}

/// What discovery needs of a process's stat line: who it is and who started it.
#[derive(Clone, Debug)]
pub(crate) struct ProcStat {
    pub(crate) pid: u32,
    pub(crate) comm: String,
    pub(crate) ppid: u32,
    /// Clock ticks after boot; with the pid it names a process uniquely across pid reuse.
    pub(crate) start_time: u64,
}

/// Reads /proc/PID/stat.
pub(crate) fn read_stat(pid: u32) -> Result<ProcStat, ProcError> {
    let text = read_process_file(pid, "stat")?;
    parse_stat(&text).map_err(|e| ProcError::Format {
        path: format!("/proc/{pid}/stat").into(),
        detail: e.to_string(),
    })
}

/// Parses the text of a /proc/PID/stat file as [`read_stat`] does.
pub(crate) fn parse_stat(text: &[u8]) -> Result<ProcStat, StatError> {
    let stat = StatFields::parse(text)?;
    Ok(ProcStat {
        pid: stat.pid,
        ppid: u32::try_from(stat.number(4)?).map_err(|_| StatError::OutOfRange {
            field: 4,
            name: "ppid",
        })?,
        start_time: stat.number(22)?,
        comm: stat.comm,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_names_with_spaces_and_parentheses() {
        let stat = StatFields::parse(b"42 (a) (b c) S 7 42 42 0 -1 0 0 0 0 0 3 4\n").unwrap();
        assert_eq!((stat.pid, stat.comm.as_str()), (42, "a) (b c"));
        assert_eq!(stat.number(4), Ok(7));
        assert_eq!(stat.number(14), Ok(3));
        assert_eq!(stat.number(15), Ok(4));
        assert_eq!(stat.number(16), Err(StatError::NotANumber(16)));
        assert_eq!(
            StatFields::parse(b"1 (\xff\xfe) R 0").unwrap().comm,
            "\u{fffd}\u{fffd}"
        );
    }

    #[test]
    fn texts_that_are_not_stat_lines_are_errors() {
        let error = |text: &[u8]| StatFields::parse(text).unwrap_err().to_string();
        assert_eq!(error(b"1 x) R"), "no '(' before the command name");
        assert_eq!(error(b") 5 (x"), "no ')' after the command name");
        // Found by the proc_stat fuzz target: procfs's parser sliced the text two bytes after
        // the last ')', past the end of "1 (x)" and inside the '€' of "1 (x)€ 2", and panicked.
        assert!(StatFields::parse(b"1 (x)").unwrap().number(3).is_err());
        assert_eq!(
            StatFields::parse("1 (x)€ 2".as_bytes()).unwrap().number(4),
            Ok(2)
        );
        assert_eq!(error(b"(x) R 1"), "field 1 (pid) is not a number");
        assert_eq!(
            error(b"9 (x) R \xe2\x80 1"),
            "the fields after the command name are not text"
        );
    }

    #[test]
    fn the_parent_and_start_time_of_a_stat_line() {
        let stat = parse_stat(
            b"7 (mpirun.openmpi) S 1 7 7 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 \
            4242 0 0 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n",
        )
        .unwrap();
        assert_eq!((stat.pid, stat.ppid, stat.start_time), (7, 1, 4242));
        assert_eq!(stat.comm, "mpirun.openmpi");
        assert_eq!(
            parse_stat(b"7 (x) S").unwrap_err().to_string(),
            "field 4 is not a number"
        );
        assert_eq!(
            parse_stat(b"7 (x) S 4294967296").unwrap_err(),
            StatError::OutOfRange {
                field: 4,
                name: "ppid"
            }
        );
        assert!(matches!(
            read_stat(u32::MAX),
            Err(ProcError::ProcessGone { .. })
        ));
    }
}
