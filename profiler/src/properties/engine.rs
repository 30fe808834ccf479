//! The property model and the strategy engine (Guillén (2015), §3.1–§3.2): a property has a value,
//! a threshold t, an exponent p, a severity formula, a severity in [0, 1] and a condition.
//! Properties form trees ("strategies"): roots are always evaluated, a child only when its
//! parent's condition holds.

use serde::{Deserialize, Serialize};

use super::quantiles::{bucket_bounds, RankHistogram, Summary};

/// The reason given wherever a value needs hardware counters that are not there.
pub const NO_PMU: &str = "not measured (no PMU)";

/// How a property value becomes a severity in [0, 1]. x = value, t = threshold, p = exponent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Formula {
    /// FORMULA1, larger is worse (Eq. 3.1): 0 if x/t − 1 < 0, 1 if x/t − 1 > 1, else (x/t − 1)^p.
    /// Zero up to t, saturates at 2t.
    #[serde(rename = "F1")]
    F1,
    /// FORMULA2, smaller is worse (Eq. 3.2): 0 if (x/t)^p > 1, 1 if (x/t)^p < 0, else
    /// 1 − (x/t)^p. Zero from t up, 1 only at x = 0. A negative x counts as 0.
    #[serde(rename = "F2")]
    F2,
    /// The simplified SAR formulas of Guillén (2015) for %system and %iowait (Eq. 3.57, 3.59),
    /// generalised with the exponent and clamped: clamp((x/t)^p, 0, 1). Saturates at t.
    #[serde(rename = "proportional")]
    Proportional,
    /// No severity (the core frequency of Guillén (2015), "all values are collected"): severity 0,
    /// no threshold, no exponent.
    #[serde(rename = "informational")]
    Informational,
}

impl Formula {
    /// The severity of `value`. `setting` is ignored for [`Formula::Informational`]; for the
    /// other formulas t > 0 and p > 0 (the configuration guarantees it). The result is in
    /// [0, 1] for every finite value.
    pub fn severity(self, value: f64, setting: Option<Setting>) -> f64 {
        let Some(Setting {
            threshold: t,
            exponent: p,
        }) = setting
        else {
            return 0.0;
        };
        match self {
            Formula::F1 => {
                let r = value / t - 1.0;
                if r < 0.0 {
                    0.0
                } else if r > 1.0 {
                    1.0
                } else {
                    r.powf(p)
                }
            }
            Formula::F2 => {
                let q = (value / t).max(0.0).powf(p);
                if q > 1.0 {
                    0.0
                } else {
                    1.0 - q
                }
            }
            Formula::Proportional => (value / t).max(0.0).powf(p).min(1.0),
            Formula::Informational => 0.0,
        }
    }
}

/// When a property's condition holds. A child is evaluated only when its parent's condition
/// holds, and a recommendation is given when the condition holds and the severity is above 0.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Condition {
    /// Severity > 0: PerSyst's default.
    SeverityPositive,
    /// Always: monitoring values collected even at severity 0; the children are always
    /// evaluated.
    Always,
    /// x > t: the "bound" replica of a property that branches on saturation (§3.2, the
    /// memory-bound replica).
    AboveThreshold,
    /// x ≤ t: the complementary replica (the compute-bound one). With the same id, threshold and
    /// value as an [`Condition::AboveThreshold`] replica, exactly one of the two holds.
    AtOrBelowThreshold,
}

/// Threshold and exponent of a property.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Setting {
    pub threshold: f64,
    pub exponent: f64,
}

/// Which devices a property is evaluated on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    /// One value per job (on this node) and span.
    Job,
    /// One value per rank, aggregated over the job's ranks as quantiles.
    Rank,
    /// One value per phase (cluster of bursts).
    Phase,
}

/// What a property's evaluation function found.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// One value for the whole input.
    Scalar(f64),
    /// One value per device (rank); devices without data are left out.
    PerDevice(Vec<f64>),
    /// The source of the value does not exist here (no PMU, not collected); the text says so.
    NotMeasured(String),
    /// The source exists but the span holds nothing to compute the value from.
    NoData(String),
}

