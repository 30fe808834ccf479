//! Hashing of small integer keys: the hasher behind the analysis's hash maps (grid cells of
//! DBSCAN and of the online model, strata of the window sample) and the daemon's grouping of a
//! drain's records by pid, and a fixed, well-mixed hash of one integer for deterministic choices
//! and test data.

/// A hash map keyed by small integers, hashed with rustc's FxHasher. Cell lookups dominate grid
/// construction and run for every pushed burst the online model classifies; SipHash costs more
/// than the rest of that work, and the keys (group numbers, cell coordinates, time slots and
/// ranks) are not attacker-controlled, so a multiply-add hash is enough.
pub(crate) type FastMap<K, V> = rustc_hash::FxHashMap<K, V>;

/// splitmix64's increment of the state per step: 2⁶⁴ divided by the golden ratio, odd.
pub(crate) const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64's output function: a fixed, well-mixed hash of `x` (the generator's state before
/// its step). Not FxHasher, which only spreads keys over buckets: the choices and test data built
/// on `mix` need neighbouring integers to give unrelated values, which splitmix64's avalanche does.
pub(crate) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(GOLDEN_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
