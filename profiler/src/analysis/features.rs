//! Duration filter and feature extraction: which bursts are clustered, and where each one sits in
//! the normalised feature space.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::points::{Coords, PointSet, MAX_DIMS};
use super::AnalysisError;
use crate::model::{Burst, CallSite};

/// The features bursts are clustered on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureSet {
    /// [ln(instructions), IPC], each min–max normalised over the analysed bursts (the "performance
    /// view" of González García (2013)). Needs instructions and cycles on every analysed burst.
    InstructionsIpc,
    /// ln(on-CPU time), min–max normalised over all analysed bursts, clustered separately within
    /// each code region (start call site, end call site). The fallback without a PMU: the region
    /// stands in for the instruction count as the "what code" axis.
    OnCpuTimePerRegion,
}

impl FeatureSet {
    pub fn names(self) -> &'static [&'static str] {
        match self {
            FeatureSet::InstructionsIpc => &["ln_instructions", "ipc"],
            FeatureSet::OnCpuTimePerRegion => &["ln_oncpu_ns"],
        }
    }
}

/// Which feature set to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FeatureSelection {
    /// Instructions and IPC when every analysed burst carries counters with non-zero cycles,
    /// else on-CPU time per region. Bursts with and without counters are never mixed in one space.
    #[default]
    Auto,
    /// This set; analysis fails with [`AnalysisError::MissingCounters`] when it needs counters a
    /// burst does not have.
    Fixed(FeatureSet),
}

/// Which bursts are analysed, by on-CPU duration ([`filtered_duration_ns`]).
///
/// On-CPU rather than wall-clock time: on a busy or oversubscribed node a burst's wall time is
/// its on-CPU time plus whole scheduler time slices, so the wall times of one phase spread over
/// several factors of 2 (with gaps between them) and the tiny bursts between back-to-back MPI
/// calls, preempted now and then, fill the gap below the phases. A threshold on wall time then
/// cuts through the shortest phase on some ranks only. On-CPU time is what the work costs, and
/// the tiny bursts keep tiny on-CPU times however often they are preempted.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DurationFilter {
    /// Keep at least this share of the total on-CPU time of the bursts: start from the largest
    /// threshold whose bursts at or above it hold that share (the criterion of González García
    /// (2013), on wall time there), then lower it to the top of the first gap below, see
    /// [`duration_filter`].
    KeepTimeShare(f64),
    /// Keep bursts of at least this many nanoseconds on a CPU (the manual `duration_filter` of
    /// González García (2013)).
    MinDurationNs(u64),
}

impl Default for DurationFilter {
    fn default() -> Self {
        DurationFilter::KeepTimeShare(0.99)
    }
}

/// The duration the filter compares: on-CPU time, or the wall time of a burst with no on-CPU
/// time at all (the kernel skipped the scheduler hook that runs its on-CPU clock, so the time is
/// unknown rather than zero).
pub fn filtered_duration_ns(burst: &Burst) -> u64 {
    if burst.oncpu_ns > 0 {
        burst.oncpu_ns
    } else {
        burst.duration_ns
    }
}

/// Two consecutive burst durations (in sorted order) at least this ratio apart leave an empty
/// interval that the threshold may sit in. A factor 2 is far above the jitter between neighbours
/// in one behaviour and far below the distance between typical phases and the tiny bursts
/// between back-to-back MPI calls.
pub const DURATION_GAP_RATIO: u64 = 2;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FilterReport {
    pub filter: DurationFilter,
    /// The on-CPU threshold the criterion alone gives (for `KeepTimeShare`, the largest one
    /// keeping the share; for `MinDurationNs`, the value itself).
    pub criterion_threshold_ns: u64,
    /// The threshold applied: bursts whose [`filtered_duration_ns`] is at least this are analysed,
    /// and those that [`duration_filter`] keeps for their code region.
    pub threshold_ns: u64,
    pub bursts_in: u64,
    pub bursts_kept: u64,
    /// Kept bursts whose on-CPU time is below the threshold but whose wall time is not, in a code
    /// region where most bursts pass: phase bursts whose on-CPU clock stopped.
    #[serde(default)]
    pub kept_for_region: u64,
    /// Wall-clock time of all bursts and of the kept ones, the unit of every time share.
    pub time_in_ns: u64,
    pub time_kept_ns: u64,
    /// Share of the total (wall-clock) burst time in filtered bursts (0 when there is no time at
    /// all).
    pub time_filtered_share: f64,
}