/// The static definition of one property node of a strategy.
pub struct PropertyDef<I> {
    /// Unique among all properties.
    pub name: &'static str,
    /// Key of the threshold and exponent in the configuration. Replicas share it (and their
    /// value and severity); otherwise it equals `name`.
    pub id: &'static str,
    pub description: &'static str,
    pub unit: &'static str,
    pub scope: Scope,
    pub formula: Formula,
    pub condition: Condition,
    /// Default threshold and exponent; `None` exactly for [`Formula::Informational`].
    pub default: Option<Setting>,
    /// Where the default threshold comes from.
    pub threshold_note: &'static str,
    pub needs_pmu: bool,
    /// What to do when the property fires.
    pub recommendation: Option<&'static str>,
    pub evaluate: fn(&I) -> Observation,
}

impl<I> PropertyDef<I> {
    /// An informational property (no severity) whose condition always holds.
    pub fn new(
        name: &'static str,
        description: &'static str,
        unit: &'static str,
        scope: Scope,
        evaluate: fn(&I) -> Observation,
    ) -> Self {
        PropertyDef {
            name,
            id: name,
            description,
            unit,
            scope,
            formula: Formula::Informational,
            condition: Condition::Always,
            default: None,
            threshold_note: "",
            needs_pmu: false,
            recommendation: None,
            evaluate,
        }
    }

    /// Gives the property a severity formula with its default threshold and exponent; the
    /// condition becomes "severity > 0" unless set afterwards.
    pub fn severity(
        mut self,
        formula: Formula,
        threshold: f64,
        exponent: f64,
        note: &'static str,
    ) -> Self {
        self.formula = formula;
        self.default = Some(Setting {
            threshold,
            exponent,
        });
        self.threshold_note = note;
        self.condition = Condition::SeverityPositive;
        self
    }

    pub fn condition(mut self, condition: Condition) -> Self {
        self.condition = condition;
        self
    }

    /// Makes this property a replica sharing `id` (threshold, exponent) with another one.
    pub fn replica_of(mut self, id: &'static str) -> Self {
        self.id = id;
        self
    }

    pub fn pmu(mut self) -> Self {
        self.needs_pmu = true;
        self
    }

    pub fn recommend(mut self, text: &'static str) -> Self {
        self.recommendation = Some(text);
        self
    }
}

/// A property and the properties refining it.
pub struct Node<I> {
    pub def: PropertyDef<I>,
    pub children: Vec<Node<I>>,
}

impl<I> Node<I> {
    pub fn leaf(def: PropertyDef<I>) -> Self {
        Node {
            def,
            children: Vec::new(),
        }
    }
    pub fn new(def: PropertyDef<I>, children: Vec<Node<I>>) -> Self {
        Node { def, children }
    }
}

/// What evaluating a strategy takes from the configuration: the threshold and exponent applied
/// to each property, and how finely per-rank values are summarised. The engine knows no file
/// format; the validated property configuration ([`super::config::PropertyConfig`]) provides it.
pub trait StrategySettings {
    /// The threshold and exponent applied to `def`: the configured ones, else its defaults.
    /// `None` for properties without a severity formula.
    fn setting<I>(&self, def: &PropertyDef<I>) -> Option<Setting>;
    /// Number of equal parts the per-rank distributions are cut into (10: deciles, giving 11
    /// values from the minimum to the maximum).
    fn quantiles(&self) -> u32;
}

/// A set of property trees over one kind of input.
pub struct Strategy<I> {
    pub name: &'static str,
    pub roots: Vec<Node<I>>,
}

/// Values and severities over the devices (ranks) of a per-rank property.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RankDistribution {
    /// Ranks with a value (ranks without data are left out).
    pub count: u64,
    /// Ranks whose own condition holds.
    pub condition_count: u64,
    pub values: Summary,
    pub severities: Summary,
    /// The values in the fixed buckets of the property's unit, which add up across nodes
    /// (`None` for a unit without buckets, and from daemons before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub histogram: Option<RankHistogram>,
}

