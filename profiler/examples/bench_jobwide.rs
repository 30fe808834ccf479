//! The job-wide analysis of one 30 s window of a large job: what each node's daemon sends
//! (`GET /api/jobs/{id}/samples`) and what the aggregator (`mpiburst aggregate`) spends to decode
//! all nodes' samples and merge them, for jobs of 4, 64, 512 and 2,000 nodes × 64 ranks. The
//! targets, printed beside the numbers and never asserted: at most 64 KiB per node and window on
//! the wire, and for 2,000 nodes at most 2 s of CPU and 1 GiB of memory for the aggregator.
//!
//! Each node also sends its ranks' repetitions of every code region, from which the aggregator
//! sums the job's signature over every rank (not only the sampled ones).
//!
//! The job is a synthetic SPMD loop of three phases (distinct instructions and IPC, ±3 %
//! jitter, one call site each), about 150 bursts per rank and second. Each node's daemon is
//! played as in the daemon: its ranks' bursts are pushed into a `JobPhases` of the node's rank
//! count, the window is closed, and the node's `NodeSamples` are built and encoded as the samples
//! route does: JSON, gzip-compressed for the aggregator, which accepts gzip. The nodes are played
//! on every core, before the aggregator's part is measured; the network time of the aggregator's
//! fan-out is not part of the numbers. The aggregator's CPU is the process's (getrusage) over the
//! decompression, the decode and the merge, its memory the peak resident set (VmHWM, reset before
//! the decode through /proc/self/clear_refs), which includes the compressed samples of all nodes
//! held before the decode.
//!
//! Run: `cargo run --release -p profiler --example bench_jobwide`

use std::sync::atomic::{AtomicUsize, Ordering};

use mpiburst::analysis::online::{merge_nodes, JobPhases, NodeSamples, OnlineParams, RankSample};
use mpiburst::export::compression::{gunzip, gzip};
use mpiburst::model::{Burst, CallSite, HwCounters, JobId, Name};

const RANKS_PER_NODE: u32 = 64;
const NODES: [u32; 4] = [4, 64, 512, 2_000];
/// Unix time of the window's start: a multiple of the 30 s window.
const WINDOW_START_NS: u64 = 1_700_000_010_000_000_000;
const WINDOW_NS: u64 = 30_000_000_000;
const CLOCK_GHZ: f64 = 2.5;
/// The phases of every iteration: (instructions, IPC).
const PHASES: [(f64, f64); 3] = [(2e6, 2.0), (1e7, 0.6), (4e7, 1.2)];
/// The time between one phase's end and the next one's start: the MPI call.
const MPI_NS: u64 = 50_000;
const WIRE_TARGET_BYTES: usize = 64 * 1024;
const CPU_TARGET_S: f64 = 2.0;
const MEMORY_TARGET_BYTES: u64 = 1 << 30;

/// A value in [1 - 0.03, 1 + 0.03) from `key`: the jitter of one burst.
fn jitter(key: u64) -> f64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    1.0 + 0.06 * ((z >> 11) as f64 / (1u64 << 53) as f64 - 0.5)
}

/// The bursts of `rank` in the window, in start order. Every rank starts every iteration at the
/// same time (100 ns apart, as a collective releases them).
fn rank_bursts(rank: u32) -> Vec<Burst> {
    let module = Name::new("/opt/app/bin/solver");
    let functions = [
        Name::new("MPI_Allreduce"),
        Name::new("MPI_Isend"),
        Name::new("MPI_Waitall"),
    ];
    let nominal_ns = |(instructions, ipc): (f64, f64)| (instructions / ipc / CLOCK_GHZ) as u64;
    // The slowest rank sets the pace: the nominal phases at +3 %, and the MPI calls.
    let iteration_ns: u64 = PHASES
        .iter()
        .map(|&p| nominal_ns(p) * 103 / 100 + MPI_NS)
        .sum();
    let mut bursts = Vec::new();
    let mut iteration_start = WINDOW_START_NS;
    let mut iteration = 0u64;
    while iteration_start < WINDOW_START_NS + WINDOW_NS {
        let mut phase_start = iteration_start;
        for (k, &phase) in PHASES.iter().enumerate() {
            let (instructions, ipc) = phase;
            let key = (u64::from(rank) << 40) ^ (iteration << 4) ^ k as u64;
            let instructions = instructions * jitter(key);
            let cycles = instructions / (ipc * jitter(key ^ 0xff));
            let duration_ns = (cycles / CLOCK_GHZ) as u64;
            let start_ns = phase_start + u64::from(rank) * 100;
            if start_ns < WINDOW_START_NS + WINDOW_NS {
                bursts.push(Burst {
                    pid: 10_000 + rank,
                    tid: 10_000 + rank,
                    rank,
                    start_ns,
                    duration_ns,
                    oncpu_ns: duration_ns,
                    counters: Some(HwCounters {
                        instructions: instructions as u64,
                        cycles: cycles as u64,
                    }),
                    start_func: functions[(k + 2) % 3],
                    end_func: functions[k],
                    start_site: CallSite {
                        module,
                        offset: 0x1000 * (k as u64 + 1),
                    },
                    end_site: CallSite {
                        module,
                        offset: 0x1000 * (k as u64 + 1) + 0x40,
                    },
                });
            }
            phase_start += nominal_ns(phase) * 103 / 100 + MPI_NS;
        }
        iteration_start += iteration_ns;
        iteration += 1;
    }
    bursts
}

