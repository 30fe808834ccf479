//! Run-time prediction at a new workload value from the signatures of runs at other values
//! (Martínez Canillas (2011), Eq. 5.1): PAET(x) = Σ_i fPET_i(x) · fW_i(x), each function of the
//! workload fitted per phase by [`fit::select`], plus the time no phase covers, fitted the same
//! way so that the prediction is of the whole run time and not only of its phases.
//!
//! Phases are matched across runs by their [`PhaseKey`], which needs the runs to be of the same
//! build. A phase missing from a run did not run there: its weight at that workload is 0, and its
//! time is fitted to the runs it ran in.

use std::collections::BTreeMap;

use serde::Serialize;

use super::fit::{self, Fit};
use super::{AppSignature, PhaseKey};

/// One phase's model and what it predicts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PhaseModel {
    pub key: PhaseKey,
    /// The measured (workload, W) of every run.
    pub weights: Vec<(f64, f64)>,
    /// The measured (workload, PET in ns) of the runs the phase ran in.
    pub pets_ns: Vec<(f64, f64)>,
    pub weight_fit: Fit,
    pub pet_fit: Fit,
    /// fW(x) and fPET(x) at the predicted workload, neither below 0.
    pub weight: f64,
    pub pet_ns: f64,
}

impl PhaseModel {
    pub fn time_ns(&self) -> f64 {
        self.weight * self.pet_ns
    }
}

/// A prediction and how it was made.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    /// The workload value predicted at.
    pub at: f64,
    /// `at` lies outside the measured workloads.
    pub extrapolated: bool,
    pub runtime_ns: f64,
    /// By decreasing predicted time.
    pub phases: Vec<PhaseModel>,
    /// The time no phase covers: measured (workload, ns), its fit and its prediction.
    pub other_points_ns: Vec<(f64, f64)>,
    pub other_fit: Fit,
    pub other_ns: f64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum PredictError {
    #[error("a prediction needs runs at two or more different workload values; got {0}")]
    TooFewWorkloads(usize),
    #[error(
        "{at} lies outside the measured workloads {low} … {high}; the model is meant for \
         interpolation: record a run beyond it, or pass --extrapolate to predict anyway"
    )]
    Extrapolation { at: f64, low: f64, high: f64 },
    #[error("the workload value {0} is not a finite number")]
    NotFinite(f64),
}

/// The run time at workload `at` from `runs` (workload value, signature). `tolerance` is the
/// validation error of [`fit::select`]; outside the measured workloads only with `extrapolate`.
pub fn predict(
    runs: &[(f64, &AppSignature)],
    at: f64,
    tolerance: f64,
    extrapolate: bool,
) -> Result<Prediction, PredictError> {
    if let Some(bad) = std::iter::once(at)
        .chain(runs.iter().map(|r| r.0))
        .find(|x| !x.is_finite())
    {
        return Err(PredictError::NotFinite(bad));
    }
    let mut workloads: Vec<f64> = runs.iter().map(|r| r.0).collect();
    workloads.sort_by(f64::total_cmp);
    workloads.dedup();
    if workloads.len() < 2 {
        return Err(PredictError::TooFewWorkloads(workloads.len()));
    }
    let (low, high) = (workloads[0], workloads[workloads.len() - 1]);
    let extrapolated = at < low || at > high;
    if extrapolated && !extrapolate {
        return Err(PredictError::Extrapolation { at, low, high });
    }

    // Per phase: (workload, W) of every run and (workload, PET) of the runs it ran in.
    type Points = Vec<(f64, f64)>;
    let mut measured: BTreeMap<&PhaseKey, (Points, Points)> = BTreeMap::new();
    for (_, signature) in runs {
        for phase in &signature.phases {
            measured.entry(&phase.key).or_default();
        }
    }
    for (key, (weights, pets)) in measured.iter_mut() {
        for &(x, signature) in runs {
            match signature.phases.iter().find(|p| &p.key == *key) {
                Some(p) => {
                    weights.push((x, p.weight));
                    pets.push((x, p.pet_ns));
                }
                None => weights.push((x, 0.0)),
            }
        }
    }
    let chosen = |points: &[(f64, f64)]| {
        fit::select(points, tolerance).expect("every phase and the other time have a point")
    };
    let mut phases: Vec<PhaseModel> = measured
        .into_iter()
        .map(|(key, (weights, pets_ns))| {
            let weight_fit = chosen(&weights);
            let pet_fit = chosen(&pets_ns);
            PhaseModel {
                key: key.clone(),
                weight: weight_fit.eval(at).max(0.0),
                pet_ns: pet_fit.eval(at).max(0.0),
                weights,
                pets_ns,
                weight_fit,
                pet_fit,
            }
        })
        .collect();
    phases.sort_by(|a, b| b.time_ns().total_cmp(&a.time_ns()).then(a.key.cmp(&b.key)));
    let other_points_ns: Vec<(f64, f64)> = runs.iter().map(|&(x, s)| (x, s.other_ns)).collect();
    let relative_to_run: Vec<(f64, f64, f64)> = runs
        .iter()
        .map(|&(x, s)| (x, s.other_ns, s.runtime_ns as f64))
        .collect();
    let other_fit =
        fit::select_relative_to(&relative_to_run, tolerance).expect("every run has its other time");
    let other_ns = other_fit.eval(at).max(0.0);
    Ok(Prediction {
        at,
        extrapolated,
        runtime_ns: phases.iter().map(PhaseModel::time_ns).sum::<f64>() + other_ns,
        phases,
        other_points_ns,
        other_fit,
        other_ns,
    })
}