/// Indices of the bursts that pass the filter (ascending), and what the filter did.
///
/// `KeepTimeShare(p)`: with on-CPU durations sorted in decreasing order, the criterion threshold
/// is the first duration at which the running sum reaches p of the total. Used as is, it cuts through
/// whatever behaviour holds that duration, typically the shortest real phase when the tiny bursts
/// hold less than 1 − p of the time, and drops part of that phase's bursts on some ranks only,
/// which breaks its sequences. So the threshold is lowered further, to the smallest duration of
/// the run of sorted durations that contains the criterion threshold and has no two neighbours
/// [`DURATION_GAP_RATIO`] or more apart. More than p of the time is then kept; when no such gap
/// exists down to the shortest burst, everything is kept (the kernel's own filter bounds the
/// volume of short bursts).
///
/// A burst below the threshold is still kept when its wall time is not and most bursts of its
/// code region pass: the kernel skips the scheduler hook that runs a thread's on-CPU clock at
/// some switches (when another tracing program runs on that CPU), so a preempted phase burst can
/// show a fraction of its on-CPU time. A preempted tiny burst has a long wall time too, but sits
/// in a region of tiny bursts. Dropping the phase burst would leave a hole in its rank's
/// sequence; kept, its outlying feature makes it noise or it joins its phase by column majority.
pub fn duration_filter(
    bursts: &[Burst],
    filter: DurationFilter,
) -> Result<(Vec<usize>, FilterReport), AnalysisError> {
    let time_in_ns: u64 = bursts.iter().map(|b| b.duration_ns).sum();
    let oncpu_ns: u64 = bursts.iter().map(filtered_duration_ns).sum();
    let (criterion_threshold_ns, threshold_ns) = match filter {
        DurationFilter::KeepTimeShare(share) => {
            if !(share > 0.0 && share <= 1.0) {
                return Err(AnalysisError::InvalidParameter {
                    name: "duration_filter.keep_time_share",
                    value: share.to_string(),
                    expected: "a share in (0, 1]",
                });
            }
            let mut sorted: Vec<u64> = bursts.iter().map(filtered_duration_ns).collect();
            sorted.sort_unstable_by(|a, b| b.cmp(a));
            let target = share * oncpu_ns as f64;
            let mut running = 0u64;
            let cut = sorted
                .iter()
                .position(|&d| {
                    running += d;
                    running as f64 >= target
                })
                .unwrap_or(sorted.len().saturating_sub(1));
            let mut bottom = cut;
            while bottom + 1 < sorted.len()
                && sorted[bottom] < DURATION_GAP_RATIO.saturating_mul(sorted[bottom + 1])
            {
                bottom += 1;
            }
            (
                sorted.get(cut).copied().unwrap_or(0),
                sorted.get(bottom).copied().unwrap_or(0),
            )
        }
        DurationFilter::MinDurationNs(ns) => (ns, ns),
    };
    let passes = |b: &Burst| filtered_duration_ns(b) >= threshold_ns;
    // (passing, all) bursts per code region.
    let mut regions: BTreeMap<(&CallSite, &CallSite), (u64, u64)> = BTreeMap::new();
    for b in bursts {
        let counts = regions.entry(b.region()).or_default();
        counts.0 += u64::from(passes(b));
        counts.1 += 1;
    }
    let for_region = |b: &Burst| {
        let (passing, all) = regions[&b.region()];
        !passes(b) && b.duration_ns >= threshold_ns && 2 * passing > all
    };
    let kept: Vec<usize> = (0..bursts.len())
        .filter(|&i| passes(&bursts[i]) || for_region(&bursts[i]))
        .collect();
    let kept_for_region = kept.iter().filter(|&&i| for_region(&bursts[i])).count() as u64;
    let time_kept_ns: u64 = kept.iter().map(|&i| bursts[i].duration_ns).sum();
    let report = FilterReport {
        filter,
        criterion_threshold_ns,
        threshold_ns,
        bursts_in: bursts.len() as u64,
        bursts_kept: kept.len() as u64,
        kept_for_region,
        time_in_ns,
        time_kept_ns,
        time_filtered_share: if time_in_ns == 0 {
            0.0
        } else {
            (time_in_ns - time_kept_ns) as f64 / time_in_ns as f64
        },
    };
    Ok((kept, report))
}

/// Range of one raw feature over the analysed bursts; normalised value = (raw − min)/(max − min),
/// or 0 for every burst when max = min.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureRange {
    pub name: String,
    pub min: f64,
    pub max: f64,
}

/// Which features were used and how they were normalised.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FeatureReport {
    pub requested: FeatureSelection,
    pub used: FeatureSet,
    pub ranges: Vec<FeatureRange>,
}

