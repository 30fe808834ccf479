//! Thresholds and exponents of the properties, from TOML with unknown fields and unknown
//! properties rejected. Every property missing from the file keeps its catalogue default;
//! [`PropertyConfig::default_toml`] prints every default with its documentation.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::catalogue::{catalogue, PropertyInfo};
use super::engine::{Condition, Formula, PropertyDef, Setting, StrategySettings};
use super::error::PropertyError;

/// Overrides for one property. Fields left out keep the default.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PropertySetting {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exponent: Option<f64>,
}

/// The file's shape before validation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawConfig {
    quantiles: u32,
    property: BTreeMap<String, PropertySetting>,
}

impl Default for RawConfig {
    fn default() -> Self {
        RawConfig {
            quantiles: DEFAULT_QUANTILES,
            property: BTreeMap::new(),
        }
    }
}

/// Deciles: minimum, deciles 1–9 and maximum, as PerSyst on SuperMUC.
pub const DEFAULT_QUANTILES: u32 = 10;

/// The validated property configuration: every threshold and exponent is finite and positive,
/// every property named exists and has a severity formula, `quantiles` is within 1..=100.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawConfig", into = "RawConfig")]
pub struct PropertyConfig {
    quantiles: u32,
    property: BTreeMap<String, PropertySetting>,
}

impl Default for PropertyConfig {
    /// Every catalogue default written out.
    fn default() -> Self {
        let property = defaults()
            .into_iter()
            .map(|(id, s)| {
                (
                    id.to_string(),
                    PropertySetting {
                        threshold: Some(s.threshold),
                        exponent: Some(s.exponent),
                    },
                )
            })
            .collect();
        PropertyConfig {
            quantiles: DEFAULT_QUANTILES,
            property,
        }
    }
}

impl From<PropertyConfig> for RawConfig {
    fn from(c: PropertyConfig) -> RawConfig {
        RawConfig {
            quantiles: c.quantiles,
            property: c.property,
        }
    }
}

impl TryFrom<RawConfig> for PropertyConfig {
    type Error = PropertyError;
    fn try_from(raw: RawConfig) -> Result<Self, PropertyError> {
        if !(1..=100).contains(&raw.quantiles) {
            return Err(PropertyError::Quantiles(raw.quantiles));
        }
        let mut config = PropertyConfig {
            quantiles: raw.quantiles,
            property: BTreeMap::new(),
        };
        for (id, setting) in raw.property {
            config = config.with_setting(&id, setting)?;
        }
        Ok(config)
    }
}

