//! Text view of a job's bottleneck properties: the POP efficiencies, then every property that
//! fires with its severity and recommendation, most severe first, then what could not be measured.
//! [`Bottlenecks`] holds the values once, for the text and the JSON of `mpiburst report`.

use std::fmt::Write as _;

use serde::Serialize;

use crate::properties::{ActiveRecommendation, JobProperties, Outcome};

/// Wraps `text` to lines of at most `width` characters, each starting with `indent`.
fn wrap(text: &str, indent: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && indent.len() + line.len() + 1 + word.len() > width {
            let _ = writeln!(out, "{indent}{line}");
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        let _ = writeln!(out, "{indent}{line}");
    }
    out
}

/// A recommendation that applies, with the value of the property that fired it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommendation {
    #[serde(flatten)]
    pub recommendation: ActiveRecommendation,
    /// The property's value, where it has one (unit as the catalogue defines the property).
    pub value: Option<f64>,
}

/// What the bottleneck view of one job shows: its properties over one span and the
/// recommendations that apply, most severe first.
#[derive(Clone, Debug, Serialize)]
pub struct Bottlenecks<'a> {
    pub properties: &'a JobProperties,
    pub recommendations: Vec<Recommendation>,
}

impl<'a> Bottlenecks<'a> {
    pub fn new(props: &'a JobProperties) -> Bottlenecks<'a> {
        let recommendations = props
            .recommendations()
            .into_iter()
            .map(|r| {
                let value = props
                    .properties
                    .iter()
                    .chain(
                        props
                            .phases
                            .iter()
                            .filter(|ph| Some(ph.phase) == r.phase)
                            .flat_map(|ph| &ph.properties),
                    )
                    .find(|p| p.name == r.property)
                    .and_then(|p| p.value());
                Recommendation {
                    recommendation: r,
                    value,
                }
            })
            .collect();
        Bottlenecks {
            properties: props,
            recommendations,
        }
    }

    /// The view as text, titled `what` (e.g. "over the job's life here").
    pub fn text(&self, what: &str) -> String {
        let props = self.properties;
        let mut out = String::new();
        let secs = (props.span.end_ns - props.span.start_ns) as f64 / 1e9;
        let _ = writeln!(
            out,
            "   bottlenecks of job {} {what} ({secs:.1} s, {} ranks here):",
            props.job, props.pop.ranks
        );
        let pop = &props.pop;
        let show = |r: &crate::properties::Reading| {
            r.value().map_or("n/a".to_string(), |v| format!("{v:.3}"))
        };
        let _ = writeln!(
            out,
            "     parallel efficiency {} = load balance {} × communication efficiency {}",
            show(&pop.parallel_efficiency),
            show(&pop.load_balance),
            show(&pop.communication_efficiency)
        );
        if self.recommendations.is_empty() {
            let _ = writeln!(out, "     no property fires");
        }
        for Recommendation {
            recommendation: r,
            value,
        } in &self.recommendations
        {
            let phase = r.phase.map(|p| format!(" (phase {p})")).unwrap_or_default();
            let value = value.map(|v| format!(" = {v:.4}")).unwrap_or_default();
            let _ = writeln!(
                out,
                "     {:<28} severity {:.2}{value}{phase}",
                r.property, r.severity
            );
            out.push_str(&wrap(&r.text, "         ", 100));
        }
        let mut reasons: Vec<(&str, &str)> = props
            .properties
            .iter()
            .filter_map(|p| match &p.outcome {
                Outcome::NotMeasured { reason } => Some((p.name.as_str(), reason.as_str())),
                _ => None,
            })
            .collect();
        reasons.sort_by_key(|(_, reason)| *reason);
        let mut grouped: Vec<(&str, Vec<&str>)> = Vec::new();
        for (name, reason) in reasons {
            match grouped.last_mut() {
                Some((r, names)) if *r == reason => names.push(name),
                _ => grouped.push((reason, vec![name])),
            }
        }
        for (reason, names) in grouped {
            let _ = writeln!(out, "     {reason}: {}", names.join(", "));
        }
        out
    }
}

/// The bottlenecks of one job over one span, titled `what` (e.g. "over the job's life here").
pub fn render(props: &JobProperties, what: &str) -> String {
    Bottlenecks::new(props).text(what)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraps_at_word_boundaries() {
        assert_eq!(wrap("aaa bbb ccc", "  ", 9), "  aaa bbb\n  ccc\n");
        assert_eq!(wrap("", "  ", 9), "");
    }
}
