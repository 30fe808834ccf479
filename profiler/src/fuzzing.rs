//! Entry points of the fuzz targets (the cargo-fuzz crate in fuzz/, see docs/fuzzing.md). Each
//! feeds arbitrary bytes through one reader of input mpiburst does not control, the way the
//! daemon or the CLI reads it, and through what they compute from the result. Bad input must
//! give an error, never a panic, an endless loop or an allocation beyond its size.

use std::path::Path;

use crate::{
    analysis::{analyse, AnalysisParams},
    config::Config,
    discovery::{self, LaunchEnv},
    export::{bottlenecks::Bottlenecks, phases, recording::Recording, report::JobReport},
    model::Burst,
    proc,
    properties::PropertyConfig,
};

/// Most bursts of a job clustered per input: enough to reach every stage of the analysis, few
/// enough to keep a run at thousands of inputs per second.
const MAX_ANALYSED_BURSTS: usize = 256;

/// A recording, read as `mpiburst report FILE` reads it, then reported: each job's report, its
/// bottlenecks and (for jobs with few bursts) its phases.
pub fn recording(data: &[u8]) {
    let Ok(recording) = Recording::from_reader(data, Path::new("input")) else {
        return;
    };
    let now = recording.end.as_ref().map_or(0, |end| end.ended_ns);
    for job in recording.jobs.values() {
        JobReport::new(job, now, &recording.header.counters_note).text();
        let properties = recording.job_properties(job, now, &PropertyConfig::default());
        Bottlenecks::new(&properties).text("over its life");
        phases::render_kernel_filter(job, Some(recording.header.min_burst_ns));
        if job.bursts.len() <= MAX_ANALYSED_BURSTS {
            let bursts: Vec<Burst> = job.bursts.iter().cloned().collect();
            let _ = analyse(&bursts, job.node_ranks(), &AnalysisParams::default());
        }
    }
}

/// A config file (`mpiburst run --config FILE`) and a property file, with the values the
/// daemon derives from a valid config.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(config) = Config::from_toml_str(text, Path::new("input")) {
        config.capture.min_burst_ns();
        config.capture.drain_interval();
        config.capture.stats_interval();
    }
    let _ = PropertyConfig::from_toml_str(text);
}

/// A /proc/PID/maps file, and the MPI libraries among its mappings.
pub fn proc_maps(data: &[u8]) {
    if let Ok(maps) = proc::parse_maps(data) {
        for path in maps.iter().filter_map(|m| m.path.as_deref()) {
            discovery::is_mpi_library_name(path);
        }
    }
}

/// A /proc/PID/environ file, and the job, rank and size its launcher variables name (with no
/// Hydra job above the process).
pub fn proc_environ(data: &[u8]) {
    let env = LaunchEnv::parse(data);
    let _ = env.job(|| Ok(None));
    env.rank();
    env.size();
}

/// The /proc/PID/stat family: `stat`, then optionally `statm`, `status` and /proc/meminfo, each
/// after a NUL byte (none of them holds one).
pub fn proc_stat(data: &[u8]) {
    let mut parts = data.split(|&b| b == 0);
    let stat = parts.next().unwrap_or_default();
    let mut text = || String::from_utf8_lossy(parts.next().unwrap_or_default());
    let (statm, status, meminfo) = (text(), text(), text());
    if let Ok(process) = proc::parse_stat(stat) {
        discovery::is_launcher(&process.comm);
    }
    let tick_ns = 10_000_000;
    let _ = proc::parse_start_time_ns(stat, tick_ns);
    let _ = proc::parse_process(stat, &statm, &status, tick_ns, 4096);
    let _ = proc::parse_mem_total(&meminfo);
}

/// A /proc/PID/cgroup file after a first line naming a Slurm job id and a cgroup scope
/// (`daemon.cgroup`), separated by a space: the job's cgroup and whether the process is in scope.
pub fn proc_cgroup(data: &[u8]) {
    let (first, file) = match data.iter().position(|&b| b == b'\n') {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &[][..]),
    };
    let first = String::from_utf8_lossy(first);
    let (job, scope) = first.split_once(' ').unwrap_or((&first, ""));
    if let Ok(cgroups) = proc::parse_cgroups(file) {
        discovery::job_cgroup_of(&cgroups, job);
        discovery::cgroups_match(&cgroups, scope);
    }
}
