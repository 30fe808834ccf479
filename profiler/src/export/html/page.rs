//! The HTML pages: one per job with both views and the phase table, and the live page of a job a
//! daemon is running.

use std::fmt::Write as _;

use super::{
    plot::escape, scatter::scatter, sequences::sequences, timeline::timeline, HtmlOptions,
};
use crate::{
    analysis::{groups::RankGroupsView, online::PhasesSnapshot, Analysis},
    export::phases::{features_line, render_phases},
    model::{Burst, JobId},
    store::Job,
    symbols::SiteNames,
};

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
/// analysis was run on, in the same order (`analysis.labels[i]` is the label of `bursts[i]`);
/// `names` name their call sites; the timeline's rows follow the job's rank `groups` when given.
pub fn render_html(
    job: &Job,
    bursts: &[Burst],
    analysis: &Analysis,
    names: &SiteNames,
    groups: Option<&RankGroupsView>,
) -> String {
    render_html_with(
        job,
        bursts,
        analysis,
        names,
        groups,
        &HtmlOptions::default(),
    )
}

/// [`render_html`] with explicit drawing limits.
///
/// # Panics
/// When `analysis` was not computed from `bursts` (the number of labels differs).
pub fn render_html_with(
    job: &Job,
    bursts: &[Burst],
    analysis: &Analysis,
    names: &SiteNames,
    groups: Option<&RankGroupsView>,
    options: &HtmlOptions,
) -> String {
    assert_eq!(
        analysis.labels.len(),
        bursts.len(),
        "render_html needs the bursts the analysis was computed from, in the same order"
    );
    let m = &job.meta;
    let (scatter_svg, scatter_caption) = scatter(bursts, analysis, options, names);
    let (timeline_svg, timeline_caption) = timeline(job, bursts, analysis, options, names, groups);
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
                content: format!(
                    "<pre>{}</pre>\n",
                    escape(&render_phases(&m.id, analysis, names))
                ),
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

/// The HTML page of a job a daemon is running, from its JSON API: the window's phase sequences
/// (the daemon's snapshot carries them) and the phase tables `tables`. The scatter plot and the
/// timeline are left out, and the page says so: they need the bursts themselves, which the API
/// does not serve.
pub fn render_live_html(
    job: &Job,
    snapshot: &PhasesSnapshot,
    tables: &str,
    daemon: &str,
    names: &SiteNames,
) -> String {
    let m = &job.meta;
    let mut meta = vec![format!(
        "node {} · {} · {} of {} ranks on this node · live from the daemon at {daemon}",
        m.node, m.executable, snapshot.ranks, m.size
    )];
    let mut sections = Vec::new();
    if let Some(window) = &snapshot.last_window {
        meta.push(features_line(&window.features));
        let (svg, caption) = sequences(window, &HtmlOptions::default(), names);
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
    use std::path::{Path, PathBuf};

    use super::{
        super::{
            plot::{cluster_colour, FILTERED_COLOUR, NOISE_COLOUR},
            scatter::MIN_POINTS_PER_CLUSTER,
            testing::*,
        },
        *,
    };
    use crate::analysis::{analyse, synthetic::SyntheticJob, AnalysisParams};

    fn check_page(counters: bool) {
        let job = SyntheticJob::three_phases(4, 12, counters);
        let mut bursts = job.bursts();
        if !counters {
            // Bursts the kernel never saw on a CPU: drawn at 0, left of the log axis.
            for b in bursts.iter_mut().step_by(40) {
                b.oncpu_ns = 0;
            }
        }
        let analysis = analyse(&bursts, 4, &AnalysisParams::default()).unwrap();
        let html = render_html(
            &crate::store::Job::new(meta_needing_escapes(8)),
            &bursts,
            &analysis,
            &SiteNames::default(),
            None,
        );
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
        let job = SyntheticJob::three_phases(4, 40, true);
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
            &crate::store::Job::new(meta_needing_escapes(4)),
            &bursts,
            &analysis,
            &SiteNames::default(),
            None,
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
                &crate::store::Job::new(meta_needing_escapes(4)),
                &bursts,
                &analysis,
                &SiteNames::default(),
                None,
                &options
            )
        );
    }

    #[test]
    fn timeline_rows_go_group_by_group() {
        use crate::analysis::groups::{cluster::GroupSignature, RankGroup, RankGroupsView};
        let job = SyntheticJob::three_phases(4, 12, false);
        let bursts = job.bursts();
        let analysis = analyse(&bursts, 4, &AnalysisParams::default()).unwrap();
        let group = |id, members: Vec<u32>| RankGroup {
            id,
            lead: members[0],
            members,
            signature: GroupSignature {
                main_group: id,
                call_path: Vec::new(),
                functions: Default::default(),
                call_sites: Vec::new(),
            },
        };
        let view = RankGroupsView {
            groups: vec![group(1, vec![1, 3]), group(2, vec![0, 2])],
            ..RankGroupsView::default()
        };
        let job = crate::store::Job::new(meta_needing_escapes(4));
        let html = render_html(&job, &bursts, &analysis, &SiteNames::default(), Some(&view));
        let rows: Vec<usize> = (0..4)
            .map(|r| html.find(&format!(">rank {r}</text>")).unwrap())
            .collect();
        assert!(
            rows[1] < rows[3] && rows[3] < rows[0] && rows[0] < rows[2],
            "{rows:?}"
        );
        assert!(html.contains("Rows by rank group: group 1 [1,3], group 2 [0,2]."));
    }

    #[test]
    fn live_page_draws_the_window_sequences_and_says_what_it_cannot_draw() {
        let now = 1_700_000_002_400_000_000;
        let snapshot = crate::export::phases::synthetic_snapshot(250, now);
        let window = snapshot.last_window.as_ref().unwrap();
        let names = SiteNames::default();
        let tables = crate::export::phases::render_live_phases(
            &JobId("pmix:<a&b>".into()),
            &snapshot,
            now,
            &names,
        );
        let html = render_live_html(
            &crate::store::Job::new(meta_needing_escapes(4)),
            &snapshot,
            &tables,
            "127.0.0.1:9464",
            &names,
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
}