impl FeatureReport {
    /// The normalised distance that a relative difference `ratio` (0.05 = 5 %) makes along the
    /// narrowest logarithmic feature: ln(1 + ratio) over the widest ln range. 0 when no ln
    /// feature has a range.
    pub fn normalised_ratio(&self, ratio: f64) -> f64 {
        self.ranges
            .iter()
            .filter(|r| r.name.starts_with("ln_") && r.max > r.min)
            .map(|r| ratio.ln_1p() / (r.max - r.min))
            .reduce(f64::min)
            .unwrap_or(0.0)
    }
}

/// The analysed bursts as points.
#[derive(Clone, Debug)]
pub struct Features {
    /// Normalised points, in the order of the `kept` indices given to [`extract_features`].
    pub points: PointSet,
    /// The same points before normalisation (ln applied), for statistics and tracking.
    pub raw: Vec<Coords>,
    pub report: FeatureReport,
}

fn has_usable_counters(burst: &Burst) -> bool {
    burst.counters.is_some_and(|c| c.cycles > 0)
}

/// Raw features of `kept` bursts under the selected set, normalised. Logs use max(value, 1) so a
/// burst that retired no instructions or was never seen on a CPU sits at the low edge instead of
/// at −∞.
pub fn extract_features(
    bursts: &[Burst],
    kept: &[usize],
    selection: FeatureSelection,
) -> Result<Features, AnalysisError> {
    let used = match selection {
        FeatureSelection::Fixed(set) => set,
        FeatureSelection::Auto
            if !kept.is_empty() && kept.iter().all(|&i| has_usable_counters(&bursts[i])) =>
        {
            FeatureSet::InstructionsIpc
        }
        FeatureSelection::Auto => FeatureSet::OnCpuTimePerRegion,
    };
    let dims = used.names().len();
    let (raw, groups): (Vec<Coords>, Vec<u32>) = match used {
        FeatureSet::InstructionsIpc => {
            let missing = kept
                .iter()
                .filter(|&&i| !has_usable_counters(&bursts[i]))
                .count();
            if missing > 0 {
                return Err(AnalysisError::MissingCounters {
                    missing,
                    bursts: kept.len(),
                });
            }
            kept.iter()
                .map(|&i| {
                    let c = bursts[i].counters.expect("checked above");
                    (
                        [
                            (c.instructions.max(1) as f64).ln(),
                            c.instructions as f64 / c.cycles as f64,
                            0.0,
                        ],
                        0,
                    )
                })
                .unzip()
        }
        FeatureSet::OnCpuTimePerRegion => {
            let regions = numbered(kept.iter().map(|&i| bursts[i].region()));
            kept.iter()
                .map(|&i| {
                    (
                        [(bursts[i].oncpu_ns.max(1) as f64).ln(), 0.0, 0.0],
                        regions[&bursts[i].region()],
                    )
                })
                .unzip()
        }
    };
    let ranges: Vec<FeatureRange> = used
        .names()
        .iter()
        .enumerate()
        .map(|(d, name)| {
            let min = raw.iter().map(|c| c[d]).fold(f64::INFINITY, f64::min);
            let max = raw.iter().map(|c| c[d]).fold(f64::NEG_INFINITY, f64::max);
            // No bursts: an empty range rather than ±∞, which JSON cannot carry.
            let (min, max) = if raw.is_empty() {
                (0.0, 0.0)
            } else {
                (min, max)
            };
            FeatureRange {
                name: name.to_string(),
                min,
                max,
            }
        })
        .collect();
    let normalised = raw
        .iter()
        .map(|c| {
            let mut out = [0.0; MAX_DIMS];
            for (d, range) in ranges.iter().enumerate() {
                let span = range.max - range.min;
                out[d] = if span > 0.0 {
                    (c[d] - range.min) / span
                } else {
                    0.0
                };
            }
            out
        })
        .collect();
    let end_sites = numbered(kept.iter().map(|&i| &bursts[i].end_site));
    let ends = kept
        .iter()
        .map(|&i| end_sites[&bursts[i].end_site])
        .collect();
    Ok(Features {
        points: match used {
            FeatureSet::OnCpuTimePerRegion => PointSet::with_regions(dims, normalised, groups),
            FeatureSet::InstructionsIpc => PointSet::with_groups(dims, normalised, groups),
        }
        .with_ends(ends),
        raw,
        report: FeatureReport {
            requested: selection,
            used,
            ranges,
        },
    })
}

/// Each distinct key numbered from 0, in key order: a group index that does not depend on the
/// order of the bursts.
fn numbered<K: Ord>(keys: impl Iterator<Item = K>) -> BTreeMap<K, u32> {
    let mut numbers: BTreeMap<K, u32> = keys.map(|k| (k, 0)).collect();
    for (index, number) in numbers.values_mut().enumerate() {
        *number = index as u32;
    }
    numbers
}
