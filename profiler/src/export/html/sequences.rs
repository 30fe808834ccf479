//! The per-rank phase sequences of a window the daemon analysed: each rank's analysed bursts in
//! their order, coloured by stable phase id.

use std::{collections::BTreeMap, fmt::Write as _};

use super::{
    plot::{cluster_legend, runs, Paint, RankRows, Scale},
    HtmlOptions,
};
use crate::{
    analysis::{online::WindowView, ClusterId, NOISE},
    export::phases::utc_span,
    symbols::SiteNames,
};

/// The rank × position view of a window's phase sequences and a caption for it: each rank's
/// analysed bursts in their order, coloured by stable phase id. Not to time scale: the daemon
/// keeps, per window, the order of the phases, not when each burst ran. Above the bar budget each
/// column shows the phase most of its bursts had.
pub(super) fn sequences(
    window: &WindowView,
    options: &HtmlOptions,
    names: &SiteNames,
) -> (String, String) {
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
        names,
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

#[cfg(test)]
mod tests {
    use super::{super::testing::*, *};

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
        let (svg, caption) = sequences(window, &options, &SiteNames::default());
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
}
