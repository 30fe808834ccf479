//! Per-CPU perf counters for the BPF programs, opened with perf-event2 and put into the BPF
//! perf-event arrays with a raw `bpf()` call. The BPF side reads them with
//! `bpf_perf_event_read_value` and virtualises them per thread at sched_switch, because a per-CPU
//! counter counts the CPU, not the thread.

use std::{
    io::ErrorKind,
    os::fd::{AsRawFd, BorrowedFd},
};

use perf_event::{
    events::{Hardware, Software},
    Builder, Counter,
};

use super::{config::CounterMode, CaptureError};
use crate::proc::parse_cpu_list;

/// The perf event behind a counter slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    Hardware(Hardware),
    Software(Software),
}

/// One counter event as opened on every CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CounterEvent {
    pub name: &'static str,
    source: Source,
}

const INSTRUCTIONS: CounterEvent = CounterEvent {
    name: "instructions",
    source: Source::Hardware(Hardware::INSTRUCTIONS),
};
const CYCLES: CounterEvent = CounterEvent {
    name: "cycles",
    source: Source::Hardware(Hardware::CPU_CYCLES),
};
const CPU_CLOCK: CounterEvent = CounterEvent {
    name: "cpu-clock",
    source: Source::Software(Software::CPU_CLOCK),
};

impl CounterEvent {
    pub fn is_hardware(&self) -> bool {
        matches!(self.source, Source::Hardware(_))
    }

    /// Opens the event on one CPU for every task, counting from now.
    fn open(&self, cpu: u32) -> std::io::Result<Counter> {
        self.builder().any_pid().one_cpu(cpu as usize).build()
    }

    /// The event counting user space only, like the PAPI counters of González García (2013),
    /// and pinned: the kernel keeps it on the PMU or, when another user of the PMU holds the
    /// slots, puts it in an error state that [`Counters::descheduled`] reports, rather than
    /// multiplexing it unnoticed. Its reads carry time enabled and time running.
    fn builder(&self) -> Builder<'static> {
        let mut builder = match self.source {
            Source::Hardware(event) => Builder::new(event),
            Source::Software(event) => Builder::new(event),
        };
        builder
            .exclude_kernel(true)
            .exclude_hv(true)
            .pinned(true)
            .enabled(true);
        builder
    }
}

/// The opened per-CPU counters, one per (slot, CPU). Keeping them open keeps them counting.
pub struct Counters {
    pub events: [CounterEvent; 2],
    pub counters: [Vec<Counter>; 2],
    /// The last [`Counters::descheduled`] count that was logged.
    descheduled_logged: u64,
}

impl Counters {
    /// How many of the per-CPU counters were off the PMU for part of the time they were enabled
    /// (their time running is behind their time enabled, or they were put in the error state of
    /// a pinned counter that lost its slot). Another user of the PMU took their slot; the
    /// bursts on those CPUs undercount. Only ever grows: both times are totals since opening.
    /// Logs a warning whenever it grows.
    pub fn descheduled(&mut self) -> u64 {
        let count = self
            .counters
            .iter_mut()
            .flatten()
            .map(ran_throughout)
            .filter(|ran| !ran)
            .count() as u64;
        if count > self.descheduled_logged {
            self.descheduled_logged = count;
            let total: usize = self.counters.iter().map(Vec::len).sum();
            tracing::warn!(
                "{count} of {total} per-CPU counters ({} and {}) were off the PMU for part of \
                 the time: another tool (perf, a second profiler) uses the PMU, and bursts on \
                 those CPUs undercount; stop that tool or set `capture.counters = \"off\"`",
                self.events[0].name,
                self.events[1].name
            );
        }
        count
    }
}

fn ran_throughout(counter: &mut Counter) -> bool {
    match counter.read_full() {
        Ok(data) => data.time_enabled() == data.time_running(),
        // A pinned counter that lost its PMU slot reads as end of file from then on.
        Err(e) if e.kind() == ErrorKind::UnexpectedEof => false,
        Err(e) => {
            tracing::warn!("cannot read a perf counter's run time: {e}");
            false
        }
    }
}

/// What the counter set-up resolved to, for the user: never silent about a missing PMU.
pub enum CounterSetup {
    Enabled(Counters),
    /// No counters; the reason is printed and exported.
    Disabled(CountersOff),
}

