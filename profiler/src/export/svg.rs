//! The two pictures people read a phase analysis from (among the outputs of González García
//! (2013), App. B.2), as one self-contained HTML file with inline SVG (no script, nothing fetched
//! from the network):
//!
//! * the **cluster scatter plot**: every analysed burst as a dot coloured by its cluster, in the
//!   space it was clustered in: IPC over instructions (log) with hardware counters, or on-CPU time
//!   (log) per code region (one row per `start→end` region, by decreasing time) without them;
//! * the **timeline**: one row per rank, each burst a bar from its start to its end coloured by its
//!   cluster, MPI time left white, time in seconds since the job was first seen.
//!
//! Both use one palette indexed by cluster id ([`cluster_colour`]), so a colour means the same
//! cluster in both; the noise is grey and bursts below the analysis's duration filter light grey.
//! Large jobs stay drawable: the scatter plot keeps an even, deterministic subsample of each
//! cluster, and above the bar limit the timeline draws, per rank and pixel column, whatever took
//! most of that column's time (Paraver's "maximum" rendering, with MPI as a candidate).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use super::phases::{count, duration, features_line, render_phases, utc_span};
use crate::{
    analysis::{
        online::{PhasesSnapshot, WindowView},
        Analysis, ClusterId, ClusterStats, FeatureSet, NOISE,
    },
    model::{Burst, CallSite, JobId},
    store::Job,
};

/// Limits on what is drawn. Defaults: 20 000 dots and 20 000 bars.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HtmlOptions {
    /// Dots in the scatter plot; each cluster keeps an evenly spaced subsample of its bursts in
    /// proportion to its size, but at least [`MIN_POINTS_PER_CLUSTER`] (or all it has), so the
    /// total can exceed this by that much per cluster.
    pub max_points: usize,
    /// Bursts drawn as one bar each; above this the timeline is drawn per pixel column.
    pub max_bars: usize,
    /// Dots and bars get a tooltip (SVG `<title>`) only up to this many, to bound the file size.
    pub max_tooltips: usize,
}

impl Default for HtmlOptions {
    fn default() -> Self {
        HtmlOptions {
            max_points: 20_000,
            max_bars: 20_000,
            max_tooltips: 5_000,
        }
    }
}

/// Smallest subsample of a cluster in the scatter plot (all of it when it has fewer bursts).
pub const MIN_POINTS_PER_CLUSTER: usize = 100;

/// The noise (bursts DBSCAN left unclustered).
pub const NOISE_COLOUR: &str = "#7f7f7f";
/// Bursts the analysis's duration filter left out (they have no cluster).
pub const FILTERED_COLOUR: &str = "#d4d4d4";

/// Clusters 1–18: Tableau's category colours without their grey, dark then light.
const PALETTE: [&str; 18] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22",
    "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94", "#f7b6d2",
    "#dbdb8d", "#9edae5",
];

/// The colour of a cluster in every view: [`NOISE_COLOUR`] for the noise, a fixed palette for
/// clusters 1–18, then hues 137.5° apart (the golden angle) at a fixed saturation and lightness.
pub fn cluster_colour(id: ClusterId) -> String {
    if id == NOISE {
        return NOISE_COLOUR.to_string();
    }
    if let Some(c) = PALETTE.get(id as usize - 1) {
        return c.to_string();
    }
    let hue = ((id as usize - PALETTE.len()) as f64 * 137.508) % 360.0;
    let (r, g, b) = hsl_to_rgb(hue, 0.55, 0.5);
    format!("#{r:02x}{g:02x}{b:02x}")
}

fn hsl_to_rgb(h: f64, s: f64, l: f64) -> (u8, u8, u8) {
    let c = (1.0 - (2.0 * l - 1.0).abs()) * s;
    let hp = h / 60.0;
    let x = c * (1.0 - (hp % 2.0 - 1.0).abs());
    let (r, g, b) = match hp as u32 {
        0 => (c, x, 0.0),
        1 => (x, c, 0.0),
        2 => (0.0, c, x),
        3 => (0.0, x, c),
        4 => (x, 0.0, c),
        _ => (c, 0.0, x),
    };
    let m = l - c / 2.0;
    let byte = |v: f64| ((v + m) * 255.0).round().clamp(0.0, 255.0) as u8;
    (byte(r), byte(g), byte(b))
}

/// Escapes text for XML/HTML content and double- or single-quoted attribute values.
pub fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            // Control characters are not allowed in XML 1.0.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

const WIDTH: f64 = 1100.0;
const FONT: &str = r#"font-family="sans-serif" font-size="11""#;

/// What a burst is painted as: `Some(cluster)` (noise included) or `None` when filtered out.
type Paint = Option<ClusterId>;

fn paint_colour(p: Paint) -> String {
    match p {
        Some(id) => cluster_colour(id),
        None => FILTERED_COLOUR.to_string(),
    }
}

fn paint_attr(p: Paint) -> String {
    match p {
        Some(id) => format!(r#"data-cluster="{id}""#),
        None => r#"data-cluster="filtered""#.to_string(),
    }
}

/// A linear or log₁₀ map from data values to pixels.
#[derive(Clone, Copy, Debug)]
struct Scale {
    lo: f64,
    hi: f64,
    px_lo: f64,
    px_hi: f64,
    log: bool,
}

impl Scale {
    fn at(&self, v: f64) -> f64 {
        let (v, lo, hi) = if self.log {
            (
                v.max(f64::MIN_POSITIVE).log10(),
                self.lo.log10(),
                self.hi.log10(),
            )
        } else {
            (v, self.lo, self.hi)
        };
        let t = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
        self.px_lo + t * (self.px_hi - self.px_lo)
    }

    /// Tick values inside the range: 1-2-5 steps (linear) or decades, with 2× and 5× when fewer
    /// than three decades fall inside (log).
    fn ticks(&self) -> Vec<f64> {
        if self.log {
            let (a, b) = (
                self.lo.log10().floor() as i32,
                self.hi.log10().ceil() as i32,
            );
            let decades: Vec<f64> = (a..=b)
                .map(|e| 10f64.powi(e))
                .filter(|v| self.contains(*v))
                .collect();
            if decades.len() >= 3 {
                return decades;
            }
            (a..=b)
                .flat_map(|e| [1.0, 2.0, 5.0].map(|m| m * 10f64.powi(e)))
                .filter(|v| self.contains(*v))
                .collect()
        } else {
            let step = nice_step((self.hi - self.lo) / 6.0);
            let mut v = (self.lo / step).ceil() * step;
            let mut out = Vec::new();
            while v <= self.hi + step * 1e-9 {
                out.push(if v.abs() < step * 1e-9 { 0.0 } else { v });
                v += step;
            }
            out
        }
    }

    fn contains(&self, v: f64) -> bool {
        v >= self.lo * (1.0 - 1e-9) && v <= self.hi * (1.0 + 1e-9)
    }
}

/// The 1, 2 or 5 × 10ᵏ at or above `raw`.
fn nice_step(raw: f64) -> f64 {
    if !(raw > 0.0 && raw.is_finite()) {
        return 1.0;
    }
    let magnitude = 10f64.powf(raw.log10().floor());
    let m = raw / magnitude;
    let nice = if m <= 1.0 {
        1.0
    } else if m <= 2.0 {
        2.0
    } else if m <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

/// A log scale over the positive values, padded by 5 % of the span (half a decade each side for
/// a single value). Zeros are left out: the scatter plot draws them left of an axis break.
fn log_scale(values: impl Iterator<Item = f64>, px_lo: f64, px_hi: f64) -> Scale {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| *v > 0.0) {
        lo = lo.min(v.log10());
        hi = hi.max(v.log10());
    }
    if !lo.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    let pad = if hi > lo { 0.05 * (hi - lo) } else { 0.5 };
    Scale {
        lo: 10f64.powf(lo - pad),
        hi: 10f64.powf(hi + pad),
        px_lo,
        px_hi,
        log: true,
    }
}

/// A tick label without trailing zeros after the decimal point: "1.00M" → "1M", "2.50 ms" →
/// "2.5 ms".
fn tick_label(label: String) -> String {
    let end = label
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-'))
        .unwrap_or(label.len());
    let (number, unit) = label.split_at(end);
    if !number.contains('.') {
        return label;
    }
    format!(
        "{}{unit}",
        number.trim_end_matches('0').trim_end_matches('.')
    )
}

/// Seconds with as many decimals as the tick step needs.
fn seconds_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$} s")
}

