//! The daemon's evaluation of one job: over the job's life on this node, and over the last
//! complete window aligned to Unix time (the same length as the phase windows, so the windows of
//! every node coincide and their aggregates merge). A window's values are the differences of
//! snapshots (store totals and kernel usage) taken at the first update after each boundary, so
//! its span is the exact time between the two snapshots, at most one stats interval after the
//! boundaries. Per-phase properties come from the last closed analysis window of the job.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::catalogue::{evaluate_job, JobProperties};
use super::config::PropertyConfig;
use super::error::PropertyError;
use super::inputs::{IoStats, JobInput, PhasesInput, PmuCounters, RankSample, ResourceUsage};
use super::window::Span;
use crate::{
    analysis::online::WindowView,
    capture::usage::UsageTotals,
    store::{Job, RankRecord},
};

/// What the daemon publishes for one job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LiveProperties {
    /// Over the job's life on this node (phase properties are per window only).
    pub job: JobProperties,
    /// Over the last complete window, once one has passed since the job was first seen.
    pub window: Option<WindowProperties>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowProperties {
    /// Index of the last aligned window the span ends in (Unix start time ÷ window length).
    pub window: u64,
    /// The aligned boundary the span ends at (its end is the first update after it): the same on
    /// every node for the same window, so it tells which nodes' windows merge.
    pub aligned_end_ns: u64,
    pub properties: JobProperties,
}

/// The state at the start of the current window.
struct Mark {
    window: u64,
    at_ns: u64,
    ranks: BTreeMap<u32, RankRecord>,
    usage: Option<UsageTotals>,
}

pub struct LiveEvaluator {
    window_ns: u64,
    /// The counter slots hold instructions and cycles (a PMU), not test-mode software events.
    hardware_counters: bool,
    mark: Option<Mark>,
    last_window: Option<WindowProperties>,
    /// The most CPUs the job's live processes could use at any reading: the CPU shares of an
    /// ended job are relative to what it had while it ran.
    cpus_seen: u32,
}

fn resources(
    after: &UsageTotals,
    before: Option<&UsageTotals>,
    cpus: u32,
    memory_available_bytes: u64,
    seconds: f64,
) -> ResourceUsage {
    let before = before.copied().unwrap_or_default();
    ResourceUsage {
        seconds,
        memory_used_bytes: after.memory_used_bytes,
        memory_available_bytes,
        user_seconds: after.user_ns.saturating_sub(before.user_ns) as f64 / 1e9,
        system_seconds: after.system_ns.saturating_sub(before.system_ns) as f64 / 1e9,
        cpus: cpus.max(1) as f64,
    }
}

fn io(after: &UsageTotals, before: Option<&UsageTotals>, seconds: f64) -> Option<IoStats> {
    let before = match before {
        Some(u) => u.io?,
        None => Default::default(),
    };
    Some(IoStats {
        seconds,
        counts: after.io?.since(before),
    })
}

/// A rank's instructions and cycles inside its bursts, from the kernel's counter sums.
fn pmu(record: &RankRecord) -> Option<PmuCounters> {
    let [instructions, cycles] = record.totals.counter_sums?;
    Some(PmuCounters {
        instructions,
        cycles,
        ref_cycles: None,
        llc_misses: None,
        branch_misses: None,
    })
}

/// The properties of `job` over its life from its ranks' exact totals alone (no kernel usage, no
/// phases): what a recording or the job-wide merge of the nodes' ranks can evaluate.
/// `hardware_counters`: the counter slots are instructions and cycles.
pub fn lifetime_properties(
    job: &Job,
    hardware_counters: bool,
    now_ns: u64,
    config: &PropertyConfig,
) -> JobProperties {
    // The lifetime evaluation does not depend on the window length; any will do.
    let window_ns = 1_000_000_000;
    LiveEvaluator::new(window_ns, hardware_counters)
        .update(job, None, 0, None, now_ns, config)
        .job
}

