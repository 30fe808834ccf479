//! Deterministic synthetic burst streams of an SPMD loop, for tests, the clustering benchmark and
//! demos without MPI: every rank runs the same phases in every iteration, with jitter, optional
//! imbalance, parity-dependent work, outliers, iterations slowed on every rank or on some, pipeline stages
//! and rare phases, separated by collective calls, plus the tiny bursts that back-to-back MPI
//! calls produce.

use super::hashing::{mix, GOLDEN_GAMMA};
use crate::model::{Burst, CallSite, HwCounters, Name};

/// Core clock used to turn cycles into time.
const CLOCK_GHZ: f64 = 2.5;
/// Wall time of each collective call that ends a phase, and of each call between tiny bursts.
const MPI_CALL_NS: u64 = 5_000;
/// Duration of a tiny burst between back-to-back MPI calls.
const TINY_BURST_NS: u64 = 2_000;

/// One compute phase of the loop body.
#[derive(Clone, Debug)]
pub struct Phase {
    pub instructions: f64,
    pub ipc: f64,
    /// Half-width of the uniform relative jitter applied to instructions and IPC.
    pub jitter: f64,
    /// One rank doing a multiple of the work: (rank, factor).
    pub imbalance: Option<(u32, f64)>,
    /// (first rank, factor): the ranks from the first on take FACTOR times longer for the phase
    /// (the same instructions at a lower IPC), as ranks that share cores and evict each other's
    /// caches do.
    pub slow_ranks_from: Option<(u32, f64)>,
    /// Work multiplier on odd iterations (1 for none).
    pub odd_iteration_factor: f64,
    /// Only ranks below this run the phase (for example I/O aggregators); `None` for all ranks.
    pub run_by: Option<u32>,
    /// The phase runs only in iterations divisible by this (1: every iteration), such as a
    /// checkpoint.
    pub every: u32,
    /// (iteration, factor): in that iteration every rank takes FACTOR times longer for the phase
    /// (the same instructions at a lower IPC), as when the hypervisor preempts all of them at
    /// once, or in a slow first iteration.
    pub slowed: Vec<(u32, f64)>,
    /// (rank, iteration, factor): that rank takes FACTOR times longer for the phase in that
    /// iteration, as ranks do while another rank shares their core.
    pub slowed_on: Vec<(u32, u32, f64)>,
    /// Each rank opens the phase at a call site of its own, as a pipeline stage does: in a
    /// wavefront the first rank receives nothing and the last sends nothing, so the same
    /// computation sits between different MPI calls on different ranks.
    pub per_rank_sites: bool,
}

impl Phase {
    pub fn new(instructions: f64, ipc: f64, jitter: f64) -> Self {
        Phase {
            instructions,
            ipc,
            jitter,
            imbalance: None,
            slow_ranks_from: None,
            odd_iteration_factor: 1.0,
            run_by: None,
            every: 1,
            slowed: Vec::new(),
            slowed_on: Vec::new(),
            per_rank_sites: false,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SyntheticJob {
    pub ranks: u32,
    pub iterations: u32,
    pub phases: Vec<Phase>,
    /// Tiny bursts each rank runs after each phase, before the collective.
    pub tiny_bursts_per_phase: u32,
    /// Share of phase bursts replaced by outliers: instructions ×0.2–5, IPC ×0.5–1.5.
    pub outlier_share: f64,
    /// Whether bursts carry hardware counters.
    pub counters: bool,
    pub seed: u64,
}

/// splitmix64: tiny, seedable, and good enough for test data and resampling.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        let z = mix(self.0);
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        z
    }

    /// Uniform in [low, high).
    pub fn uniform(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
    }
}

impl SyntheticJob {
    /// The loop of experiment E1 in González García (2013), the job most tests draw, cluster or
    /// track: three phases of 10⁶, 5·10⁶ and 2·10⁷ instructions at IPC 2.0, 0.6 and 1.2 (0.2, 3.3
    /// and 6.7 ms), 3 % jitter, two tiny bursts after each phase, no outliers, seed 7. A test
    /// that needs more changes the fields it names.
    pub fn three_phases(ranks: u32, iterations: u32, counters: bool) -> Self {
        SyntheticJob {
            ranks,
            iterations,
            phases: vec![
                Phase::new(1e6, 2.0, 0.03),
                Phase::new(5e6, 0.6, 0.03),
                Phase::new(2e7, 1.2, 0.03),
            ],
            tiny_bursts_per_phase: 2,
            outlier_share: 0.0,
            counters,
            seed: 7,
        }
    }

