//! The cluster scatter plot: every analysed burst as a dot coloured by its cluster, in the space it
//! was clustered in.

use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    plot::{
        cluster_colour, cluster_legend, escape, legend, log_scale, nice_step, paint_attr, shorten,
        tick_label, x_axis, y_axis, Scale, FONT, WIDTH,
    },
    HtmlOptions,
};
use crate::{
    analysis::{Analysis, ClusterId, FeatureSet, NOISE},
    export::phases::{count, duration},
    model::{Burst, CallSite},
    symbols::SiteNames,
};

/// Smallest subsample of a cluster in the scatter plot (all of it when it has fewer bursts).
pub const MIN_POINTS_PER_CLUSTER: usize = 100;

/// Evenly spaced subsample of each group (see [`HtmlOptions::max_points`]).
fn subsample(groups: &mut BTreeMap<ClusterId, Vec<usize>>, limit: usize) {
    let total: usize = groups.values().map(Vec::len).sum();
    if total <= limit {
        return;
    }
    for members in groups.values_mut() {
        let n = members.len();
        let quota = (n * limit / total).max(n.min(MIN_POINTS_PER_CLUSTER));
        if quota < n {
            *members = (0..quota).map(|j| members[j * n / quota]).collect();
        }
    }
}

/// Deterministic vertical jitter in [-0.5, 0.5) for dot `i` in a categorical row.
fn jitter(i: usize) -> f64 {
    let mut z = (i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 - 0.5
}

/// Characters of a code region's name on the scatter plot's axis.
const AXIS_REGION_CHARS: usize = 64;

/// Regions shown as their own row in the scatter plot without counters; the rest share one.
const MAX_REGION_ROWS: usize = 40;

/// The top margin of the scatter plot.
const TOP: f64 = 12.0;

/// Zeros of the x value (a burst that never ran on a CPU as far as the kernel saw) have no place
/// on a log axis; they get their own column at 0, left of an axis break this many pixels wide.
const ZERO_GAP: f64 = 36.0;

/// The cluster scatter plot and a caption for it.
pub(super) fn scatter(
    bursts: &[Burst],
    analysis: &Analysis,
    options: &HtmlOptions,
    names: &SiteNames,
) -> (String, String) {
    let mut groups = groups_by_cluster(bursts, analysis);
    let analysed: usize = groups.values().map(Vec::len).sum();
    subsample(&mut groups, options.max_points);
    let plotted: usize = groups.values().map(Vec::len).sum();
    let tooltips = plotted <= options.max_tooltips;
    let counters = analysis.features.used == FeatureSet::InstructionsIpc;

    // The x value of a burst: instructions, or on-CPU time without counters.
    let x_value = |i: usize| -> f64 {
        if counters {
            bursts[i].counters.map_or(0.0, |c| c.instructions as f64)
        } else {
            bursts[i].oncpu_ns as f64
        }
    };
    let zeros = groups
        .values()
        .flatten()
        .filter(|&&i| x_value(i) <= 0.0)
        .count();
    let gap = if zeros > 0 { ZERO_GAP } else { 0.0 };
    let y_axis = if counters {
        ipc_axis(bursts, &groups)
    } else {
        region_axis(bursts, analysis, &groups, names)
    };
    let (left, plot_h) = (y_axis.left, y_axis.plot_h);
    let x_scale = log_scale(
        groups.values().flatten().map(|&i| x_value(i)),
        left + gap,
        WIDTH - 20.0,
    );
    let zero_x = left + ZERO_GAP * 0.4;
    let x_of = |i: usize| {
        let v = x_value(i);
        if v > 0.0 {
            x_scale.at(v)
        } else {
            zero_x
        }
    };

    let legend_items = cluster_legend(
        "cluster",
        analysis.clusters.iter(),
        analysis.noise.as_ref(),
        names,
    );
    let legend_y = TOP + plot_h + 50.0;
    let mut body = String::new();
    let legend_h = legend(&mut body, &legend_items, left, legend_y);
    let height = legend_y + legend_h + 6.0;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="scatter" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" {FONT}>"#
    );
    let _ = writeln!(
        svg,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{height:.0}" fill="white"/>"#
    );
    svg.push_str(&y_axis.svg);
    if counters {
        x_axis(
            &mut svg,
            &x_scale,
            TOP + plot_h,
            |v| tick_label(count(v)),
            "instructions per burst (log scale)",
        );
    } else {
        x_axis(
            &mut svg,
            &x_scale,
            TOP + plot_h,
            |v| tick_label(duration(v.round() as u64)),
            "on-CPU time per burst (log scale; the clustered feature)",
        );
    }
    if zeros > 0 {
        zero_axis_break(&mut svg, left, zero_x, TOP + plot_h);
    }
    let dots = Dots {
        bursts,
        names,
        tooltips,
        x_of: &x_of,
        y_of: &*y_axis.y_of,
    };
    dots.draw(&mut svg, &groups);
    svg.push_str(&body);
    let _ = writeln!(svg, "</svg>");
    let caption = caption(analysis, counters, zeros, plotted, analysed);
    (svg, caption)
}

