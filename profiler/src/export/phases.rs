//! The phase table: what [`analyse`](crate::analysis::analyse) found in one job, as text. One row
//! per cluster (1 = most time), then the code regions it runs, after a header that says which
//! features were clustered, what the duration filter kept and how SPMD the structure is.

use std::fmt::Write as _;

use crate::{
    analysis::{
        tracking::{InstructionScaling, RunMatch, RunSignature},
        Analysis, ClusterStats, ClusteringMethod, DurationFilter, FeatureSelection, FeatureSet,
    },
    model::JobId,
    store::Job,
};

/// Code regions listed under each cluster.
const REGIONS_SHOWN: usize = 3;

/// A duration in a unit that keeps 3 significant digits: "850 ns", "12.5 µs", "3.31 ms", "1.20 s".
pub fn duration(ns: u64) -> String {
    let v = ns as f64;
    let (value, unit) = if ns < 1_000 {
        return format!("{ns} ns");
    } else if ns < 1_000_000 {
        (v / 1e3, "µs")
    } else if ns < 1_000_000_000 {
        (v / 1e6, "ms")
    } else {
        (v / 1e9, "s")
    };
    format!("{} {unit}", three_digits(value))
}

/// A count with an SI suffix and 3 significant digits: "950", "12.5k", "3.00M", "1.20G".
pub fn count(x: f64) -> String {
    let (value, suffix) = if x.abs() < 1e3 {
        return format!("{x:.0}");
    } else if x.abs() < 1e6 {
        (x / 1e3, "k")
    } else if x.abs() < 1e9 {
        (x / 1e6, "M")
    } else if x.abs() < 1e12 {
        (x / 1e9, "G")
    } else {
        (x / 1e12, "T")
    };
    format!("{}{suffix}", three_digits(value))
}

