//! The per-job text report printed while a job runs and when it ends: ranks, bursts, useful
//! time versus MPI time per rank over its region of interest, start-up and shut-down, and calls,
//! time and bytes per MPI function.

use std::fmt::Write as _;

use crate::{
    properties::{Aggregate, RankSample},
    store::{Job, RankRecord},
};

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

/// Renders the report of one job. `now_ns` (Unix) gives the elapsed time of a running job.
pub fn render(job: &Job, now_ns: u64, counters_note: &str) -> String {
    let m = &job.meta;
    let end = m.ended_ns.unwrap_or(now_ns);
    let state = if m.ended_ns.is_some() {
        "ended"
    } else {
        "running"
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== job {} on {}: {} of {} ranks here, {state}, {:.1} s, {}",
        m.id,
        m.node,
        job.ranks.len(),
        m.size,
        secs(end.saturating_sub(m.first_seen_ns)),
        m.executable
    );
    let _ = writeln!(out, "   identity from {}; {counters_note}", m.source);
    let _ = writeln!(
        out,
        "   {:>5} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>8}",
        "rank", "pid", "bursts", "filtered", "region s", "useful s", "MPI s", "MPI %", "on-CPU %"
    );
    for r in job.ranks.values() {
        let t = &r.totals;
        let sample = RankSample::lifetime(r, end);
        let mpi_pct = if sample.runtime_ns > 0 {
            100.0 * sample.mpi_ns as f64 / sample.runtime_ns as f64
        } else {
            0.0
        };
        let oncpu_pct = if t.burst_ns > 0 {
            100.0 * t.burst_oncpu_ns as f64 / t.burst_ns as f64
        } else {
            0.0
        };
        let state = match (r.region_span(end), r.ended_ns) {
            (None, _) => "  (in MPI_Init)",
            (Some(_), Some(_)) if r.region.finalize_entry_ns.is_none() => {
                "  (exited without MPI_Finalize)"
            }
            (Some(_), Some(_)) => "  (exited)",
            (Some(_), None) => "",
        };
        let _ = writeln!(
            out,
            "   {:>5} {:>8} {:>9} {:>9} {:>9.3} {:>9.3} {:>9.3} {:>6.1}% {:>7.1}%{state}",
            r.rank,
            r.pid,
            t.bursts,
            t.filtered_bursts,
            secs(sample.runtime_ns),
            secs(sample.useful_ns),
            secs(sample.mpi_ns),
            mpi_pct,
            oncpu_pct,
        );
    }
    if let Some(line) = lifecycle_line(job) {
        let _ = writeln!(out, "   {line}");
    }
    let functions = job.functions();
    if !functions.is_empty() {
        let _ = writeln!(
            out,
            "   {:<24} {:>10} {:>10} {:>12}",
            "MPI function", "calls", "time s", "bytes"
        );
        let mut rows: Vec<_> = functions.into_iter().collect();
        rows.sort_by(|a, b| b.1.time_ns.cmp(&a.1.time_ns).then(a.0.cmp(b.0)));
        for (name, s) in rows {
            let b = if s.sized_calls > 0 {
                bytes(s.bytes)
            } else {
                "-".into()
            };
            let _ = writeln!(
                out,
                "   {:<24} {:>10} {:>10.3} {:>12}",
                name,
                s.calls,
                secs(s.time_ns),
                b
            );
        }
    }
    let t = job.totals();
    if t.dropped_bursts > 0 || job.bursts_evicted > 0 {
        let _ = writeln!(
            out,
            "   {} bursts lost (ring buffer full), {} older bursts evicted from memory (totals stay exact)",
            t.dropped_bursts, job.bursts_evicted
        );
    }
    out
}

/// Start-up and shut-down of the ranks, which the efficiencies leave out: MPI_Init over the
/// ranks whose return from it the daemon saw, MPI_Finalize over those that entered it.
fn lifecycle_line(job: &Job) -> Option<String> {
    let over = |seen: fn(&RankRecord) -> bool, value: fn(&RankRecord) -> u64| {
        Aggregate::of(
            job.ranks
                .values()
                .filter(|r| seen(r))
                .map(|r| secs(value(r))),
        )
    };
    let init = over(|r| r.region.init_return_ns.is_some(), RankRecord::init_ns);
    let finalize = over(
        |r| r.region.finalize_entry_ns.is_some(),
        RankRecord::finalize_ns,
    );
    let startup = match init.mean() {
        Some(mean) => format!("startup: MPI_Init {:.3} s max, {mean:.3} s mean", init.max),
        None if job.ranks.values().any(|r| r.region_span(u64::MAX).is_some()) => {
            "startup: MPI_Init not seen (the daemon attached after it; regions start when it saw the ranks)".to_string()
        }
        None => return None,
    };
    let shutdown = match finalize.count {
        0 => String::new(),
        n => format!(
            "; shutdown: MPI_Finalize {:.3} s max over {n} ranks",
            finalize.max
        ),
    };
    Some(format!(
        "{startup}{shutdown} (outside the region of interest the efficiencies use)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::JobId,
        store::{CallStats, JobMeta, RankTotals, RegionMarks},
    };

    #[test]
    fn report_shows_ranks_and_functions() {
        let mut job = Job::new(JobMeta {
            id: JobId("pmix:x".into()),
            node: "n1".into(),
            size: 2,
            source: "OMPI environment".into(),
            executable: "/bin/app".into(),
            build_id: None,
            first_seen_ns: 0,
            ended_ns: Some(2_000_000_000),
        });
        let mut functions = std::collections::BTreeMap::new();
        functions.insert(
            "MPI_Send".to_string(),
            CallStats {
                calls: 3,
                time_ns: 500_000_000,
                bytes: 3 << 20,
                sized_calls: 3,
            },
        );
        functions.insert(
            "MPI_Init".to_string(),
            CallStats {
                calls: 1,
                time_ns: 300_000_000,
                ..Default::default()
            },
        );
        functions.insert(
            "MPI_Finalize".to_string(),
            CallStats {
                calls: 1,
                time_ns: 100_000_000,
                ..Default::default()
            },
        );
        job.ranks.insert(
            0,
            RankRecord {
                rank: 0,
                pid: 42,
                first_seen_ns: 0,
                ended_ns: Some(2_100_000_000),
                totals: RankTotals {
                    bursts: 4,
                    burst_ns: 1_500_000_000,
                    burst_oncpu_ns: 750_000_000,
                    ..Default::default()
                },
                functions,
                region: RegionMarks {
                    init_return_ns: Some(0),
                    finalize_entry_ns: Some(2_000_000_000),
                    ..Default::default()
                },
            },
        );
        let text = render(&job, 0, "no counters");
        assert!(text.contains("ended, 2.0 s"), "{text}");
        assert!(
            text.contains("25.0%"),
            "MPI share 0.5 s of the 2 s region: {text}"
        );
        assert!(
            text.contains("startup: MPI_Init 0.300 s max")
                && text.contains("MPI_Finalize 0.100 s max over 1 ranks"),
            "{text}"
        );
        assert!(text.contains("50.0%"), "on-CPU share: {text}");
        assert!(
            text.contains("MPI_Send") && text.contains("3.0 MiB"),
            "{text}"
        );
    }
}