/// The analysed bursts (by index) of each cluster, in rank and time order.
fn groups_by_cluster(bursts: &[Burst], analysis: &Analysis) -> BTreeMap<ClusterId, Vec<usize>> {
    let mut groups: BTreeMap<ClusterId, Vec<usize>> = BTreeMap::new();
    for (i, label) in analysis.labels.iter().enumerate() {
        if let Some(id) = label {
            groups.entry(*id).or_default().push(i);
        }
    }
    for members in groups.values_mut() {
        members.sort_by_key(|&i| (bursts[i].rank, bursts[i].start_ns, i));
    }
    groups
}

/// The y axis of the scatter plot: where the plot area starts on the left, its height, the
/// axis's SVG and the y pixel of each burst.
struct YAxis<'a> {
    left: f64,
    plot_h: f64,
    svg: String,
    y_of: Box<dyn Fn(usize) -> f64 + 'a>,
}

/// With counters: IPC on a linear axis.
fn ipc_axis<'a>(bursts: &'a [Burst], groups: &BTreeMap<ClusterId, Vec<usize>>) -> YAxis<'a> {
    let (left, plot_h) = (80.0, 440.0);
    let ipc = |i: usize| {
        bursts[i]
            .counters
            .map_or(0.0, |c| c.instructions as f64 / c.cycles.max(1) as f64)
    };
    let max_ipc = groups
        .values()
        .flatten()
        .map(|&i| ipc(i))
        .fold(0.0, f64::max);
    let step = nice_step(max_ipc.max(0.1) * 1.05 / 6.0);
    let y_scale = Scale {
        lo: 0.0,
        hi: (max_ipc.max(0.1) * 1.05 / step).ceil() * step,
        px_lo: TOP + plot_h,
        px_hi: TOP,
        log: false,
    };
    let mut svg = String::new();
    y_axis(
        &mut svg,
        &y_scale,
        left,
        WIDTH - 20.0,
        |v| format!("{}", (v * 1e6).round() / 1e6),
        "IPC (instructions per cycle)",
    );
    YAxis {
        left,
        plot_h,
        svg,
        y_of: Box::new(move |i| y_scale.at(ipc(i))),
    }
}

/// Without counters: one row per code region by decreasing analysed time (the ones beyond
/// [`MAX_REGION_ROWS`] share the last row), bursts jittered within their row.
fn region_axis<'a>(
    bursts: &'a [Burst],
    analysis: &Analysis,
    groups: &BTreeMap<ClusterId, Vec<usize>>,
    names: &SiteNames,
) -> YAxis<'a> {
    let mut time: BTreeMap<(&CallSite, &CallSite), u64> = BTreeMap::new();
    for (i, label) in analysis.labels.iter().enumerate() {
        if label.is_some() {
            *time.entry(bursts[i].region()).or_default() += bursts[i].duration_ns;
        }
    }
    let mut regions: Vec<_> = time.into_iter().collect();
    regions.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let mut labels: Vec<String> = regions
        .iter()
        .take(MAX_REGION_ROWS)
        .map(|((s, e), _)| shorten(&names.region(s, e), AXIS_REGION_CHARS))
        .collect();
    if regions.len() > MAX_REGION_ROWS {
        labels.push(format!("{} other regions", regions.len() - MAX_REGION_ROWS));
    }
    let row_of: BTreeMap<(&CallSite, &CallSite), usize> = regions
        .iter()
        .enumerate()
        .map(|(row, (r, _))| (*r, row.min(MAX_REGION_ROWS)))
        .collect();
    let rows = labels.len().max(1);
    let row_h = (440.0 / rows as f64).clamp(14.0, 28.0);
    let plot_h = rows as f64 * row_h;
    let widest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
    let left = (widest as f64 * 6.6 + 20.0).clamp(80.0, 440.0);
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r##"<line x1="{left:.1}" y1="{TOP:.1}" x2="{left:.1}" y2="{:.1}" stroke="#333"/>"##,
        TOP + plot_h
    );
    let _ = writeln!(svg, r#"<g font-family="monospace" font-size="11">"#);
    for (row, label) in labels.iter().enumerate() {
        let y = TOP + (row as f64 + 0.5) * row_h;
        if row % 2 == 1 {
            let _ = writeln!(
                svg,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{row_h:.1}" fill="#f4f4f4"/>"##,
                left + 1.0,
                TOP + row as f64 * row_h,
                WIDTH - 20.0 - left - 1.0
            );
        }
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y + 4.0,
            escape(label)
        );
    }
    let _ = writeln!(svg, "</g>");
    let rows_of: BTreeMap<usize, usize> = groups
        .values()
        .flatten()
        .map(|&i| (i, row_of[&bursts[i].region()]))
        .collect();
    YAxis {
        left,
        plot_h,
        svg,
        y_of: Box::new(move |i| TOP + (rows_of[&i] as f64 + 0.5 + 0.7 * jitter(i)) * row_h),
    }
}

