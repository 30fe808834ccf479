//! Recordings: what `mpiburst record` writes and offline analysis and tests replay.
//!
//! Format (documented in docs/recording.md): JSON Lines, one object per line, each with exactly
//! one key naming its kind. The first line is the header and carries the format version; readers
//! refuse versions they do not know.
//!
//! - `{"header": RecordingHeader}` once, first.
//! - `{"job": JobMeta}` when a job is first seen and again when it ends (the last one counts).
//! - `{"burst": RecordedBurst}` for every burst shipped by the kernel.
//! - `{"rank": {"job": id, "record": RankRecord}}` with a rank's exact kernel totals, written when
//!   the rank ends and at shutdown (the last one per (job, rank) counts), and with `"at_ns"` at
//!   every rank-group window the daemon closed: the readings the rank groups replay from.
//! - `{"end": RecordingEnd}` once, last, on a clean shutdown. A recording without it was cut short
//!   (for example by `kill -9`); everything before the cut is still valid.
//!
//! Each node's daemon records only the ranks on its node. [`Recording::read_all`] merges the
//! recordings of one job's nodes into the recording one daemon seeing every rank would have
//! written, so that every offline report of it is job-wide.

use std::{
    collections::BTreeMap,
    fs::File,
    io::{BufRead, BufReader, BufWriter, Write},
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::{
    analysis::groups::GroupParams,
    capture::Lost,
    model::{Burst, JobId},
    properties::{lifetime_properties, JobProperties, PropertyConfig},
    store::{
        job_wide::{add_node_part, JobWideError},
        CallStats, Job, JobMeta, RankRecord, RegionMarks,
    },
};

pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error(transparent)]
    JobWide(#[from] JobWideError),
    #[error("cannot write recording {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read recording {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}: not a valid recording line: {source}")]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
    #[error("{path}: not an mpiburst recording (the first line must be its header)")]
    NoHeader { path: PathBuf },
    #[error("{path}: recording format version {found}, this mpiburst reads version {FORMAT_VERSION}; use a matching mpiburst release")]
    Version { path: PathBuf, found: u32 },
    #[error("no recording to read; pass one recording, or the recordings of one job's nodes")]
    NoRecording,
    #[error(
        "{first} and {second} were recorded with different {setting} ({first_value} and \
         {second_value}), which changes the numbers; merge only the recordings of daemons that \
         ran with the same options"
    )]
    Settings {
        first: PathBuf,
        second: PathBuf,
        setting: &'static str,
        first_value: String,
        second_value: String,
    },
    #[error(
        "{first} and {second} both hold rank {rank} of job {job}: the same file given twice, or \
         two daemons that recorded the same node; pass each node's recording once"
    )]
    SameRank {
        job: JobId,
        rank: u32,
        first: PathBuf,
        second: PathBuf,
    },
    #[error(
        "{path} shares no job with the other recordings, so they are not of one job ({listing}); \
         pass together only the recordings of one job's nodes"
    )]
    NoSharedJob { path: PathBuf, listing: String },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordingHeader {
    pub version: u32,
    pub node: String,
    pub started_ns: u64,
    pub min_burst_ns: u64,
    /// Names of the two counter events per burst, or null when there were no counters.
    pub counter_events: Option<[String; 2]>,
    /// Which counters were available, in words (for example why there are none).
    pub counters_note: String,
    pub functions: Vec<String>,
    /// How the daemon grouped the ranks; `None` in recordings made before rank groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rank_groups: Option<RankGroupSettings>,
}

/// The rank-group settings of the daemon that made a recording, for replaying its groups.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankGroupSettings {
    pub window_s: f64,
    pub params: GroupParams,
}

