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
    store::{CallStats, Job, JobMeta, RankRecord, RegionMarks},
};

pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
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
    /// None when the recording was cut short.
    pub end: Option<RecordingEnd>,
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
        Ok(Recording {
            header,
            jobs,
            event_counts,
            readings,
            end,
        })
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
        assert_eq!(job.bursts[0], burst);
        assert_eq!(job.ranks[&0], record);
        assert_eq!(r.event_counts[&meta.id], vec![Some([3, 4])]);
        assert_eq!(r.end.unwrap().ended_ns, 10);
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