/// The break of the x axis between the column of zeros at `zero_x` and the log axis, on the
/// axis line at `y`.
fn zero_axis_break(svg: &mut String, left: f64, zero_x: f64, y: f64) {
    let _ = writeln!(
        svg,
        r##"<g class="zero" stroke="#333"><line x1="{left:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}"/><line x1="{zero_x:.1}" y1="{y:.1}" x2="{zero_x:.1}" y2="{:.1}"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}"/></g><text x="{zero_x:.1}" y="{:.1}" text-anchor="middle">0</text>"##,
        left + ZERO_GAP - 10.0,
        y + 5.0,
        left + ZERO_GAP - 11.0,
        y + 4.0,
        left + ZERO_GAP - 7.0,
        y - 4.0,
        left + ZERO_GAP - 6.0,
        y + 4.0,
        left + ZERO_GAP - 2.0,
        y - 4.0,
        y + 17.0
    );
}

/// How the dots of the bursts are drawn: where, and whether with a tooltip.
struct Dots<'a> {
    bursts: &'a [Burst],
    names: &'a SiteNames,
    tooltips: bool,
    x_of: &'a dyn Fn(usize) -> f64,
    y_of: &'a dyn Fn(usize) -> f64,
}

impl Dots<'_> {
    /// One group of dots per cluster: noise first, then the clusters with most dots, so small
    /// clusters stay visible on top.
    fn draw(&self, svg: &mut String, groups: &BTreeMap<ClusterId, Vec<usize>>) {
        let mut order: Vec<(&ClusterId, &Vec<usize>)> = groups.iter().collect();
        order.sort_by_key(|(id, members)| (**id != NOISE, std::cmp::Reverse(members.len()), **id));
        let _ = writeln!(svg, r#"<g class="points" fill-opacity="0.75">"#);
        for (&id, members) in order {
            let _ = writeln!(
                svg,
                r#"<g {} fill="{}">"#,
                paint_attr(Some(id)),
                cluster_colour(id)
            );
            for &i in members {
                let (x, y) = ((self.x_of)(i), (self.y_of)(i));
                if self.tooltips {
                    let b = &self.bursts[i];
                    let _ = writeln!(
                        svg,
                        r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5"><title>{}</title></circle>"#,
                        escape(&format!(
                            "{} · rank {} · {} ({} on CPU) · {}",
                            if id == NOISE {
                                "noise".to_string()
                            } else {
                                format!("cluster {id}")
                            },
                            b.rank,
                            duration(b.duration_ns),
                            duration(b.oncpu_ns),
                            self.names.region(&b.start_site, &b.end_site)
                        ))
                    );
                } else {
                    let _ = writeln!(svg, r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5"/>"#);
                }
            }
            let _ = writeln!(svg, "</g>");
        }
        let _ = writeln!(svg, "</g>");
    }
}

/// The caption: the space, the bursts at zero, the subsample and the filtered bursts.
fn caption(
    analysis: &Analysis,
    counters: bool,
    zeros: usize,
    plotted: usize,
    analysed: usize,
) -> String {
    let space = if counters {
        "IPC over instructions per burst (log)".to_string()
    } else {
        "on-CPU time per burst (log) in each code region, regions by decreasing time".to_string()
    };
    let mut caption = format!("{space}; one dot per analysed burst, coloured by cluster.");
    if zeros > 0 {
        let _ = write!(
            caption,
            " {zeros} bursts with {} are drawn at 0, left of the axis break.",
            if counters {
                "no instructions"
            } else {
                "no on-CPU time (the thread was never seen on a CPU during them)"
            }
        );
    }
    if plotted < analysed {
        let _ = write!(
            caption,
            " Showing {plotted} of {analysed} bursts: an evenly spaced subsample of each cluster."
        );
    }
    if analysis.filter.bursts_kept < analysis.filter.bursts_in {
        let _ = write!(
            caption,
            " {} bursts shorter than {} were filtered out before clustering and are not shown.",
            analysis.filter.bursts_in - analysis.filter.bursts_kept,
            duration(analysis.filter.threshold_ns)
        );
    }
    caption
}