/// What node `node` of a job of `nodes` nodes sends of the window.
struct Sent {
    /// The daemon's window sample, trimmed and encoded as the samples route does, gzip-compressed
    /// as the route sends it to the aggregator (which accepts gzip).
    body: Vec<u8>,
    /// The length of the JSON before compression.
    json_bytes: usize,
    /// The bursts the node's ranks ran in the window.
    bursts: u64,
}

fn node_samples(job: &JobId, nodes: u32, node: u32, params: &OnlineParams) -> Sent {
    let ranks: Vec<u32> = (node * RANKS_PER_NODE..(node + 1) * RANKS_PER_NODE).collect();
    let mut phases = JobPhases::new(RANKS_PER_NODE, params.clone()).expect("default parameters");
    let mut bursts = 0;
    for &rank in &ranks {
        let batch = rank_bursts(rank);
        bursts += batch.len() as u64;
        phases.push_all(&batch);
    }
    let lateness_ns = (params.lateness_s * 1e9) as u64;
    phases.tick(WINDOW_START_NS + WINDOW_NS + lateness_ns);
    let samples = NodeSamples::new(
        format!("node{node:04}"),
        job.clone(),
        nodes * RANKS_PER_NODE,
        ranks,
        &phases.snapshot().samples,
    );
    let json = serde_json::to_vec(&samples).expect("samples serialise");
    Sent {
        body: gzip(&json),
        json_bytes: json.len(),
        bursts,
    }
}

/// What every node sends, the nodes played on every core.
fn all_nodes(job: &JobId, nodes: u32, params: &OnlineParams) -> Vec<Sent> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let next = AtomicUsize::new(0);
    let mut played: Vec<(u32, Sent)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut own = Vec::new();
                    loop {
                        let node = next.fetch_add(1, Ordering::Relaxed) as u32;
                        if node >= nodes {
                            return own;
                        }
                        own.push((node, node_samples(job, nodes, node, params)));
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a node's thread panicked"))
            .collect()
    });
    played.sort_by_key(|(node, _)| *node);
    played.into_iter().map(|(_, samples)| samples).collect()
}

/// CPU seconds of the process so far (user and system).
fn cpu_seconds() -> f64 {
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// A field of /proc/self/status in bytes (`VmHWM`, `VmRSS`).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|line| line.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|rest| rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// Resets the peak resident set to the current one (Linux ≥ 4.0), so that VmHWM is the peak
/// of what follows.
fn reset_peak_memory() {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        eprintln!("cannot reset the peak memory ({e}); the peak includes the nodes' part");
    }
}

