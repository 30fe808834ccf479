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
//!
//! Files: `plot.rs`, the small plotting library the views draw with (colours, scales, axes,
//! legends, rows of ranks); `scatter.rs`, the cluster scatter plot; `timeline.rs`, the timeline;
//! `sequences.rs`, the per-rank phase sequences of a window the daemon analysed (the live page's
//! view); `page.rs`, the HTML pages that hold them.

mod page;
mod plot;
mod scatter;
mod sequences;
#[cfg(test)]
mod testing;
mod timeline;

pub use page::{html_path, render_html, render_html_with, render_live_html};
pub use plot::{cluster_colour, escape, FILTERED_COLOUR, NOISE_COLOUR};
pub use scatter::MIN_POINTS_PER_CLUSTER;

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
