//! The JSON documents of `mpiburst report --format json` and `mpiburst compare --format json`,
//! for scripts and CI pipelines (schema in docs/report-json.md): what the text shows, built from
//! the same structures the text is rendered from, numbers in base units and never formatted.

use std::path::Path;

use serde::Serialize;

use crate::{
    analysis::{
        groups::RankGroupsView,
        online::{CumulativeView, OpenWindow, PhaseView, PhasesSnapshot},
        signature::AppSignature,
        tracking::{AppIdentity, EventCounts, RunMatch, RunSignature, StableId},
        Analysis, AnalysisParams, ClusterStats, ClusteringReport, FeatureReport, FilterReport,
    },
    export::{
        bottlenecks::Bottlenecks,
        phases::{active_phases, current_window, KernelFilter},
        recording::NodeRanks,
        report::JobReport,
    },
    symbols::SiteName,
};

/// The `schema` of `mpiburst report --format json`.
pub const REPORT_SCHEMA: &str = "mpiburst-report";
/// The `schema` of `mpiburst compare --format json`.
pub const COMPARE_SCHEMA: &str = "mpiburst-compare";
/// The `version` of both schemas: additive changes keep it, renames and removals bump it.
pub const SCHEMA_VERSION: u32 = 1;

/// `mpiburst report --format json`: one document per invocation.
#[derive(Clone, Debug, Serialize)]
pub struct ReportDocument {
    pub schema: &'static str,
    pub version: u32,
    /// One [`JobDocument`] per job reported, in the order of the text.
    pub jobs: Vec<serde_json::Value>,
}

impl ReportDocument {
    pub fn new(jobs: Vec<serde_json::Value>) -> ReportDocument {
        ReportDocument {
            schema: REPORT_SCHEMA,
            version: SCHEMA_VERSION,
            jobs,
        }
    }
}

/// One job of the report: the job report's fields, then its bottlenecks and phases.
#[derive(Clone, Debug, Serialize)]
pub struct JobDocument<'a> {
    #[serde(flatten)]
    pub report: JobReport<'a>,
    /// Over the job's life on its node; `None` while a daemon has not evaluated them yet.
    pub bottlenecks: Option<Bottlenecks<'a>>,
    /// With `--phases` only.
    pub phases: Option<PhasesDocument<'a>>,
    /// The rank groups and behaviour changes (as `GET /api/jobs/{id}/ranks`); `None` from a
    /// daemon that has not grouped the job yet.
    pub rank_groups: Option<&'a RankGroupsView>,
    /// In a report merged from the recordings of several nodes only: which node recorded which
    /// ranks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<NodeRanks<'a>>>,
}

/// An application signature with the values its text section derives: PAET and coverage.
#[derive(Clone, Debug, Serialize)]
pub struct SignatureView {
    #[serde(flatten)]
    pub signature: AppSignature,
    /// Σ PET × W, in ns.
    pub paet_ns: f64,
    /// PAET ÷ run time.
    pub coverage: f64,
}

impl From<AppSignature> for SignatureView {
    fn from(signature: AppSignature) -> Self {
        SignatureView {
            paet_ns: signature.paet_ns(),
            coverage: signature.coverage(),
            signature,
        }
    }
}

/// The phases of one job, from where the report read them.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum PhasesDocument<'a> {
    /// Clustered from a recording's bursts.
    Recording {
        /// The kernel's duration filter the recording was made with.
        min_burst_ns: u64,
        /// `None` when the recording holds no burst of the job.
        analysis: Option<AnalysisView<'a>>,
        kernel_filter: Option<KernelFilter>,
        /// The call sites of the code regions, named.
        call_sites: Vec<&'a SiteName>,
        /// The application signature of the run, as the text's signature section shows it;
        /// `None` without an analysis or a region of interest.
        signature: Option<SignatureView>,
    },
    /// A running daemon's online analysis.
    Daemon {
        /// `None` before the daemon started one (it does with the job's first bursts).
        online: Option<OnlineView<'a>>,
        kernel_filter: Option<KernelFilter>,
        /// The call sites of the code regions, named.
        call_sites: Vec<&'a SiteName>,
    },
}

/// An [`Analysis`] without its per-burst labels.
#[derive(Clone, Debug, Serialize)]
pub struct AnalysisView<'a> {
    pub params: &'a AnalysisParams,
    pub ranks: u32,
    pub global_score: f64,
    pub features: &'a FeatureReport,
    pub filter: &'a FilterReport,
    pub clustering: &'a ClusteringReport,
    pub clusters: &'a [ClusterStats],
    pub noise: Option<&'a ClusterStats>,
}