fn min_median_max(mut values: Vec<usize>) -> (usize, usize, usize) {
    values.sort_unstable();
    (
        values[0],
        values[values.len() / 2],
        values[values.len() - 1],
    )
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// Whether each known phase is found once, by its instructions and IPC (within 5 %), and
/// nothing else: the found phases' (time share, IPC, instructions), by time.
fn phases_found(view: &mpiburst::analysis::online::WindowView) -> (bool, Vec<String>) {
    let mut found: Vec<_> = view.phases.iter().collect();
    found.sort_by_key(|p| p.time_rank);
    let close = |a: f64, b: f64| (a / b - 1.0).abs() < 0.05;
    let matched = found.len() == PHASES.len()
        && PHASES.iter().all(|&(instructions, ipc)| {
            found
                .iter()
                .filter(|p| {
                    p.stats.ipc.is_some_and(|x| close(x, ipc))
                        && p.stats
                            .instructions_mean
                            .is_some_and(|x| close(x, instructions))
                })
                .count()
                == 1
        });
    let described = found
        .iter()
        .map(|p| {
            format!(
                "{:.0} % at IPC {:.2}, {:.1e} instr.",
                p.stats.time_share * 100.0,
                p.stats.ipc.unwrap_or(0.0),
                p.stats.instructions_mean.unwrap_or(0.0)
            )
        })
        .collect();
    (matched, described)
}

fn main() {
    let params = OnlineParams::default();
    println!(
        "One 30 s window of a synthetic SPMD job ({} phases, {RANKS_PER_NODE} ranks per node, \
         about {} bursts per rank); default [online] settings (max_window_bursts {}, {} slots).",
        PHASES.len(),
        rank_bursts(0).len(),
        params.max_window_bursts,
        params.window_slots
    );
    println!(
        "Targets: ≤ {} KiB per node and window on the wire; for the aggregator's decode and \
         merge ≤ {CPU_TARGET_S} s CPU and ≤ {} MiB. Network time of the fan-out not included.",
        WIRE_TARGET_BYTES / 1024,
        MEMORY_TARGET_BYTES >> 20
    );
    println!();
    println!(
        "| nodes | ranks   | ranks sampled | bursts per node | wire bytes per node min / median / max | JSON bytes per node (max) | bursts sent per node (max) | decode CPU | merge CPU | peak RSS  | phases found | SPMD score |"
    );
    println!(
        "|-------|---------|---------------|-----------------|----------------------------------------|---------------------------|----------------------------|------------|-----------|-----------|--------------|------------|"
    );
    let mut details = Vec::new();
    for nodes in NODES {
        let job = JobId(format!("synthetic:{nodes}"));
        let played = all_nodes(&job, nodes, &params);
        let bursts_per_node = played[0].bursts;
        let (wire_min, wire_median, wire_max) =
            min_median_max(played.iter().map(|sent| sent.body.len()).collect());
        let json_max = played.iter().map(|sent| sent.json_bytes).max().unwrap_or(0);
        let bodies: Vec<Vec<u8>> = played.into_iter().map(|sent| sent.body).collect();

        reset_peak_memory();
        let before_decode = cpu_seconds();
        let samples: Vec<NodeSamples> = bodies
            .iter()
            .map(|body| {
                let json = gunzip(body).expect("samples decompress");
                serde_json::from_slice(&json).expect("samples decode")
            })
            .collect();
        let decoded = cpu_seconds();
        let merged = merge_nodes(&job, &samples).expect("the nodes' samples merge");
        let merge_cpu = cpu_seconds() - decoded;
        let peak = status_bytes("VmHWM");

        let sent_max = samples
            .iter()
            .map(|s| s.held.windows.iter().map(|w| w.bursts.len()).sum::<usize>())
            .max()
            .unwrap_or(0);
        let world = nodes * RANKS_PER_NODE;
        let last = merged
            .snapshot
            .last_window
            .as_ref()
            .expect("the merged window was clustered");
        let (matched, described) = phases_found(last);
        let wire_mark = if wire_max <= WIRE_TARGET_BYTES {
            ""
        } else {
            " (over)"
        };
        println!(
            "| {nodes:>5} | {world:>7} | {:>13} | {bursts_per_node:>15} | {:>10} / {:>8} / {:>8}{wire_mark} | {json_max:>25} | {sent_max:>26} | {:>8.3} s | {:>7.3} s | {:>5.0} MiB | {:>12} | {:>10.4} |",
            RankSample::new(world, &params).kept(),
            wire_min,
            wire_median,
            wire_max,
            decoded - before_decode,
            merge_cpu,
            mib(peak),
            if matched { "3 of 3" } else { "NOT the 3" },
            last.spmd_score,
        );
        let signature = merged.snapshot.signature.as_ref().map(|s| &s.signature).map_or_else(
            || "none".to_string(),
            |s| {
                let weights: Vec<String> =
                    s.phases.iter().map(|p| format!("{:.0}", p.weight)).collect();
                format!(
                    "{} ranks, W per rank {} (each rank ran {} iterations), PAET {:.2} s of {:.2} s",
                    s.ranks,
                    weights.join(" / "),
                    rank_bursts(0).len() / PHASES.len(),
                    s.paet_ns() / 1e9,
                    s.runtime_ns as f64 / 1e9
                )
            },
        );
        details.push(format!(
            "{nodes} nodes: {} bursts analysed of {} seen, over {} ranks; phases {}; signature \
             over every rank: {signature}",
            last.bursts_analysed,
            last.bursts_seen,
            last.ranks_sampled,
            described.join("; ")
        ));
        if nodes == *NODES.last().expect("sizes") {
            let cpu = decoded - before_decode + merge_cpu;
            println!();
            println!(
                "{nodes} nodes: wire {} ({} KiB max per node), aggregator CPU {cpu:.3} s ({}), peak {:.0} MiB ({})",
                if wire_max <= WIRE_TARGET_BYTES { "within target" } else { "OVER target" },
                wire_max / 1024,
                if cpu <= CPU_TARGET_S { "within target" } else { "OVER target" },
                mib(peak),
                if peak <= MEMORY_TARGET_BYTES { "within target" } else { "OVER target" },
            );
        }
    }
    println!();
    for line in details {
        println!("{line}");
    }
}
