//! mpiburst: an always-on, eBPF-based profiler for MPI jobs. One module per stage, see
//! docs/architecture.md: capture → discovery → store → analysis → properties → export.

pub mod model;
pub mod analysis;
pub mod properties;
pub mod discovery;
pub mod capture;
pub mod config;
pub mod export;
pub mod store;
pub mod cli;
pub mod daemon;