impl LiveEvaluator {
    pub fn new(window_ns: u64, hardware_counters: bool) -> Self {
        assert!(window_ns > 0, "window length must be positive");
        LiveEvaluator {
            window_ns,
            hardware_counters,
            mark: None,
            last_window: None,
            cpus_seen: 0,
        }
    }

    /// Evaluates the job now. `usage` is the job's kernel usage (None where it could not be
    /// read); `phases` the last closed analysis window of the job.
    pub fn update(
        &mut self,
        job: &Job,
        usage: Option<&UsageTotals>,
        memory_available_bytes: u64,
        phases: Option<&WindowView>,
        now_ns: u64,
        config: &PropertyConfig,
    ) -> LiveProperties {
        if let Some(u) = usage {
            self.cpus_seen = self.cpus_seen.max(u.cpus);
        }
        let mut lifetime = JobInput::lifetime(job, now_ns);
        if self.hardware_counters {
            for (sample, record) in lifetime.ranks.iter_mut().zip(job.ranks.values()) {
                sample.pmu = pmu(record);
            }
        }
        if let Some(u) = usage {
            self.set_usage(&mut lifetime, u, None, memory_available_bytes);
        }
        let job_properties = evaluate_job(&lifetime, config);

        let window = now_ns / self.window_ns;
        let ended_before_mark = |m: &Mark| job.meta.ended_ns.is_some_and(|end| end < m.at_ns);
        match &self.mark {
            Some(m) if m.window < window && !ended_before_mark(m) => {
                match self.evaluate_window(
                    m,
                    job,
                    usage,
                    memory_available_bytes,
                    phases,
                    now_ns,
                    config,
                ) {
                    Ok(properties) => {
                        self.last_window = Some(WindowProperties {
                            window: window - 1,
                            aligned_end_ns: window * self.window_ns,
                            properties,
                        })
                    }
                    Err(e) => {
                        tracing::warn!("job {}: window properties not evaluated: {e}", job.meta.id)
                    }
                }
                self.set_mark(window, job, usage, now_ns);
            }
            Some(_) => {}
            None => self.set_mark(window, job, usage, now_ns),
        }
        LiveProperties {
            job: job_properties,
            window: self.last_window.clone(),
        }
    }

    /// The span's resource usage and file I/O: the usage since `before`, or since the job
    /// started.
    fn set_usage(
        &self,
        input: &mut JobInput<'_>,
        after: &UsageTotals,
        before: Option<&UsageTotals>,
        memory_available_bytes: u64,
    ) {
        let seconds = (input.span.end_ns - input.span.start_ns) as f64 / 1e9;
        input.resources = Some(resources(
            after,
            before,
            self.cpus_seen,
            memory_available_bytes,
            seconds,
        ));
        input.io = io(after, before, seconds);
    }

