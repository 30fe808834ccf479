//! The per-job text report printed while a job runs and when it ends: ranks, bursts, time in
//! computation versus MPI per rank, and calls, time and bytes per MPI function.

use std::fmt::Write as _;

use crate::store::Job;

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
    let state = if m.ended_ns.is_some() { "ended" } else { "running" };
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
        "   {:>5} {:>8} {:>9} {:>9} {:>10} {:>10} {:>7} {:>8}",
        "rank", "pid", "bursts", "filtered", "compute s", "MPI s", "MPI %", "on-CPU %"
    );
    for r in job.ranks.values() {
        let t = &r.totals;
        let mpi = r.mpi_ns();
        let total = t.burst_ns + mpi;
        let mpi_pct = if total > 0 { 100.0 * mpi as f64 / total as f64 } else { 0.0 };
        let oncpu_pct = if t.burst_ns > 0 { 100.0 * t.burst_oncpu_ns as f64 / t.burst_ns as f64 } else { 0.0 };
        let _ = writeln!(
            out,
            "   {:>5} {:>8} {:>9} {:>9} {:>10.3} {:>10.3} {:>6.1}% {:>7.1}%{}",
            r.rank,
            r.pid,
            t.bursts,
            t.filtered_bursts,
            secs(t.burst_ns),
            secs(mpi),
            mpi_pct,
            oncpu_pct,
            if r.ended_ns.is_some() { "  (exited)" } else { "" }
        );
    }
    let functions = job.functions();
    if !functions.is_empty() {
        let _ = writeln!(out, "   {:<24} {:>10} {:>10} {:>12}", "MPI function", "calls", "time s", "bytes");
        let mut rows: Vec<_> = functions.into_iter().collect();
        rows.sort_by(|a, b| b.1.time_ns.cmp(&a.1.time_ns).then(a.0.cmp(b.0)));
        for (name, s) in rows {
            let b = if s.sized_calls > 0 { bytes(s.bytes) } else { "-".into() };
            let _ = writeln!(out, "   {:<24} {:>10} {:>10.3} {:>12}", name, s.calls, secs(s.time_ns), b);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        model::JobId,
        store::{CallStats, JobMeta, RankRecord, RankTotals},
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
        functions.insert("MPI_Send".to_string(), CallStats { calls: 3, time_ns: 500_000_000, bytes: 3 << 20, sized_calls: 3 });
        job.ranks.insert(
            0,
            RankRecord {
                rank: 0,
                pid: 42,
                first_seen_ns: 0,
                ended_ns: None,
                totals: RankTotals { bursts: 4, burst_ns: 1_500_000_000, burst_oncpu_ns: 750_000_000, ..Default::default() },
                functions,
            },
        );
        let text = render(&job, 0, "no counters");
        assert!(text.contains("ended, 2.0 s"), "{text}");
        assert!(text.contains("25.0%"), "MPI share 0.5/(1.5+0.5): {text}");
        assert!(text.contains("50.0%"), "on-CPU share: {text}");
        assert!(text.contains("MPI_Send") && text.contains("3.0 MiB"), "{text}");
    }
}