/// The result of evaluating a property that has a value.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Evaluation {
    /// The value; for a per-rank property, the mean over the ranks.
    pub value: f64,
    /// The severity in [0, 1]; for a per-rank property, the mean of the ranks' severities
    /// (the average severity over devices of Guillén (2015), Appendix A).
    pub severity: f64,
    /// The condition; for a per-rank property, whether it holds for at least one rank.
    pub condition: bool,
    /// The property's recommendation, present exactly when the condition holds and the
    /// severity is above 0.
    pub recommendation: Option<String>,
    /// Per-rank properties only: quantiles over the ranks.
    pub ranks: Option<RankDistribution>,
}

/// What came out of a property. Properties whose parent's condition does not hold are not
/// evaluated and do not appear at all; the children of a property that is not measured appear
/// as not measured, with the same reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Outcome {
    Evaluated(Evaluation),
    NotMeasured { reason: String },
    NoData { reason: String },
}

/// One evaluated property.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PropertyResult {
    pub name: String,
    pub id: String,
    pub strategy: String,
    pub parent: Option<String>,
    pub unit: String,
    pub formula: Formula,
    /// The threshold and exponent applied (from the configuration); `None` for
    /// informational properties.
    pub setting: Option<Setting>,
    pub outcome: Outcome,
}

impl PropertyResult {
    pub fn evaluation(&self) -> Option<&Evaluation> {
        match &self.outcome {
            Outcome::Evaluated(e) => Some(e),
            _ => None,
        }
    }
    pub fn value(&self) -> Option<f64> {
        self.evaluation().map(|e| e.value)
    }
    pub fn severity(&self) -> Option<f64> {
        self.evaluation().map(|e| e.severity)
    }
    /// Condition true and severity above 0: the recommendation applies.
    pub fn fires(&self) -> bool {
        self.evaluation()
            .is_some_and(|e| e.condition && e.severity > 0.0)
    }
    pub fn recommendation(&self) -> Option<&str> {
        self.evaluation().and_then(|e| e.recommendation.as_deref())
    }
    /// The reason when the property was not measured or had no data.
    pub fn reason(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Evaluated(_) => None,
            Outcome::NotMeasured { reason } | Outcome::NoData { reason } => Some(reason),
        }
    }
}

fn condition_holds(
    condition: Condition,
    value: f64,
    severity: f64,
    setting: Option<Setting>,
) -> bool {
    match (condition, setting) {
        (Condition::SeverityPositive, _) => severity > 0.0,
        (Condition::Always, _) => true,
        (Condition::AboveThreshold, Some(s)) => value > s.threshold,
        (Condition::AtOrBelowThreshold, Some(s)) => value <= s.threshold,
        // A replica without a threshold is a definition error that the catalogue tests rule
        // out; without a threshold to compare to, nothing is "above" it.
        (Condition::AboveThreshold, None) => false,
        (Condition::AtOrBelowThreshold, None) => true,
    }
}

impl<I> Strategy<I> {
    /// Evaluates the trees in pre-order (a parent before its children). Never fails: the
    /// configuration is valid by construction and every value problem becomes an outcome.
    pub fn evaluate(&self, input: &I, settings: &impl StrategySettings) -> Vec<PropertyResult> {
        let mut out = Vec::new();
        for root in &self.roots {
            self.visit(root, None, input, settings, &mut out);
        }
        out
    }

    fn visit(
        &self,
        node: &Node<I>,
        parent: Option<&'static str>,
        input: &I,
        settings: &impl StrategySettings,
        out: &mut Vec<PropertyResult>,
    ) {
        let def = &node.def;
        let setting = settings.setting(def);
        let outcome =
            evaluate_observation(def, setting, (def.evaluate)(input), settings.quantiles());
        let descend = match &outcome {
            Outcome::Evaluated(e) => e.condition,
            _ => false,
        };
        let not_measured = match &outcome {
            Outcome::NotMeasured { reason } => Some(reason.clone()),
            _ => None,
        };
        out.push(self.result(def, parent, setting, outcome));
        if descend {
            for child in &node.children {
                self.visit(child, Some(def.name), input, settings, out);
            }
        } else if let Some(reason) = not_measured {
            for child in &node.children {
                self.not_measured(child, def.name, &reason, settings, out);
            }
        }
    }