/// An x axis along the bottom of the plot area: line, ticks, labels, title.
fn x_axis(svg: &mut String, scale: &Scale, y: f64, label: impl Fn(f64) -> String, title: &str) {
    let _ = writeln!(
        svg,
        r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#333"/>"##,
        scale.px_lo, scale.px_hi
    );
    for v in scale.ticks() {
        let x = scale.at(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{y:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            y + 5.0,
            y + 17.0,
            escape(&label(v))
        );
    }
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="12">{}</text>"#,
        (scale.px_lo + scale.px_hi) / 2.0,
        y + 33.0,
        escape(title)
    );
}

/// A y axis along the left of the plot area, with light grid lines across it.
fn y_axis(
    svg: &mut String,
    scale: &Scale,
    x: f64,
    x_end: f64,
    label: impl Fn(f64) -> String,
    title: &str,
) {
    let _ = writeln!(
        svg,
        r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/>"##,
        scale.px_lo, scale.px_hi
    );
    for v in scale.ticks() {
        let y = scale.at(v);
        let _ = writeln!(
            svg,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{x_end:.1}" y2="{y:.1}" stroke="#e4e4e4"/><line x1="{:.1}" y1="{y:.1}" x2="{x:.1}" y2="{y:.1}" stroke="#333"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            x + 1.0,
            x - 5.0,
            x - 7.0,
            y + 4.0,
            escape(&label(v))
        );
    }
    let (cy, cx) = ((scale.px_lo + scale.px_hi) / 2.0, x - 48.0);
    let _ = writeln!(
        svg,
        r#"<text x="{cx:.1}" y="{cy:.1}" text-anchor="middle" font-size="12" transform="rotate(-90 {cx:.1} {cy:.1})">{}</text>"#,
        escape(title)
    );
}

/// One legend entry.
struct LegendItem {
    colour: String,
    /// Drawn with a dark outline (for white).
    outline: bool,
    text: String,
}

/// Legend entries in rows under the plot, starting at `y`; returns the height used.
fn legend(svg: &mut String, items: &[LegendItem], x0: f64, y: f64) -> f64 {
    const ITEM: f64 = 265.0;
    const ROW: f64 = 18.0;
    let per_row = (((WIDTH - x0 - 10.0) / ITEM).floor() as usize).max(1);
    let _ = writeln!(svg, r#"<g class="legend">"#);
    for (i, item) in items.iter().enumerate() {
        let x = x0 + (i % per_row) as f64 * ITEM;
        let yy = y + (i / per_row) as f64 * ROW;
        let stroke = if item.outline {
            r##" stroke="#555""##
        } else {
            ""
        };
        let _ = writeln!(
            svg,
            r#"<rect x="{x:.1}" y="{:.1}" width="12" height="12" fill="{}"{stroke}/><text x="{:.1}" y="{:.1}">{}</text>"#,
            yy,
            item.colour,
            x + 17.0,
            yy + 10.0,
            escape(&item.text)
        );
    }
    let _ = writeln!(svg, "</g>");
    items.len().div_ceil(per_row) as f64 * ROW
}

/// Legend entries for clusters (`word` "cluster") or tracked phases ("phase") and the noise.
fn cluster_legend<'a>(
    word: &str,
    clusters: impl Iterator<Item = &'a ClusterStats>,
    noise: Option<&ClusterStats>,
) -> Vec<LegendItem> {
    let mut items: Vec<LegendItem> = clusters
        .map(|c| {
            let mut text = format!("{word} {}: {:.1}% of time", c.id, 100.0 * c.time_share);
            if let Some(ipc) = c.ipc {
                let _ = write!(text, ", IPC {ipc:.2}");
            }
            let _ = write!(text, ", SPMD {:.2}", c.spmd_score);
            LegendItem {
                colour: cluster_colour(c.id),
                outline: false,
                text,
            }
        })
        .collect();
    if let Some(noise) = noise {
        items.push(LegendItem {
            colour: NOISE_COLOUR.into(),
            outline: false,
            text: format!(
                "noise: {} bursts, {:.1}% of time",
                noise.bursts,
                100.0 * noise.time_share
            ),
        });
    }
    items
}

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

fn region_label(start: &CallSite, end: &CallSite) -> String {
    let s = format!("{start}→{end}");
    if s.chars().count() > 64 {
        let tail: String = s.chars().skip(s.chars().count() - 63).collect();
        format!("…{tail}")
    } else {
        s
    }
}

/// Regions shown as their own row in the scatter plot without counters; the rest share one.
const MAX_REGION_ROWS: usize = 40;

/// The cluster scatter plot and a caption for it.
fn scatter(bursts: &[Burst], analysis: &Analysis, options: &HtmlOptions) -> (String, String) {
    let mut groups: BTreeMap<ClusterId, Vec<usize>> = BTreeMap::new();
    for (i, label) in analysis.labels.iter().enumerate() {
        if let Some(id) = label {
            groups.entry(*id).or_default().push(i);
        }
    }
    for members in groups.values_mut() {
        members.sort_by_key(|&i| (bursts[i].rank, bursts[i].start_ns, i));
    }
    let analysed: usize = groups.values().map(Vec::len).sum();
    subsample(&mut groups, options.max_points);
    let plotted: usize = groups.values().map(Vec::len).sum();
    let tooltips = plotted <= options.max_tooltips;
    let counters = analysis.features.used == FeatureSet::InstructionsIpc;

    // Where each burst goes: (x value, y pixel), and the y axis.
    let mut svg = String::new();
    let top = 12.0;
    let left: f64;
    let plot_h: f64;
    let x_scale: Scale;
    let y_of: Box<dyn Fn(usize) -> f64 + '_>;
    let mut y_axis_svg = String::new();
    // The x value of a burst: instructions, or on-CPU time without counters. Zeros (a burst that
    // never ran on a CPU as far as the kernel saw) have no place on a log axis; they get their
    // own column at 0, left of an axis break, `ZERO_GAP` pixels wide.
    const ZERO_GAP: f64 = 36.0;
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
    if counters {
        left = 80.0;
        plot_h = 440.0;
        x_scale = log_scale(
            groups.values().flatten().map(|&i| x_value(i)),
            left + gap,
            WIDTH - 20.0,
        );
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
            px_lo: top + plot_h,
            px_hi: top,
            log: false,
        };
        y_axis(
            &mut y_axis_svg,
            &y_scale,
            left,
            WIDTH - 20.0,
            |v| format!("{}", (v * 1e6).round() / 1e6),
            "IPC (instructions per cycle)",
        );
        y_of = Box::new(move |i| y_scale.at(ipc(i)));
    } else {
        // Regions by decreasing analysed time; the ones beyond the row limit share the last row.
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
            .map(|((s, e), _)| region_label(s, e))
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
        plot_h = rows as f64 * row_h;
        let widest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(0);
        left = (widest as f64 * 6.6 + 20.0).clamp(80.0, 440.0);
        x_scale = log_scale(
            groups.values().flatten().map(|&i| x_value(i)),
            left + gap,
            WIDTH - 20.0,
        );
        let _ = writeln!(
            y_axis_svg,
            r##"<line x1="{left:.1}" y1="{top:.1}" x2="{left:.1}" y2="{:.1}" stroke="#333"/>"##,
            top + plot_h
        );
        let _ = writeln!(y_axis_svg, r#"<g font-family="monospace" font-size="11">"#);
        for (row, label) in labels.iter().enumerate() {
            let y = top + (row as f64 + 0.5) * row_h;
            if row % 2 == 1 {
                let _ = writeln!(
                    y_axis_svg,
                    r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{row_h:.1}" fill="#f4f4f4"/>"##,
                    left + 1.0,
                    top + row as f64 * row_h,
                    WIDTH - 20.0 - left - 1.0
                );
            }
            let _ = writeln!(
                y_axis_svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                left - 6.0,
                y + 4.0,
                escape(label)
            );
        }
        let _ = writeln!(y_axis_svg, "</g>");
        let rows_of: BTreeMap<usize, usize> = groups
            .values()
            .flatten()
            .map(|&i| (i, row_of[&bursts[i].region()]))
            .collect();
        y_of = Box::new(move |i| top + (rows_of[&i] as f64 + 0.5 + 0.7 * jitter(i)) * row_h);
    }
    let zero_x = left + ZERO_GAP * 0.4;
    let x_of = |i: usize| {
        let v = x_value(i);
        if v > 0.0 {
            x_scale.at(v)
        } else {
            zero_x
        }
    };

    let legend_items = cluster_legend("cluster", analysis.clusters.iter(), analysis.noise.as_ref());
    let legend_y = top + plot_h + 50.0;
    let mut body = String::new();
    let legend_h = legend(&mut body, &legend_items, left, legend_y);
    let height = legend_y + legend_h + 6.0;
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" class="scatter" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" {FONT}>"#
    );
    let _ = writeln!(
        svg,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{height:.0}" fill="white"/>"#
    );
    svg.push_str(&y_axis_svg);
    if counters {
        x_axis(
            &mut svg,
            &x_scale,
            top + plot_h,
            |v| tick_label(count(v)),
            "instructions per burst (log scale)",
        );
    } else {
        x_axis(
            &mut svg,
            &x_scale,
            top + plot_h,
            |v| tick_label(duration(v.round() as u64)),
            "on-CPU time per burst (log scale; the clustered feature)",
        );
    }
    if zeros > 0 {
        let y = top + plot_h;
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
    // Noise first, then the clusters with most dots, so small clusters stay visible on top.
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
            let (x, y) = (x_of(i), y_of(i));
            if tooltips {
                let b = &bursts[i];
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
                        region_label(&b.start_site, &b.end_site)
                    ))
                );
            } else {
                let _ = writeln!(svg, r#"<circle cx="{x:.1}" cy="{y:.1}" r="2.5"/>"#);
            }
        }
        let _ = writeln!(svg, "</g>");
    }
    let _ = writeln!(svg, "</g>");
    svg.push_str(&body);
    let _ = writeln!(svg, "</svg>");

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
    (svg, caption)
}