/// Why the bursts carry no counters; the message is the note the daemon prints and exports.
#[derive(Debug, thiserror::Error)]
pub enum CountersOff {
    #[error("counters are off in the configuration")]
    Configured,
    #[error(
        "no hardware PMU (the {event} event: {source}); bursts carry wall and on-CPU time only"
    )]
    NoPmu {
        event: &'static str,
        #[source]
        source: std::io::Error,
    },
}

fn open_on_all_cpus(event: CounterEvent, cpus: &[u32]) -> Result<Vec<Counter>, CaptureError> {
    cpus.iter()
        .map(|&cpu| {
            event.open(cpu).map_err(|source| CaptureError::PerfEvent {
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
        CounterMode::Off => return Ok(CounterSetup::Disabled(CountersOff::Configured)),
        CounterMode::Software => [CPU_CLOCK, CPU_CLOCK],
        CounterMode::Auto | CounterMode::Hardware => [INSTRUCTIONS, CYCLES],
    };
    let opened =
        open_on_all_cpus(events[0], cpus).and_then(|a| Ok([a, open_on_all_cpus(events[1], cpus)?]));
    match (opened, mode) {
        (Ok(counters), _) => Ok(CounterSetup::Enabled(Counters {
            events,
            counters,
            descheduled_logged: 0,
        })),
        (Err(CaptureError::PerfEvent { event, source, .. }), CounterMode::Auto) => {
            Ok(CounterSetup::Disabled(CountersOff::NoPmu { event, source }))
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
    event: &impl AsRawFd,
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
    let cpus = parse_cpu_list(&text).map_err(|e| CaptureError::Io {
        what: path.into(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    Ok(cpus.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spins until `counter` has been enabled for at least `ns` of this thread's time.
    fn spin_until_enabled(counter: &mut Counter, ns: u128) {
        while counter
            .read_full()
            .unwrap()
            .time_enabled()
            .unwrap()
            .as_nanos()
            < ns
        {
            std::hint::black_box((0..10_000u64).sum::<u64>());
        }
    }

    #[test]
    #[ignore = "needs root to open per-CPU perf counters: run `sudo -E cargo xtask test`"]
    fn software_counters_run_all_their_enabled_time() {
        let cpus = online_cpus().unwrap();
        let CounterSetup::Enabled(mut counters) = open(CounterMode::Software, &cpus).unwrap()
        else {
            panic!("software counters are always available");
        };
        assert_eq!(counters.counters.each_ref().map(Vec::len), [cpus.len(); 2]);
        // This thread runs on one of the CPUs; its counter is enabled throughout.
        let mut own = CPU_CLOCK
            .builder()
            .observe_self()
            .any_cpu()
            .build()
            .unwrap();
        spin_until_enabled(&mut own, 20_000_000);
        assert_eq!(counters.descheduled(), 0);
        let counted: u64 = counters
            .counters
            .iter_mut()
            .flatten()
            .map(|c| c.read_full().unwrap().count())
            .sum();
        assert!(counted > 0, "the software counters counted nothing");
    }

    /// The same check on a counter that cannot run all its enabled time: this thread's clock
    /// counted on a CPU the thread may not run on is enabled while the thread runs, and never
    /// running.
    #[test]
    fn a_counter_that_did_not_run_all_its_enabled_time_is_reported() {
        let cpus = online_cpus().unwrap();
        let [run_on, count_on, ..] = cpus[..] else {
            // The line `cargo xtask test` reads to report a test skipped (tests/harness.rs).
            use std::io::Write as _;
            let _ = writeln!(
                std::io::stderr(),
                "mpiburst-test skipped at run time: \
                 a_counter_that_did_not_run_all_its_enabled_time_is_reported: it needs two \
                 online CPUs (one to run on, one to count on); this machine has {}",
                cpus.len()
            );
            return;
        };
        // SAFETY: cpu_set_t is plain data; CPU_SET writes inside it; pid 0 is this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(run_on as usize, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set),
                0,
                "pin the test thread: {}",
                std::io::Error::last_os_error()
            );
        }
        let mut elsewhere = CPU_CLOCK
            .builder()
            .observe_self()
            .one_cpu(count_on as usize)
            .build()
            .unwrap();
        spin_until_enabled(&mut elsewhere, 20_000_000);
        let mut counters = Counters {
            events: [CPU_CLOCK, CPU_CLOCK],
            counters: [vec![elsewhere], Vec::new()],
            descheduled_logged: 0,
        };
        assert_eq!(counters.descheduled(), 1);
    }
}
