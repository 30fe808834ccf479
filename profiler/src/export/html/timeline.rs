//! The per-rank timeline: one row per rank, each burst a bar from its start to its end coloured by
//! its cluster; above the bar budget, per pixel column. With the job's rank groups the rows go
//! group by group, so ranks of one behaviour sit together.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
};

use super::{
    plot::{
        cluster_legend, escape, nice_step, runs, seconds_label, LegendItem, Paint, RankRows, Scale,
        FILTERED_COLOUR,
    },
    HtmlOptions,
};
use crate::{
    analysis::{groups::RankGroupsView, Analysis, ClusterId, NOISE},
    export::{groups::rank_list, phases::duration},
    model::Burst,
    store::Job,
    symbols::SiteNames,
};

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

/// The rank × time timeline and a caption for it.
pub(super) fn timeline(
    job: &Job,
    bursts: &[Burst],
    analysis: &Analysis,
    options: &HtmlOptions,
    names: &SiteNames,
    groups: Option<&RankGroupsView>,
) -> (String, String) {
    let ranks = ranks_in_group_order(job, bursts, groups);
    let row_of: BTreeMap<u32, usize> = ranks.iter().enumerate().map(|(i, &r)| (r, i)).collect();
    let (t0, t1) = time_span(job, bursts);
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
        let tooltip_names = tooltips.then_some(names);
        burst_bars(
            &mut bars,
            bursts,
            analysis,
            &frame,
            &row_of,
            x_of,
            tooltip_names,
        );
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

    let step = nice_step(scale.hi / 6.0);
    let svg = frame.svg(
        "timeline",
        &scale,
        |v| seconds_label(v, step),
        "time since the job was first seen (s)",
        &bars,
        &timeline_legend(analysis, names),
    );
    let caption = caption(job, bursts, ranks.len(), groups, binned, options.max_bars);
    (svg, caption)
}

/// The job's ranks (those it knows and those with bursts), group by group (in the groups'
/// order, members ascending), then any rank in none.
fn ranks_in_group_order(job: &Job, bursts: &[Burst], groups: Option<&RankGroupsView>) -> Vec<u32> {
    let mut ranks: Vec<u32> = job
        .ranks
        .keys()
        .copied()
        .chain(bursts.iter().map(|b| b.rank))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let group_of: BTreeMap<u32, usize> = groups
        .iter()
        .flat_map(|v| v.groups.iter().enumerate())
        .flat_map(|(i, g)| g.members.iter().map(move |&r| (r, i)))
        .collect();
    ranks.sort_by_key(|r| (group_of.get(r).copied().unwrap_or(usize::MAX), *r));
    ranks
}

/// The time the timeline spans: from the job's first sight or first burst, whichever is
/// earlier, to the end of the last burst (at least 1 ns).
fn time_span(job: &Job, bursts: &[Burst]) -> (u64, u64) {
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
    (t0, t1)
}

/// One bar per burst, from its start to its end (`x_of`) in its rank's row, into the fragment of
/// its paint; with a tooltip when `tooltip_names` names the call sites.
fn burst_bars(
    bars: &mut BTreeMap<Paint, String>,
    bursts: &[Burst],
    analysis: &Analysis,
    rows: &RankRows<'_>,
    row_of: &BTreeMap<u32, usize>,
    x_of: impl Fn(u64) -> f64,
    tooltip_names: Option<&SiteNames>,
) {
    let bar_h = rows.bar_h;
    for (i, b) in bursts.iter().enumerate() {
        let paint = analysis.labels[i];
        let x = x_of(b.start_ns);
        let w = (x_of(b.start_ns + b.duration_ns) - x).max(0.4);
        let y = rows.bar_y(row_of[&b.rank]);
        let out = bars.entry(paint).or_default();
        if let Some(names) = tooltip_names {
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
                    names.region(&b.start_site, &b.end_site)
                ))
            );
        } else {
            let _ = writeln!(
                out,
                r#"<rect x="{x:.2}" y="{y:.1}" width="{w:.2}" height="{bar_h:.1}"/>"#
            );
        }
    }
}

/// The clusters, the filtered bursts (if any) and MPI.
fn timeline_legend(analysis: &Analysis, names: &SiteNames) -> Vec<LegendItem> {
    let mut items = cluster_legend(
        "cluster",
        analysis.clusters.iter(),
        analysis.noise.as_ref(),
        names,
    );
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
    items
}

/// The caption: the rows, their order by rank group, how the bars were binned and the bursts no
/// longer held.
fn caption(
    job: &Job,
    bursts: &[Burst],
    ranks: usize,
    groups: Option<&RankGroupsView>,
    binned: Option<Binning>,
    max_bars: usize,
) -> String {
    let mut caption = format!(
        "One row per rank on this node ({} rank{}), each burst a bar from its start to its end coloured by its cluster; white is MPI time.",
        ranks,
        if ranks == 1 { "" } else { "s" }
    );
    if let Some(v) = groups.filter(|v| v.groups.len() > 1) {
        let order: Vec<String> = v
            .groups
            .iter()
            .map(|g| format!("group {} [{}]", g.id, rank_list(&g.members)))
            .collect();
        let _ = write!(caption, " Rows by rank group: {}.", order.join(", "));
    }
    match binned {
        Some(Binning::Stacked { column_px }) => {
            let _ = write!(
                caption,
                " {} bursts are more than {} bars, so each column of {column_px:.1} px stacks, top \
                 down, the share of its time each cluster took; white is the rest.",
                bursts.len(),
                max_bars
            );
        }
        Some(Binning::Majority { column_px }) => {
            let _ = write!(
                caption,
                " {} bursts are more than {} bars, so each column of {column_px:.1} px shows \
                 whatever took most of its time (MPI included).",
                bursts.len(),
                max_bars
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
    caption
}

#[cfg(test)]
mod tests {
    use super::{super::testing::*, *};
    use crate::analysis::synthetic::SyntheticJob;

    /// Bars of each paint as (x, y, width, height), from the fragments `bin_timeline` wrote.
    fn binned_rects(bar_h: f64) -> (Binning, BTreeMap<Paint, Vec<[f64; 4]>>) {
        let burst = |rank: u32, start_ns: u64, duration_ns: u64| Burst {
            rank,
            start_ns,
            duration_ns,
            ..SyntheticJob::three_phases(1, 1, false).bursts()[0].clone()
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
}
