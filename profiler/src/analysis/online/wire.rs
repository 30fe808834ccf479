//! The wire form of [`NodeSamples`] (`GET /api/jobs/{id}/samples`, read by `mpiburst
//! aggregate`): JSON, with each window's bursts in columns rather than as objects, the names of
//! MPI functions and modules in one table of the node's samples referred to by index, and start
//! times as differences to the previous burst's (the bursts are by rank and start, so these are
//! short). A `format` field names the version of this layout: a reader refuses any other, with a
//! message that says to run the same mpiburst version everywhere, rather than misread it.
//!
//! Durations, on-CPU times and counters are sent to four significant digits (at most 5 parts in
//! 10⁴ off, far inside what separates two clusters; rounding to the nearest, so sums stay
//! unbiased), and start times to the microsecond (rounded down: slot edges are whole
//! microseconds, so a burst keeps its slot). The digits dropped are noise to the analysis but
//! most of what gzip cannot shrink: a node of a 4 × 64-rank job sends 48 KiB per window instead
//! of 83 KiB (`cargo xtask bench jobwide`).
//!
//! Layout of format 2 (every column of a window has one entry per burst, every column of its
//! repetitions one per code region):
//!
//! ```text
//! { "format": 2, "node", "job", "world_size", "ranks", "params", "samples_from", "closed_before",
//!   "names": [string],
//!   "windows": [{ "window", "seen", "seen_time_ns", "dropped",
//!                 "rank", "pid", "tid": [u32], "start_delta_ns": [i64],
//!                 "duration_ns", "oncpu_ns": [u64], "counters": [[instructions, cycles] | null],
//!                 "start_func", "end_func", "start_module", "end_module": [index into names],
//!                 "start_offset", "end_offset": [u64],
//!                 "repetitions": { "cut_ns", "ranks", "runtime_ns",
//!                                  "start_module", "end_module": [index into names],
//!                                  "start_offset", "end_offset", "count", "time_ns": [u64] } }] }
//! ```
//!
//! Format 1 had no repetitions.

use std::collections::HashMap;
use std::sync::Arc;

use serde::{de::Error as _, Deserialize, Deserializer, Serialize, Serializer};

use super::{HeldSamples, NodeSamples, OnlineParams, WindowSample};
use crate::analysis::signature::live::{RegionRepetitions, RepetitionSums};
use crate::model::{Burst, CallSite, HwCounters, JobId, Name};

/// The version of the layout this build writes and reads.
pub const SAMPLES_FORMAT: u32 = 2;

#[derive(Debug, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error(
        "the node's samples are in format {found}, but this mpiburst reads format \
         {SAMPLES_FORMAT}: run the same mpiburst version on every node's daemon and on the \
         aggregator"
    )]
    Format { found: String },
    #[error(
        "the node's samples of window {window} are malformed ({what}); run the same mpiburst \
         version on every node's daemon and on the aggregator, and report it if they are"
    )]
    Malformed { window: u64, what: String },
}

#[derive(Serialize, Deserialize)]
struct WireSamples {
    format: u32,
    node: String,
    job: JobId,
    world_size: u32,
    ranks: Vec<u32>,
    params: OnlineParams,
    samples_from: u64,
    closed_before: u64,
    names: Vec<String>,
    windows: Vec<WireWindow>,
}

#[derive(Default, Serialize, Deserialize)]
struct WireWindow {
    window: u64,
    seen: u64,
    seen_time_ns: u64,
    dropped: u64,
    rank: Vec<u32>,
    pid: Vec<u32>,
    tid: Vec<u32>,
    start_delta_ns: Vec<i64>,
    duration_ns: Vec<u64>,
    oncpu_ns: Vec<u64>,
    counters: Vec<Option<(u64, u64)>>,
    start_func: Vec<u32>,
    end_func: Vec<u32>,
    start_module: Vec<u32>,
    end_module: Vec<u32>,
    start_offset: Vec<u64>,
    end_offset: Vec<u64>,
    repetitions: WireRepetitions,
}

/// [`RepetitionSums`] in columns, one entry per code region. Exact: these are sums.
#[derive(Default, Serialize, Deserialize)]
struct WireRepetitions {
    cut_ns: u64,
    ranks: u32,
    runtime_ns: u64,
    start_module: Vec<u32>,
    end_module: Vec<u32>,
    start_offset: Vec<u64>,
    end_offset: Vec<u64>,
    count: Vec<u64>,
    time_ns: Vec<u64>,
}