    fn set_mark(&mut self, window: u64, job: &Job, usage: Option<&UsageTotals>, now_ns: u64) {
        self.mark = Some(Mark {
            window,
            at_ns: now_ns,
            ranks: job.ranks.clone(),
            usage: usage.copied(),
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn evaluate_window(
        &self,
        mark: &Mark,
        job: &Job,
        usage: Option<&UsageTotals>,
        memory_available_bytes: u64,
        phases: Option<&WindowView>,
        now_ns: u64,
        config: &PropertyConfig,
    ) -> Result<JobProperties, PropertyError> {
        let span = Span::new(mark.at_ns, now_ns);
        // Ranks that ended before the window have nothing in it and would only dilute the means.
        let ranks = job
            .ranks
            .values()
            .filter(|r| r.ended_ns.is_none_or(|end| end > span.start_ns))
            .map(|r| {
                let before = mark.ranks.get(&r.rank).filter(|b| b.pid == r.pid);
                let mut sample = RankSample::window(before, r, span)?;
                if self.hardware_counters {
                    sample.pmu = match (pmu(r), before.map(pmu)) {
                        (Some(after), Some(Some(before))) => Some(after.delta(&before, r.rank)?),
                        (after, None) => after,
                        _ => None,
                    };
                }
                Ok(sample)
            })
            .collect::<Result<Vec<_>, PropertyError>>()?;
        let mut input = JobInput {
            meta: &job.meta,
            span,
            ranks,
            nominal_hz: None,
            resources: None,
            io: None,
            phases: phases.map(PhasesInput::from),
        };
        // Usage is differenced only when both snapshots have it.
        if let (Some(u), Some(before)) = (usage, mark.usage.as_ref()) {
            self.set_usage(&mut input, u, Some(before), memory_available_bytes);
        }
        Ok(evaluate_job(&input, config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        store::{CallStats, RankTotals, RegionMarks},
        test_support::JobMetaBuilder,
    };

    const S: u64 = 1_000_000_000;
    const W: u64 = 30 * S;

    /// Two ranks that returned from MPI_Init at 100 W and spent `mpi` in MPI since: their useful
    /// time is the rest of their region of interest. `useful` is their burst time.
    fn job(useful: [u64; 2], mpi: [u64; 2]) -> Job {
        let mut job = Job::new(JobMetaBuilder::new("j").first_seen_ns(100 * W).build());
        for rank in 0..2 {
            let mut functions = BTreeMap::new();
            functions.insert(
                "MPI_Allreduce".to_string(),
                CallStats {
                    calls: 1,
                    time_ns: mpi[rank],
                    bytes: 0,
                    sized_calls: 0,
                    ..Default::default()
                },
            );
            job.ranks.insert(
                rank as u32,
                RankRecord {
                    call_sites: Vec::new(),
                    rank: rank as u32,
                    pid: 10 + rank as u32,
                    first_seen_ns: 100 * W,
                    ended_ns: None,
                    totals: RankTotals {
                        bursts: 1,
                        burst_ns: useful[rank],
                        burst_oncpu_ns: useful[rank],
                        ..Default::default()
                    },
                    functions,
                    region: RegionMarks {
                        init_return_ns: Some(100 * W),
                        ..Default::default()
                    },
                    probe_cost: None,
                },
            );
        }
        job
    }

    #[test]
    fn windows_are_differences_between_boundary_snapshots() {
        let config = PropertyConfig::default();
        let mut e = LiveEvaluator::new(W, false);
        let usage = |user_s: u64, write_bytes: u64| UsageTotals {
            user_ns: user_s * S,
            cpus: 2,
            io: Some(crate::capture::usage::IoCounts {
                write_bytes,
                write_calls: 1,
                ..Default::default()
            }),
            ..Default::default()
        };
        // First update: a mark, no window yet. Balanced so far.
        let start = 100 * W + S;
        let first = e.update(
            &job([S, S], [0, 0]),
            Some(&usage(2, 10)),
            1 << 30,
            None,
            start,
            &config,
        );
        assert!(first.window.is_none());
        // Same window: still none.
        assert!(e
            .update(
                &job([2 * S, 2 * S], [0, 0]),
                Some(&usage(4, 10)),
                1 << 30,
                None,
                start + 10 * S,
                &config
            )
            .window
            .is_none());
        // After the boundary: rank 1 computed all of the 30 s since the mark, rank 0 3 s (27 s in
        // MPI).
        let now = 101 * W + S;
        let live = e.update(
            &job([4 * S, 31 * S], [27 * S, 0]),
            Some(&usage(42, 1010)),
            1 << 30,
            None,
            now,
            &config,
        );
        let w = live.window.expect("a complete window");
        assert_eq!((w.window, w.aligned_end_ns), (100, 101 * W));
        assert_eq!(w.properties.span, Span::new(start, now));
        let lb = w.properties.get("load_balance").unwrap().value().unwrap();
        assert!((lb - 0.55).abs() < 1e-12, "window LB {lb}");
        // Over the life (regions of 31 s): (4 + 31) / 2 / 31.
        let life_lb = live.job.get("load_balance").unwrap().value().unwrap();
        assert!(
            (life_lb - 35.0 / 62.0).abs() < 1e-12,
            "lifetime LB {life_lb}"
        );
        // The window's I/O is the difference: 1000 bytes in 30 s.
        let bw = w
            .properties
            .get("io_write_bandwidth_low")
            .or(w.properties.get("io_write_bandwidth_high"))
            .unwrap();
        assert!((bw.value().unwrap() - 1000.0 / 30.0).abs() < 1e-9, "{bw:?}");
        // User time since the mark: 40 s on 2 CPUs over 30 s.
        let user = w
            .properties
            .get("user_time_share")
            .unwrap()
            .value()
            .unwrap();
        assert!((user - 40.0 / 60.0).abs() < 1e-9, "{user}");
    }

    #[test]
    fn a_new_process_for_a_rank_starts_from_zero() {
        let config = PropertyConfig::default();
        let mut e = LiveEvaluator::new(W, false);
        e.update(
            &job([10 * S, 10 * S], [0, 0]),
            None,
            0,
            None,
            100 * W + S,
            &config,
        );
        // Rank 1 spent 20 s of the 30 s window in MPI; rank 0's new process returned from
        // MPI_Init 1 s before the end of the window.
        let mut restarted = job([S, 11 * S], [0, 20 * S]);
        let new = restarted.ranks.get_mut(&0).unwrap();
        new.pid = 99;
        new.first_seen_ns = 101 * W;
        new.region.init_return_ns = Some(101 * W);
        let live = e.update(&restarted, None, 0, None, 101 * W + S, &config);
        let w = live.window.unwrap();
        // Rank 0's new process did 1 s, rank 1 did 10 s in the window.
        let lb = w.properties.get("load_balance").unwrap().value().unwrap();
        assert!((lb - 0.55).abs() < 1e-12, "{lb}");
        assert!(
            w.properties
                .get("user_time_share")
                .unwrap()
                .reason()
                .is_some(),
            "no usage: not measured"
        );
        // CPU time read, file I/O not counted (capture.file_io = false): the I/O properties say so.
        let usage = UsageTotals {
            user_ns: S,
            cpus: 2,
            io: None,
            ..Default::default()
        };
        let live = LiveEvaluator::new(W, false).update(
            &restarted,
            Some(&usage),
            0,
            None,
            101 * W + S,
            &config,
        );
        assert!(live.job.get("user_time_share").unwrap().value().is_some());
        let io = live.job.get("io_open_rate").unwrap();
        assert!(
            io.reason().is_some_and(|r| r.contains("not collected")),
            "{io:?}"
        );
    }

    #[test]
    fn hardware_counter_sums_give_the_window_cpi() {
        let config = PropertyConfig::default();
        let with_counters = |instructions: u64, cycles: u64| {
            let mut j = job([S, S], [0, 0]);
            for r in j.ranks.values_mut() {
                r.totals.counter_sums = Some([instructions, cycles]);
            }
            j
        };
        let mut e = LiveEvaluator::new(W, true);
        e.update(
            &with_counters(1_000_000_000, 2_000_000_000),
            None,
            0,
            None,
            100 * W + S,
            &config,
        );
        let live = e.update(
            &with_counters(3_000_000_000, 5_000_000_000),
            None,
            0,
            None,
            101 * W + S,
            &config,
        );
        let cpi = |p: &JobProperties| p.get("cpi").unwrap().value().unwrap();
        assert!((cpi(&live.job) - 5.0 / 3.0).abs() < 1e-12);
        assert!((cpi(&live.window.unwrap().properties) - 1.5).abs() < 1e-12);
        // Software events in the slots are not instructions and cycles: not measured.
        let mut soft = LiveEvaluator::new(W, false);
        let live = soft.update(&with_counters(3, 5), None, 0, None, 100 * W + S, &config);
        assert!(live
            .job
            .get("cpi")
            .unwrap()
            .reason()
            .unwrap()
            .contains("no PMU"));
    }
}
