//! The phase table: what [`analyse`](crate::analysis::analyse) found in one job, as text. One row
//! per cluster (1 = most time), then the code regions it runs, after a header that says which
//! features were clustered, what the duration filter kept and how SPMD the structure is.

use std::fmt::Write as _;

use jiff::{civil::DateTime, tz::Offset, Timestamp};
use serde::Serialize;

use crate::{
    analysis::{
        online::{CumulativeView, OpenWindow, PhasesSnapshot, WindowView},
        tracking::{InstructionScaling, RunMatch, RunSignature, StableId},
        Analysis, ClusterStats, ClusteringMethod, ClusteringReport, DurationFilter, FeatureReport,
        FeatureSelection, FeatureSet, FilterReport,
    },
    export::signature::render_signature,
    model::JobId,
    store::Job,
    symbols::SiteNames,
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

/// "1 cluster", "3 clusters".
fn counted(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

/// One line saying which features the clustering used, in words.
pub fn features_line(f: &FeatureReport) -> String {
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

fn filter_line(r: &FilterReport) -> String {
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

/// The clustering line. `method` is `None` where it is not known: the daemon's snapshot reports
/// the steps its configured clustering took, not which method the configuration selects.
fn clustering_line(c: &ClusteringReport, method: Option<&ClusteringMethod>) -> String {
    let steps = || {
        let last = c
            .steps
            .last()
            .map(|s| format!(", last Eps {:.4}", s.eps))
            .unwrap_or_default();
        format!(
            "{}{last}, MinPoints {}",
            counted(c.steps.len(), "step"),
            c.min_points
        )
    };
    let mut line = match method {
        Some(ClusteringMethod::Acr { .. }) => {
            format!("clustering: DBSCAN refined by ACR, {}", steps())
        }
        Some(ClusteringMethod::Dbscan { eps, .. }) => {
            format!(
                "clustering: DBSCAN, Eps {eps:.4}, MinPoints {}",
                c.min_points
            )
        }
        None => format!(
            "clustering: as the daemon is configured (analysis.analysis.clustering), {}",
            steps()
        ),
    };
    if !c.sequence_merges.is_empty() {
        let _ = write!(line, "; {} sequence merge(s)", c.sequence_merges.len());
    }
    if c.same_region_joined > 0 {
        let _ = write!(
            line,
            "; {} joined their code region's phase: the same computation at another speed on other ranks or for a while",
            counted(c.same_region_joined, "cluster")
        );
    }
    if c.placed_by_context > 0 {
        let _ = write!(
            line,
            "; {} bursts joined the cluster whose place they take in their rank's sequence",
            c.placed_by_context
        );
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

fn row(out: &mut String, label: &str, c: &ClusterStats, names: &SiteNames) {
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
    let more = c.regions.len().saturating_sub(REGIONS_SHOWN);
    let width = c.regions.first().map_or(1, |r| r.bursts.to_string().len());
    for (i, r) in c.regions.iter().take(REGIONS_SHOWN).enumerate() {
        let _ = writeln!(
            out,
            "   {:>7} {} {:>width$} × {}{}",
            "",
            if i == 0 { "regions:" } else { "       +" },
            r.bursts,
            names.region(&r.start, &r.end),
            if more > 0 && i + 1 == REGIONS_SHOWN {
                format!(" (+{more} more regions)")
            } else {
                String::new()
            }
        );
    }
}

/// How the bursts of a table were clustered: the facts its header states. A one-shot analysis,
/// a window of the daemon's online analysis and its cumulative sample all report them.
struct Basis<'a> {
    features: &'a FeatureReport,
    filter: &'a FilterReport,
    /// `None` for the cumulative sample, whose snapshot does not report its clustering steps.
    clustering: Option<(&'a ClusteringReport, Option<&'a ClusteringMethod>)>,
}

/// The body of a phase table under its title line: the header facts, one row per cluster (its
/// label under `key`, then its most frequent code regions), and the noise.
fn table(
    out: &mut String,
    basis: &Basis,
    key: &str,
    rows: &[(String, &ClusterStats)],
    noise: Option<&ClusterStats>,
    names: &SiteNames,
) {
    let _ = writeln!(out, "   {}", features_line(basis.features));
    let _ = writeln!(out, "   {}", filter_line(basis.filter));
    if let Some((report, method)) = basis.clustering {
        let _ = writeln!(out, "   {}", clustering_line(report, method));
    }
    if basis.filter.bursts_kept == 0 {
        let _ = writeln!(
            out,
            "   no bursts passed the duration filter: nothing to cluster"
        );
        return;
    }
    let _ = writeln!(
        out,
        "   {:>7} {:>7} {:>9} {:>6} {:>9} {:>9} {:>9} {:>9} {:>7} {:>5} {:>6} {:>7} {:>5}",
        key,
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
    for (label, c) in rows {
        row(out, label, c, names);
    }
    match noise {
        Some(noise) => row(out, "noise", noise, names),
        None => {
            let _ = writeln!(out, "   noise: none (every analysed burst is in a {key})");
        }
    }
}

/// The phase table of one job: a header (features, duration filter, clustering, global SPMD
/// score), one row per cluster followed by its most frequent code regions (`bursts × start → end`,
/// named by `names`; the first, the region with most bursts, names the cluster), and the noise.
///
/// Columns: bursts; total time in seconds and its share of the burst time given to the analysis
/// (filtered bursts included, so clusters, noise and filter add up to 100 %); burst duration
/// quantiles p10, p50, p90, p99; mean instructions per burst and IPC (Σ instructions ÷ Σ cycles)
/// when every burst of the cluster carries counters; load balance of time and of instructions
/// (mean over ranks ÷ max, absent ranks counting 0; see [`ClusterStats::lb_duration`]); the
/// cluster's sequence score.
pub fn render_phases(job_id: &JobId, analysis: &Analysis, names: &SiteNames) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== phases of job {job_id}: {} over {}, global SPMD score {:.3}",
        counted(analysis.clusters.len(), "cluster"),
        counted(analysis.ranks as usize, "rank"),
        analysis.global_score
    );
    let basis = Basis {
        features: &analysis.features,
        filter: &analysis.filter,
        clustering: Some((&analysis.clustering, Some(&analysis.params.clustering))),
    };
    let rows: Vec<(String, &ClusterStats)> = analysis
        .clusters
        .iter()
        .map(|c| (c.id.to_string(), c))
        .collect();
    table(
        &mut out,
        &basis,
        "cluster",
        &rows,
        analysis.noise.as_ref(),
        names,
    );
    out
}

/// Unix nanoseconds as a date and time of day in UTC.
fn civil(ns: u64) -> DateTime {
    let timestamp = Timestamp::from_nanosecond(i128::from(ns))
        .expect("u64 nanoseconds end in 2554, within jiff's range");
    Offset::UTC.to_datetime(timestamp)
}

/// Unix nanoseconds as `YYYY-MM-DD HH:MM:SS` in UTC, with milliseconds when not a whole second.
pub fn utc(ns: u64) -> String {
    format!("{} {}", civil(ns).date(), clock(ns))
}

/// The time of day of Unix nanoseconds, `HH:MM:SS` UTC, with milliseconds when not a whole
/// second.
fn clock(ns: u64) -> String {
    let format = if ns.is_multiple_of(1_000_000_000) {
        "%H:%M:%S"
    } else {
        "%H:%M:%S%.3f"
    };
    civil(ns).strftime(format).to_string()
}

/// A stretch of Unix time: `2026-11-22 12:20:00–12:20:30 UTC` (the date repeated when the end
/// falls on another day).
pub fn utc_span(start_ns: u64, end_ns: u64) -> String {
    let end = if civil(start_ns).date() == civil(end_ns).date() {
        clock(end_ns)
    } else {
        utc(end_ns)
    };
    format!("{}–{end} UTC", utc(start_ns))
}

/// A wait or an age, rounded for reading: "under a second", "12 s", "14 min", "3.5 h".
fn roughly(ns: u64) -> String {
    let s = (ns as f64 / 1e9).round();
    if ns < 1_000_000_000 {
        "under a second".to_string()
    } else if s < 100.0 {
        format!("{s} s")
    } else if s < 6000.0 {
        format!("{} min", (s / 60.0).round())
    } else {
        format!("{:.1} h", s / 3600.0)
    }
}

fn ids(ids: &[StableId]) -> String {
    ids.iter()
        .map(StableId::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The window of the daemon's online analysis that is open at `now_ns`: as the snapshot says,
/// or, before the daemon's first tick, the window of that time, empty.
pub fn current_window(s: &PhasesSnapshot, now_ns: u64) -> OpenWindow {
    s.open_window.unwrap_or_else(|| {
        let window = now_ns / s.window_ns;
        OpenWindow {
            window,
            start_ns: window * s.window_ns,
            end_ns: (window + 1) * s.window_ns,
            bursts_seen: 0,
            bursts_held: 0,
        }
    })
}

/// The active phases of the daemon's tracking: live and not dormant.
pub fn active_phases(s: &PhasesSnapshot) -> Vec<StableId> {
    s.live_ids
        .iter()
        .copied()
        .filter(|id| !s.dormant_ids.contains(id))
        .collect()
}

/// The daemon's online phase analysis of one job (its `/api/jobs/{id}/phases` snapshot), as
/// `mpiburst report http://…` prints it at `now_ns`: the table of the last clustered window,
/// keyed by stable phase ids (the same phase keeps its id from window to window), how the phases
/// were tracked, then the table of the cumulative sample of the whole job. Before the first window
/// is clustered, when that will be.
pub fn render_live_phases(
    job_id: &JobId,
    s: &PhasesSnapshot,
    now_ns: u64,
    names: &SiteNames,
) -> String {
    let mut out = String::new();
    let current = current_window(s, now_ns);
    match &s.last_window {
        None => no_window_yet(&mut out, job_id, s, &current, now_ns),
        Some(w) => {
            last_window(&mut out, job_id, s, w, now_ns, names);
            tracking_line(&mut out, s);
            if current.window > w.window && current.bursts_seen > 0 {
                current_window_line(&mut out, &current, now_ns, false);
            }
        }
    }
    if let Some(e) = &s.last_error {
        let _ = writeln!(out, "   last analysis error: {e}");
    }
    if let Some(c) = &s.cumulative {
        whole_job(&mut out, s, c, names);
    }
    if let Some(live) = &s.signature {
        let _ = writeln!(
            out,
            "== the job's signature up to {} UTC: every rank's repetitions of each code region, \
             the phases of the last clustered window",
            utc(live.up_to_ns)
        );
        out.push_str(&render_signature(&live.signature, names));
    }
    out
}

/// The line on the window still open at `now_ns`; `first` when no window was clustered yet.
fn current_window_line(out: &mut String, current: &OpenWindow, now_ns: u64, first: bool) {
    let _ = writeln!(
        out,
        "   {} current window, {}, holds {} so far; {}",
        if first {
            "windows are aligned to Unix time; the"
        } else {
            "the"
        },
        utc_span(current.start_ns, current.end_ns),
        counted(current.bursts_seen as usize, "burst"),
        match current.end_ns.checked_sub(now_ns).filter(|&wait| wait > 0) {
            Some(wait) => format!(
                "it is clustered a few seconds after it ends, in {}",
                roughly(wait)
            ),
            None =>
                "it has ended and is clustered within seconds (analysis.lateness_s)".to_string(),
        }
    );
}

/// Before the first window is clustered: when that will be.
fn no_window_yet(
    out: &mut String,
    job_id: &JobId,
    s: &PhasesSnapshot,
    current: &OpenWindow,
    now_ns: u64,
) {
    let window_s = s.window_ns as f64 / 1e9;
    let _ = writeln!(
        out,
        "== phases of job {job_id}: no window clustered yet ({window_s} s windows)"
    );
    current_window_line(out, current, now_ns, true);
    if s.totals.windows_carried > 0 {
        let _ = writeln!(
            out,
            "   {} held too few bursts to be clustered alone (analysis.min_window_bursts); \
             their bursts go to the next window",
            counted(s.totals.windows_carried as usize, "earlier window")
        );
    }
}

/// The table of the last clustered window, keyed by stable phase ids.
fn last_window(
    out: &mut String,
    job_id: &JobId,
    s: &PhasesSnapshot,
    w: &WindowView,
    now_ns: u64,
    names: &SiteNames,
) {
    let window_s = s.window_ns as f64 / 1e9;
    let state = if w.partial {
        "clustered early, while it was open".to_string()
    } else if w.end_ns <= now_ns {
        format!("ended {} ago", roughly(now_ns - w.end_ns))
    } else {
        "closed early".to_string()
    };
    let _ = writeln!(
        out,
        "== phases of job {job_id} in the last clustered window, {} ({window_s} s, {state}): {} over {}, SPMD score {:.3}",
        utc_span(w.start_ns, w.end_ns),
        counted(w.phases.len(), "phase"),
        counted(s.ranks as usize, "rank"),
        w.spmd_score
    );
    if w.bursts_dropped > 0 {
        let _ = writeln!(
            out,
            "   the window held {} bursts; a sample of {} of them, spread over its time and \
             ranks, was clustered (analysis.max_window_bursts)",
            w.bursts_seen, w.bursts_analysed
        );
    }
    let basis = Basis {
        features: &w.features,
        filter: &w.filter,
        clustering: Some((&w.clustering, None)),
    };
    let rows: Vec<(String, &ClusterStats)> = w
        .phases
        .iter()
        .map(|p| (p.id.to_string(), &p.stats))
        .collect();
    table(out, &basis, "phase", &rows, w.noise.as_ref(), names);
}

/// How the phases were tracked: the active and dormant ids, and the events so far.
fn tracking_line(out: &mut String, s: &PhasesSnapshot) {
    let c = &s.event_counts;
    let events: Vec<String> = [
        (c.appear, "appear"),
        (c.split, "split"),
        (c.merge, "merge"),
        (c.moved, "moved"),
        (c.vanish, "vanish"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, kind)| format!("{n} {kind}"))
    .collect();
    let active = active_phases(s);
    let _ = writeln!(
        out,
        "   tracking: phases {} active{}; events since the job started: {}",
        ids(&active),
        if s.dormant_ids.is_empty() {
            String::new()
        } else {
            format!(
                ", {} dormant (not seen lately or merged; may come back)",
                ids(&s.dormant_ids)
            )
        },
        if events.is_empty() {
            "none".to_string()
        } else {
            events.join(", ")
        }
    );
}

/// The table of the cumulative sample of the whole job.
fn whole_job(out: &mut String, s: &PhasesSnapshot, c: &CumulativeView, names: &SiteNames) {
    let _ = writeln!(
        out,
        "== whole job so far: {} in a sample of {} from {}{}, SPMD score {:.3}",
        counted(c.clusters.len(), "cluster"),
        counted(c.windows_sampled, "window"),
        utc_span(
            c.first_window * s.window_ns,
            (c.last_window + 1) * s.window_ns
        ),
        if c.stride > 1 {
            format!(" (one window in {})", c.stride)
        } else {
            String::new()
        },
        c.spmd_score
    );
    let _ = writeln!(
        out,
        "   statistics of the {} sampled bursts, not job totals; each row is keyed by the window \
         phase holding most of its time{}",
        c.bursts_analysed,
        if c.clusters.iter().any(|k| k.part > 0) {
            " (phase.N: another behaviour of that phase)"
        } else {
            ""
        }
    );
    if c.clusters.iter().any(|k| k.phase == 0) {
        let _ = writeln!(out, "   phase 0: bursts that were noise in their windows");
    }
    let basis = Basis {
        features: &c.features,
        filter: &c.filter,
        clustering: None,
    };
    let rows: Vec<(String, &ClusterStats)> = c
        .clusters
        .iter()
        .map(|k| {
            let label = if k.part == 0 {
                k.phase.to_string()
            } else {
                format!("{}.{}", k.phase, k.part)
            };
            (label, &k.stats)
        })
        .collect();
    table(out, &basis, "phase", &rows, c.noise.as_ref(), names);
}

/// What the kernel's own duration filter kept out of the recording or the daemon, which the
/// phase analysis never sees.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct KernelFilter {
    /// The filter's threshold where known (a recording's header has it, the daemon's API does
    /// not).
    pub min_burst_ns: Option<u64>,
    /// Bursts shorter than the threshold, only summed in kernel.
    pub filtered_bursts: u64,
    pub filtered_ns: u64,
    /// `filtered_ns` over the wall time of all bursts (0 without burst time).
    pub computation_share: f64,
}

impl KernelFilter {
    /// `None` when the filter dropped nothing.
    pub fn of(job: &Job, min_burst_ns: Option<u64>) -> Option<KernelFilter> {
        let t = job.totals();
        (t.filtered_bursts > 0).then(|| KernelFilter {
            min_burst_ns,
            filtered_bursts: t.filtered_bursts,
            filtered_ns: t.filtered_ns,
            computation_share: if t.burst_ns > 0 {
                t.filtered_ns as f64 / t.burst_ns as f64
            } else {
                0.0
            },
        })
    }

    /// The line that says it.
    pub fn text(&self) -> String {
        format!(
            "   kernel filter: {} bursts shorter than {} were only summed in kernel ({:.3} s, {} of \
             the computation time) and are not in this analysis\n",
            self.filtered_bursts,
            self.min_burst_ns
                .map_or_else(|| "the daemon's capture.min_burst_us".to_string(), duration),
            self.filtered_ns as f64 / 1e9,
            percent(self.computation_share)
        )
    }
}

/// The line saying what the kernel's own duration filter kept out of the recording or the
/// daemon (see [`KernelFilter`]): empty when it dropped nothing.
pub fn render_kernel_filter(job: &Job, min_burst_ns: Option<u64>) -> String {
    KernelFilter::of(job, min_burst_ns).map_or_else(String::new, |f| f.text())
}

/// The name of a phase of a run: its code region with most bursts, named by `names`.
fn phase_name(s: &RunSignature, ids: &[u32], names: &SiteNames) -> Option<String> {
    let cluster = ids
        .iter()
        .find_map(|&id| s.frame.clusters.iter().find(|c| c.id == id))?;
    let r = cluster.regions.first()?;
    Some(names.region(&r.start, &r.end))
}

/// The phase-for-phase comparison of two runs (`mpiburst compare`): which phase of the earlier
/// run became which of the later one, how its duration, time share, instructions and IPC
/// changed, and the phase's name (its main code region, in the earlier run if it ran there).
pub fn render_run_match(
    a: &RunSignature,
    b: &RunSignature,
    m: &RunMatch,
    names: &SiteNames,
) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "== phases of {} ({} ranks) → {} ({} ranks){}",
        a.label,
        a.frame.ranks,
        b.label,
        b.frame.ranks,
        if m.same_application {
            ""
        } else {
            "; NOTE: different executables, matched on behaviour only"
        }
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
        "   {:>8} {:>8} {:<10} {:>12} {:>12} {:>9} {:>10} {:>9}  main code region",
        "before", "after", "match", "mean before", "mean after", "Δ mean", "Δ share", "Δ IPC"
    );
    let ids = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join("+");
    for p in &m.phases {
        let t = &p.trend;
        let _ = writeln!(
            out,
            "   {:>8} {:>8} {:<10} {:>12} {:>12} {:>+8.1}% {:>+9.1}pp {:>9}  {}",
            ids(&p.a),
            ids(&p.b),
            format!("{:?}", p.kind),
            duration(t.a.duration_mean_ns as u64),
            duration(t.b.duration_mean_ns as u64),
            100.0 * t.duration_mean_change,
            100.0 * t.time_share_change,
            t.ipc_change
                .map_or("-".to_string(), |c| format!("{:+.1}%", 100.0 * c)),
            phase_name(a, &p.a, names)
                .or_else(|| phase_name(b, &p.b, names))
                .unwrap_or_else(|| "-".to_string()),
        );
    }
    if !m.unmatched_a.is_empty() || !m.unmatched_b.is_empty() {
        let _ = writeln!(
            out,
            "   only before: {}; only after: {}",
            if m.unmatched_a.is_empty() {
                "-".into()
            } else {
                ids(&m.unmatched_a)
            },
            if m.unmatched_b.is_empty() {
                "-".into()
            } else {
                ids(&m.unmatched_b)
            }
        );
    }
    out
}

/// The snapshot a daemon would serve for [`SyntheticJob::three_phases`] on 4 ranks (10 ms per
/// iteration, hardware counters), which started at 2023-11-14 22:13:20 UTC, with 1 s windows, as
/// read back from its JSON, after the daemon's last tick at `now_ns`. 250 iterations fill windows
/// 0 and 1 and part of 2.
///
/// [`SyntheticJob::three_phases`]: crate::analysis::synthetic::SyntheticJob::three_phases
#[cfg(test)]
pub(crate) fn synthetic_snapshot(iterations: u32, now_ns: u64) -> PhasesSnapshot {
    use crate::analysis::{
        online::{JobPhases, OnlineParams},
        synthetic::SyntheticJob,
    };
    let bursts = SyntheticJob::three_phases(4, iterations, true).bursts();
    let params = OnlineParams {
        window_s: 1.0,
        lateness_s: 0.0,
        ..OnlineParams::default()
    };
    let mut online = JobPhases::new(4, params).unwrap();
    for b in bursts.iter().filter(|b| b.start_ns < now_ns) {
        online.push(b);
    }
    online.tick(now_ns);
    serde_json::from_str(&serde_json::to_string(&online.snapshot()).unwrap()).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{analyse, synthetic::SyntheticJob, AnalysisParams};

    /// Start of the synthetic jobs: 2023-11-14 22:13:20 UTC.
    const T0: u64 = 1_700_000_000_000_000_000;

    /// The table rows (lines that start with a label, not the regions under them).
    fn rows(text: &str) -> Vec<Vec<&str>> {
        text.lines()
            .filter(|l| {
                l.trim_start().starts_with(char::is_numeric) || l.trim_start().starts_with("noise ")
            })
            .map(|l| l.split_whitespace().collect())
            .collect()
    }

    #[test]
    fn utc_times() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(T0), "2023-11-14 22:13:20");
        assert_eq!(utc(T0 + 500_000_000), "2023-11-14 22:13:20.500");
        assert_eq!(
            utc(T0 + 1),
            "2023-11-14 22:13:20.000",
            "milliseconds truncated"
        );
        assert_eq!(
            utc(1_709_164_800_000_000_000),
            "2024-02-29 00:00:00",
            "leap day"
        );
        assert_eq!(utc(1_735_689_599_000_000_000), "2024-12-31 23:59:59");
        assert_eq!(
            utc_span(T0, T0 + 30_000_000_000),
            "2023-11-14 22:13:20–22:13:50 UTC"
        );
        assert_eq!(
            utc_span(1_735_689_570_000_000_000, 1_735_689_600_000_000_000),
            "2024-12-31 23:59:30–2025-01-01 00:00:00 UTC"
        );
        assert_eq!(roughly(400_000_000), "under a second");
        assert_eq!(roughly(4_400_000_000), "4 s");
        assert_eq!(roughly(840_000_000_000), "14 min");
        assert_eq!(roughly(12_600_000_000_000), "3.5 h");
    }

    #[test]
    fn live_table_names_its_window_and_keys_phases_by_stable_id() {
        let now = T0 + 2_400_000_000;
        let snapshot = synthetic_snapshot(250, now);
        let text = render_live_phases(
            &JobId("pmix:42".into()),
            &snapshot,
            now,
            &SiteNames::default(),
        );
        let window = snapshot
            .last_window
            .as_ref()
            .expect("windows 0 and 1 closed");
        assert_eq!(window.window, T0 / 1_000_000_000 + 1, "{text}");
        assert!(
            text.starts_with(
                "== phases of job pmix:42 in the last clustered window, 2023-11-14 22:13:21–22:13:22 UTC (1 s, \
                 ended under a second ago): 3 phases over 4 ranks, SPMD score 1.000\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("features: instructions (log) and IPC from hardware counters"),
            "{text}"
        );
        assert!(
            text.contains("clustering: as the daemon is configured"),
            "{text}"
        );
        assert!(text.contains("\n     phase  bursts    time s"), "{text}");
        assert!(
            text.contains(
                "tracking: phases 1, 2, 3 active; events since the job started: 3 appear"
            ),
            "{text}"
        );
        assert!(
            text.contains("the current window, 2023-11-14 22:13:22–22:13:23 UTC, holds ")
                && text.contains(
                    "so far; it is clustered a few seconds after it ends, in under a second\n"
                ),
            "{text}"
        );
        let (window_part, whole) = text
            .split_once("== whole job so far: ")
            .expect("cumulative view");
        assert!(whole.starts_with("3 clusters in a sample of 2 windows from 2023-11-14 22:13:20–22:13:22 UTC, SPMD score 1.000"), "{text}");
        // Rows by stable id, with the window's statistics: 1 s of 10 ms iterations on 4 ranks.
        let ids: Vec<&str> = rows(window_part).iter().map(|r| r[0]).collect();
        assert_eq!(ids, ["1", "2", "3"], "{text}");
        for (row, phase) in rows(window_part).iter().zip(&window.phases) {
            assert_eq!(row[1], phase.stats.bursts.to_string(), "{text}");
            assert!(
                (350..=400).contains(&phase.stats.bursts),
                "about 97 iterations × 4 ranks: {text}"
            );
        }
        let (whole, signature) = whole
            .split_once("== the job's signature up to 2023-11-14 22:13:22 UTC: ")
            .expect("the signature up to the last window's end");
        let (_, whole_table) = whole.split_once('\n').unwrap();
        assert_eq!(rows(whole_table).len(), 3, "{text}");
        // 3 phases, each run once per 10 ms iteration of the job's first 2 s.
        let s = &snapshot.signature.as_ref().unwrap().signature;
        assert_eq!((s.ranks, s.phases.len()), (4, 3), "{text}");
        assert!(
            s.phases.iter().all(|p| (190.0..=200.0).contains(&p.weight)),
            "{text}"
        );
        assert!(
            signature.contains("signature: PAET = Σ PET × W = "),
            "{text}"
        );
    }

    #[test]
    fn before_the_first_window_closes_the_live_table_says_when() {
        let now = T0 + 400_000_000;
        let snapshot = synthetic_snapshot(250, now);
        let text = render_live_phases(&JobId("j".into()), &snapshot, now, &SiteNames::default());
        assert_eq!(
            text,
            format!(
                "== phases of job j: no window clustered yet (1 s windows)\n   windows are aligned to \
                 Unix time; the current window, 2023-11-14 22:13:20–22:13:21 UTC, holds {} bursts so \
                 far; it is clustered a few seconds after it ends, in under a second\n",
                snapshot.open_window.unwrap().bursts_seen
            )
        );
        // Before the daemon's first tick, the window is the one of the time asked about.
        let mut untouched = snapshot.clone();
        untouched.open_window = None;
        let text = render_live_phases(
            &JobId("j".into()),
            &untouched,
            T0 + 65_000_000_000,
            &SiteNames::default(),
        );
        assert!(
            text.contains("the current window, 2023-11-14 22:14:25–22:14:26 UTC, holds 0 bursts"),
            "{text}"
        );
    }

    /// The job of the one-shot tables: 20 iterations on 4 ranks.
    fn job(counters: bool) -> SyntheticJob {
        SyntheticJob::three_phases(4, 20, counters)
    }

    fn table(counters: bool) -> (Analysis, String) {
        let bursts = job(counters).bursts();
        let analysis = analyse(&bursts, 4, &AnalysisParams::default()).unwrap();
        let text = render_phases(&JobId("pmix:42".into()), &analysis, &SiteNames::default());
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
        // Regions as start → end, by burst count; these sites have no binary to name them.
        assert!(
            text.contains("regions: 80 × synthetic+0x2000 → synthetic+0x2001 (unresolved)\n"),
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
        let text = render_phases(&JobId("j".into()), &analysis, &SiteNames::default());
        if let Some(noise) = &analysis.noise {
            let line = text
                .lines()
                .find(|l| l.trim_start().starts_with("noise "))
                .expect(&text);
            assert!(line.contains(&noise.bursts.to_string()), "{text}");
        }

        let empty = analyse(&[], 1, &AnalysisParams::default()).unwrap();
        let text = render_phases(&JobId("j".into()), &empty, &SiteNames::default());
        assert!(text.contains("0 clusters over 1 rank,"), "{text}");
        assert!(text.contains("nothing to cluster"), "{text}");
    }

    fn job_bursts_one() -> crate::model::Burst {
        job(false).bursts().remove(0)
    }

    #[test]
    fn kernel_filter_line_and_node_ranks() {
        use crate::{
            store::{RankRecord, RankTotals},
            test_support::JobMetaBuilder,
        };
        let mut job = Job::new(JobMetaBuilder::new("j").size(64).build());
        assert_eq!(render_kernel_filter(&job, Some(100_000)), "");
        assert_eq!(job.node_ranks(), 0);
        let mut burst = job_bursts_one();
        burst.rank = 3;
        job.bursts.push_back(burst);
        job.ranks.insert(
            0,
            RankRecord {
                call_sites: Vec::new(),
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
                region: Default::default(),
                probe_cost: None,
            },
        );
        assert_eq!(
            job.node_ranks(),
            2,
            "rank 0 from its totals, rank 3 from its burst, not the world size"
        );
        let line = render_kernel_filter(&job, Some(100_000));
        assert!(
            line.contains("8 bursts shorter than 100 µs")
                && line.contains("2.0% of the computation"),
            "{line}"
        );
    }
}