/// The runs of equal neighbours in `cells`, as `(first, end)` index ranges: adjacent cells that
/// look the same are drawn as one bar.
fn runs<T: PartialEq>(cells: &[T]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for end in 1..=cells.len() {
        if end == cells.len() || cells[end] != cells[start] {
            out.push((start, end));
            start = end;
        }
    }
    out
}

/// How a timeline with more bursts than bars was drawn.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Binning {
    /// Rows tall enough: each column stacks the time share of every cluster.
    Stacked { column_px: f64 },
    /// Rows too thin to stack: each column shows what took most of its time, MPI included.
    Majority { column_px: f64 },
}

/// The geometry of a binned timeline.
struct Bins<'a> {
    row_of: &'a BTreeMap<u32, usize>,
    rows: usize,
    t0: u64,
    span_ns: f64,
    left: f64,
    right: f64,
    top: f64,
    row_h: f64,
    bar_h: f64,
    max_bars: usize,
}

/// Stacking order inside a column, top down: clusters by id, then the noise, then filtered bursts.
fn stack_key(p: Paint) -> (u8, ClusterId) {
    match p {
        Some(NOISE) => (1, 0),
        Some(id) => (0, id),
        None => (2, 0),
    }
}

/// Draws a timeline with more bursts than bars per column of a few pixels: the columns are as
/// narrow as the bar budget allows (rows × columns cells of up to 4 bars each when stacked),
/// adjacent columns that look the same become one bar, and a burst spread over several columns
/// counts in each for the time it overlaps it.
fn bin_timeline(
    bars: &mut BTreeMap<Paint, String>,
    bursts: &[Burst],
    labels: &[Paint],
    g: &Bins<'_>,
) -> Binning {
    let stacked = g.bar_h >= 8.0;
    let plot_px = g.right - g.left;
    let cells = if stacked { g.max_bars / 4 } else { g.max_bars }.max(g.rows);
    // Whole columns across the plot, at least one pixel wide, so a column's bar heights stand for
    // time shares of exactly its width.
    let columns =
        ((plot_px / (g.rows as f64 * plot_px / cells as f64).ceil().max(1.0)) as usize).max(1);
    let column_px = plot_px / columns as f64;
    let column_ns = g.span_ns * column_px / plot_px;
    let mut time: Vec<Vec<BTreeMap<Paint, f64>>> = vec![vec![BTreeMap::new(); columns]; g.rows];
    for (b, &paint) in bursts.iter().zip(labels) {
        let s = (b.start_ns - g.t0) as f64;
        let e = s + b.duration_ns as f64;
        let c0 = ((s / column_ns) as usize).min(columns - 1);
        let c1 = ((e / column_ns) as usize).min(columns - 1);
        for (c, cell) in time[g.row_of[&b.rank]]
            .iter_mut()
            .enumerate()
            .take(c1 + 1)
            .skip(c0)
        {
            let overlap = e.min((c + 1) as f64 * column_ns) - s.max(c as f64 * column_ns);
            if overlap > 0.0 {
                *cell.entry(paint).or_default() += overlap;
            }
        }
    }
    // What each cell looks like: (paint, top offset, height) of its bars, heights in half pixels.
    let look = |cell: &BTreeMap<Paint, f64>| -> Vec<(Paint, f64, f64)> {
        if stacked {
            let mut paints: Vec<(Paint, f64)> = cell.iter().map(|(p, t)| (*p, *t)).collect();
            paints.sort_by_key(|(p, _)| stack_key(*p));
            let mut offset = 0.0;
            let mut out = Vec::new();
            for (paint, t) in paints {
                let h = ((g.bar_h * t / column_ns * 2.0).round() / 2.0).min(g.bar_h - offset);
                if h > 0.0 {
                    out.push((paint, offset, h));
                    offset += h;
                }
            }
            out
        } else {
            let busy: f64 = cell.values().sum();
            cell.iter()
                .max_by(|a, b| a.1.total_cmp(b.1).then(b.0.cmp(a.0)))
                .filter(|best| *best.1 >= column_ns - busy)
                .map(|best| vec![(*best.0, 0.0, g.bar_h)])
                .unwrap_or_default()
        }
    };
    for (row, cells) in time.iter().enumerate() {
        let y0 = g.top + row as f64 * g.row_h + (g.row_h - g.bar_h) / 2.0;
        let looks: Vec<_> = cells.iter().map(look).collect();
        for (start, end) in runs(&looks) {
            let x = g.left + start as f64 * column_px;
            let w = (end - start) as f64 * column_px;
            for &(paint, offset, h) in &looks[start] {
                let _ = writeln!(
                    bars.entry(paint).or_default(),
                    r#"<rect x="{x:.2}" y="{:.1}" width="{w:.2}" height="{h:.1}"/>"#,
                    y0 + offset
                );
            }
        }
    }
    if stacked {
        Binning::Stacked { column_px }
    } else {
        Binning::Majority { column_px }
    }
}

/// The layout of a chart with one row per rank: bars in the rows, an x axis below them, then a
/// legend.
#[derive(Clone, Copy)]
struct RankRows<'a> {
    /// One row each, top down.
    ranks: &'a [u32],
    left: f64,
    right: f64,
    top: f64,
    row_h: f64,
    bar_h: f64,
    plot_h: f64,
}

