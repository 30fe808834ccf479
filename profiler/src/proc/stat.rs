//! /proc/PID/stat: `pid (comm) state ppid ...`, the fields proc_pid_stat(5) numbers from 1. The
//! command name is whatever the process called itself (up to 15 bytes, any but NUL, spaces and
//! parentheses included), so the fields after it start after the last `)`.

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
    /// Splits a stat text; the error says what is wrong with it.
    pub fn parse(text: &'a [u8]) -> Result<StatFields<'a>, String> {
        let open = text
            .iter()
            .position(|&b| b == b'(')
            .ok_or("no '(' before the command name")?;
        let close = text
            .iter()
            .rposition(|&b| b == b')')
            .filter(|&close| close > open)
            .ok_or("no ')' after the command name")?;
        let pid = std::str::from_utf8(&text[..open])
            .ok()
            .and_then(|pid| pid.trim().parse().ok())
            .ok_or("field 1 (pid) is not a number")?;
        let rest = std::str::from_utf8(&text[close + 1..])
            .map_err(|_| "the fields after the command name are not text")?;
        Ok(StatFields {
            pid,
            comm: String::from_utf8_lossy(&text[open + 1..close]).into_owned(),
            rest: rest.split_ascii_whitespace().collect(),
        })
    }

    /// Field `n` (n ≥ 3) as a number.
    pub fn number(&self, n: usize) -> Result<u64, String> {
        n.checked_sub(3)
            .and_then(|i| self.rest.get(i))
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("field {n} is not a number"))
    }
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
        assert_eq!(stat.number(16), Err("field 16 is not a number".into()));
        assert_eq!(
            StatFields::parse(b"1 (\xff\xfe) R 0").unwrap().comm,
            "\u{fffd}\u{fffd}"
        );
    }

    #[test]
    fn texts_that_are_not_stat_lines_are_errors() {
        let error = |text: &[u8]| StatFields::parse(text).unwrap_err();
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
}