impl RecordingHeader {
    /// Whether the bursts carry hardware counters: instructions and cycles, as the daemon opens
    /// them when a PMU is there (otherwise software events in test mode, or none).
    pub fn hardware_counters(&self) -> bool {
        self.counter_events
            .as_ref()
            .is_some_and(|[a, b]| a == "instructions" && b == "cycles")
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedBurst {
    pub job: JobId,
    #[serde(flatten)]
    pub burst: Burst,
    /// Raw values of the header's counter events; for hardware events the same values are in
    /// `burst.counters` as instructions and cycles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_counts: Option<[u64; 2]>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordedRank {
    pub job: JobId,
    pub record: RankRecord,
    /// Unix ns of the kernel reading, on the readings taken when a rank-group window closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at_ns: Option<u64>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordingEnd {
    pub ended_ns: u64,
    pub lost: Lost,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Line {
    Header(RecordingHeader),
    Job(JobMeta),
    Burst(RecordedBurst),
    Rank(RecordedRank),
    End(RecordingEnd),
}

pub struct RecordingWriter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl RecordingWriter {
    pub fn create(path: &Path, header: RecordingHeader) -> Result<Self, RecordingError> {
        let file = File::create(path).map_err(|source| RecordingError::Write {
            path: path.into(),
            source,
        })?;
        let mut w = RecordingWriter {
            path: path.into(),
            out: BufWriter::new(file),
        };
        w.line(&Line::Header(header))?;
        Ok(w)
    }

    fn line(&mut self, line: &Line) -> Result<(), RecordingError> {
        let err = |source| RecordingError::Write {
            path: self.path.clone(),
            source,
        };
        serde_json::to_writer(&mut self.out, line).map_err(|e| err(e.into()))?;
        self.out.write_all(b"\n").map_err(err)
    }

    pub fn job(&mut self, meta: &JobMeta) -> Result<(), RecordingError> {
        self.line(&Line::Job(meta.clone()))
    }

    pub fn burst(&mut self, burst: RecordedBurst) -> Result<(), RecordingError> {
        self.line(&Line::Burst(burst))
    }

    pub fn rank(&mut self, job: &JobId, record: &RankRecord) -> Result<(), RecordingError> {
        self.line(&Line::Rank(RecordedRank {
            job: job.clone(),
            record: record.clone(),
            at_ns: None,
        }))
    }

    /// A rank's totals as read at `at_ns`, when the rank groups closed a window.
    pub fn rank_reading(
        &mut self,
        job: &JobId,
        record: &RankRecord,
        at_ns: u64,
    ) -> Result<(), RecordingError> {
        self.line(&Line::Rank(RecordedRank {
            job: job.clone(),
            record: record.clone(),
            at_ns: Some(at_ns),
        }))
    }

    /// Makes everything written so far durable, so a crash loses at most one interval.
    pub fn flush(&mut self) -> Result<(), RecordingError> {
        self.out.flush().map_err(|source| RecordingError::Write {
            path: self.path.clone(),
            source,
        })
    }

    pub fn finish(mut self, end: RecordingEnd) -> Result<(), RecordingError> {
        self.line(&Line::End(end))?;
        self.flush()
    }
}

/// Writes a recording of one job made of `bursts` alone, with the exact rank totals they imply:
/// each rank's region of interest runs from the start of its first burst to the end of its last,
/// the time between its bursts is MPI_Allreduce time, and the rank ends with the job. For tests
/// and demonstrations without MPI (see [`crate::analysis::synthetic`]).
pub fn write_synthetic(
    path: &Path,
    header: RecordingHeader,
    meta: &JobMeta,
    bursts: &[Burst],
    end: RecordingEnd,
) -> Result<(), RecordingError> {
    let mut w = RecordingWriter::create(path, header)?;
    w.job(meta)?;
    let mut ranks: BTreeMap<u32, RankRecord> = BTreeMap::new();
    for b in bursts {
        w.burst(RecordedBurst {
            job: meta.id.clone(),
            burst: b.clone(),
            event_counts: b.counters.map(|c| [c.instructions, c.cycles]),
        })?;
        let r = ranks.entry(b.rank).or_insert_with(|| RankRecord {
            call_sites: Vec::new(),
            rank: b.rank,
            pid: 1000 + b.rank,
            first_seen_ns: b.start_ns,
            ended_ns: meta.ended_ns,
            totals: Default::default(),
            functions: BTreeMap::new(),
            region: RegionMarks {
                init_return_ns: Some(b.start_ns),
                ..Default::default()
            },
            probe_cost: None,
        });
        r.totals.bursts += 1;
        r.totals.burst_ns += b.duration_ns;
        r.totals.burst_oncpu_ns += b.oncpu_ns;
        if let Some(c) = b.counters {
            let [instructions, cycles] = r.totals.counter_sums.unwrap_or_default();
            r.totals.counter_sums = Some([instructions + c.instructions, cycles + c.cycles]);
        }
        let finalize = r.region.finalize_entry_ns.unwrap_or(0);
        r.region.finalize_entry_ns = Some(finalize.max(b.start_ns + b.duration_ns));
    }
    for r in ranks.values_mut() {
        let region = r.region.finalize_entry_ns.unwrap_or(0) - r.first_seen_ns;
        r.functions.insert(
            "MPI_Allreduce".to_string(),
            CallStats {
                calls: r.totals.bursts,
                time_ns: region.saturating_sub(r.totals.burst_ns),
                ..Default::default()
            },
        );
        w.rank(&meta.id, r)?;
    }
    w.finish(end)
}

/// A recording read back: the same job structures live capture fills.
#[derive(Debug)]
pub struct Recording {
    pub header: RecordingHeader,
    pub jobs: BTreeMap<JobId, Job>,
    /// Raw counter values per burst, in the order of each job's bursts (None without counters).
    pub event_counts: BTreeMap<JobId, Vec<Option<[u64; 2]>>>,
    /// The rank readings taken when the daemon's rank groups closed a window: (Unix ns, totals).
    pub readings: BTreeMap<JobId, Vec<(u64, RankRecord)>>,
    /// None when the recording was cut short (when any of the merged recordings was).
    pub end: Option<RecordingEnd>,
    /// The files read, one per node, in the order given.
    pub parts: Vec<RecordingPart>,
}

/// One file of a recording: the node it was recorded on and the ranks of each of its jobs.
#[derive(Clone, Debug, PartialEq)]
pub struct RecordingPart {
    pub path: PathBuf,
    pub node: String,
    /// The ranks of each job the file holds, from their totals or their bursts, ascending.
    pub ranks: BTreeMap<JobId, Vec<u32>>,
    /// The file has no end record.
    pub cut_short: bool,
}

/// Where the ranks of one job were recorded: what a job-wide report names.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeRanks<'a> {
    pub node: &'a str,
    pub recording: &'a Path,
    pub ranks: &'a [u32],
}

/// The settings of a recording's header that change the numbers of its reports: recordings
/// merged into one must agree on each.
fn settings(h: &RecordingHeader) -> [(&'static str, String); 4] {
    [
        (
            "kernel filters (--min-burst-us, in ns)",
            h.min_burst_ns.to_string(),
        ),
        (
            "counter events (--counters)",
            format!("{:?}", h.counter_events),
        ),
        ("probed MPI functions", h.functions.join(" ")),
        (
            "rank-group settings (analysis.window_s, [groups])",
            format!("{:?}", h.rank_groups),
        ),
    ]
}

/// The ranks a job's records and bursts name.
fn job_ranks(job: &Job) -> Vec<u32> {
    job.ranks
        .keys()
        .copied()
        .chain(job.bursts.iter().map(|b| b.rank))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect()
}

/// The readings of several nodes as one daemon would have taken them: each node reads its ranks
/// at its first update after a window boundary, so the readings of one window are those nearest
/// to its boundary, whatever the clocks of the nodes (they differ by far less than half a window).
/// They count as taken together, at the latest of them and not before the boundary, so that the
/// replay closes that window with all of them.
fn align_readings(readings: Vec<(u64, RankRecord)>, window_ns: u64) -> Vec<(u64, RankRecord)> {
    let mut windows: BTreeMap<u64, (u64, Vec<RankRecord>)> = BTreeMap::new();
    for (at, record) in readings {
        let boundary = (at + window_ns / 2) / window_ns;
        let (taken, records) = windows
            .entry(boundary)
            .or_insert((boundary * window_ns, Vec::new()));
        *taken = (*taken).max(at);
        records.push(record);
    }
    windows
        .into_values()
        .flat_map(|(at, records)| records.into_iter().map(move |r| (at, r)))
        .collect()
}

impl Recording {
    pub fn read(path: &Path) -> Result<Recording, RecordingError> {
        let file = File::open(path).map_err(|source| RecordingError::Read {
            path: path.into(),
            source,
        })?;
        Recording::from_reader(BufReader::new(file), path)
    }

    /// Reads a recording from `reader`; `path` names it in errors.
    pub fn from_reader(reader: impl BufRead, path: &Path) -> Result<Recording, RecordingError> {
        let mut header = None;
        let mut jobs: BTreeMap<JobId, Job> = BTreeMap::new();
        let mut event_counts: BTreeMap<JobId, Vec<Option<[u64; 2]>>> = BTreeMap::new();
        let mut readings: BTreeMap<JobId, Vec<(u64, RankRecord)>> = BTreeMap::new();
        let mut end = None;
        for (index, line) in reader.lines().enumerate() {
            let line = line.map_err(|source| RecordingError::Read {
                path: path.into(),
                source,
            })?;
            if line.is_empty() {
                continue;
            }
            let parsed: Line = match serde_json::from_str(&line) {
                Ok(l) => l,
                // A crash can cut the last line in half; everything before it stands.
                Err(e) if e.is_eof() => break,
                Err(source) => {
                    return Err(RecordingError::Parse {
                        path: path.into(),
                        line: index + 1,
                        source,
                    })
                }
            };
            match parsed {
                Line::Header(h) if index == 0 => {
                    if h.version != FORMAT_VERSION {
                        return Err(RecordingError::Version {
                            path: path.into(),
                            found: h.version,
                        });
                    }
                    header = Some(h);
                }
                _ if header.is_none() => {
                    return Err(RecordingError::NoHeader { path: path.into() })
                }
                Line::Header(_) => return Err(RecordingError::NoHeader { path: path.into() }),
                Line::Job(meta) => match jobs.get_mut(&meta.id) {
                    Some(job) => job.meta = meta,
                    None => {
                        jobs.insert(meta.id.clone(), Job::new(meta));
                    }
                },
                Line::Burst(b) => {
                    let job = jobs.get_mut(&b.job).ok_or_else(|| RecordingError::Parse {
                        path: path.into(),
                        line: index + 1,
                        source: serde::de::Error::custom(format!("burst of unknown job {}", b.job)),
                    })?;
                    job.bursts.push_back(b.burst);
                    event_counts.entry(b.job).or_default().push(b.event_counts);
                }
                Line::Rank(r) => {
                    if let Some(job) = jobs.get_mut(&r.job) {
                        if let Some(at) = r.at_ns {
                            readings
                                .entry(r.job.clone())
                                .or_default()
                                .push((at, r.record.clone()));
                        }
                        job.ranks.insert(r.record.rank, r.record);
                    }
                }
                Line::End(e) => end = Some(e),
            }
        }
        let header = header.ok_or_else(|| RecordingError::NoHeader { path: path.into() })?;
        let part = RecordingPart {
            path: path.into(),
            node: header.node.clone(),
            ranks: jobs
                .iter()
                .map(|(id, j)| (id.clone(), job_ranks(j)))
                .collect(),
            cut_short: end.is_none(),
        };
        Ok(Recording {
            header,
            jobs,
            event_counts,
            readings,
            end,
            parts: vec![part],
        })
    }

    /// Reads the recordings of one job's nodes as one: the recording of a daemon that saw all
    /// their ranks (see [`Recording::merge`]). One path reads that recording as it is.
    pub fn read_all(paths: &[PathBuf]) -> Result<Recording, RecordingError> {
        let recordings = paths
            .iter()
            .map(|p| Recording::read(p))
            .collect::<Result<Vec<_>, _>>()?;
        Recording::merge(recordings)
    }

    /// Merges recordings made on different nodes: jobs are matched by id, each job's ranks,
    /// bursts and readings put together (a job only some hold comes from those), its life spans
    /// them all. Refuses recordings whose settings differ where that changes the numbers, that
    /// hold the same rank of a job twice, or one that shares no job with the others. Each node's
    /// times stay on its own clock: every number of the reports is per rank, or of durations,
    /// or (the rank groups' windows) tolerant of a skew up to a fraction of a window.
    pub fn merge(recordings: Vec<Recording>) -> Result<Recording, RecordingError> {
        let mut recordings = recordings.into_iter();
        let mut merged = recordings.next().ok_or(RecordingError::NoRecording)?;
        let others: Vec<Recording> = recordings.collect();
        if others.is_empty() {
            return Ok(merged);
        }
        let everyone: Vec<&RecordingPart> = std::iter::once(&merged)
            .chain(&others)
            .flat_map(|r| &r.parts)
            .collect();
        Recording::check_shared_jobs(&everyone)?;
        let first_path = merged.parts[0].path.clone();
        for other in &others {
            let expected = settings(&merged.header);
            for ((setting, mine), (_, theirs)) in expected.into_iter().zip(settings(&other.header))
            {
                if mine != theirs {
                    return Err(RecordingError::Settings {
                        first: first_path.clone(),
                        second: other.parts[0].path.clone(),
                        setting,
                        first_value: mine,
                        second_value: theirs,
                    });
                }
            }
        }
        let window_ns = merged
            .header
            .rank_groups
            .as_ref()
            .map(|g| ((g.window_s * 1e9) as u64).max(1));
        for other in others {
            merged.absorb(other)?;
        }
        if let Some(window_ns) = window_ns {
            for readings in merged.readings.values_mut() {
                *readings = align_readings(std::mem::take(readings), window_ns);
            }
        }
        Ok(merged)
    }

    /// Refuses a set of files one of which shares no job with the others, naming each file's jobs.
    fn check_shared_jobs(parts: &[&RecordingPart]) -> Result<(), RecordingError> {
        let lonely = parts.iter().enumerate().find(|(i, part)| {
            !parts.iter().enumerate().any(|(j, other)| {
                *i != j && part.ranks.keys().any(|id| other.ranks.contains_key(id))
            })
        });
        let Some((_, lonely)) = lonely else {
            return Ok(());
        };
        let listing = parts
            .iter()
            .map(|p| {
                let jobs: Vec<&str> = p.ranks.keys().map(|j| j.0.as_str()).collect();
                match jobs[..] {
                    [] => format!("{} holds no job", p.path.display()),
                    _ => format!("{} holds {}", p.path.display(), jobs.join(", ")),
                }
            })
            .collect::<Vec<_>>()
            .join("; ");
        Err(RecordingError::NoSharedJob {
            path: lonely.path.clone(),
            listing,
        })
    }

    /// Adds the recording of another node, whose settings agree with this one's.
    fn absorb(&mut self, other: Recording) -> Result<(), RecordingError> {
        let other_part = &other.parts[0];
        for (id, ranks) in &other_part.ranks {
            let held = self.parts.iter().find_map(|p| {
                let mine = p.ranks.get(id)?;
                let rank = ranks.iter().find(|r| mine.binary_search(r).is_ok())?;
                Some((p, *rank))
            });
            if let Some((part, rank)) = held {
                return Err(RecordingError::SameRank {
                    job: id.clone(),
                    rank,
                    first: part.path.clone(),
                    second: other_part.path.clone(),
                });
            }
        }
        let h = &mut self.header;
        h.node = format!("{},{}", h.node, other.header.node);
        h.started_ns = h.started_ns.min(other.header.started_ns);
        let mut event_counts = other.event_counts;
        let mut readings = other.readings;
        for (id, job) in other.jobs {
            let counts = event_counts.remove(&id).unwrap_or_default();
            self.event_counts
                .entry(id.clone())
                .or_default()
                .extend(counts);
            let job_readings = readings.remove(&id).unwrap_or_default();
            self.readings
                .entry(id.clone())
                .or_default()
                .extend(job_readings);
            match self.jobs.get_mut(&id) {
                Some(mine) => add_node_part(mine, job)?,
                None => {
                    self.jobs.insert(id, job);
                }
            }
        }
        self.end = match (self.end.take(), other.end) {
            (Some(a), Some(b)) => Some(RecordingEnd {
                ended_ns: a.ended_ns.max(b.ended_ns),
                lost: Lost {
                    bursts: a.lost.bursts + b.lost.bursts,
                    execs: a.lost.execs + b.lost.execs,
                    thread_states: a.lost.thread_states + b.lost.thread_states,
                    thread_stats: a.lost.thread_stats + b.lost.thread_stats,
                    counters_descheduled: a.lost.counters_descheduled + b.lost.counters_descheduled,
                },
            }),
            _ => None,
        };
        self.parts.extend(other.parts);
        Ok(())
    }

    /// Where the ranks of job `id` were recorded, one entry per file that holds it.
    pub fn nodes_of(&self, id: &JobId) -> Vec<NodeRanks<'_>> {
        self.parts
            .iter()
            .filter_map(|p| {
                Some(NodeRanks {
                    node: &p.node,
                    recording: &p.path,
                    ranks: p.ranks.get(id)?,
                })
            })
            .collect()
    }

    /// The properties of one of its jobs over the job's life up to `now_ns`, evaluated from the
    /// ranks' exact totals as the daemon evaluates them, without the kernel's resource usage and
    /// file I/O, which a recording does not hold.
    pub fn job_properties(&self, job: &Job, now_ns: u64, config: &PropertyConfig) -> JobProperties {
        lifetime_properties(job, self.header.hardware_counters(), now_ns, config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{model::CallSite, store::RankTotals, test_support::JobMetaBuilder};

    fn header() -> RecordingHeader {
        RecordingHeader {
            version: FORMAT_VERSION,
            node: "n".into(),
            started_ns: 1,
            min_burst_ns: 100_000,
            counter_events: None,
            counters_note: "none".into(),
            functions: vec!["MPI_Send".into()],
            rank_groups: None,
        }
    }

    #[test]
    fn round_trip_and_cut_short() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let mut w = RecordingWriter::create(&path, header()).unwrap();
        let meta = JobMetaBuilder::new("j").size(1).build();
        w.job(&meta).unwrap();
        let burst = Burst {
            pid: 1,
            tid: 1,
            rank: 0,
            start_ns: 5,
            duration_ns: 7,
            oncpu_ns: 6,
            counters: None,
            start_func: "MPI_Init".into(),
            end_func: "MPI_Send".into(),
            start_site: CallSite {
                module: "abc".into(),
                offset: 0x10,
            },
            end_site: CallSite {
                module: "abc".into(),
                offset: 0x20,
            },
        };
        w.burst(RecordedBurst {
            job: meta.id.clone(),
            burst: burst.clone(),
            event_counts: Some([3, 4]),
        })
        .unwrap();
        let record = RankRecord {
            call_sites: Vec::new(),
            rank: 0,
            pid: 1,
            first_seen_ns: 0,
            ended_ns: Some(9),
            totals: RankTotals {
                bursts: 1,
                burst_ns: 7,
                ..Default::default()
            },
            functions: BTreeMap::new(),
            region: Default::default(),
            probe_cost: None,
        };
        w.rank(&meta.id, &record).unwrap();
        w.flush().unwrap();
        let cut = Recording::read(&path).unwrap();
        assert!(cut.end.is_none());
        w.finish(RecordingEnd {
            ended_ns: 10,
            lost: Lost::default(),
        })
        .unwrap();

        let r = Recording::read(&path).unwrap();
        assert_eq!(r.header, header());
        let job = &r.jobs[&meta.id];
        assert_eq!(job.bursts.front(), Some(&burst));
        assert_eq!(job.ranks[&0], record);
        assert_eq!(r.event_counts[&meta.id], vec![Some([3, 4])]);
        assert_eq!(r.end.unwrap().ended_ns, 10);
    }

    const MS: u64 = 1_000_000;

    /// What the reports of a job are made of: its phases (cluster time shares), SPMD score and
    /// POP efficiencies.
    fn results(
        r: &Recording,
        id: &str,
    ) -> (usize, Vec<f64>, f64, crate::properties::PopEfficiencies) {
        let job = &r.jobs[&JobId(id.into())];
        let bursts: Vec<Burst> = job.bursts.iter().cloned().collect();
        let analysis =
            crate::analysis::analyse(&bursts, job.node_ranks(), &Default::default()).unwrap();
        let now = r.end.as_ref().unwrap().ended_ns;
        let properties = r.job_properties(job, now, &PropertyConfig::default());
        (
            analysis.clusters.len(),
            analysis.clusters.iter().map(|c| c.time_share).collect(),
            analysis.global_score,
            properties.pop,
        )
    }

    /// The recording that the daemon of `node` writes of `ranks` of a synthetic four-rank job
    /// with three phases, its clock `skew_ns` ahead.
    fn node_recording(
        dir: &Path,
        node: &str,
        job: &str,
        ranks: std::ops::Range<u32>,
        skew_ns: u64,
    ) -> PathBuf {
        let synthetic = crate::analysis::synthetic::SyntheticJob::three_phases(4, 40, false);
        let all = synthetic.bursts();
        let first_seen = all.iter().map(|b| b.start_ns).min().unwrap() - MS + skew_ns;
        let bursts: Vec<Burst> = all
            .into_iter()
            .filter(|b| ranks.contains(&b.rank))
            .map(|mut b| {
                b.start_ns += skew_ns;
                b
            })
            .collect();
        let end = bursts
            .iter()
            .map(|b| b.start_ns + b.duration_ns)
            .max()
            .unwrap();
        let path = dir.join(format!("{node}-{job}.jsonl"));
        let meta = JobMetaBuilder::new(job)
            .node(node)
            .size(4)
            .first_seen_ns(first_seen)
            .ended_ns(Some(end))
            .build();
        let end = RecordingEnd {
            ended_ns: end + MS,
            lost: Lost::default(),
        };
        let header = RecordingHeader {
            node: node.into(),
            ..header()
        };
        write_synthetic(&path, header, &meta, &bursts, end).unwrap();
        path
    }

    #[test]
    fn the_nodes_recordings_merge_into_the_recording_of_all_ranks() {
        let dir = tempfile::tempdir().unwrap();
        let all = Recording::read(&node_recording(dir.path(), "all", "pmix:7", 0..4, 0)).unwrap();
        let a = node_recording(dir.path(), "a", "pmix:7", 0..2, 0);
        let b = node_recording(dir.path(), "b", "pmix:7", 2..4, 0);
        let merged = Recording::read_all(&[a.clone(), b.clone()]).unwrap();
        assert_eq!(results(&merged, "pmix:7"), results(&all, "pmix:7"));
        assert_eq!(results(&merged, "pmix:7").0, 3, "the three phases");
        let job = &merged.jobs[&JobId("pmix:7".into())];
        assert_eq!(job.node_ranks(), 4);
        assert_eq!(job.meta.node, "a,b");
        assert_eq!(job.bursts.len(), merged.event_counts[&job.meta.id].len());
        let nodes = merged.nodes_of(&job.meta.id);
        assert_eq!(
            nodes,
            [
                NodeRanks {
                    node: "a",
                    recording: &a,
                    ranks: &[0, 1]
                },
                NodeRanks {
                    node: "b",
                    recording: &b,
                    ranks: &[2, 3]
                }
            ]
        );
        // One file is read as it is.
        let single = Recording::read_all(std::slice::from_ref(&a)).unwrap();
        assert_eq!(single.jobs, Recording::read(&a).unwrap().jobs);
    }

    #[test]
    fn a_clock_skew_of_50_ms_between_nodes_changes_no_result() {
        let dir = tempfile::tempdir().unwrap();
        let a = node_recording(dir.path(), "a", "pmix:7", 0..2, 0);
        let b = node_recording(dir.path(), "b", "pmix:7", 2..4, 0);
        let skewed = node_recording(dir.path(), "skewed", "pmix:7", 2..4, 50 * MS);
        let merged = Recording::read_all(&[a.clone(), b]).unwrap();
        let with_skew = Recording::read_all(&[a, skewed]).unwrap();
        assert_eq!(results(&with_skew, "pmix:7"), results(&merged, "pmix:7"));
    }

    #[test]
    fn the_readings_of_one_window_are_taken_together_whatever_the_clocks() {
        let window = 10_000 * MS;
        let boundary = 170_000 * window;
        let reading = |at: u64, rank: u32| {
            let mut record = RankRecord {
                call_sites: Vec::new(),
                rank,
                pid: rank,
                first_seen_ns: 0,
                ended_ns: None,
                totals: RankTotals::default(),
                functions: BTreeMap::new(),
                region: Default::default(),
                probe_cost: None,
            };
            record.totals.bursts = at;
            (at, record)
        };
        // Node a reads 300 ms after each boundary, node b 20 ms after it on a clock 50 ms behind.
        let readings = vec![
            reading(boundary + 300 * MS, 0),
            reading(boundary + window + 300 * MS, 0),
            reading(boundary - 30 * MS, 1),
            reading(boundary + window - 30 * MS, 1),
        ];
        let aligned = align_readings(readings, window);
        let times: Vec<(u64, u32)> = aligned.iter().map(|(at, r)| (*at, r.rank)).collect();
        assert_eq!(
            times,
            [
                (boundary + 300 * MS, 0),
                (boundary + 300 * MS, 1),
                (boundary + window + 300 * MS, 0),
                (boundary + window + 300 * MS, 1)
            ]
        );
        // A window only a node behind the boundary read is still that boundary's.
        let early = align_readings(vec![reading(boundary - 30 * MS, 1)], window);
        assert_eq!(early[0].0, boundary);
    }

    #[test]
    fn a_job_only_some_nodes_recorded_comes_from_those() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Recording::read(&node_recording(dir.path(), "a", "pmix:7", 0..2, 0)).unwrap();
        let other = Recording::read(&node_recording(dir.path(), "a", "pmix:8", 0..4, 0)).unwrap();
        let eight = JobId("pmix:8".into());
        a.jobs.insert(eight.clone(), other.jobs[&eight].clone());
        a.parts[0]
            .ranks
            .insert(eight.clone(), other.parts[0].ranks[&eight].clone());
        let b = Recording::read(&node_recording(dir.path(), "b", "pmix:7", 2..4, 0)).unwrap();
        let merged = Recording::merge(vec![a, b]).unwrap();
        assert_eq!(merged.jobs[&eight].node_ranks(), 4);
        assert_eq!(merged.jobs[&eight].meta.node, "a");
        assert_eq!(merged.nodes_of(&eight).len(), 1);
        assert_eq!(merged.jobs[&JobId("pmix:7".into())].node_ranks(), 4);
    }

    #[test]
    fn recordings_that_are_not_of_one_job_are_refused_saying_why() {
        let dir = tempfile::tempdir().unwrap();
        let a = node_recording(dir.path(), "a", "pmix:7", 0..2, 0);
        let b = node_recording(dir.path(), "b", "pmix:7", 2..4, 0);
        let e = Recording::read_all(&[a.clone(), a.clone()]).unwrap_err();
        assert!(matches!(e, RecordingError::SameRank { rank: 0, .. }), "{e}");
        assert!(
            e.to_string().contains("pass each node's recording once"),
            "{e}"
        );

        let other = node_recording(dir.path(), "c", "pmix:9", 2..4, 0);
        let e = Recording::read_all(&[a.clone(), other]).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, RecordingError::NoSharedJob { .. }), "{e}");
        assert!(text.contains("a-pmix:7.jsonl holds pmix:7"), "{text}");
        assert!(text.contains("c-pmix:9.jsonl holds pmix:9"), "{text}");

        let mut filtered = Recording::read(&b).unwrap();
        filtered.header.min_burst_ns *= 2;
        let e = Recording::merge(vec![Recording::read(&a).unwrap(), filtered]).unwrap_err();
        assert!(
            matches!(e, RecordingError::Settings { setting, .. } if setting.contains("--min-burst-us")),
            "{e}"
        );
        let mut counted = Recording::read(&b).unwrap();
        counted.header.counter_events = Some(["instructions".into(), "cycles".into()]);
        let e = Recording::merge(vec![Recording::read(&a).unwrap(), counted]).unwrap_err();
        assert!(e.to_string().contains("--counters"), "{e}");
    }

    #[test]
    fn other_versions_and_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.jsonl");
        let mut h = header();
        h.version = 99;
        RecordingWriter::create(&path, h).unwrap().flush().unwrap();
        assert!(matches!(
            Recording::read(&path),
            Err(RecordingError::Version { found: 99, .. })
        ));
        std::fs::write(&path, "{\"job\":{}}\n").unwrap();
        assert!(Recording::read(&path).is_err());
    }
}
