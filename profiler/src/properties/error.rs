//! What can go wrong in the properties: a property configuration that does not parse or names
//! what does not exist, and window snapshots that do not fit together.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PropertyError {
    #[error("cannot read property file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid property configuration ({origin}): {source}")]
    Parse {
        origin: String,
        source: toml::de::Error,
    },
    #[error(
        "unknown property {id:?} in the property configuration; configurable properties: {known}"
    )]
    UnknownProperty { id: String, known: String },
    #[error(
        "property {id} has no severity formula, so it takes no threshold or exponent; remove \
         [property.{id}]"
    )]
    NoSeverity { id: String },
    #[error("property {id}: {field} = {value} is invalid; expected {expected}")]
    InvalidSetting {
        id: String,
        field: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(
        "quantiles = {0} is invalid; expected 1 to 100 (10 gives the minimum, deciles and maximum)"
    )]
    Quantiles(u32),
    #[error("rank {rank}: inconsistent snapshots for a window: {detail}")]
    Snapshot { rank: u32, detail: String },
}
