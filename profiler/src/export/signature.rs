//! The application signature of a run (the signature section of `mpiburst report --phases`) and
//! run-time predictions (`mpiburst predict`), as text and as the `mpiburst-predict` JSON
//! document (docs/report-json.md).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use serde::Serialize;

use crate::analysis::signature::{
    fit::Fit,
    predict::{PhaseModel, Prediction},
    AppSignature,
};
use crate::store::Job;
use crate::symbols::SiteNames;

/// The `schema` of `mpiburst predict --format json`.
pub const PREDICT_SCHEMA: &str = "mpiburst-predict";
/// Its `version`: additive changes keep it, renames and removals bump it.
pub const PREDICT_VERSION: u32 = 1;

const NS_PER_S: f64 = 1e9;

/// Each rank's region of interest (MPI_Init's return to MPI_Finalize's entry, or to the rank's
/// end or `now_ns`), the span a signature tiles.
pub fn regions(job: &Job, now_ns: u64) -> BTreeMap<u32, (u64, u64)> {
    let end = job.meta.ended_ns.unwrap_or(now_ns);
    job.ranks
        .values()
        .filter_map(|r| r.region_span(end).map(|span| (r.rank, span)))
        .collect()
}

/// The signature section of the text report, phases named by their code regions.
pub fn render_signature(s: &AppSignature, names: &SiteNames) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "signature: PAET = Σ PET × W = {:.3} s of the run time {:.3} s (region of interest, \
         slowest rank): the phases cover {:.1} %",
        s.paet_ns() / NS_PER_S,
        s.runtime_ns as f64 / NS_PER_S,
        100.0 * s.coverage()
    );
    let _ = writeln!(
        out,
        "  {:>10} {:>12} {:>10}  {:<8} phase (code region)",
        "W/rank", "PET ms", "W×PET s", "clusters"
    );
    for p in &s.phases {
        let clusters: Vec<String> = p.clusters.iter().map(u32::to_string).collect();
        let _ = writeln!(
            out,
            "  {:>10.1} {:>12.4} {:>10.3}  {:<8} {}",
            p.weight,
            p.pet_ns / 1e6,
            p.time_ns() / NS_PER_S,
            clusters.join(","),
            names.region(&p.key.start, &p.key.end)
        );
    }
    let _ = writeln!(
        out,
        "  {:>10} {:>12} {:>10.3}  not in a phase (start, noise and the calls after it)",
        "",
        "",
        s.other_ns / NS_PER_S
    );
    out
}

/// One run a prediction was made from.
#[derive(Clone, Debug, Serialize)]
pub struct RunPoint<'a> {
    pub recording: &'a Path,
    pub job: &'a str,
    pub workload: f64,
    pub runtime_s: f64,
    pub paet_s: f64,
    pub coverage: f64,
}

impl<'a> RunPoint<'a> {
    pub fn new(recording: &'a Path, job: &'a str, workload: f64, s: &AppSignature) -> Self {
        RunPoint {
            recording,
            job,
            workload,
            runtime_s: s.runtime_ns as f64 / NS_PER_S,
            paet_s: s.paet_ns() / NS_PER_S,
            coverage: s.coverage(),
        }
    }
}

/// A fitted function of the workload, its measured points and its value at the prediction.
#[derive(Clone, Debug, Serialize)]
pub struct FunctionDocument {
    pub family: crate::analysis::signature::fit::Family,
    pub formula: String,
    pub coefficients: Vec<f64>,
    pub validation_error: Option<f64>,
    pub above_tolerance: bool,
    /// (workload, value) pairs.
    pub measured: Vec<(f64, f64)>,
    pub predicted: f64,
}