impl<'a> From<&'a Analysis> for AnalysisView<'a> {
    fn from(a: &'a Analysis) -> Self {
        AnalysisView {
            params: &a.params,
            ranks: a.ranks,
            global_score: a.global_score,
            features: &a.features,
            filter: &a.filter,
            clustering: &a.clustering,
            clusters: &a.clusters,
            noise: a.noise.as_ref(),
        }
    }
}

/// The daemon's online analysis of one job as the text shows it at a time: the last clustered
/// window, the open one, the tracking and the whole job so far.
#[derive(Clone, Debug, Serialize)]
pub struct OnlineView<'a> {
    pub ranks: u32,
    pub window_ns: u64,
    pub last_window: Option<WindowSummary<'a>>,
    pub current_window: OpenWindow,
    /// Windows that held too few bursts to be clustered alone; their bursts went to the next.
    pub windows_carried: u64,
    pub tracking: Tracking<'a>,
    pub last_error: Option<&'a str>,
    pub whole_job: Option<&'a CumulativeView>,
    /// The job's signature up to the end of the last closed window, with the last clustering's
    /// phases.
    pub signature: Option<LiveSignatureView>,
}

/// A running job's signature, with the instant it is of.
#[derive(Clone, Debug, Serialize)]
pub struct LiveSignatureView {
    /// Unix ns: the end of the window whose repetitions it counts.
    pub up_to_ns: u64,
    #[serde(flatten)]
    pub signature: SignatureView,
}

impl<'a> OnlineView<'a> {
    /// The view of `s` at `now_ns` (Unix), which gives the open window before the daemon's
    /// first tick.
    pub fn new(s: &'a PhasesSnapshot, now_ns: u64) -> OnlineView<'a> {
        OnlineView {
            ranks: s.ranks,
            window_ns: s.window_ns,
            last_window: s.last_window.as_ref().map(|w| WindowSummary {
                window: w.window,
                start_ns: w.start_ns,
                end_ns: w.end_ns,
                partial: w.partial,
                bursts_seen: w.bursts_seen,
                bursts_analysed: w.bursts_analysed,
                bursts_dropped: w.bursts_dropped,
                features: &w.features,
                filter: &w.filter,
                clustering: &w.clustering,
                spmd_score: w.spmd_score,
                phases: &w.phases,
                noise: w.noise.as_ref(),
            }),
            current_window: current_window(s, now_ns),
            windows_carried: s.totals.windows_carried,
            tracking: Tracking {
                active: active_phases(s),
                dormant: &s.dormant_ids,
                event_counts: &s.event_counts,
            },
            last_error: s.last_error.as_deref(),
            whole_job: s.cumulative.as_ref(),
            signature: s.signature.as_ref().map(|live| LiveSignatureView {
                up_to_ns: live.up_to_ns,
                signature: live.signature.clone().into(),
            }),
        }
    }
}

/// A clustered window without its per-rank phase sequences.
#[derive(Clone, Debug, Serialize)]
pub struct WindowSummary<'a> {
    pub window: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub partial: bool,
    pub bursts_seen: u64,
    pub bursts_analysed: u64,
    pub bursts_dropped: u64,
    pub features: &'a FeatureReport,
    pub filter: &'a FilterReport,
    pub clustering: &'a ClusteringReport,
    pub spmd_score: f64,
    pub phases: &'a [PhaseView],
    pub noise: Option<&'a ClusterStats>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Tracking<'a> {
    pub active: Vec<StableId>,
    pub dormant: &'a [StableId],
    /// Tracking events since the job started, by kind.
    pub event_counts: &'a EventCounts,
}

/// `mpiburst compare --format json`.
#[derive(Clone, Debug, Serialize)]
pub struct CompareDocument<'a> {
    pub schema: &'static str,
    pub version: u32,
    pub before: RunSide<'a>,
    pub after: RunSide<'a>,
    #[serde(rename = "match")]
    pub run_match: &'a RunMatch,
    /// The call sites of both runs' code regions, named.
    pub call_sites: Vec<&'a SiteName>,
}

impl<'a> CompareDocument<'a> {
    pub fn new(
        before: RunSide<'a>,
        after: RunSide<'a>,
        m: &'a RunMatch,
        call_sites: Vec<&'a SiteName>,
    ) -> CompareDocument<'a> {
        CompareDocument {
            schema: COMPARE_SCHEMA,
            version: SCHEMA_VERSION,
            before,
            after,
            run_match: m,
            call_sites,
        }
    }
}