    /// The subtree under a property that is not measured: reported as not measured, nothing
    /// evaluated.
    fn not_measured(
        &self,
        node: &Node<I>,
        parent: &'static str,
        reason: &str,
        settings: &impl StrategySettings,
        out: &mut Vec<PropertyResult>,
    ) {
        let setting = settings.setting(&node.def);
        let outcome = Outcome::NotMeasured {
            reason: reason.to_string(),
        };
        out.push(self.result(&node.def, Some(parent), setting, outcome));
        for child in &node.children {
            self.not_measured(child, node.def.name, reason, settings, out);
        }
    }

    fn result(
        &self,
        def: &PropertyDef<I>,
        parent: Option<&'static str>,
        setting: Option<Setting>,
        outcome: Outcome,
    ) -> PropertyResult {
        PropertyResult {
            name: def.name.to_string(),
            id: def.id.to_string(),
            strategy: self.name.to_string(),
            parent: parent.map(str::to_string),
            unit: def.unit.to_string(),
            formula: def.formula,
            setting,
            outcome,
        }
    }

    /// Every node with its parent, in pre-order.
    pub fn nodes(&self) -> Vec<(&PropertyDef<I>, Option<&'static str>)> {
        fn walk<'s, I>(
            node: &'s Node<I>,
            parent: Option<&'static str>,
            out: &mut Vec<(&'s PropertyDef<I>, Option<&'static str>)>,
        ) {
            out.push((&node.def, parent));
            for child in &node.children {
                walk(child, Some(node.def.name), out);
            }
        }
        let mut out = Vec::new();
        for root in &self.roots {
            walk(root, None, &mut out);
        }
        out
    }
}