fn three_digits(v: f64) -> String {
    if v.abs() >= 99.95 {
        format!("{v:.0}")
    } else if v.abs() >= 9.995 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn percent(share: f64) -> String {
    format!("{:.1}%", 100.0 * share)
}

/// One line saying which features the clustering used, in words.
pub fn features_line(analysis: &Analysis) -> String {
    let f = &analysis.features;
    match (f.used, f.requested) {
        (FeatureSet::InstructionsIpc, _) => {
            "features: instructions (log) and IPC from hardware counters".to_string()
        }
        (FeatureSet::OnCpuTimePerRegion, FeatureSelection::Auto) => {
            "features: no hardware counters: duration per code region (log on-CPU time, \
             clustered within each start→end call-site pair)"
                .to_string()
        }
        (FeatureSet::OnCpuTimePerRegion, FeatureSelection::Fixed(_)) => {
            "features: duration per code region as configured (log on-CPU time, clustered \
             within each start→end call-site pair)"
                .to_string()
        }
    }
}

fn filter_line(analysis: &Analysis) -> String {
    let r = &analysis.filter;
    let how = match r.filter {
        DurationFilter::KeepTimeShare(share) if r.threshold_ns < r.criterion_threshold_ns => {
            format!(
                "keep {} of the time (at {}), lowered to the gap below: bursts ≥ {}",
                percent(share),
                duration(r.criterion_threshold_ns),
                duration(r.threshold_ns)
            )
        }
        DurationFilter::KeepTimeShare(share) => format!(
            "keep {} of the time: bursts ≥ {}",
            percent(share),
            duration(r.threshold_ns)
        ),
        DurationFilter::MinDurationNs(_) => format!("bursts ≥ {}", duration(r.threshold_ns)),
    };
    format!(
        "duration filter: {how}; {} of {} bursts analysed, {} of the burst time filtered out",
        r.bursts_kept,
        r.bursts_in,
        percent(r.time_filtered_share)
    )
}

fn clustering_line(analysis: &Analysis) -> String {
    let c = &analysis.clustering;
    let mut line = match analysis.params.clustering {
        ClusteringMethod::Acr { .. } => {
            let last = c
                .steps
                .last()
                .map(|s| format!(", last Eps {:.4}", s.eps))
                .unwrap_or_default();
            format!(
                "clustering: DBSCAN refined by ACR, {} step{}{last}, MinPoints {}",
                c.steps.len(),
                if c.steps.len() == 1 { "" } else { "s" },
                c.min_points
            )
        }
        ClusteringMethod::Dbscan { eps, .. } => {
            format!(
                "clustering: DBSCAN, Eps {eps:.4}, MinPoints {}",
                c.min_points
            )
        }
    };
    if !c.sequence_merges.is_empty() {
        let _ = write!(line, "; {} sequence merge(s)", c.sequence_merges.len());
    }
    if c.absorbed_by_column > 0 {
        let _ = write!(
            line,
            "; {} bursts joined a cluster by column majority",
            c.absorbed_by_column
        );
    }
    line
}

fn optional(value: Option<f64>, f: impl Fn(f64) -> String) -> String {
    value.map(f).unwrap_or_else(|| "-".to_string())
}

fn row(out: &mut String, label: &str, c: &ClusterStats) {
    let d = &c.duration;
    let _ = writeln!(
        out,
        "   {:>7} {:>7} {:>9.3} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>5} {:>6} {:>7} {:>5}",
        label,
        c.bursts,
        c.time_ns as f64 / 1e9,
        percent(c.time_share),
        duration(d.p10_ns),
        duration(d.p50_ns),
        duration(d.p90_ns),
        duration(d.p99_ns),
        optional(c.instructions_mean, count),
        optional(c.ipc, |v| format!("{v:.2}")),
        format!("{:.2}", c.lb_duration),
        optional(c.lb_instructions, |v| format!("{v:.2}")),
        format!("{:.2}", c.spmd_score),
    );
    let shown: Vec<String> = c
        .regions
        .iter()
        .take(REGIONS_SHOWN)
        .map(|r| format!("{}→{} ({})", r.start, r.end, r.bursts))
        .collect();
    let more = c.regions.len().saturating_sub(REGIONS_SHOWN);
    let _ = writeln!(
        out,
        "   {:>7} regions: {}{}",
        "",
        shown.join(", "),
        if more > 0 {
            format!(", +{more} more")
        } else {
            String::new()
        }
    );
}

/// The phase table of one job: a header (features, duration filter, clustering, global SPMD
/// score), one row per cluster followed by its most frequent code regions (`start→end (bursts)`),
/// and the noise.
///
/// Columns: bursts; total time in seconds and its share of the burst time given to the analysis
/// (filtered bursts included, so clusters, noise and filter add up to 100 %); burst duration
/// quantiles p10, p50, p90, p99; mean instructions per burst and IPC (Σ instructions ÷ Σ cycles)
/// when every burst of the cluster carries counters; load balance of time and of instructions
/// (mean over ranks ÷ max, absent ranks counting 0; see [`ClusterStats::lb_duration`]); the
/// cluster's sequence score.
pub fn render_phases(job_id: &JobId, analysis: &Analysis) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== phases of job {job_id}: {} cluster{} over {} rank{}, global SPMD score {:.3}",
        analysis.clusters.len(),
        if analysis.clusters.len() == 1 {
            ""
        } else {
            "s"
        },
        analysis.ranks,
        if analysis.ranks == 1 { "" } else { "s" },
        analysis.global_score
    );
    let _ = writeln!(out, "   {}", features_line(analysis));
    let _ = writeln!(out, "   {}", filter_line(analysis));
    let _ = writeln!(out, "   {}", clustering_line(analysis));
    if analysis.filter.bursts_kept == 0 {
        let _ = writeln!(
            out,
            "   no bursts passed the duration filter: nothing to cluster"
        );
        return out;
    }
    let _ = writeln!(
        out,
        "   {:>7} {:>7} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>5} {:>6} {:>7} {:>5}",
        "cluster",
        "bursts",
        "time s",
        "time",
        "p10",
        "p50",
        "p90",
        "p99",
        "instr",
        "IPC",
        "LB dur",
        "LB inst",
        "SPMD"
    );
    for c in &analysis.clusters {
        row(&mut out, &c.id.to_string(), c);
    }
    match &analysis.noise {
        Some(noise) => row(&mut out, "noise", noise),
        None => {
            let _ = writeln!(out, "   noise: none (every analysed burst is in a cluster)");
        }
    }
    out
}

/// The number of ranks a node-local phase analysis is over (m in
/// [`analyse`](crate::analysis::analyse)): the job's ranks this node saw, from their kernel totals
/// or their bursts. Not the job's world size: a node sees only its own ranks, and counting the
/// others as ranks without bursts would cut every load balance and SPMD score by the share of
/// ranks running elsewhere. A local rank without any analysed burst still counts, as it should.
pub fn node_ranks(job: &Job) -> u32 {
    job.ranks
        .keys()
        .copied()
        .chain(job.bursts.iter().map(|b| b.rank))
        .collect::<std::collections::BTreeSet<_>>()
        .len() as u32
}