impl FunctionDocument {
    /// `scale` turns the fitted unit into the document's (ns into s for times).
    fn new(fit: &Fit, measured: &[(f64, f64)], predicted: f64, scale: f64) -> Self {
        let coefficients: Vec<f64> = fit.coefficients.iter().map(|c| c * scale).collect();
        FunctionDocument {
            family: fit.family,
            formula: fit.family.formula(&coefficients),
            coefficients,
            validation_error: fit.validation_error,
            above_tolerance: fit.above_tolerance,
            measured: measured.iter().map(|&(x, y)| (x, y * scale)).collect(),
            predicted: predicted * scale,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct PhaseDocument {
    /// The phase's code region, named as the text names it (function, file and line where the
    /// binaries have them).
    pub phase: String,
    pub start: crate::model::CallSite,
    pub end: crate::model::CallSite,
    /// Repetitions per rank.
    pub weight: FunctionDocument,
    /// Seconds per repetition.
    pub pet_s: FunctionDocument,
    /// W × PET at the predicted workload.
    pub predicted_time_s: f64,
}

impl PhaseDocument {
    fn new(m: &PhaseModel, names: &SiteNames) -> Self {
        PhaseDocument {
            phase: names.region(&m.key.start, &m.key.end),
            start: m.key.start.clone(),
            end: m.key.end.clone(),
            weight: FunctionDocument::new(&m.weight_fit, &m.weights, m.weight, 1.0),
            pet_s: FunctionDocument::new(&m.pet_fit, &m.pets_ns, m.pet_ns, 1.0 / NS_PER_S),
            predicted_time_s: m.time_ns() / NS_PER_S,
        }
    }
}

/// `mpiburst predict --format json`.
#[derive(Clone, Debug, Serialize)]
pub struct PredictDocument<'a> {
    pub schema: &'static str,
    pub version: u32,
    pub at: f64,
    pub extrapolated: bool,
    /// The predicted run time: region of interest of the slowest rank, as the report shows it.
    pub predicted_runtime_s: f64,
    pub tolerance: f64,
    pub runs: Vec<RunPoint<'a>>,
    /// By decreasing predicted time.
    pub phases: Vec<PhaseDocument>,
    /// The time no phase covers.
    pub other_s: FunctionDocument,
}

impl<'a> PredictDocument<'a> {
    /// `names` names the phases' code regions.
    pub fn new(runs: Vec<RunPoint<'a>>, p: &Prediction, tolerance: f64, names: &SiteNames) -> Self {
        PredictDocument {
            schema: PREDICT_SCHEMA,
            version: PREDICT_VERSION,
            at: p.at,
            extrapolated: p.extrapolated,
            predicted_runtime_s: p.runtime_ns / NS_PER_S,
            tolerance,
            runs,
            phases: p
                .phases
                .iter()
                .map(|m| PhaseDocument::new(m, names))
                .collect(),
            other_s: FunctionDocument::new(
                &p.other_fit,
                &p.other_points_ns,
                p.other_ns,
                1.0 / NS_PER_S,
            ),
        }
    }

    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "predicted run time at workload {}: {:.3} s{}",
            self.at,
            self.predicted_runtime_s,
            if self.extrapolated {
                " (EXTRAPOLATED beyond the measured workloads: less reliable)"
            } else {
                ""
            }
        );
        let _ = writeln!(
            out,
            "(region of interest of the slowest rank, MPI_Init's return to MPI_Finalize's entry)\n"
        );
        let _ = writeln!(out, "measured runs:");
        let _ = writeln!(
            out,
            "  {:>10} {:>10} {:>10} {:>9}  recording (job)",
            "workload", "run s", "PAET s", "coverage"
        );
        for r in &self.runs {
            let _ = writeln!(
                out,
                "  {:>10} {:>10.3} {:>10.3} {:>8.1}%  {} ({})",
                r.workload,
                r.runtime_s,
                r.paet_s,
                100.0 * r.coverage,
                r.recording.display(),
                r.job
            );
        }
        let _ = writeln!(out, "\nper phase at workload {}:", self.at);
        let _ = writeln!(
            out,
            "  {:>10} {:>12} {:>10}  phase (code region)",
            "W/rank", "PET ms", "W×PET s"
        );
        for p in &self.phases {
            let _ = writeln!(
                out,
                "  {:>10.1} {:>12.4} {:>10.3}  {}",
                p.weight.predicted,
                p.pet_s.predicted * 1e3,
                p.predicted_time_s,
                p.phase
            );
        }
        let _ = writeln!(
            out,
            "  {:>10} {:>12} {:>10.3}  not in a phase",
            "", "", self.other_s.predicted
        );
        let _ = writeln!(
            out,
            "\nmodels (x = workload; chosen by the largest relative miss on a held-out interior \
             point, tolerance {:.0} %):",
            100.0 * self.tolerance
        );
        let model = |out: &mut String, what: &str, f: &FunctionDocument| {
            let check = match f.validation_error {
                Some(e) if f.above_tolerance => {
                    format!("held-out miss {:.1} %, ABOVE the tolerance", 100.0 * e)
                }
                Some(e) => format!("held-out miss {:.1} %", 100.0 * e),
                None => "not validated: too few runs".to_string(),
            };
            let _ = writeln!(out, "    {what} = {}  ({check})", f.formula);
        };
        for p in &self.phases {
            let _ = writeln!(out, "  {}", p.phase);
            model(&mut out, "W", &p.weight);
            model(&mut out, "PET s", &p.pet_s);
        }
        let _ = writeln!(out, "  not in a phase");
        model(&mut out, "time s", &self.other_s);
        out
    }
}
