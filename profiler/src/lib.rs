//! mpiburst: an always-on, eBPF-based profiler for MPI jobs. docs/architecture.md describes the
//! stages and how data flows through them.
//!
//! # Layers
//!
//! Each module imports only the modules listed before it, and the files of every folder import
//! each other one way (tests/layering.rs checks both):
//!
//! 1. `model`: the types every stage shares (bursts, call sites, job ids).
//! 2. `proc`: reading /proc (processes' status, maps, environment, cgroups, usage).
//! 3. `capture`: the BPF programs, their ring buffers and the kernel's exact totals, the probe
//!    governor, the jobs' kernel usage (CPU time, memory, file I/O).
//! 4. `discovery`: processes and their jobs and ranks, the MPI libraries and where to probe them.
//! 5. `symbols`: call sites to function, file and line.
//! 6. `store`: each job's data on the node, and the steps that fill it: identify, ingest, the
//!    kernel readings per rank.
//! 7. `analysis`: burst clustering, phases, SPMD score, tracking, rank groups, signatures; it
//!    imports only `model`.
//! 8. `properties`: bottleneck properties with severities, POP efficiencies.
//! 9. `export`: the HTTP API, Prometheus metrics, recordings, text, JSON and HTML reports.
//! 10. `config`: the configuration file, made of the stages' own sections.
//! 11. `cli`: the command line's options over the configuration.
//! 12. `daemon`: the loop that runs the stages as steps.
//! 13. `aggregate`: the job-wide view over the daemons of a job's nodes (`mpiburst aggregate`).
//! 14. `fuzzing`: the entry points of the fuzz targets.

pub mod aggregate;
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
pub mod proc;
pub mod properties;
pub mod store;
pub mod symbols;
#[doc(hidden)]
pub mod test_support;