/// What the kernel's own duration filter kept out of the recording, which the analysis above
/// never sees: `None` when it dropped nothing.
pub fn render_kernel_filter(job: &Job, min_burst_ns: u64) -> Option<String> {
    let t = job.totals();
    if t.filtered_bursts == 0 {
        return None;
    }
    let share = if t.burst_ns > 0 {
        t.filtered_ns as f64 / t.burst_ns as f64
    } else {
        0.0
    };
    Some(format!(
        "   kernel filter: {} bursts shorter than {} were only summed in kernel ({:.3} s, {} of \
         the computation time) and are not in this analysis",
        t.filtered_bursts,
        duration(min_burst_ns),
        t.filtered_ns as f64 / 1e9,
        percent(share)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{
        analyse,
        synthetic::{Phase, SyntheticJob},
        AnalysisParams,
    };

    fn job(counters: bool) -> SyntheticJob {
        SyntheticJob {
            ranks: 4,
            iterations: 20,
            phases: vec![
                Phase::new(1e6, 2.0, 0.03),
                Phase::new(5e6, 0.6, 0.03),
                Phase::new(2e7, 1.2, 0.03),
            ],
            tiny_bursts_per_phase: 2,
            outlier_share: 0.0,
            counters,
            seed: 7,
        }
    }

    fn table(counters: bool) -> (Analysis, String) {
        let bursts = job(counters).bursts();
        let analysis = analyse(&bursts, 4, &AnalysisParams::default()).unwrap();
        let text = render_phases(&JobId("pmix:42".into()), &analysis);
        (analysis, text)
    }

    #[test]
    fn formats_keep_three_digits() {
        assert_eq!(duration(850), "850 ns");
        assert_eq!(duration(12_500), "12.5 µs");
        assert_eq!(duration(3_310_000), "3.31 ms");
        assert_eq!(duration(123_400_000), "123 ms");
        assert_eq!(duration(1_200_000_000), "1.20 s");
        assert_eq!(count(950.0), "950");
        assert_eq!(count(2e7), "20.0M");
        assert_eq!(count(1.2e9), "1.20G");
    }

    #[test]
    fn table_with_counters_shows_every_cluster_ipc_and_regions() {
        let (analysis, text) = table(true);
        assert_eq!(analysis.clusters.len(), 3, "{text}");
        assert!(
            text.starts_with(
                "== phases of job pmix:42: 3 clusters over 4 ranks, global SPMD score 1.000"
            ),
            "{text}"
        );
        assert!(
            text.contains("features: instructions (log) and IPC from hardware counters"),
            "{text}"
        );
        assert!(
            text.contains("duration filter: keep 99.0% of the time"),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "{} of {} bursts analysed",
                analysis.filter.bursts_kept, analysis.filter.bursts_in
            )),
            "{text}"
        );
        assert!(text.contains("noise: none"), "{text}");
        let rows: Vec<&str> = text
            .lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .collect();
        assert_eq!(rows.len(), 3, "{text}");
        // Cluster 1 is the 2·10⁷-instruction phase at IPC 1.2, run by all 4 ranks alike.
        let one: Vec<&str> = rows[0].split_whitespace().collect();
        assert_eq!(one[0], "1");
        assert_eq!(one[1], "80", "20 iterations × 4 ranks: {text}");
        assert!(
            one.contains(&"20.0M") || one.contains(&"19.9M") || one.contains(&"20.1M"),
            "{text}"
        );
        assert!(
            one.contains(&"1.20") || one.contains(&"1.19") || one.contains(&"1.21"),
            "{text}"
        );
        assert_eq!(one.last(), Some(&"1.00"), "SPMD score: {text}");
        // Shares of clusters and filter add up to the whole.
        let shares: f64 = analysis.clusters.iter().map(|c| c.time_share).sum::<f64>()
            + analysis.filter.time_filtered_share;
        assert!((shares - 1.0).abs() < 1e-9);
        // Regions as start→end with the CallSite display.
        assert!(
            text.contains("regions: synthetic+0x2000→synthetic+0x2001 (80)"),
            "{text}"
        );
    }

    #[test]
    fn table_without_counters_says_so_and_leaves_counter_columns_empty() {
        let (analysis, text) = table(false);
        assert_eq!(analysis.features.used, FeatureSet::OnCpuTimePerRegion);
        assert!(
            text.contains("no hardware counters: duration per code region"),
            "{text}"
        );
        for row in text
            .lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
        {
            let cells: Vec<&str> = row.split_whitespace().collect();
            // instr, IPC and LB inst are "-".
            assert_eq!(cells.iter().filter(|c| **c == "-").count(), 3, "{row}");
        }
    }

    #[test]
    fn noise_row_and_empty_analysis() {
        let mut j = job(true);
        j.outlier_share = 0.05;
        let bursts = j.bursts();
        let analysis = analyse(&bursts, 4, &AnalysisParams::default()).unwrap();
        let text = render_phases(&JobId("j".into()), &analysis);
        if let Some(noise) = &analysis.noise {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with("noise "))
                .expect(&text);
            assert!(line.contains(&noise.bursts.to_string()), "{text}");
        }

        let empty = analyse(&[], 1, &AnalysisParams::default()).unwrap();
        let text = render_phases(&JobId("j".into()), &empty);
        assert!(text.contains("0 clusters over 1 rank,"), "{text}");
        assert!(text.contains("nothing to cluster"), "{text}");
    }

    fn job_bursts_one() -> crate::model::Burst {
        job(false).bursts().remove(0)
    }

    #[test]
    fn kernel_filter_line_and_node_ranks() {
        use crate::store::{JobMeta, RankRecord, RankTotals};
        let mut job = Job::new(JobMeta {
            id: JobId("j".into()),
            node: "n".into(),
            size: 64,
            source: "t".into(),
            executable: "x".into(),
            first_seen_ns: 0,
            ended_ns: None,
        });
        assert_eq!(render_kernel_filter(&job, 100_000), None);
        assert_eq!(node_ranks(&job), 0);
        let mut burst = job_bursts_one();
        burst.rank = 3;
        job.bursts.push_back(burst);
        job.ranks.insert(
            0,
            RankRecord {
                rank: 0,
                pid: 1,
                first_seen_ns: 0,
                ended_ns: None,
                totals: RankTotals {
                    bursts: 10,
                    burst_ns: 1_000_000_000,
                    filtered_bursts: 8,
                    filtered_ns: 20_000_000,
                    ..Default::default()
                },
                functions: Default::default(),
            },
        );
        assert_eq!(
            node_ranks(&job),
            2,
            "rank 0 from its totals, rank 3 from its burst, not the world size"
        );
        let line = render_kernel_filter(&job, 100_000).unwrap();
        assert!(
            line.contains("8 bursts shorter than 100 µs")
                && line.contains("2.0% of the computation"),
            "{line}"
        );
    }
}

