//! The two clocks of the daemon: the BPF programs stamp events with CLOCK_MONOTONIC, the store
//! keeps Unix time (CLOCK_REALTIME). The offset between them is read once at start, so every
//! conversion of a run moves by the same amount and bursts keep their order and spacing.

use crate::capture::usage;

/// Unix time minus CLOCK_MONOTONIC, read once.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    unix_offset_ns: i128,
}

impl Clock {
    /// Reads the offset between the two clocks now.
    pub fn read() -> Self {
        Clock {
            unix_offset_ns: usage::clock_ns(libc::CLOCK_REALTIME) as i128
                - usage::clock_ns(libc::CLOCK_MONOTONIC) as i128,
        }
    }

    /// A time of the BPF clock (CLOCK_MONOTONIC) as Unix time.
    pub fn unix_ns(&self, monotonic_ns: u64) -> u64 {
        (monotonic_ns as i128 + self.unix_offset_ns) as u64
    }

    /// The BPF clock at Unix time `unix_ns`; the inverse of [`Clock::unix_ns`].
    pub fn monotonic_ns(&self, unix_ns: u64) -> u64 {
        (unix_ns as i128 - self.unix_offset_ns).max(0) as u64
    }

    /// The BPF clock now.
    pub fn monotonic_now_ns() -> u64 {
        usage::clock_ns(libc::CLOCK_MONOTONIC)
    }
}
