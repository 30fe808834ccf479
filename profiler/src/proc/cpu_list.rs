//! The kernel's CPU list format ("0-3,8,10-11", see cpuset(7)), as
//! /sys/devices/system/cpu/online and the `Cpus_allowed_list` of /proc/PID/status write it.

use std::collections::BTreeSet;

/// The highest CPU number accepted. The kernel supports at most 8192 CPUs (NR_CPUS); the bound
/// keeps a damaged list such as "0-4294967295" from filling memory with four billion CPUs.
pub const MAX_CPU: u32 = 65_535;

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("bad CPU list {list:?}: {reason}; the kernel writes lists such as \"0-3,8,10-11\"")]
pub struct CpuListError {
    list: String,
    reason: String,
}

/// The CPUs of a list; surrounding white space is ignored and an empty list has no CPUs.
pub fn parse_cpu_list(list: &str) -> Result<BTreeSet<u32>, CpuListError> {
    let list = list.trim();
    let error = |reason: String| CpuListError {
        // A damaged list can be long; its start shows what is wrong.
        list: list.chars().take(80).collect(),
        reason,
    };
    let cpu = |text: &str| match text.trim().parse::<u32>() {
        Ok(n) if n <= MAX_CPU => Ok(n),
        Ok(n) => Err(error(format!("CPU {n} is above {MAX_CPU}"))),
        Err(_) => Err(error(format!("{text:?} is not a CPU number"))),
    };
    let mut cpus = BTreeSet::new();
    if list.is_empty() {
        return Ok(cpus);
    }
    for part in list.split(',') {
        let (first, last) = match part.split_once('-') {
            Some((a, b)) => (cpu(a)?, cpu(b)?),
            None => (cpu(part)?, cpu(part)?),
        };
        if first > last {
            return Err(error(format!("the range {part:?} runs backwards")));
        }
        cpus.extend(first..=last);
    }
    Ok(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_single_cpus() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n").unwrap(),
            [0, 1, 2, 3, 8, 10, 11].into()
        );
        assert_eq!(parse_cpu_list("1").unwrap(), [1].into());
        assert!(parse_cpu_list("").unwrap().is_empty());
    }

    #[test]
    fn damaged_lists_are_refused_with_the_cause() {
        let reason = |list: &str| parse_cpu_list(list).unwrap_err().to_string();
        assert!(reason("x").contains("\"x\" is not a CPU number"));
        assert!(reason("0-4294967295").contains("CPU 4294967295 is above 65535"));
        assert!(reason("3-1").contains("runs backwards"));
        assert!(reason("0,,2").contains("\"\" is not a CPU number"));
    }
}
