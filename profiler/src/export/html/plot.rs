//! The plotting library the views draw with: one colour per cluster, linear and log scales with
//! their ticks, axes, legends, labels, and the layout of a chart with one row per rank. Everything
//! is SVG text.

use std::{collections::BTreeMap, fmt::Write as _};

use crate::{
    analysis::{ClusterId, ClusterStats, NOISE},
    symbols::SiteNames,
};

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

pub(super) const WIDTH: f64 = 1100.0;
pub(super) const FONT: &str = r#"font-family="sans-serif" font-size="11""#;

/// What a burst is painted as: `Some(cluster)` (noise included) or `None` when filtered out.
pub(super) type Paint = Option<ClusterId>;

pub(super) fn paint_colour(p: Paint) -> String {
    match p {
        Some(id) => cluster_colour(id),
        None => FILTERED_COLOUR.to_string(),
    }
}

pub(super) fn paint_attr(p: Paint) -> String {
    match p {
        Some(id) => format!(r#"data-cluster="{id}""#),
        None => r#"data-cluster="filtered""#.to_string(),
    }
}

/// A linear or log₁₀ map from data values to pixels.
#[derive(Clone, Copy, Debug)]
pub(super) struct Scale {
    pub(super) lo: f64,
    pub(super) hi: f64,
    pub(super) px_lo: f64,
    pub(super) px_hi: f64,
    pub(super) log: bool,
}

impl Scale {
    pub(super) fn at(&self, v: f64) -> f64 {
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
pub(super) fn nice_step(raw: f64) -> f64 {
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
pub(super) fn log_scale(values: impl Iterator<Item = f64>, px_lo: f64, px_hi: f64) -> Scale {
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
pub(super) fn tick_label(label: String) -> String {
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
pub(super) fn seconds_label(v: f64, step: f64) -> String {
    let decimals = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()) as usize
    };
    format!("{v:.decimals$} s")
}

/// An x axis along the bottom of the plot area: line, ticks, labels, title.
pub(super) fn x_axis(
    svg: &mut String,
    scale: &Scale,
    y: f64,
    label: impl Fn(f64) -> String,
    title: &str,
) {
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
pub(super) fn y_axis(
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
pub(super) struct LegendItem {
    pub(super) colour: String,
    /// Drawn with a dark outline (for white).
    pub(super) outline: bool,
    pub(super) text: String,
}

/// Characters of a code region's name in a legend entry.
const LEGEND_REGION_CHARS: usize = 90;

/// Legend entries in rows under the plot, starting at `y`, as many to a row as the longest
/// entry allows; returns the height used.
pub(super) fn legend(svg: &mut String, items: &[LegendItem], x0: f64, y: f64) -> f64 {
    const ROW: f64 = 18.0;
    let widest = items
        .iter()
        .map(|i| i.text.chars().count())
        .max()
        .unwrap_or(0);
    let item_width = (widest as f64 * 6.2 + 30.0).max(265.0);
    let per_row = (((WIDTH - x0 - 10.0) / item_width).floor() as usize).max(1);
    let _ = writeln!(svg, r#"<g class="legend">"#);
    for (i, item) in items.iter().enumerate() {
        let x = x0 + (i % per_row) as f64 * item_width;
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

/// Legend entries for clusters (`word` "cluster") or tracked phases ("phase"), each named by its
/// code region with most bursts, and the noise.
pub(super) fn cluster_legend<'a>(
    word: &str,
    clusters: impl Iterator<Item = &'a ClusterStats>,
    noise: Option<&ClusterStats>,
    names: &SiteNames,
) -> Vec<LegendItem> {
    let mut items: Vec<LegendItem> = clusters
        .map(|c| {
            let mut text = format!("{word} {}: {:.1}% of time", c.id, 100.0 * c.time_share);
            if let Some(ipc) = c.ipc {
                let _ = write!(text, ", IPC {ipc:.2}");
            }
            let _ = write!(text, ", SPMD {:.2}", c.spmd_score);
            if let Some(r) = c.regions.first() {
                let region = shorten(&names.region(&r.start, &r.end), LEGEND_REGION_CHARS);
                let _ = write!(text, " · {region}");
            }
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

/// A label cut to at most `max` characters, keeping its end (where a region's end and a
/// site's line are).
pub(super) fn shorten(s: &str, max: usize) -> String {
    let n = s.chars().count();
    if n > max {
        let tail: String = s.chars().skip(n - (max - 1)).collect();
        format!("…{tail}")
    } else {
        s.to_string()
    }
}

/// The runs of equal neighbours in `cells`, as `(first, end)` index ranges: adjacent cells that
/// look the same are drawn as one bar.
pub(super) fn runs<T: PartialEq>(cells: &[T]) -> Vec<(usize, usize)> {
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

/// The layout of a chart with one row per rank: bars in the rows, an x axis below them, then a
/// legend.
#[derive(Clone, Copy)]
pub(super) struct RankRows<'a> {
    /// One row each, top down.
    pub(super) ranks: &'a [u32],
    pub(super) left: f64,
    pub(super) right: f64,
    pub(super) top: f64,
    pub(super) row_h: f64,
    pub(super) bar_h: f64,
    pub(super) plot_h: f64,
}

impl<'a> RankRows<'a> {
    pub(super) fn new(ranks: &'a [u32]) -> Self {
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
    pub(super) fn bar_y(&self, row: usize) -> f64 {
        self.top + row as f64 * self.row_h + (self.row_h - self.bar_h) / 2.0
    }

    /// The whole chart: rank labels, the x axis (`scale`, `tick` labels, `title`), the bars
    /// (`<rect>` fragments grouped by paint, drawn in paint order) and the legend.
    pub(super) fn svg(
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::export::phases::{count, duration};

    #[test]
    fn runs_of_equal_cells() {
        assert_eq!(runs(&[1, 1, 2, 1]), vec![(0, 2), (2, 3), (3, 4)]);
        assert_eq!(runs::<u8>(&[]), vec![]);
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