/// One of the two runs compared.
#[derive(Clone, Debug, Serialize)]
pub struct RunSide<'a> {
    pub recording: &'a Path,
    pub job: &'a str,
    pub app: &'a AppIdentity,
    pub ranks: u32,
    pub start_ns: u64,
    pub end_ns: u64,
    pub spmd_score: f64,
}

impl<'a> RunSide<'a> {
    pub fn new(recording: &'a Path, s: &'a RunSignature) -> RunSide<'a> {
        RunSide {
            recording,
            job: &s.label,
            app: &s.app,
            ranks: s.frame.ranks,
            start_ns: s.start_ns,
            end_ns: s.end_ns,
            spmd_score: s.frame.spmd_score,
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::symbols::SiteNames;
    use crate::{
        analysis::{
            analyse,
            synthetic::{Phase, SyntheticJob},
            tracking::{match_runs, TrackingParams},
        },
        export::{
            phases::{render_live_phases, render_phases, render_run_match},
            recording::{
                write_synthetic, Recording, RecordingEnd, RecordingHeader, FORMAT_VERSION,
            },
        },
        model::JobId,
        properties::PropertyConfig,
        test_support::JobMetaBuilder,
    };

    /// 2023-11-14 22:13:20 UTC, where the synthetic jobs start.
    const T0: u64 = 1_700_000_000_000_000_000;

    /// 4 ranks, 3 phases, 20 iterations; rank 3 does 2.5 times the work of the longest phase.
    fn synthetic() -> SyntheticJob {
        SyntheticJob {
            ranks: 4,
            iterations: 20,
            phases: vec![
                Phase {
                    imbalance: Some((3, 2.5)),
                    ..Phase::new(2e7, 1.2, 0.03)
                },
                Phase::new(5e6, 0.6, 0.03),
                Phase::new(1e6, 2.0, 0.03),
            ],
            tiny_bursts_per_phase: 2,
            outlier_share: 0.0,
            counters: false,
            seed: 7,
        }
    }

    /// `job` written to a recording in `dir` as a job that ended with its last burst, and read
    /// back.
    fn recorded(dir: &Path, name: &str, job: &SyntheticJob) -> Recording {
        let bursts = job.bursts();
        let end = bursts
            .iter()
            .map(|b| b.start_ns + b.duration_ns)
            .max()
            .unwrap();
        let path = dir.join(name);
        write_synthetic(
            &path,
            RecordingHeader {
                version: FORMAT_VERSION,
                node: "n1".into(),
                started_ns: T0,
                min_burst_ns: 1_000,
                counter_events: None,
                counters_note: "no counters".into(),
                functions: vec!["MPI_Allreduce".into(), "MPI_Isend".into()],
                rank_groups: None,
            },
            &JobMetaBuilder::new(format!("pmix:{name}"))
                .node("n1")
                .size(job.ranks)
                .executable("/bin/synthetic")
                .first_seen_ns(T0)
                .ended_ns(Some(end))
                .build(),
            &bursts,
            RecordingEnd {
                ended_ns: end + 1_000_000,
                lost: Default::default(),
            },
        )
        .unwrap();
        Recording::read(&path).unwrap()
    }

    /// The text of a number as the text output prints it with `decimals`.
    fn fixed(v: &Value, decimals: usize) -> String {
        format!("{:.*}", decimals, v.as_f64().expect("a number"))
    }

    #[test]
    fn report_document_has_the_values_of_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let r = recorded(dir.path(), "a", &synthetic());
        let job = r.jobs.values().next().unwrap();
        let now = r.end.as_ref().unwrap().ended_ns;
        let report = JobReport::new(job, now, &r.header.counters_note);
        let properties = r.job_properties(job, now, &PropertyConfig::default());
        let bottlenecks = Bottlenecks::new(&properties);
        let bursts: Vec<_> = job.bursts.iter().cloned().collect();
        let analysis = analyse(&bursts, job.node_ranks(), &Default::default()).unwrap();
        let text = [
            report.text(),
            bottlenecks.text("over its life"),
            render_phases(&job.meta.id, &analysis, &SiteNames::default()),
        ]
        .concat();
        let document = JobDocument {
            report,
            bottlenecks: Some(bottlenecks),
            phases: Some(PhasesDocument::Recording {
                min_burst_ns: r.header.min_burst_ns,
                analysis: Some(AnalysisView::from(&analysis)),
                kernel_filter: KernelFilter::of(job, Some(r.header.min_burst_ns)),
                call_sites: Vec::new(),
                signature: None,
            }),
            rank_groups: None,
            nodes: None,
        };
        let json =
            serde_json::to_string(&ReportDocument::new(vec![
                serde_json::to_value(&document).unwrap()
            ]))
            .unwrap();
        let doc: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(doc["schema"], "mpiburst-report");
        assert_eq!(doc["version"], 1);
        let j = &doc["jobs"][0];
        assert_eq!(j["meta"]["id"], "pmix:a");
        assert_eq!(j["state"], "ended");
        assert_eq!(j["ranks_here"], 4);
        assert!(
            text.contains(&format!(
                "4 of 4 ranks here, ended, {} s",
                fixed(&(j["elapsed_ns"].as_f64().unwrap() / 1e9).into(), 1)
            )),
            "{text}"
        );
        // Rank rows: bursts and MPI share as the table prints them.
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("rank"))
            .skip(1)
            .take(4)
            .map(|l| l.split_whitespace().collect())
            .collect();
        for (row, rank) in rows.iter().zip(j["ranks"].as_array().unwrap()) {
            assert_eq!(row[0], rank["rank"].to_string(), "{text}");
            assert_eq!(row[2], rank["totals"]["bursts"].to_string(), "{text}");
            assert_eq!(
                row[4],
                fixed(
                    &(rank["region"]["runtime_ns"].as_f64().unwrap() / 1e9).into(),
                    3
                )
            );
            let mpi_percent = 100.0 * rank["mpi_share"].as_f64().unwrap();
            assert_eq!(row[7], format!("{mpi_percent:.1}%"), "{text}");
            assert_eq!(rank["state"], "exited");
        }
        assert!(
            text.contains(&format!(
                "startup: MPI_Init {} s max",
                fixed(
                    &(j["lifecycle"]["init_max_ns"].as_f64().unwrap() / 1e9).into(),
                    3
                )
            )),
            "{text}"
        );
        assert_eq!(j["lifecycle"]["finalize_ranks"], 4);
        let allreduce = &j["functions"][0];
        assert_eq!(allreduce["function"], "MPI_Allreduce");
        assert_eq!(allreduce["calls"], j["totals"]["bursts"]);
        // The POP efficiencies and the recommendations of the bottleneck view.
        let pop = &j["bottlenecks"]["properties"]["pop"];
        let lb = &pop["load_balance"]["value"];
        let comm = &pop["communication_efficiency"]["value"];
        assert!(lb.as_f64().unwrap() < 0.8, "rank 3 works longer: {pop}");
        assert!(
            text.contains(&format!(
                "load balance {} × communication efficiency {}",
                fixed(lb, 3),
                fixed(comm, 3)
            )),
            "{text}"
        );
        let fired: Vec<&str> = j["bottlenecks"]["recommendations"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["property"].as_str().unwrap())
            .collect();
        assert!(fired.contains(&"load_balance"), "{fired:?}");
        let listed: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" severity "))
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(fired, listed, "{text}");
        // The phase table: the same clusters with the same burst counts, and no labels.
        let phases = &j["phases"];
        assert_eq!(phases["source"], "recording");
        assert_eq!(phases["min_burst_ns"], 1_000);
        assert!(phases["analysis"].get("labels").is_none());
        let table: Vec<(String, String)> = text
            .lines()
            .skip_while(|l| !l.trim_start().starts_with("cluster "))
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .map(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                (cells[0].to_string(), cells[1].to_string())
            })
            .collect();
        let clusters: Vec<(String, String)> = phases["analysis"]["clusters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| (c["id"].to_string(), c["bursts"].to_string()))
            .collect();
        assert_eq!(clusters.len(), 3, "{text}");
        assert_eq!(clusters, table, "{text}");
        assert!(
            text.contains(&format!(
                "global SPMD score {}",
                fixed(&phases["analysis"]["global_score"], 3)
            )),
            "{text}"
        );
    }

    #[test]
    fn online_view_has_the_values_of_the_live_text() {
        let now = T0 + 2_400_000_000;
        let snapshot = crate::export::phases::synthetic_snapshot(250, now);
        let text = render_live_phases(&JobId("j".into()), &snapshot, now, &SiteNames::default());
        let json = serde_json::to_string(&PhasesDocument::Daemon {
            online: Some(OnlineView::new(&snapshot, now)),
            kernel_filter: None,
            call_sites: Vec::new(),
        })
        .unwrap();
        let view: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(view["source"], "daemon");
        let online = &view["online"];
        let window = &online["last_window"];
        assert!(window.get("sequences").is_none(), "{window}");
        assert_eq!(window["window"], T0 / 1_000_000_000 + 1);
        let rows: Vec<(String, String)> = text
            .split("== whole job so far")
            .next()
            .unwrap()
            .lines()
            .filter(|l| l.trim_start().starts_with(char::is_numeric))
            .map(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                (cells[0].to_string(), cells[1].to_string())
            })
            .collect();
        let phases: Vec<(String, String)> = window["phases"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p["id"].to_string(), p["stats"]["bursts"].to_string()))
            .collect();
        assert_eq!(phases.len(), 3, "{text}");
        assert_eq!(phases, rows, "{text}");
        assert_eq!(online["tracking"]["active"], serde_json::json!([1, 2, 3]));
        assert!(
            text.contains(
                "tracking: phases 1, 2, 3 active; events since the job started: 3 appear"
            ),
            "{text}"
        );
        assert_eq!(online["tracking"]["event_counts"]["appear"], 3);
        assert_eq!(online["current_window"]["window"], T0 / 1_000_000_000 + 2);
        assert_eq!(
            online["whole_job"]["clusters"].as_array().unwrap().len(),
            3,
            "{text}"
        );
    }

    #[test]
    fn compare_document_has_the_matches_of_the_text() {
        let dir = tempfile::tempdir().unwrap();
        let mut slower = synthetic();
        slower.phases[1].ipc = 0.4;
        let params = TrackingParams::default();
        let signature = |r: &Recording| {
            let job = r.jobs.values().next().unwrap();
            let bursts: Vec<_> = job.bursts.iter().cloned().collect();
            let analysis = analyse(&bursts, job.node_ranks(), &Default::default()).unwrap();
            let app = AppIdentity {
                build_id: None,
                executable: job.meta.executable.clone(),
            };
            RunSignature::from_analysis(app, job.meta.id.0.clone(), &analysis, &bursts, &params)
                .unwrap()
        };
        let a = signature(&recorded(dir.path(), "a", &synthetic()));
        let b = signature(&recorded(dir.path(), "b", &slower));
        let m = match_runs(&a, &b, &params);
        let names = SiteNames::default();
        let text = render_run_match(&a, &b, &m, &names);
        let (pa, pb) = (dir.path().join("a"), dir.path().join("b"));
        let document =
            CompareDocument::new(RunSide::new(&pa, &a), RunSide::new(&pb, &b), &m, Vec::new());
        let doc: Value = serde_json::from_str(&serde_json::to_string(&document).unwrap()).unwrap();
        assert_eq!(doc["schema"], "mpiburst-compare");
        assert_eq!(doc["version"], 1);
        assert_eq!(doc["before"]["job"], "pmix:a");
        assert_eq!(doc["after"]["ranks"], 4);
        assert_eq!(doc["after"]["recording"], pb.to_str().unwrap());
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip(3)
            .map(|l| l.split_whitespace().collect())
            .collect();
        let matches = doc["match"]["phases"].as_array().unwrap();
        assert_eq!(matches.len(), 3, "{text}");
        assert_eq!(rows.len(), 3, "{text}");
        for (row, p) in rows.iter().zip(matches) {
            assert_eq!(row[0], p["a"][0].to_string(), "{text}");
            assert_eq!(row[1], p["b"][0].to_string(), "{text}");
            assert_eq!(p["kind"], "one_to_one");
            let change = 100.0 * p["trend"]["duration_mean_change"].as_f64().unwrap();
            let shown = row.iter().find(|cell| cell.ends_with('%'));
            assert_eq!(shown, Some(&format!("{change:+.1}%").as_str()), "{text}");
        }
        // The phase whose IPC fell from 0.6 to 0.4 takes half as long again.
        assert!(
            matches.iter().any(|p| {
                let change = p["trend"]["duration_mean_change"].as_f64().unwrap();
                (0.4..0.6).contains(&change)
            }),
            "{text}"
        );
        assert!(
            text.contains(&format!(
                "coverage {:.0} %",
                100.0 * doc["match"]["coverage"].as_f64().unwrap()
            )),
            "{text}"
        );
    }
}