fn evaluate_observation<I>(
    def: &PropertyDef<I>,
    setting: Option<Setting>,
    observation: Observation,
    quantiles: u32,
) -> Outcome {
    let recommendation = |condition: bool, severity: f64| {
        (condition && severity > 0.0)
            .then_some(def.recommendation)
            .flatten()
            .map(str::to_string)
    };
    match observation {
        Observation::NotMeasured(reason) => Outcome::NotMeasured { reason },
        Observation::NoData(reason) => Outcome::NoData { reason },
        Observation::Scalar(value) if !value.is_finite() => Outcome::NoData {
            reason: format!("the value is not a finite number ({value})"),
        },
        Observation::Scalar(value) => {
            let severity = def.formula.severity(value, setting);
            let condition = condition_holds(def.condition, value, severity, setting);
            Outcome::Evaluated(Evaluation {
                value,
                severity,
                condition,
                recommendation: recommendation(condition, severity),
                ranks: None,
            })
        }
        Observation::PerDevice(values) if values.iter().any(|v| !v.is_finite()) => {
            Outcome::NoData {
                reason: "a rank's value is not a finite number".to_string(),
            }
        }
        Observation::PerDevice(values) => {
            let severities: Vec<f64> = values
                .iter()
                .map(|&v| def.formula.severity(v, setting))
                .collect();
            let condition_count = values
                .iter()
                .zip(&severities)
                .filter(|(&v, &s)| condition_holds(def.condition, v, s, setting))
                .count() as u64;
            let (Some(value_summary), Some(severity_summary)) = (
                Summary::of(&values, quantiles),
                Summary::of(&severities, quantiles),
            ) else {
                return Outcome::NoData {
                    reason: "no rank has a value in the span".to_string(),
                };
            };
            let condition = condition_count > 0;
            let severity = severity_summary.avg;
            Outcome::Evaluated(Evaluation {
                value: value_summary.avg,
                severity,
                condition,
                recommendation: recommendation(condition, severity),
                ranks: Some(RankDistribution {
                    count: values.len() as u64,
                    condition_count,
                    values: value_summary,
                    severities: severity_summary,
                    histogram: bucket_bounds(def.unit).map(|b| RankHistogram::of(&values, b)),
                }),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::properties::config::PropertyConfig;
    use std::cell::Cell;

    const MIB: f64 = 1024.0 * 1024.0;

    fn s(threshold: f64, exponent: f64) -> Option<Setting> {
        Some(Setting {
            threshold,
            exponent,
        })
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    /// Worked examples of the severity formulas of Guillén (2015): F1 and F2 (Eq. 3.1, 3.2) with
    /// p = 1 and 2, and the SAR forms for %user, %system and %iowait (Eq. 3.55, 3.57, 3.59).
    #[test]
    fn v1_severity_formulas() {
        let f1 = |x, p| Formula::F1.severity(x, s(1.6, p));
        assert_eq!(f1(1.6, 1.0), 0.0);
        assert!(close(f1(2.4, 1.0), 0.5));
        assert_eq!(f1(3.2, 1.0), 1.0);
        assert_eq!(f1(5.0, 1.0), 1.0);
        assert!(close(f1(2.4, 2.0), 0.25));
        // Below the threshold, never negative.
        assert_eq!(f1(0.0, 1.0), 0.0);

        let f2 = |x, p| Formula::F2.severity(x, s(2.0 * MIB, p));
        assert_eq!(f2(8.0 * MIB, 1.0), 0.0);
        assert!(close(f2(1.0 * MIB, 1.0), 0.5));
        assert!(close(f2(64.0 * 1024.0, 1.0), 0.96875));
        assert!(close(f2(0.5 * MIB, 2.0), 0.9375));
        assert_eq!(f2(0.0, 1.0), 1.0);
        assert_eq!(
            f2(-1.0, 0.5),
            1.0,
            "a negative value counts as 0, never NaN"
        );

        // User %: s = 1 − USER/t (Eq. 3.55) is FORMULA2 with p = 1, clamped.
        let user = |x| Formula::F2.severity(x, s(80.0, 1.0));
        assert!(close(user(40.0), 0.5));
        assert_eq!(user(100.0), 0.0, "1 − 100/80 = −0.25 clamps to 0");
        // System %: s = SYSTEM/t (Eq. 3.57), clamped.
        let system = |x| Formula::Proportional.severity(x, s(20.0, 1.0));
        assert!(close(system(10.0), 0.5));
        assert_eq!(system(30.0), 1.0, "30/20 = 1.5 clamps to 1");
        // I/O wait %: s = IOWAIT/t (Eq. 3.59).
        assert!(close(Formula::Proportional.severity(0.5, s(1.0, 1.0)), 0.5));

        assert_eq!(Formula::Informational.severity(123.0, None), 0.0);
    }

    /// The test input counts how often each property is evaluated.
    #[derive(Default)]
    struct Probe {
        parent_value: f64,
        bandwidth: f64,
        parent_calls: Cell<u32>,
        child_calls: Cell<u32>,
        grandchild_calls: Cell<u32>,
        pmu: bool,
    }

    fn tree() -> Strategy<Probe> {
        let parent = PropertyDef::new("parent", "", "ratio", Scope::Job, |p: &Probe| {
            p.parent_calls.set(p.parent_calls.get() + 1);
            Observation::Scalar(p.parent_value)
        })
        .severity(Formula::F1, 1.0, 1.0, "")
        .recommend("fix the parent");
        let child = PropertyDef::new("child", "", "ratio", Scope::Job, |p: &Probe| {
            p.child_calls.set(p.child_calls.get() + 1);
            Observation::Scalar(3.0)
        })
        .severity(Formula::F1, 1.0, 1.0, "");
        let grandchild = PropertyDef::new("grandchild", "", "ratio", Scope::Job, |p: &Probe| {
            p.grandchild_calls.set(p.grandchild_calls.get() + 1);
            Observation::Scalar(3.0)
        })
        .severity(Formula::F1, 1.0, 1.0, "");
        Strategy {
            name: "test",
            roots: vec![Node::new(
                parent,
                vec![Node::new(child, vec![Node::leaf(grandchild)])],
            )],
        }
    }

    /// Strategy gating (Guillén (2015), §3.1–§3.2), first half: children are not evaluated and
    /// emit nothing when the parent's condition is false.
    #[test]
    fn v15_children_only_when_the_parent_condition_holds() {
        let config = PropertyConfig::default();
        let strategy = tree();

        let quiet = Probe {
            parent_value: 0.5,
            ..Probe::default()
        };
        let results = strategy.evaluate(&quiet, &config);
        assert_eq!(quiet.parent_calls.get(), 1, "roots are always evaluated");
        assert_eq!(quiet.child_calls.get(), 0);
        assert_eq!(quiet.grandchild_calls.get(), 0);
        assert_eq!(results.len(), 1, "no result at all for gated children");
        assert_eq!(results[0].severity(), Some(0.0));
        assert!(!results[0].fires());
        assert_eq!(results[0].recommendation(), None);

        let firing = Probe {
            parent_value: 1.5,
            ..Probe::default()
        };
        let results = strategy.evaluate(&firing, &config);
        assert_eq!(
            (
                firing.parent_calls.get(),
                firing.child_calls.get(),
                firing.grandchild_calls.get()
            ),
            (1, 1, 1)
        );
        let names: Vec<_> = results
            .iter()
            .map(|r| (r.name.as_str(), r.parent.as_deref()))
            .collect();
        assert_eq!(
            names,
            [
                ("parent", None),
                ("child", Some("parent")),
                ("grandchild", Some("child"))
            ]
        );
        assert!(close(results[0].severity().unwrap(), 0.5));
        assert_eq!(results[0].recommendation(), Some("fix the parent"));
    }

    fn replicas() -> Strategy<Probe> {
        let bound = PropertyDef::new("memory_bound", "", "B/s", Scope::Job, |p: &Probe| {
            Observation::Scalar(p.bandwidth)
        })
        .severity(Formula::F1, 4.0, 1.0, "")
        .replica_of("memory_bandwidth")
        .condition(Condition::AboveThreshold);
        let compute = PropertyDef::new("compute_bound", "", "B/s", Scope::Job, |p: &Probe| {
            Observation::Scalar(p.bandwidth)
        })
        .severity(Formula::F1, 4.0, 1.0, "")
        .replica_of("memory_bandwidth")
        .condition(Condition::AtOrBelowThreshold);
        let below_compute = PropertyDef::new("flops", "", "1", Scope::Job, |p: &Probe| {
            p.child_calls.set(p.child_calls.get() + 1);
            Observation::Scalar(1.0)
        });
        let below_memory = PropertyDef::new("locality", "", "1", Scope::Job, |p: &Probe| {
            p.grandchild_calls.set(p.grandchild_calls.get() + 1);
            Observation::Scalar(1.0)
        });
        Strategy {
            name: "replicas",
            roots: vec![
                Node::new(bound, vec![Node::leaf(below_memory)]),
                Node::new(compute, vec![Node::leaf(below_compute)]),
            ],
        }
    }

    /// Strategy gating, second half: of the memory-bound / compute-bound replicas (the branching
    /// of Guillén (2015), §3.2) exactly one holds for any value, and they share id, threshold and
    /// value.
    #[test]
    fn v15_replicas_exactly_one_holds() {
        let config = PropertyConfig::default();
        for bandwidth in [0.0, 1.0, 3.999, 4.0, 4.001, 6.0, 8.0, 100.0] {
            let probe = Probe {
                bandwidth,
                ..Probe::default()
            };
            let results = replicas().evaluate(&probe, &config);
            let bound = results.iter().find(|r| r.name == "memory_bound").unwrap();
            let compute = results.iter().find(|r| r.name == "compute_bound").unwrap();
            let holds = |r: &PropertyResult| r.evaluation().unwrap().condition;
            assert!(holds(bound) ^ holds(compute), "bandwidth {bandwidth}");
            assert_eq!(bound.id, compute.id);
            assert_eq!(bound.setting, compute.setting);
            assert_eq!(bound.value(), compute.value());
            assert_eq!(bound.severity(), compute.severity());
            // Exactly one subtree is explored.
            assert_eq!(probe.grandchild_calls.get(), holds(bound) as u32);
            assert_eq!(probe.child_calls.get(), holds(compute) as u32);
        }
    }

    #[test]
    fn not_measured_subtrees_say_so_and_are_not_evaluated() {
        let mut strategy = tree();
        strategy.roots[0].def.evaluate = |p: &Probe| {
            p.parent_calls.set(p.parent_calls.get() + 1);
            if p.pmu {
                Observation::Scalar(1.5)
            } else {
                Observation::NotMeasured(NO_PMU.to_string())
            }
        };
        let probe = Probe::default();
        let results = strategy.evaluate(&probe, &PropertyConfig::default());
        assert_eq!(results.len(), 3);
        assert_eq!(
            (probe.child_calls.get(), probe.grandchild_calls.get()),
            (0, 0)
        );
        for r in &results {
            assert_eq!(
                r.outcome,
                Outcome::NotMeasured {
                    reason: NO_PMU.to_string()
                }
            );
            assert_eq!(r.value(), None);
        }
        let json = serde_json::to_value(&results[1]).unwrap();
        assert_eq!(json["outcome"]["status"], "not_measured");
        assert_eq!(json["outcome"]["reason"], NO_PMU);
        assert!(json["outcome"].get("value").is_none());
    }

    #[test]
    fn per_rank_properties_summarise_values_and_severities() {
        let def = PropertyDef::new("x", "", "ratio", Scope::Rank, |_: &()| {
            Observation::PerDevice(vec![0.1, 0.9])
        })
        .severity(Formula::F1, 0.2, 1.0, "")
        .recommend("do it");
        let strategy = Strategy {
            name: "t",
            roots: vec![Node::leaf(def)],
        };
        let results = strategy.evaluate(&(), &PropertyConfig::default());
        let e = results[0].evaluation().unwrap();
        assert!(close(e.value, 0.5));
        // Severities 0 and 1 (0.9/0.2 − 1 > 1).
        assert!(close(e.severity, 0.5));
        assert!(e.condition);
        let ranks = e.ranks.as_ref().unwrap();
        assert_eq!((ranks.count, ranks.condition_count), (2, 1));
        assert_eq!(ranks.severities.quantiles.first(), Some(&0.0));
        assert_eq!(ranks.severities.quantiles.last(), Some(&1.0));
        assert_eq!(ranks.values.quantiles.len(), 11);
        assert_eq!(e.recommendation.as_deref(), Some("do it"));
    }

    #[test]
    fn results_round_trip_through_json() {
        let def = PropertyDef::new("x", "", "ratio", Scope::Rank, |_: &()| {
            Observation::PerDevice(vec![0.1, 0.9, 0.3])
        })
        .severity(Formula::F2, 0.5, 2.0, "");
        let strategy = Strategy {
            name: "t",
            roots: vec![Node::leaf(def)],
        };
        let results = strategy.evaluate(&(), &PropertyConfig::default());
        let text = serde_json::to_string(&results).unwrap();
        let back: Vec<PropertyResult> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, results);
    }

    #[test]
    fn non_finite_values_are_no_data() {
        let def = PropertyDef::new("x", "", "ratio", Scope::Job, |_: &()| {
            Observation::Scalar(f64::NAN)
        })
        .severity(Formula::F1, 1.0, 1.0, "");
        let strategy = Strategy {
            name: "t",
            roots: vec![Node::leaf(def)],
        };
        let results = strategy.evaluate(&(), &PropertyConfig::default());
        assert!(matches!(results[0].outcome, Outcome::NoData { .. }));
    }
}
