//! Spans of time the properties are evaluated over, and windows aligned to Unix time so that the
//! windows of every node coincide (Guillén (2015), §4.4, Eq. 4.1: TS ≡ TC − UT (mod TC)). Aligned
//! windows are what makes per-window values of different nodes comparable and mergeable.

use serde::{Deserialize, Serialize};

/// Time until the next window boundary (Eq. 4.1), in the unit of the arguments: `cycle − now mod
/// cycle`, in (0, cycle]. At a boundary it is a whole cycle, not 0 (the formula's edge case).
pub fn time_to_next_window(now: u64, cycle: u64) -> u64 {
    assert!(cycle > 0, "window length must be positive");
    cycle - now % cycle
}

/// A half-open span [start_ns, end_ns) of Unix time in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Span {
    pub start_ns: u64,
    pub end_ns: u64,
}

impl Span {
    pub fn new(start_ns: u64, end_ns: u64) -> Self {
        Span {
            start_ns,
            end_ns: end_ns.max(start_ns),
        }
    }

    /// The aligned window of `length_ns` that contains `t_ns`.
    pub fn aligned_containing(t_ns: u64, length_ns: u64) -> Self {
        assert!(length_ns > 0, "window length must be positive");
        let start_ns = t_ns - t_ns % length_ns;
        Span {
            start_ns,
            end_ns: start_ns + length_ns,
        }
    }

    /// The last aligned window that ended at or before `now_ns`.
    pub fn last_complete(now_ns: u64, length_ns: u64) -> Self {
        let current = Span::aligned_containing(now_ns, length_ns);
        Span {
            start_ns: current.start_ns.saturating_sub(length_ns),
            end_ns: current.start_ns,
        }
    }

    pub fn duration_ns(&self) -> u64 {
        self.end_ns - self.start_ns
    }

    pub fn seconds(&self) -> f64 {
        self.duration_ns() as f64 / 1e9
    }

    /// Nanoseconds of [from_ns, to_ns) inside the span.
    pub fn overlap_ns(&self, from_ns: u64, to_ns: u64) -> u64 {
        to_ns
            .min(self.end_ns)
            .saturating_sub(from_ns.max(self.start_ns))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Worked examples of Eq. 4.1 of Guillén (2015): TC = 600 s and UT = 10⁹ s give TS = 200 s;
    /// UT ≡ 0 (mod TC) gives TS = TC.
    #[test]
    fn v14_epoch_alignment() {
        assert_eq!(time_to_next_window(1_000_000_000, 600), 200);
        assert_eq!(
            time_to_next_window(600 * 1_000_000, 600),
            600,
            "UT ≡ 0 mod TC gives TC"
        );
        assert_eq!(time_to_next_window(0, 600), 600);
        assert_eq!(time_to_next_window(599, 600), 1);
    }

    #[test]
    fn aligned_windows() {
        let w = Span::aligned_containing(1_000_000_000_123, 10_000_000_000);
        assert_eq!(
            w,
            Span {
                start_ns: 1_000_000_000_000,
                end_ns: 1_010_000_000_000
            }
        );
        assert_eq!(w.seconds(), 10.0);
        let last = Span::last_complete(1_000_000_000_123, 10_000_000_000);
        assert_eq!(last.end_ns, w.start_ns);
        assert_eq!(last.duration_ns(), 10_000_000_000);
        assert_eq!(w.overlap_ns(0, 1_005_000_000_000), 5_000_000_000);
        assert_eq!(w.overlap_ns(2_000_000_000_000, 3_000_000_000_000), 0);
    }
}
