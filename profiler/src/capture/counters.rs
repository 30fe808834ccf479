//! Per-CPU perf counters for the BPF programs. The BPF side reads them with
//! `bpf_perf_event_read_value` and virtualises them per thread at sched_switch, because a per-CPU
//! counter counts the CPU, not the thread.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use super::{config::CounterMode, CaptureError};

const PERF_TYPE_HARDWARE: u32 = 0;
const PERF_TYPE_SOFTWARE: u32 = 1;
const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;
const PERF_COUNT_HW_INSTRUCTIONS: u64 = 1;
const PERF_COUNT_SW_CPU_CLOCK: u64 = 0;
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;
/// perf_event_attr.flags bits: count user space only, like the PAPI counters of González García
/// (2013).
const EXCLUDE_KERNEL: u64 = 1 << 5;
const EXCLUDE_HV: u64 = 1 << 6;

/// `struct perf_event_attr` up to PERF_ATTR_SIZE_VER5 (the fields this daemon sets).
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
    branch_sample_type: u64,
    sample_regs_user: u64,
    sample_stack_user: u32,
    clockid: i32,
    sample_regs_intr: u64,
    aux_watermark: u32,
    sample_max_stack: u16,
    reserved: u16,
}
const _: () = assert!(std::mem::size_of::<PerfEventAttr>() == 112);

/// One counter event as opened on every CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterEvent {
    pub name: &'static str,
    kind: u32,
    config: u64,
}

const INSTRUCTIONS: CounterEvent = CounterEvent {
    name: "instructions",
    kind: PERF_TYPE_HARDWARE,
    config: PERF_COUNT_HW_INSTRUCTIONS,
};
const CYCLES: CounterEvent = CounterEvent {
    name: "cycles",
    kind: PERF_TYPE_HARDWARE,
    config: PERF_COUNT_HW_CPU_CYCLES,
};
const CPU_CLOCK: CounterEvent = CounterEvent {
    name: "cpu-clock",
    kind: PERF_TYPE_SOFTWARE,
    config: PERF_COUNT_SW_CPU_CLOCK,
};

impl CounterEvent {
    pub fn is_hardware(&self) -> bool {
        self.kind == PERF_TYPE_HARDWARE
    }
}

/// The opened per-CPU counters, one fd per (slot, CPU). Keeping them open keeps them counting.
pub struct Counters {
    pub events: [CounterEvent; 2],
    pub fds: [Vec<OwnedFd>; 2],
}

/// What the counter set-up resolved to, for the user: never silent about a missing PMU.
pub enum CounterSetup {
    Enabled(Counters),
    /// No counters; the reason is printed and exported.
    Disabled(String),
}

fn perf_event_open(event: CounterEvent, cpu: i32) -> std::io::Result<OwnedFd> {
    let attr = PerfEventAttr {
        kind: event.kind,
        size: std::mem::size_of::<PerfEventAttr>() as u32,
        config: event.config,
        flags: EXCLUDE_KERNEL | EXCLUDE_HV,
        ..Default::default()
    };
    // SAFETY: attr is a valid, fully initialised perf_event_attr of the size it declares.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &attr as *const PerfEventAttr,
            -1 as libc::pid_t,
            cpu,
            -1,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

fn open_on_all_cpus(event: CounterEvent, cpus: &[u32]) -> Result<Vec<OwnedFd>, CaptureError> {
    cpus.iter()
        .map(|&cpu| {
            perf_event_open(event, cpu as i32).map_err(|source| CaptureError::PerfEvent {
                event: event.name,
                cpu,
                source,
            })
        })
        .collect()
}

/// Opens the counters the mode asks for. `auto` falls back to no counters, with the reason.
pub fn open(mode: CounterMode, cpus: &[u32]) -> Result<CounterSetup, CaptureError> {
    let events = match mode {
        CounterMode::Off => {
            return Ok(CounterSetup::Disabled(
                "counters are off in the configuration".into(),
            ))
        }
        CounterMode::Software => [CPU_CLOCK, CPU_CLOCK],
        CounterMode::Auto | CounterMode::Hardware => [INSTRUCTIONS, CYCLES],
    };
    let opened =
        open_on_all_cpus(events[0], cpus).and_then(|a| Ok([a, open_on_all_cpus(events[1], cpus)?]));
    match (opened, mode) {
        (Ok(fds), _) => Ok(CounterSetup::Enabled(Counters { events, fds })),
        (Err(CaptureError::PerfEvent { event, source, .. }), CounterMode::Auto) => {
            Ok(CounterSetup::Disabled(format!(
            "no hardware PMU (the {event} event: {source}); bursts carry wall and on-CPU time only"
        )))
        }
        (Err(e), _) => Err(e),
    }
}

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;

/// The `BPF_MAP_*_ELEM` layout of `union bpf_attr`.
#[repr(C)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// Stores a perf event fd at `index` of a BPF perf-event array. aya has no API for this: its
/// perf-event array type only opens output buffers.
pub fn set_perf_array_fd(
    map: BorrowedFd<'_>,
    index: u32,
    event: BorrowedFd<'_>,
) -> std::io::Result<()> {
    let value: u32 = event.as_raw_fd() as u32;
    let attr = MapElemAttr {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &index as *const u32 as u64,
        value: &value as *const u32 as u64,
        flags: 0,
    };
    // SAFETY: attr points at live key and value buffers of the sizes the map declares.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_ELEM,
            &attr as *const MapElemAttr,
            std::mem::size_of::<MapElemAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// CPUs the kernel may run tasks on, from /sys (a perf-event array is indexed by CPU id).
pub fn online_cpus() -> Result<Vec<u32>, CaptureError> {
    let path = "/sys/devices/system/cpu/online";
    let text = std::fs::read_to_string(path).map_err(|source| CaptureError::Io {
        what: path.into(),
        source,
    })?;
    parse_cpu_list(text.trim()).ok_or_else(|| CaptureError::Io {
        what: path.into(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("bad CPU list {text:?}"),
        ),
    })
}

fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<u32>().ok()?..=b.parse::<u32>().ok()?),
            None => cpus.push(part.parse().ok()?),
        }
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,6,8-9"), Some(vec![0, 1, 2, 3, 6, 8, 9]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("x"), None);
    }
}
