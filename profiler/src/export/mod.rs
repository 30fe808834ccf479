//! Export stage: Prometheus metrics, the HTTP server, recordings, text reports, phase tables and
//! the HTML views of a phase analysis.

pub mod bottlenecks;
pub mod client;
pub mod compression;
pub mod groups;
pub mod html;
pub mod http;
pub mod phases;
pub mod printed;
pub mod prometheus;
pub mod published;
pub mod recording;
pub mod recording_sink;
pub mod report;
pub mod report_json;
pub mod signature;
pub mod sites;