/// (id, default) of every property with a severity formula, in catalogue order, replicas once.
fn defaults() -> Vec<(&'static str, Setting)> {
    let mut out: Vec<(&'static str, Setting)> = Vec::new();
    for info in catalogue() {
        if let Some(d) = info.default {
            if !out.iter().any(|(id, _)| *id == info.id) {
                out.push((info.id, d));
            }
        }
    }
    out
}

fn check(id: &str, field: &'static str, value: Option<f64>) -> Result<(), PropertyError> {
    match value {
        Some(v) if !(v.is_finite() && v > 0.0) => Err(PropertyError::InvalidSetting {
            id: id.to_string(),
            field,
            value: v.to_string(),
            expected: "a finite number above 0",
        }),
        _ => Ok(()),
    }
}

impl PropertyConfig {
    /// Parses and validates TOML text.
    pub fn from_toml_str(text: &str) -> Result<PropertyConfig, PropertyError> {
        toml::from_str(text).map_err(|source| PropertyError::Parse {
            origin: "text".into(),
            source,
        })
    }

    pub fn load(path: &Path) -> Result<PropertyConfig, PropertyError> {
        let text = std::fs::read_to_string(path).map_err(|source| PropertyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| PropertyError::Parse {
            origin: format!("file {}", path.display()),
            source,
        })
    }

    /// This configuration with `setting` merged into property `id`'s (fields left `None` keep
    /// the current value).
    pub fn with_setting(
        mut self,
        id: &str,
        setting: PropertySetting,
    ) -> Result<Self, PropertyError> {
        let infos = catalogue();
        let Some(info) = infos.iter().find(|i| i.id == id) else {
            let mut known: Vec<&str> = infos
                .iter()
                .filter(|i| i.default.is_some())
                .map(|i| i.id)
                .collect();
            known.dedup();
            return Err(PropertyError::UnknownProperty {
                id: id.to_string(),
                known: known.join(", "),
            });
        };
        if info.default.is_none() {
            return Err(PropertyError::NoSeverity { id: id.to_string() });
        }
        check(id, "threshold", setting.threshold)?;
        check(id, "exponent", setting.exponent)?;
        let entry = self.property.entry(id.to_string()).or_default();
        entry.threshold = setting.threshold.or(entry.threshold);
        entry.exponent = setting.exponent.or(entry.exponent);
        Ok(self)
    }

    /// The complete default file, every threshold and exponent with its documentation.
    pub fn default_toml() -> String {
        let infos = catalogue();
        let mut out = String::from(
            "# mpiburst property thresholds and exponents (Guillén (2015), PerSyst). Every entry is\n\
             # optional; shown here with its default. x = property value, t = threshold, p = exponent:\n\
             #   F1 (higher is worse, Eq. 3.1): severity 0 for x <= t, (x/t - 1)^p up to x = 2t, then 1.\n\
             #   F2 (lower is worse, Eq. 3.2): severity 1 - (x/t)^p for x < t, else 0.\n\
             #   proportional (Eq. 3.57/3.59): severity min((x/t)^p, 1).\n\
             # A recommendation is given when a property's condition holds and its severity is above\n\
             # 0; a child property is evaluated only when its parent's condition holds. Thresholds\n\
             # and exponents must be finite and above 0. Guillén (2015) publishes no exponents: all\n\
             # are 1.\n\n",
        );
        let _ = writeln!(
            out,
            "# Per-rank properties are summarised over the job's ranks as quantiles: this many equal\n\
             # parts (10: minimum, deciles 1-9, maximum; 1 to 100).\n\
             quantiles = {DEFAULT_QUANTILES}\n"
        );
        let mut seen: Vec<&str> = Vec::new();
        for info in &infos {
            let Some(d) = info.default else { continue };
            if seen.contains(&info.id) {
                continue;
            }
            seen.push(info.id);
            let sharing: Vec<&PropertyInfo> = infos.iter().filter(|i| i.id == info.id).collect();
            write_entry(&mut out, info, d, &sharing);
        }
        out
    }
}

impl StrategySettings for PropertyConfig {
    fn setting<I>(&self, def: &PropertyDef<I>) -> Option<Setting> {
        let default = def.default?;
        let configured = self.property.get(def.id).copied().unwrap_or_default();
        Some(Setting {
            threshold: configured.threshold.unwrap_or(default.threshold),
            exponent: configured.exponent.unwrap_or(default.exponent),
        })
    }

    fn quantiles(&self) -> u32 {
        self.quantiles
    }
}

fn write_entry(out: &mut String, info: &PropertyInfo, d: Setting, sharing: &[&PropertyInfo]) {
    let formula = match info.formula {
        Formula::F1 => "F1 (higher is worse)",
        Formula::F2 => "F2 (lower is worse)",
        Formula::Proportional => "proportional",
        Formula::Informational => "none",
    };
    let mut text = format!(
        "{} [{}], strategy {}: {}.",
        info.id, info.unit, info.strategy, info.description
    );
    if sharing.len() > 1 {
        let replicas: Vec<String> = sharing
            .iter()
            .map(|r| match r.condition {
                Condition::AboveThreshold => format!("{} (condition x > t)", r.name),
                Condition::AtOrBelowThreshold => format!("{} (condition x <= t)", r.name),
                _ => r.name.to_string(),
            })
            .collect();
        text.push_str(&format!(
            " Shared by the replicas {}.",
            replicas.join(" and ")
        ));
    }
    text.push_str(&format!(
        " Severity {formula}. Default threshold: {}.",
        info.threshold_note
    ));
    comment(out, &text);
    let _ = writeln!(
        out,
        "[property.{}]\nthreshold = {:?}\nexponent = {:?}\n",
        info.id, d.threshold, d.exponent
    );
}

/// Writes `text` as comment lines of at most about 98 columns.
fn comment(out: &mut String, text: &str) {
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.chars().count() + 1 + word.chars().count() > 98 && line.len() > 1 {
            let _ = writeln!(out, "{line}");
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    let _ = writeln!(out, "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_file_parses_back_to_the_defaults() {
        let text = PropertyConfig::default_toml();
        let parsed = PropertyConfig::from_toml_str(&text).unwrap();
        assert_eq!(parsed, PropertyConfig::default());
        // Every property with a severity has its threshold and exponent in the file.
        for info in catalogue() {
            if info.default.is_some() {
                assert!(
                    text.contains(&format!("[property.{}]", info.id)),
                    "{}",
                    info.id
                );
            }
        }
        assert!(text.contains("quantiles = 10"));
    }

    #[test]
    fn partial_files_keep_the_other_defaults() {
        let c = PropertyConfig::from_toml_str("quantiles = 4\n[property.cpi]\nthreshold = 2.0\n")
            .unwrap();
        assert_eq!(c.quantiles(), 4);
        let infos = catalogue();
        let cpi = infos.iter().find(|i| i.id == "cpi").unwrap();
        assert_eq!(
            c.property["cpi"],
            PropertySetting {
                threshold: Some(2.0),
                exponent: None
            }
        );
        assert_eq!(cpi.default.unwrap().threshold, 1.6);
        assert!(!c.property.contains_key("load_balance"));
        assert_eq!(PropertyConfig::from_toml_str("").unwrap().quantiles(), 10);
    }

    #[test]
    fn invalid_files_are_rejected_with_the_cause() {
        let err = |text: &str| PropertyConfig::from_toml_str(text).unwrap_err().to_string();
        assert!(err("[property.cpi]\nthreshhold = 2.0\n").contains("unknown field"));
        assert!(err("quantile = 10\n").contains("unknown field"));
        assert!(
            err("[property.nonsense]\nthreshold = 2.0\n").contains("unknown property \"nonsense\"")
        );
        assert!(err("[property.cpi]\nthreshold = 0.0\n").contains("threshold = 0"));
        assert!(err("[property.cpi]\nexponent = -1.0\n").contains("exponent = -1"));
        assert!(err("[property.core_frequency]\nthreshold = 2.0\n").contains("no severity formula"));
        assert!(err("quantiles = 0\n").contains("quantiles = 0"));
        // Replicas are configured through their shared id only.
        assert!(err("[property.io_read_bandwidth_high]\nthreshold = 2.0\n")
            .contains("unknown property"));
    }

    #[test]
    fn load_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("props.toml");
        std::fs::write(&path, "[property.cpi]\nthreshold = -3.0\n").unwrap();
        let e = PropertyConfig::load(&path).unwrap_err().to_string();
        assert!(e.contains("props.toml") && e.contains("threshold"), "{e}");
        let missing = PropertyConfig::load(&dir.path().join("absent.toml"))
            .unwrap_err()
            .to_string();
        assert!(missing.contains("absent.toml"), "{missing}");
    }

    #[test]
    fn serialises_as_the_file_shape() {
        let c = PropertyConfig::from_toml_str("[property.cpi]\nthreshold = 2.0\n").unwrap();
        let text = toml::to_string(&c).unwrap();
        assert_eq!(PropertyConfig::from_toml_str(&text).unwrap(), c);
    }
}