    /// All bursts, rank by rank in time order.
    pub fn bursts(&self) -> Vec<Burst> {
        let mut random = SplitMix64(self.seed);
        let module = Name::new("synthetic");
        let site = |offset: u64| CallSite { module, offset };
        let allreduce = Name::new("MPI_Allreduce");
        let isend = Name::new("MPI_Isend");
        let mut bursts = Vec::new();
        let mut now: u64 = 1_700_000_000_000_000_000;
        // Phase k opens at the collective at site 0x1000·k, or at 0x1000·k + 0x100·(rank + 1) for
        // per-rank sites, and runs to the next running phase's one; its tiny bursts sit between
        // point-to-point calls at the sites in between.
        let opening_site = |k: usize, rank: u32| {
            0x1000 * k as u64
                + if self.phases[k].per_rank_sites {
                    0x100 * u64::from(rank + 1)
                } else {
                    0
                }
        };
        for iteration in 0..self.iterations {
            let running: Vec<usize> = (0..self.phases.len())
                .filter(|&k| iteration % self.phases[k].every.max(1) == 0)
                .collect();
            for (i, &k) in running.iter().enumerate() {
                let phase = &self.phases[k];
                let next = running[(i + 1) % running.len()];
                let slowed = phase
                    .slowed
                    .iter()
                    .find(|&&(it, _)| it == iteration)
                    .map_or(1.0, |&(_, factor)| factor);
                let tiny_sites = u64::from(self.tiny_bursts_per_phase);
                let mut phase_end = now;
                for rank in 0..phase.run_by.map_or(self.ranks, |r| r.min(self.ranks)) {
                    let opening = opening_site(k, rank);
                    let collective = (&allreduce, site(opening_site(next, rank)));
                    let mut instructions =
                        phase.instructions * random.uniform(1.0 - phase.jitter, 1.0 + phase.jitter);
                    let mut ipc =
                        phase.ipc * random.uniform(1.0 - phase.jitter, 1.0 + phase.jitter);
                    if iteration % 2 == 1 {
                        instructions *= phase.odd_iteration_factor;
                    }
                    if let Some((_, factor)) = phase.imbalance.filter(|&(r, _)| r == rank) {
                        instructions *= factor;
                    }
                    if let Some((_, factor)) = phase.slow_ranks_from.filter(|&(r, _)| rank >= r) {
                        ipc /= factor;
                    }
                    if random.uniform(0.0, 1.0) < self.outlier_share {
                        instructions *= random.uniform(0.2f64.ln(), 5f64.ln()).exp();
                        ipc *= random.uniform(0.5, 1.5);
                    }
                    let slowed_here = phase
                        .slowed_on
                        .iter()
                        .find(|&&(r, it, _)| r == rank && it == iteration)
                        .map_or(1.0, |&(.., factor)| factor);
                    let cycles = instructions / ipc * slowed * slowed_here;
                    let duration_ns = (cycles / CLOCK_GHZ) as u64;
                    let start_ns = now + u64::from(rank) * 100;
                    let counters = self.counters.then_some(HwCounters {
                        instructions: instructions as u64,
                        cycles: cycles as u64,
                    });
                    let closing = if tiny_sites == 0 {
                        collective.clone()
                    } else {
                        (&isend, site(opening + 1))
                    };
                    bursts.push(self.burst(
                        rank,
                        start_ns,
                        duration_ns,
                        counters,
                        (&allreduce, site(opening)),
                        closing,
                    ));
                    let mut t = start_ns + duration_ns + MPI_CALL_NS;
                    for tiny in 0..tiny_sites {
                        let closing = if tiny + 1 == tiny_sites {
                            collective.clone()
                        } else {
                            (&isend, site(opening + tiny + 2))
                        };
                        let counters = self.counters.then_some(HwCounters {
                            instructions: 4_000,
                            cycles: 5_000,
                        });
                        bursts.push(self.burst(
                            rank,
                            t,
                            TINY_BURST_NS,
                            counters,
                            (&isend, site(opening + tiny + 1)),
                            closing,
                        ));
                        t += TINY_BURST_NS + MPI_CALL_NS;
                    }
                    phase_end = phase_end.max(t);
                }
                now = phase_end + MPI_CALL_NS;
            }
        }
        bursts
    }

    fn burst(
        &self,
        rank: u32,
        start_ns: u64,
        duration_ns: u64,
        counters: Option<HwCounters>,
        opened_by: (&Name, CallSite),
        closed_by: (&Name, CallSite),
    ) -> Burst {
        Burst {
            pid: 1000 + rank,
            tid: 1000 + rank,
            rank,
            start_ns,
            duration_ns,
            oncpu_ns: duration_ns,
            counters,
            start_func: *opened_by.0,
            end_func: *closed_by.0,
            start_site: opened_by.1,
            end_site: closed_by.1,
        }
    }
}