/// The names of a node's samples, each given an index at its first use.
#[derive(Default)]
struct NameTable {
    index: HashMap<Name, u32>,
    names: Vec<String>,
}

impl NameTable {
    fn index(&mut self, name: Name) -> u32 {
        *self.index.entry(name).or_insert_with(|| {
            self.names.push(name.as_str().to_string());
            (self.names.len() - 1) as u32
        })
    }
}

/// The significant digits of each duration and counter sent.
const SIGNIFICANT_DIGITS: u32 = 4;
/// Start times are sent to the microsecond.
const START_STEP_NS: u64 = 1_000;

/// `value` to [`SIGNIFICANT_DIGITS`], rounded to the nearest.
fn significant(value: u64) -> u64 {
    let digits = value.checked_ilog10().map_or(0, |d| d + 1);
    if digits <= SIGNIFICANT_DIGITS {
        return value;
    }
    let step = 10u64.pow(digits - SIGNIFICANT_DIGITS);
    value.saturating_add(step / 2) / step * step
}

fn encode_window(sample: &WindowSample, names: &mut NameTable) -> WireWindow {
    let mut wire = WireWindow {
        window: sample.window,
        seen: sample.seen,
        seen_time_ns: sample.seen_time_ns,
        dropped: sample.dropped,
        ..WireWindow::default()
    };
    let mut previous_start = 0u64;
    for burst in &sample.bursts {
        let start_ns = burst.start_ns / START_STEP_NS * START_STEP_NS;
        wire.rank.push(burst.rank);
        wire.pid.push(burst.pid);
        wire.tid.push(burst.tid);
        wire.start_delta_ns
            .push(start_ns.wrapping_sub(previous_start) as i64);
        previous_start = start_ns;
        wire.duration_ns.push(significant(burst.duration_ns));
        wire.oncpu_ns.push(significant(burst.oncpu_ns));
        wire.counters.push(
            burst
                .counters
                .map(|c| (significant(c.instructions), significant(c.cycles))),
        );
        wire.start_func.push(names.index(burst.start_func));
        wire.end_func.push(names.index(burst.end_func));
        wire.start_module.push(names.index(burst.start_site.module));
        wire.end_module.push(names.index(burst.end_site.module));
        wire.start_offset.push(burst.start_site.offset);
        wire.end_offset.push(burst.end_site.offset);
    }
    let sums = &sample.repetitions;
    let repetitions = &mut wire.repetitions;
    (
        repetitions.cut_ns,
        repetitions.ranks,
        repetitions.runtime_ns,
    ) = (sums.cut_ns, sums.ranks, sums.runtime_ns);
    for region in &sums.regions {
        repetitions
            .start_module
            .push(names.index(region.start.module));
        repetitions.end_module.push(names.index(region.end.module));
        repetitions.start_offset.push(region.start.offset);
        repetitions.end_offset.push(region.end.offset);
        repetitions.count.push(region.count);
        repetitions.time_ns.push(region.time_ns);
    }
    wire
}

/// Whether the other columns have as many entries as the first (`n` of `first`); what is wrong
/// when they do not.
fn same_lengths(columns: &str, (first, n): (&str, usize), others: &[usize]) -> Result<(), String> {
    if others.iter().all(|&len| len == n) {
        Ok(())
    } else {
        Err(format!(
            "{columns} of different lengths: {n} {first}, others {others:?}"
        ))
    }
}

fn decode_repetitions(
    wire: WireRepetitions,
    name: impl Fn(u32) -> Result<Name, WireError>,
    malformed: impl Fn(String) -> WireError,
) -> Result<RepetitionSums, WireError> {
    let n = wire.count.len();
    let lengths = [
        wire.start_module.len(),
        wire.end_module.len(),
        wire.start_offset.len(),
        wire.end_offset.len(),
        wire.time_ns.len(),
    ];
    same_lengths("repetition columns", ("counts", n), &lengths).map_err(malformed)?;
    let regions = (0..n)
        .map(|i| {
            Ok(RegionRepetitions {
                start: CallSite {
                    module: name(wire.start_module[i])?,
                    offset: wire.start_offset[i],
                },
                end: CallSite {
                    module: name(wire.end_module[i])?,
                    offset: wire.end_offset[i],
                },
                count: wire.count[i],
                time_ns: wire.time_ns[i],
            })
        })
        .collect::<Result<_, WireError>>()?;
    Ok(RepetitionSums {
        cut_ns: wire.cut_ns,
        ranks: wire.ranks,
        runtime_ns: wire.runtime_ns,
        regions,
    })
}

