//! mpiburst: an always-on, eBPF-based profiler for MPI jobs. One module per stage, see
//! docs/architecture.md: capture → discovery → store → analysis → properties → export, with
//! symbols between the store and the export.

pub mod analysis;
pub mod capture;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod discovery;
pub mod export;
#[doc(hidden)]
pub mod fuzzing;
pub mod model;
pub mod properties;
pub mod store;
pub mod symbols;
#[doc(hidden)]
pub mod test_support;