impl<'a> RankRows<'a> {
    fn new(ranks: &'a [u32]) -> Self {
        let rows = ranks.len().max(1);
        let row_h = (420.0 / rows as f64).clamp(3.0, 32.0);
        RankRows {
            ranks,
            left: 70.0,
            right: WIDTH - 20.0,
            top: 12.0,
            row_h,
            bar_h: if row_h >= 8.0 { row_h - 3.0 } else { row_h },
            plot_h: rows as f64 * row_h,
        }
    }

    /// The top of the bars in row `row`.
    fn bar_y(&self, row: usize) -> f64 {
        self.top + row as f64 * self.row_h + (self.row_h - self.bar_h) / 2.0
    }

    /// The whole chart: rank labels, the x axis (`scale`, `tick` labels, `title`), the bars
    /// (`<rect>` fragments grouped by paint, drawn in paint order) and the legend.
    fn svg(
        &self,
        class: &str,
        scale: &Scale,
        tick: impl Fn(f64) -> String,
        title: &str,
        bars: &BTreeMap<Paint, String>,
        items: &[LegendItem],
    ) -> String {
        let RankRows {
            ranks,
            left,
            top,
            row_h,
            plot_h,
            ..
        } = *self;
        let legend_y = top + plot_h + 50.0;
        let mut legend_svg = String::new();
        let legend_h = legend(&mut legend_svg, items, left, legend_y);
        let height = legend_y + legend_h + 6.0;
        let mut svg = String::new();
        let _ = writeln!(
            svg,
            r#"<svg xmlns="http://www.w3.org/2000/svg" class="{class}" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" {FONT}>"#
        );
        let _ = writeln!(
            svg,
            r#"<rect x="0" y="0" width="{WIDTH}" height="{height:.0}" fill="white"/>"#
        );
        // Rank labels, at least 11 px apart.
        let every = (11.0 / row_h).ceil().max(1.0) as usize;
        for (row, rank) in ranks.iter().enumerate() {
            if row % every == 0 {
                let _ = writeln!(
                    svg,
                    r#"<text x="{:.1}" y="{:.1}" text-anchor="end">rank {rank}</text>"#,
                    left - 6.0,
                    top + (row as f64 + 0.5) * row_h + 4.0
                );
            }
        }
        let _ = writeln!(
            svg,
            r##"<line x1="{left:.1}" y1="{top:.1}" x2="{left:.1}" y2="{:.1}" stroke="#333"/>"##,
            top + plot_h
        );
        x_axis(&mut svg, scale, top + plot_h, tick, title);
        let _ = writeln!(svg, r#"<g class="bursts">"#);
        for (paint, rects) in bars {
            let _ = writeln!(
                svg,
                r#"<g {} fill="{}">"#,
                paint_attr(*paint),
                paint_colour(*paint)
            );
            svg.push_str(rects);
            let _ = writeln!(svg, "</g>");
        }
        let _ = writeln!(svg, "</g>");
        svg.push_str(&legend_svg);
        let _ = writeln!(svg, "</svg>");
        svg
    }
}

/// The rank × time timeline and a caption for it.
fn timeline(
    job: &Job,
    bursts: &[Burst],
    analysis: &Analysis,
    options: &HtmlOptions,
) -> (String, String) {
    let ranks: Vec<u32> = job
        .ranks
        .keys()
        .copied()
        .chain(bursts.iter().map(|b| b.rank))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let row_of: BTreeMap<u32, usize> = ranks.iter().enumerate().map(|(i, &r)| (r, i)).collect();
    let t0 = bursts
        .iter()
        .map(|b| b.start_ns)
        .min()
        .map_or(job.meta.first_seen_ns, |s| s.min(job.meta.first_seen_ns));
    let t1 = bursts
        .iter()
        .map(|b| b.start_ns + b.duration_ns)
        .max()
        .unwrap_or(t0)
        .max(t0 + 1);
    let frame = RankRows::new(&ranks);
    let RankRows {
        left,
        right,
        top,
        row_h,
        bar_h,
        ..
    } = frame;
    let scale = Scale {
        lo: 0.0,
        hi: (t1 - t0) as f64 / 1e9,
        px_lo: left,
        px_hi: right,
        log: false,
    };
    let x_of = |ns: u64| scale.at(ns.saturating_sub(t0) as f64 / 1e9);

    // Bars grouped by paint, drawn filtered first, then noise, then clusters.
    let mut bars: BTreeMap<Paint, String> = BTreeMap::new();
    let per_burst = bursts.len() <= options.max_bars;
    let tooltips = bursts.len() <= options.max_tooltips;
    let mut binned = None;
    if per_burst {
        for (i, b) in bursts.iter().enumerate() {
            let paint = analysis.labels[i];
            let x = x_of(b.start_ns);
            let w = (x_of(b.start_ns + b.duration_ns) - x).max(0.4);
            let y = frame.bar_y(row_of[&b.rank]);
            let out = bars.entry(paint).or_default();
            if tooltips {
                let what = match paint {
                    Some(NOISE) => "noise".to_string(),
                    Some(id) => format!("cluster {id}"),
                    None => "filtered".to_string(),
                };
                let _ = writeln!(
                    out,
                    r#"<rect x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{bar_h:.1}"><title>{}</title></rect>"#,
                    escape(&format!(
                        "rank {} · {what} · {} · {}",
                        b.rank,
                        duration(b.duration_ns),
                        region_label(&b.start_site, &b.end_site)
                    ))
                );
            } else {
                let _ = writeln!(
                    out,
                    r#"<rect x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{bar_h:.1}"/>"#
                );
            }
        }
    } else {
        binned = Some(bin_timeline(
            &mut bars,
            bursts,
            &analysis.labels,
            &Bins {
                row_of: &row_of,
                rows: ranks.len().max(1),
                t0,
                span_ns: (t1 - t0) as f64,
                left,
                right,
                top,
                row_h,
                bar_h,
                max_bars: options.max_bars,
            },
        ));
    }

    let mut items = cluster_legend("cluster", analysis.clusters.iter(), analysis.noise.as_ref());
    if analysis.labels.iter().any(Option::is_none) {
        items.push(LegendItem {
            colour: FILTERED_COLOUR.into(),
            outline: false,
            text: format!(
                "filtered: bursts < {}, {:.1}% of time",
                duration(analysis.filter.threshold_ns),
                100.0 * analysis.filter.time_filtered_share
            ),
        });
    }
    items.push(LegendItem {
        colour: "#ffffff".into(),
        outline: true,
        text: "MPI (or bursts below the kernel filter)".into(),
    });
    let step = nice_step(scale.hi / 6.0);
    let svg = frame.svg(
        "timeline",
        &scale,
        |v| seconds_label(v, step),
        "time since the job was first seen (s)",
        &bars,
        &items,
    );

    let mut caption = format!(
        "One row per rank on this node ({} rank{}), each burst a bar from its start to its end coloured by its cluster; white is MPI time.",
        ranks.len(),
        if ranks.len() == 1 { "" } else { "s" }
    );
    match binned {
        Some(Binning::Stacked { column_px }) => {
            let _ = write!(
                caption,
                " {} bursts are more than {} bars, so each column of {column_px:.1} px stacks, top \
                 down, the share of its time each cluster took; white is the rest.",
                bursts.len(),
                options.max_bars
            );
        }
        Some(Binning::Majority { column_px }) => {
            let _ = write!(
                caption,
                " {} bursts are more than {} bars, so each column of {column_px:.1} px shows \
                 whatever took most of its time (MPI included).",
                bursts.len(),
                options.max_bars
            );
        }
        None => {}
    }
    if job.bursts_evicted > 0 {
        let _ = write!(
            caption,
            " {} older bursts were no longer held and are not shown.",
            job.bursts_evicted
        );
    }
    (svg, caption)
}

/// Where the page of `job` goes when the user asked for `out`: `out` itself for a single job;
/// with several jobs, the job id (characters other than ASCII letters, digits, `.`, `_` and `-`
/// replaced by `_`) is appended to the file stem: `views.html` → `views-pmix_1234_0.html`.
pub fn html_path(out: &std::path::Path, job: &JobId, several: bool) -> std::path::PathBuf {
    if !several {
        return out.to_path_buf();
    }
    let id: String = job
        .0
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let stem = out
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match out.extension() {
        Some(ext) => format!("{stem}-{id}.{}", ext.to_string_lossy()),
        None => format!("{stem}-{id}"),
    };
    out.with_file_name(name)
}

/// The HTML page with both views and the phase table of one job. `bursts` are the bursts the
/// analysis was run on, in the same order (`analysis.labels[i]` is the label of `bursts[i]`).
pub fn render_html(job: &Job, bursts: &[Burst], analysis: &Analysis) -> String {
    render_html_with(job, bursts, analysis, &HtmlOptions::default())
}

/// [`render_html`] with explicit drawing limits.
///
/// # Panics
/// When `analysis` was not computed from `bursts` (the number of labels differs).
pub fn render_html_with(
    job: &Job,
    bursts: &[Burst],
    analysis: &Analysis,
    options: &HtmlOptions,
) -> String {
    assert_eq!(
        analysis.labels.len(),
        bursts.len(),
        "render_html needs the bursts the analysis was computed from, in the same order"
    );
    let m = &job.meta;
    let (scatter_svg, scatter_caption) = scatter(bursts, analysis, options);
    let (timeline_svg, timeline_caption) = timeline(job, bursts, analysis, options);
    page(
        &m.id,
        &[
            format!(
                "node {} · {} · {} of {} ranks on this node · {} bursts · global SPMD score {:.3}",
                m.node,
                m.executable,
                analysis.ranks,
                m.size,
                bursts.len(),
                analysis.global_score
            ),
            features_line(&analysis.features),
        ],
        &[
            Section {
                heading: "Clusters",
                caption: scatter_caption,
                content: scatter_svg,
            },
            Section {
                heading: "Timeline",
                caption: timeline_caption,
                content: timeline_svg,
            },
            Section {
                heading: "Phase table",
                caption: String::new(),
                content: format!("<pre>{}</pre>\n", escape(&render_phases(&m.id, analysis))),
            },
        ],
    )
}

/// One part of a page: a heading, a caption (plain text) and its content (HTML).
struct Section {
    heading: &'static str,
    caption: String,
    content: String,
}

/// A self-contained HTML page about one job: `meta` lines (plain text) under the title, then the
/// sections.
fn page(job: &JobId, meta: &[String], sections: &[Section]) -> String {
    let mut html = String::new();
    let _ = writeln!(html, "<!DOCTYPE html>");
    let _ = writeln!(html, r#"<html lang="en"><head><meta charset="utf-8">"#);
    let _ = writeln!(
        html,
        "<title>mpiburst phases: job {}</title>",
        escape(&job.0)
    );
    let _ = writeln!(
        html,
        "<style>body{{font-family:sans-serif;margin:16px 24px;color:#222}}h1{{font-size:20px}}h2{{font-size:16px;margin-top:28px}}\
         p{{max-width:1100px;margin:4px 0}}.meta{{color:#555}}svg{{display:block;margin:8px 0}}\
         pre{{font-size:12px;background:#f6f6f6;padding:8px;overflow-x:auto}}</style>"
    );
    let _ = writeln!(html, "</head><body>");
    let _ = writeln!(html, "<h1>Phases of job {}</h1>", escape(&job.0));
    for line in meta {
        let _ = writeln!(html, r#"<p class="meta">{}</p>"#, escape(line));
    }
    for s in sections {
        let _ = writeln!(html, "<h2>{}</h2>", escape(s.heading));
        if !s.caption.is_empty() {
            let _ = writeln!(html, "<p>{}</p>", escape(&s.caption));
        }
        html.push_str(&s.content);
    }
    let _ = writeln!(html, "</body></html>");
    html
}

/// The rank × position view of a window's phase sequences and a caption for it: each rank's
/// analysed bursts in their order, coloured by stable phase id. Not to time scale: the daemon
/// keeps, per window, the order of the phases, not when each burst ran. Above the bar budget each
/// column shows the phase most of its bursts had.
fn sequences(window: &WindowView, options: &HtmlOptions) -> (String, String) {
    let ranks: Vec<u32> = window.sequences.iter().map(|s| s.rank).collect();
    let frame = RankRows::new(&ranks);
    let longest = window
        .sequences
        .iter()
        .map(|s| s.phases.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let rows = ranks.len().max(1);
    let columns = longest
        .min((frame.right - frame.left) as usize)
        .min((options.max_bars / rows).max(1));
    let column_px = (frame.right - frame.left) / columns as f64;
    let tooltips = rows * columns <= options.max_tooltips;
    let mut bars: BTreeMap<Paint, String> = BTreeMap::new();
    for (row, sequence) in window.sequences.iter().enumerate() {
        // Column c holds positions [c·longest/columns, (c+1)·longest/columns).
        let cells: Vec<Option<ClusterId>> = (0..columns)
            .map(|c| {
                let (a, b) = (
                    c * longest / columns,
                    ((c + 1) * longest / columns).min(sequence.phases.len()),
                );
                let mut counts: BTreeMap<ClusterId, usize> = BTreeMap::new();
                for &id in sequence.phases.get(a..b).unwrap_or_default() {
                    *counts.entry(id).or_default() += 1;
                }
                counts
                    .into_iter()
                    .max_by(|x, y| x.1.cmp(&y.1).then(y.0.cmp(&x.0)))
                    .map(|(id, _)| id)
            })
            .collect();
        for (start, end) in runs(&cells) {
            let Some(id) = cells[start] else { continue };
            let x = frame.left + start as f64 * column_px;
            let w = (end - start) as f64 * column_px;
            let out = bars.entry(Some(id)).or_default();
            let _ = write!(
                out,
                r#"<rect x="{x:.2}" y="{:.1}" width="{w:.2}" height="{:.1}""#,
                frame.bar_y(row),
                frame.bar_h
            );
            if tooltips {
                let what = if id == NOISE {
                    "noise".to_string()
                } else {
                    format!("phase {id}")
                };
                let _ = writeln!(
                    out,
                    "><title>rank {} · {what} · bursts {}–{}</title></rect>",
                    sequence.rank,
                    start * longest / columns + 1,
                    (end * longest / columns).min(sequence.phases.len())
                );
            } else {
                let _ = writeln!(out, "/>");
            }
        }
    }
    let scale = Scale {
        lo: 0.0,
        hi: longest as f64,
        px_lo: frame.left,
        px_hi: frame.right,
        log: false,
    };
    let items = cluster_legend(
        "phase",
        window.phases.iter().map(|p| &p.stats),
        window.noise.as_ref(),
    );
    let svg = frame.svg(
        "sequences",
        &scale,
        |v| format!("{v:.0}"),
        "analysed bursts of the rank, in order",
        &bars,
        &items,
    );
    let mut caption = format!(
        "The phases of the window {} in the order each rank ran them: one row per rank on this \
         node, one bar per analysed burst (filtered bursts left out), coloured by stable phase id. \
         Not to time scale. The same pattern down every column is SPMD behaviour.",
        utc_span(window.start_ns, window.end_ns)
    );
    if columns < longest {
        let _ = write!(
            caption,
            " {longest} bursts per rank are more than {columns} columns, so each column shows the \
             phase of most of its bursts."
        );
    }
    (svg, caption)
}

/// The HTML page of a job a daemon is running, from its JSON API: the window's phase sequences
/// (the daemon's snapshot carries them) and the phase tables `tables`. The scatter plot and the
/// timeline are left out, and the page says so: they need the bursts themselves, which the API
/// does not serve.
pub fn render_live_html(
    job: &Job,
    snapshot: &PhasesSnapshot,
    tables: &str,
    daemon: &str,
) -> String {
    let m = &job.meta;
    let mut meta = vec![format!(
        "node {} · {} · {} of {} ranks on this node · live from the daemon at {daemon}",
        m.node, m.executable, snapshot.ranks, m.size
    )];
    let mut sections = Vec::new();
    if let Some(window) = &snapshot.last_window {
        meta.push(features_line(&window.features));
        let (svg, caption) = sequences(window, &HtmlOptions::default());
        sections.push(Section {
            heading: "Phase sequences",
            caption,
            content: svg,
        });
    }
    sections.push(Section {
        heading: "Cluster scatter plot and timeline",
        caption: "Not drawn: they need every burst's features and times, which the daemon's JSON API \
                  does not serve. Record the job (`mpiburst record -o job.jsonl`, then start it) and \
                  run `mpiburst report job.jsonl --html OUT` for them."
            .to_string(),
        content: String::new(),
    });
    sections.push(Section {
        heading: "Phase tables",
        caption: String::new(),
        content: format!("<pre>{}</pre>\n", escape(tables)),
    });
    page(&m.id, &meta, &sections)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        analysis::{
            analyse,
            synthetic::{Phase, SyntheticJob},
            AnalysisParams,
        },
        store::JobMeta,
    };
    use std::path::{Path, PathBuf};

    /// A parsed XML element: just enough XML to check well-formedness and count things.
    #[derive(Debug)]
    struct Element {
        name: String,
        attrs: Vec<(String, String)>,
        children: Vec<Element>,
    }

    impl Element {
        fn attr(&self, name: &str) -> Option<&str> {
            self.attrs
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.as_str())
        }

        fn walk<'a>(&'a self, out: &mut Vec<&'a Element>) {
            out.push(self);
            for c in &self.children {
                c.walk(out);
            }
        }

        fn all(&self) -> Vec<&Element> {
            let mut out = Vec::new();
            self.walk(&mut out);
            out
        }

        fn find(&self, name: &str, attr: &str, value: &str) -> Option<&Element> {
            self.all()
                .into_iter()
                .find(|e| e.name == name && e.attr(attr) == Some(value))
        }
    }

    fn check_entities(s: &str) -> Result<(), String> {
        let mut rest = s;
        while let Some(i) = rest.find('&') {
            rest = &rest[i + 1..];
            let end = rest
                .find(';')
                .ok_or_else(|| format!("unterminated entity in {s:?}"))?;
            let name = &rest[..end];
            let ok = matches!(name, "amp" | "lt" | "gt" | "quot" | "apos")
                || name
                    .strip_prefix("#x")
                    .is_some_and(|h| !h.is_empty() && h.chars().all(|c| c.is_ascii_hexdigit()))
                || name
                    .strip_prefix('#')
                    .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
            if !ok {
                return Err(format!("bad entity &{name}; in {s:?}"));
            }
        }
        if s.contains('<') {
            return Err(format!("raw < in {s:?}"));
        }
        Ok(())
    }

    fn is_name(s: &str) -> bool {
        let mut chars = s.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
    }

    /// Parses one XML element (no prolog, comments, CDATA or processing instructions: the SVG
    /// here has none), checking names, quoting, entities and nesting.
    fn parse_xml(s: &str) -> Result<Element, String> {
        let mut stack: Vec<Element> = Vec::new();
        let mut root = None;
        let mut rest = s;
        while !rest.is_empty() {
            let Some(lt) = rest.find('<') else {
                check_entities(rest)?;
                if !rest.trim().is_empty() && stack.is_empty() {
                    return Err("text outside the root".into());
                }
                break;
            };
            let text = &rest[..lt];
            check_entities(text)?;
            if !text.trim().is_empty() && stack.is_empty() {
                return Err(format!("text outside the root: {text:?}"));
            }
            rest = &rest[lt + 1..];
            let gt = rest.find('>').ok_or("unterminated tag")?;
            let tag = &rest[..gt];
            rest = &rest[gt + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                let open = stack
                    .pop()
                    .ok_or_else(|| format!("</{name}> without an open element"))?;
                if open.name != name.trim_end() {
                    return Err(format!("<{}> closed by </{name}>", open.name));
                }
                match stack.last_mut() {
                    Some(parent) => parent.children.push(open),
                    None if root.is_none() => root = Some(open),
                    None => return Err("two roots".into()),
                }
                continue;
            }
            let (tag, empty) = match tag.strip_suffix('/') {
                Some(t) => (t, true),
                None => (tag, false),
            };
            let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
            let name = &tag[..name_end];
            if !is_name(name) {
                return Err(format!("bad element name {name:?}"));
            }
            let mut attrs: Vec<(String, String)> = Vec::new();
            let mut a = tag[name_end..].trim_start();
            while !a.is_empty() {
                let eq = a
                    .find('=')
                    .ok_or_else(|| format!("attribute without value in <{tag}>"))?;
                let key = &a[..eq];
                if !is_name(key) {
                    return Err(format!("bad attribute name {key:?} in <{tag}>"));
                }
                let after = &a[eq + 1..];
                let quote = after
                    .chars()
                    .next()
                    .filter(|c| *c == '"' || *c == '\'')
                    .ok_or_else(|| format!("unquoted attribute in <{tag}>"))?;
                let close = after[1..]
                    .find(quote)
                    .ok_or_else(|| format!("unterminated attribute in <{tag}>"))?;
                let value = &after[1..1 + close];
                check_entities(value)?;
                if attrs.iter().any(|(k, _)| k == key) {
                    return Err(format!("duplicate attribute {key} in <{tag}>"));
                }
                attrs.push((key.to_string(), value.to_string()));
                let next = &after[close + 2..];
                if !next.is_empty() && !next.starts_with(char::is_whitespace) {
                    return Err(format!("no space between attributes in <{tag}>"));
                }
                a = next.trim_start();
            }
            let element = Element {
                name: name.to_string(),
                attrs,
                children: Vec::new(),
            };
            if empty {
                match stack.last_mut() {
                    Some(parent) => parent.children.push(element),
                    None if root.is_none() => root = Some(element),
                    None => return Err("two roots".into()),
                }
            } else {
                stack.push(element);
            }
        }
        if let Some(open) = stack.last() {
            return Err(format!("<{}> never closed", open.name));
        }
        root.ok_or_else(|| "no element".to_string())
    }

    #[test]
    fn the_checker_rejects_malformed_xml() {
        assert!(parse_xml(r#"<svg a="1"><g><rect/></g></svg>"#).is_ok());
        assert!(parse_xml("<svg><g></svg>").is_err());
        assert!(parse_xml(r#"<svg a=1/>"#).is_err());
        assert!(parse_xml("<svg>a & b</svg>").is_err());
        assert!(parse_xml(r#"<svg a="x" a="y"/>"#).is_err());
        assert!(parse_xml("<svg/><svg/>").is_err());
    }

    fn svgs(html: &str) -> Vec<Element> {
        let mut out = Vec::new();
        let mut rest = html;
        while let Some(start) = rest.find("<svg") {
            let end = rest[start..].find("</svg>").expect("closed svg") + start + "</svg>".len();
            out.push(parse_xml(&rest[start..end]).unwrap_or_else(|e| panic!("malformed SVG: {e}")));
            rest = &rest[end..];
        }
        out
    }

    fn meta(size: u32) -> JobMeta {
        JobMeta {
            id: JobId("pmix:<a&b>".into()),
            node: "node\"1\"".into(),
            size,
            source: "test".into(),
            executable: "/bin/app <x>".into(),
            build_id: None,
            first_seen_ns: 1_700_000_000_000_000_000 - 500_000_000,
            ended_ns: None,
        }
    }

    fn synthetic(counters: bool, iterations: u32) -> SyntheticJob {
        SyntheticJob {
            ranks: 4,
            iterations,
            phases: vec![
                Phase::new(1e6, 2.0, 0.03),
                Phase::new(5e6, 0.6, 0.03),
                Phase::new(2e7, 1.2, 0.03),
            ],
            tiny_bursts_per_phase: 2,
            outlier_share: 0.02,
            counters,
            seed: 11,
        }
    }

    /// Fill per cluster id (or "filtered") of the groups in the points or bursts group of an SVG,
    /// and the number of circles or rects in each.
    fn groups(svg: &Element, class: &str, shape: &str) -> BTreeMap<String, (String, usize)> {
        let container = svg.find("g", "class", class).expect(class);
        container
            .children
            .iter()
            .map(|g| {
                let id = g
                    .attr("data-cluster")
                    .expect("group names its cluster")
                    .to_string();
                let fill = g.attr("fill").expect("group has a fill").to_string();
                assert!(
                    g.children.iter().all(|c| c.name == shape),
                    "{class} holds only {shape}"
                );
                (id, (fill, g.children.len()))
            })
            .collect()
    }

    fn check_page(counters: bool) {
        let job = synthetic(counters, 12);
        let mut bursts = job.bursts();
        if !counters {
            // Bursts the kernel never saw on a CPU: drawn at 0, left of the log axis.
            for b in bursts.iter_mut().step_by(40) {
                b.oncpu_ns = 0;
            }
        }
        let analysis = analyse(&bursts, 4, &AnalysisParams::default()).unwrap();
        let html = render_html(&crate::store::Job::new(meta(8)), &bursts, &analysis);
        let zeros = (0..bursts.len())
            .filter(|&i| analysis.labels[i].is_some() && bursts[i].oncpu_ns == 0)
            .count();
        assert_eq!(zeros > 0, !counters);
        assert_eq!(
            html.contains(&format!("{zeros} bursts with no on-CPU time")),
            zeros > 0
        );

        assert!(!html.contains("<script"), "no scripts");
        assert_eq!(
            html.matches("http").count(),
            2,
            "only the SVG namespace, no network: {html}"
        );
        assert!(
            html.contains("pmix:&lt;a&amp;b&gt;") && !html.contains("<a&b>"),
            "escaped job id"
        );
        assert!(html.contains("node&quot;1&quot;") && html.contains("/bin/app &lt;x&gt;"));
        let svgs = svgs(&html);
        assert_eq!(svgs.len(), 2);
        let (scatter, timeline) = (&svgs[0], &svgs[1]);
        assert_eq!(scatter.attr("class"), Some("scatter"));
        assert_eq!(timeline.attr("class"), Some("timeline"));

        // One dot per analysed burst, one bar per burst.
        let points = groups(scatter, "points", "circle");
        let bars = groups(timeline, "bursts", "rect");
        let analysed = analysis.labels.iter().filter(|l| l.is_some()).count();
        assert_eq!(points.values().map(|(_, n)| n).sum::<usize>(), analysed);
        assert_eq!(bars.values().map(|(_, n)| n).sum::<usize>(), bursts.len());
        assert!(
            bars.contains_key("filtered"),
            "tiny bursts are filtered and still drawn"
        );
        assert_eq!(bars["filtered"].0, FILTERED_COLOUR);
        for c in &analysis.clusters {
            let id = c.id.to_string();
            assert_eq!(points[&id].1 as u64, c.bursts);
            assert_eq!(bars[&id].1 as u64, c.bursts);
            assert_eq!(
                points[&id].0,
                cluster_colour(c.id),
                "same colour in both views"
            );
            assert_eq!(
                bars[&id].0,
                cluster_colour(c.id),
                "same colour in both views"
            );
        }
        // The noise, if any, is grey in both.
        if let Some(noise) = &analysis.noise {
            assert_eq!(
                points["0"],
                (NOISE_COLOUR.to_string(), noise.bursts as usize)
            );
            assert_eq!(bars["0"], (NOISE_COLOUR.to_string(), noise.bursts as usize));
        }
        // Legends name every cluster with its colour, in both views.
        for svg in [scatter, timeline] {
            let legend = svg.find("g", "class", "legend").expect("legend");
            let swatches: Vec<&str> = legend
                .children
                .iter()
                .filter_map(|e| e.attr("fill"))
                .collect();
            for c in &analysis.clusters {
                assert!(swatches.contains(&cluster_colour(c.id).as_str()));
            }
        }
        // Every rank has a row label.
        for r in 0..4 {
            assert!(html.contains(&format!(">rank {r}</text>")));
        }
        let axis = if counters {
            "instructions per burst"
        } else {
            "on-CPU time per burst"
        };
        assert!(html.contains(axis), "{axis}");
        assert!(html.contains("time since the job was first seen (s)"));
    }

    #[test]
    fn page_with_counters_is_well_formed_and_consistent() {
        check_page(true);
    }

    #[test]
    fn page_without_counters_is_well_formed_and_consistent() {
        check_page(false);
    }

    #[test]
    fn large_jobs_are_subsampled_and_binned() {
        let job = synthetic(true, 40);
        let bursts = job.bursts();
        let analysis = analyse(&bursts, 4, &AnalysisParams::default()).unwrap();
        let analysed = analysis.labels.iter().filter(|l| l.is_some()).count();
        let options = HtmlOptions {
            max_points: 60,
            max_bars: 100,
            max_tooltips: 10,
        };
        assert!(analysed > options.max_points && bursts.len() > options.max_bars);
        let html = render_html_with(
            &crate::store::Job::new(meta(4)),
            &bursts,
            &analysis,
            &options,
        );
        let svgs = svgs(&html);
        let points = groups(&svgs[0], "points", "circle");
        let total: usize = points.values().map(|(_, n)| n).sum();
        let clusters = points.len();
        assert!(
            total <= options.max_points + MIN_POINTS_PER_CLUSTER * clusters,
            "{total}"
        );
        assert!(total < analysed);
        for c in &analysis.clusters {
            assert_eq!(
                points[&c.id.to_string()].1,
                (c.bursts as usize)
                    .min(MIN_POINTS_PER_CLUSTER)
                    .max(c.bursts as usize * 60 / analysed)
            );
        }
        assert!(html.contains(&format!("Showing {total} of {analysed} bursts")));
        let bars = groups(&svgs[1], "bursts", "rect");
        let rects: usize = bars.values().map(|(_, n)| n).sum();
        assert!(rects > 0 && rects <= options.max_bars, "{rects}");
        assert!(html.contains("stacks, top down, the share of its time each cluster took"));
        // Stacked columns: each cluster's area is its share of the time.
        let container = svgs[1].find("g", "class", "bursts").unwrap();
        let area = |id: &str| -> f64 {
            let g = container
                .children
                .iter()
                .find(|g| g.attr("data-cluster") == Some(id))
                .unwrap();
            g.children
                .iter()
                .map(|r| {
                    let f = |a: &str| r.attr(a).unwrap().parse::<f64>().unwrap();
                    f("width") * f("height")
                })
                .sum()
        };
        let total_area: f64 = bars.keys().map(|k| area(k)).sum();
        for c in &analysis.clusters {
            let share = c.time_ns as f64 / analysis.filter.time_in_ns as f64;
            let drawn = area(&c.id.to_string()) / total_area;
            assert!(
                (drawn - share).abs() < 0.02,
                "cluster {}: drawn {drawn}, time {share}",
                c.id
            );
        }
        // Same input, same page.
        assert_eq!(
            html,
            render_html_with(
                &crate::store::Job::new(meta(4)),
                &bursts,
                &analysis,
                &options
            )
        );
    }

    /// Bars of each paint as (x, y, width, height), from the fragments `bin_timeline` wrote.
    fn binned_rects(bar_h: f64) -> (Binning, BTreeMap<Paint, Vec<[f64; 4]>>) {
        let burst = |rank: u32, start_ns: u64, duration_ns: u64| Burst {
            rank,
            start_ns,
            duration_ns,
            ..synthetic(false, 1).bursts()[0].clone()
        };
        // Row 0: cluster 1 for 300 ns, then cluster 2 for 700; row 1: cluster 1 for 50 ns.
        let bursts = [burst(0, 0, 300), burst(0, 300, 700), burst(1, 0, 50)];
        let labels = [Some(1), Some(2), Some(1)];
        let row_of = BTreeMap::from([(0, 0), (1, 1)]);
        let mut bars = BTreeMap::new();
        // 100 px and 10 cells over 2 rows: 5 columns of 20 px, 200 ns each.
        let binning = bin_timeline(
            &mut bars,
            &bursts,
            &labels,
            &Bins {
                row_of: &row_of,
                rows: 2,
                t0: 0,
                span_ns: 1000.0,
                left: 0.0,
                right: 100.0,
                top: 0.0,
                row_h: bar_h,
                bar_h,
                max_bars: if bar_h >= 8.0 { 40 } else { 10 },
            },
        );
        let parsed = bars
            .into_iter()
            .map(|(paint, text)| {
                let root = parse_xml(&format!("<g>{text}</g>")).unwrap();
                let rects = root
                    .children
                    .iter()
                    .map(|r| {
                        let f = |a: &str| r.attr(a).unwrap().parse::<f64>().unwrap();
                        [f("x"), f("y"), f("width"), f("height")]
                    })
                    .collect();
                (paint, rects)
            })
            .collect();
        (binning, parsed)
    }

    #[test]
    fn thin_rows_show_the_majority_of_each_column() {
        let (binning, bars) = binned_rects(5.0);
        assert_eq!(binning, Binning::Majority { column_px: 20.0 });
        // Column 1 is a tie between clusters 1 and 2 (the lower id wins); row 1's only column
        // with computation is mostly MPI, so it stays white.
        assert_eq!(bars[&Some(1)], vec![[0.0, 0.0, 40.0, 5.0]]);
        assert_eq!(bars[&Some(2)], vec![[40.0, 0.0, 60.0, 5.0]]);
    }

    #[test]
    fn tall_rows_stack_the_time_shares_of_each_column() {
        let (binning, bars) = binned_rects(20.0);
        assert_eq!(binning, Binning::Stacked { column_px: 20.0 });
        assert_eq!(
            bars[&Some(1)],
            vec![
                [0.0, 0.0, 20.0, 20.0],
                [20.0, 0.0, 20.0, 10.0],
                [0.0, 20.0, 20.0, 5.0]
            ]
        );
        assert_eq!(
            bars[&Some(2)],
            vec![[20.0, 10.0, 20.0, 10.0], [40.0, 0.0, 60.0, 20.0]]
        );
    }

    #[test]
    fn live_page_draws_the_window_sequences_and_says_what_it_cannot_draw() {
        let now = 1_700_000_002_400_000_000;
        let snapshot = crate::export::phases::synthetic_snapshot(250, now);
        let window = snapshot.last_window.as_ref().unwrap();
        let tables =
            crate::export::phases::render_live_phases(&JobId("pmix:<a&b>".into()), &snapshot, now);
        let html = render_live_html(
            &crate::store::Job::new(meta(4)),
            &snapshot,
            &tables,
            "127.0.0.1:9464",
        );
        assert!(
            !html.contains("<script") && html.matches("http").count() == 1,
            "no network: {html}"
        );
        assert!(
            html.contains("live from the daemon at 127.0.0.1:9464"),
            "{html}"
        );
        assert!(html.contains("Not drawn: they need every burst"), "{html}");
        assert!(
            html.contains("== phases of job pmix:&lt;a&amp;b&gt; in the last clustered window"),
            "the tables, escaped"
        );
        let svgs = svgs(&html);
        assert_eq!(svgs.len(), 1);
        assert_eq!(svgs[0].attr("class"), Some("sequences"));
        // One bar per analysed burst (no two neighbours alike in this loop), coloured by stable id.
        let bars = groups(&svgs[0], "bursts", "rect");
        for phase in &window.phases {
            let id = phase.id.to_string();
            assert_eq!(
                bars[&id],
                (cluster_colour(phase.id), phase.stats.bursts as usize),
                "phase {id}"
            );
        }
        let drawn: usize = bars.values().map(|(_, n)| n).sum();
        assert_eq!(
            drawn,
            window
                .sequences
                .iter()
                .map(|s| s.phases.len())
                .sum::<usize>()
        );
        for r in 0..4 {
            assert!(html.contains(&format!(">rank {r}</text>")));
        }
    }

    #[test]
    fn long_sequences_show_the_phase_of_most_bursts_per_column() {
        let snapshot = crate::export::phases::synthetic_snapshot(250, 1_700_000_002_400_000_000);
        let window = snapshot.last_window.as_ref().unwrap();
        let longest = window
            .sequences
            .iter()
            .map(|s| s.phases.len())
            .max()
            .unwrap();
        // 4 ranks × 10 columns.
        let options = HtmlOptions {
            max_bars: 40,
            ..HtmlOptions::default()
        };
        let (svg, caption) = sequences(window, &options);
        assert!(
            caption.contains(&format!(
                "{longest} bursts per rank are more than 10 columns"
            )),
            "{caption}"
        );
        let svg = parse_xml(&svg).unwrap();
        let bars = groups(&svg, "bursts", "rect");
        let drawn: usize = bars.values().map(|(_, n)| n).sum();
        assert!((4..=40).contains(&drawn), "{bars:?}");
    }

    #[test]
    fn runs_of_equal_cells() {
        assert_eq!(runs(&[1, 1, 2, 1]), vec![(0, 2), (2, 3), (3, 4)]);
        assert_eq!(runs::<u8>(&[]), vec![]);
    }

    #[test]
    fn one_file_per_job_when_there_are_several() {
        let id = JobId("pmix:1234/0 x".into());
        assert_eq!(
            html_path(Path::new("/tmp/v.html"), &id, false),
            PathBuf::from("/tmp/v.html")
        );
        assert_eq!(
            html_path(Path::new("/tmp/v.html"), &id, true),
            PathBuf::from("/tmp/v-pmix_1234_0_x.html")
        );
        assert_eq!(
            html_path(Path::new("out"), &id, true),
            PathBuf::from("out-pmix_1234_0_x")
        );
    }

    #[test]
    fn palette_is_fixed_and_distinct() {
        assert_eq!(cluster_colour(1), "#1f77b4");
        assert_eq!(cluster_colour(NOISE), NOISE_COLOUR);
        let colours: BTreeSet<String> = (0..60).map(cluster_colour).collect();
        assert_eq!(colours.len(), 60);
        assert!(!colours.contains(FILTERED_COLOUR));
    }

    #[test]
    fn log_ticks_and_steps() {
        let s = Scale {
            lo: 5e5,
            hi: 3e7,
            px_lo: 0.0,
            px_hi: 100.0,
            log: true,
        };
        assert_eq!(s.ticks(), vec![5e5, 1e6, 2e6, 5e6, 1e7, 2e7]);
        let s = Scale {
            lo: 5e5,
            hi: 3e8,
            px_lo: 0.0,
            px_hi: 100.0,
            log: true,
        };
        assert_eq!(s.ticks(), vec![1e6, 1e7, 1e8]);
        let s = Scale {
            lo: 1.5e6,
            hi: 4e6,
            px_lo: 0.0,
            px_hi: 100.0,
            log: true,
        };
        assert_eq!(s.ticks(), vec![2e6]);
        assert_eq!(nice_step(0.13), 0.2);
        assert_eq!(nice_step(7.0), 10.0);
        let s = Scale {
            lo: 0.0,
            hi: 1.2,
            px_lo: 0.0,
            px_hi: 100.0,
            log: false,
        };
        assert_eq!(s.ticks().len(), 7);
        assert_eq!(escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
        assert_eq!(tick_label(count(1e6)), "1M");
        assert_eq!(tick_label(duration(2_500_000)), "2.5 ms");
        assert_eq!(tick_label(duration(500_000)), "500 µs");
        assert_eq!(tick_label(duration(10_000_000)), "10 ms");
    }
}