fn decode_window(wire: WireWindow, names: &[Name]) -> Result<WindowSample, WireError> {
    let malformed = |what: String| WireError::Malformed {
        window: wire.window,
        what,
    };
    let n = wire.rank.len();
    let lengths = [
        wire.pid.len(),
        wire.tid.len(),
        wire.start_delta_ns.len(),
        wire.duration_ns.len(),
        wire.oncpu_ns.len(),
        wire.counters.len(),
        wire.start_func.len(),
        wire.end_func.len(),
        wire.start_module.len(),
        wire.end_module.len(),
        wire.start_offset.len(),
        wire.end_offset.len(),
    ];
    same_lengths("columns", ("ranks", n), &lengths).map_err(malformed)?;
    let name = |index: u32| {
        names.get(index as usize).copied().ok_or_else(|| {
            malformed(format!(
                "name {index} referred to, but {} names sent",
                names.len()
            ))
        })
    };
    let mut bursts = Vec::with_capacity(n);
    let mut start_ns = 0u64;
    for i in 0..n {
        start_ns = start_ns.wrapping_add(wire.start_delta_ns[i] as u64);
        bursts.push(Burst {
            pid: wire.pid[i],
            tid: wire.tid[i],
            rank: wire.rank[i],
            start_ns,
            duration_ns: wire.duration_ns[i],
            oncpu_ns: wire.oncpu_ns[i],
            counters: wire.counters[i].map(|(instructions, cycles)| HwCounters {
                instructions,
                cycles,
            }),
            start_func: name(wire.start_func[i])?,
            end_func: name(wire.end_func[i])?,
            start_site: CallSite {
                module: name(wire.start_module[i])?,
                offset: wire.start_offset[i],
            },
            end_site: CallSite {
                module: name(wire.end_module[i])?,
                offset: wire.end_offset[i],
            },
        });
    }
    let repetitions = decode_repetitions(wire.repetitions, name, malformed)?;
    Ok(WindowSample {
        window: wire.window,
        seen: wire.seen,
        seen_time_ns: wire.seen_time_ns,
        dropped: wire.dropped,
        bursts,
        repetitions,
    })
}

