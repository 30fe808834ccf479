//! Hashing of small integer keys: the hasher behind the analysis's hash maps (grid cells of
//! DBSCAN and of the online model, strata of the window sample) and the daemon's grouping of a
//! drain's records by pid, and a fixed, well-mixed hash of one integer for deterministic choices
//! and test data.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// A multiply-rotate hasher. Cell lookups dominate grid construction and run for every pushed
/// burst the online model classifies; SipHash costs more than the rest of that work, and the keys
/// (group numbers, cell coordinates, time slots and ranks) are not attacker-controlled, so a
/// multiply-rotate hash is enough.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct FastHasher(u64);

impl Hasher for FastHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u32(&mut self, value: u32) {
        self.write_u64(u64::from(value));
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = (self.0.rotate_left(26) ^ value).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_i64(&mut self, value: i64) {
        self.write_u64(value as u64);
    }

    fn write_usize(&mut self, value: usize) {
        self.write_u64(value as u64);
    }

    fn finish(&self) -> u64 {
        self.0 ^ (self.0 >> 29)
    }
}

/// A hash map keyed by small integers, hashed with [`FastHasher`].
pub(crate) type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// splitmix64's increment of the state per step: 2⁶⁴ divided by the golden ratio, odd.
pub(crate) const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's output function: a fixed, well-mixed hash of `x` (the generator's state before
/// its step).
pub(crate) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