/// The phase-for-phase comparison of two runs (`mpiburst compare`): which phase of the earlier
/// run became which of the later one, and how its duration, time share, instructions and IPC
/// changed.
pub fn render_run_match(a: &RunSignature, b: &RunSignature, m: &RunMatch) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== phases of {} ({} ranks) → {} ({} ranks){}",
        a.label,
        a.frame.ranks,
        b.label,
        b.frame.ranks,
        if m.same_application { "" } else { "; NOTE: different executables, matched on behaviour only" }
    );
    let _ = writeln!(
        out,
        "   coverage {:.0} %, call sites {}compared, instructions {}",
        100.0 * m.coverage,
        if m.call_sites_compared { "" } else { "not " },
        match m.scaling {
            InstructionScaling::None => "compared per burst",
            InstructionScaling::ByRanks => "scaled by ranks (strong scaling)",
        }
    );
    let _ = writeln!(
        out,
        "   {:>8} {:>8} {:<10} {:>12} {:>12} {:>9} {:>10} {:>9}",
        "before", "after", "match", "mean before", "mean after", "Δ mean", "Δ share", "Δ IPC"
    );
    let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join("+");
    for p in &m.phases {
        let t = &p.trend;
        let _ = writeln!(
            out,
            "   {:>8} {:>8} {:<10} {:>12} {:>12} {:>+8.1}% {:>+9.1}pp {:>9}",
            ids(&p.a),
            ids(&p.b),
            format!("{:?}", p.kind),
            duration(t.a.duration_mean_ns as u64),
            duration(t.b.duration_mean_ns as u64),
            100.0 * t.duration_mean_change,
            100.0 * t.time_share_change,
            t.ipc_change.map_or("-".to_string(), |c| format!("{:+.1}%", 100.0 * c)),
        );
    }
    if !m.unmatched_a.is_empty() || !m.unmatched_b.is_empty() {
        let _ = writeln!(
            out,
            "   only before: {}; only after: {}",
            if m.unmatched_a.is_empty() { "-".into() } else { ids(&m.unmatched_a) },
            if m.unmatched_b.is_empty() { "-".into() } else { ids(&m.unmatched_b) }
        );
    }
    out
}