impl Serialize for NodeSamples {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut names = NameTable::default();
        let windows = self
            .held
            .windows
            .iter()
            .map(|w| encode_window(w, &mut names))
            .collect();
        WireSamples {
            format: SAMPLES_FORMAT,
            node: self.node.clone(),
            job: self.job.clone(),
            world_size: self.world_size,
            ranks: self.ranks.clone(),
            params: self.held.params.clone(),
            samples_from: self.held.samples_from,
            closed_before: self.held.closed_before,
            names: names.names,
            windows,
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for NodeSamples {
    /// Reads the format first, so that a layout of another version fails on its version, not on
    /// whichever of its fields differs.
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(deserializer)?;
        let format = value.get("format");
        if format.and_then(serde_json::Value::as_u64) != Some(u64::from(SAMPLES_FORMAT)) {
            return Err(D::Error::custom(WireError::Format {
                found: format.map_or_else(|| "none (no format field)".into(), |f| f.to_string()),
            }));
        }
        let wire: WireSamples = serde_json::from_value(value).map_err(D::Error::custom)?;
        let names: Vec<Name> = wire.names.iter().map(|n| Name::new(n)).collect();
        let windows = wire
            .windows
            .into_iter()
            .map(|w| decode_window(w, &names).map(Arc::new))
            .collect::<Result<_, _>>()
            .map_err(D::Error::custom)?;
        Ok(NodeSamples {
            node: wire.node,
            job: wire.job,
            world_size: wire.world_size,
            ranks: wire.ranks,
            held: HeldSamples {
                params: wire.params,
                samples_from: wire.samples_from,
                closed_before: wire.closed_before,
                windows,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn burst(rank: u32, start_ns: u64, counters: bool) -> Burst {
        let module = Name::new("/opt/app/bin/solver");
        Burst {
            pid: 100 + rank,
            tid: 100 + rank,
            rank,
            start_ns,
            duration_ns: 5_000 + start_ns % 7,
            oncpu_ns: 4_000,
            counters: counters.then_some(HwCounters {
                instructions: 1_000_000,
                cycles: 500_000,
            }),
            start_func: Name::new("MPI_Allreduce"),
            end_func: Name::new("MPI_Isend"),
            start_site: CallSite {
                module,
                offset: 0x1000,
            },
            end_site: CallSite::unknown(0x2000),
        }
    }

    fn samples() -> NodeSamples {
        let window = |window: u64, counters: bool| {
            Arc::new(WindowSample {
                window,
                seen: 10,
                seen_time_ns: 50_000,
                dropped: 6,
                // By rank and start: a rank's first start is before the previous rank's last.
                bursts: vec![
                    burst(4, 30_000_001_000, counters),
                    burst(4, 30_000_500_000, counters),
                    burst(5, 30_000_000_000, counters),
                    burst(5, 30_000_600_000, counters),
                ],
                repetitions: RepetitionSums {
                    cut_ns: (window + 1) * 30_000_000_000,
                    ranks: 2,
                    runtime_ns: 1_234_567_891,
                    regions: vec![RegionRepetitions {
                        start: CallSite {
                            module: Name::new("/opt/app/bin/solver"),
                            offset: 0x1000,
                        },
                        end: CallSite::unknown(0x2000),
                        count: 4,
                        time_ns: 987_654_321,
                    }],
                },
            })
        };
        NodeSamples {
            node: "node7".into(),
            job: JobId("pmix:9".into()),
            world_size: 8,
            ranks: vec![4, 5],
            held: HeldSamples {
                params: OnlineParams::default(),
                samples_from: 1,
                closed_before: 3,
                windows: vec![window(1, true), window(2, false)],
            },
        }
    }

    #[test]
    fn values_are_sent_to_four_significant_digits_and_starts_to_the_microsecond() {
        assert_eq!(significant(0), 0);
        assert_eq!(significant(9_999), 9_999);
        assert_eq!(significant(12_345), 12_350);
        assert_eq!(significant(12_344), 12_340);
        assert_eq!(significant(40_123_456), 40_120_000);
        assert_eq!(
            significant(u64::MAX),
            18_440_000_000_000_000_000,
            "no overflow"
        );
        let mut sent = samples();
        let window = Arc::make_mut(&mut sent.held.windows[0]);
        window.bursts[0].start_ns = 30_000_000_999;
        window.bursts[0].duration_ns = 1_234_567;
        window.bursts[0].oncpu_ns = 1_234_449;
        window.bursts[0].counters = Some(HwCounters {
            instructions: 40_123_456,
            cycles: 20_987_654,
        });
        let json = serde_json::to_string(&sent).unwrap();
        let received: NodeSamples = serde_json::from_str(&json).unwrap();
        let burst = &received.held.windows[0].bursts[0];
        assert_eq!(burst.start_ns, 30_000_000_000);
        assert_eq!((burst.duration_ns, burst.oncpu_ns), (1_235_000, 1_234_000));
        assert_eq!(
            burst.counters,
            Some(HwCounters {
                instructions: 40_120_000,
                cycles: 20_990_000
            })
        );
    }

    #[test]
    fn the_samples_come_back_as_they_were_sent() {
        let sent = samples();
        let json = serde_json::to_string(&sent).unwrap();
        assert!(json.contains("\"format\":2"), "{json}");
        assert_eq!(
            json.matches("MPI_Allreduce").count(),
            1,
            "one table of names"
        );
        let received: NodeSamples = serde_json::from_str(&json).unwrap();
        assert_eq!(received, sent);
    }

    #[test]
    fn samples_of_another_format_or_malformed_are_refused_with_what_to_do() {
        let mut json = serde_json::to_value(samples()).unwrap();
        json["format"] = 1.into();
        let error = serde_json::from_value::<NodeSamples>(json.clone()).unwrap_err();
        assert!(error.to_string().contains("in format 1"), "{error}");
        assert!(
            error.to_string().contains("same mpiburst version"),
            "{error}"
        );

        let old = serde_json::json!({ "node": "a", "job": "pmix:9", "windows": [] });
        let error = serde_json::from_value::<NodeSamples>(old).unwrap_err();
        assert!(error.to_string().contains("no format field"), "{error}");

        json["format"] = 2.into();
        json["windows"][0]["repetitions"]["count"] = serde_json::json!([]);
        let error = serde_json::from_value::<NodeSamples>(json.clone()).unwrap_err();
        assert!(error.to_string().contains("repetition columns"), "{error}");
        json["windows"][0]["repetitions"]["count"] = serde_json::json!([4]);
        json["windows"][0]["start_func"][0] = 99.into();
        let error = serde_json::from_value::<NodeSamples>(json.clone()).unwrap_err();
        assert!(error.to_string().contains("name 99"), "{error}");
        json["windows"][0]["start_func"] = serde_json::json!([0]);
        let error = serde_json::from_value::<NodeSamples>(json).unwrap_err();
        assert!(error.to_string().contains("different lengths"), "{error}");
    }
}
