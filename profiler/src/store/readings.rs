//! A rank's reading of the kernel's exact totals: its burst totals, its MPI functions (marked
//! where the probe governor counted less than every call) and call sites, what its probe hits
//! cost, and the bounds of its region of interest, as of one statistics update.

use crate::{
    capture::{governor, KernelTotals, ProbeCost, ProcessTotals, TimedRuns},
    discovery::AddressResolver,
    model::is_lifecycle_function,
    store::{
        clock::Clock, ingest::FunctionNames, probe_cost::RankProbeCost, CallStats, RankRecord,
        RankTotals, RegionMarks, SiteStats,
    },
};

/// What every rank's reading of one update shares.
pub struct Reading<'a> {
    pub totals: &'a KernelTotals,
    pub names: &'a FunctionNames,
    /// What the probe governor did, unless it is off.
    pub governor: Option<&'a governor::Shared>,
    /// What a probe hit costs on this node, unless it could not be measured.
    pub probe_cost: Option<ProbeCost>,
    /// The counter slots are read: the rank's counter sums are kept.
    pub counters: bool,
    pub clock: Clock,
}

impl Reading<'_> {
    /// Reads process `pid`'s totals into its rank; `life` is the rank's life in the kernel's
    /// clock (CLOCK_MONOTONIC ns), to its exit or now: the governor's demotions within it mark
    /// its counts.
    pub fn read(
        &self,
        rank: &mut RankRecord,
        pid: u32,
        process: &ProcessTotals,
        life: (u64, u64),
        resolver: &mut AddressResolver,
    ) {
        let bursts = &process.bursts;
        rank.totals = RankTotals {
            bursts: bursts.bursts,
            burst_ns: bursts.burst_ns,
            burst_oncpu_ns: bursts.burst_oncpu_ns,
            filtered_bursts: bursts.filtered_bursts,
            filtered_ns: bursts.filtered_ns,
            dropped_bursts: bursts.dropped_bursts,
            counter_sums: self.counters.then_some(bursts.counters),
        };
        self.read_functions(rank, process, life);
        rank.probe_cost = self.probe_cost.map(|cost| RankProbeCost {
            daemon_ns: bursts.daemon_delay_ns,
            ..RankProbeCost::of(rank.functions.values(), cost, TimedRuns::of(bursts))
        });
        rank.call_sites = process
            .sites
            .iter()
            .map(|(&(id, address), s)| SiteStats {
                function: self.names.name(id),
                site: resolver.resolve(pid, address),
                calls: s.calls,
                bytes: s.bytes,
                world_peer_calls: s.world_peer_calls,
                world_peer_sum: s.world_peer_sum,
            })
            .collect();
        rank.call_sites
            .sort_by(|a, b| (&a.function, &a.site).cmp(&(&b.function, &b.site)));
        rank.region = self.region(pid);
    }

    /// The rank's MPI functions, marked with the governor's modes within its life.
    fn read_functions(&self, rank: &mut RankRecord, process: &ProcessTotals, life: (u64, u64)) {
        rank.functions = process
            .functions
            .iter()
            .map(|(&id, s)| {
                let (count_only, sampled) = self
                    .governor
                    .map_or((false, false), |g| g.modes_within(id, life.0, life.1));
                (
                    self.names.name(id),
                    CallStats {
                        calls: s.calls,
                        time_ns: s.time_ns,
                        bytes: s.bytes,
                        sized_calls: s.sized_calls,
                        count_only,
                        sampled,
                    },
                )
            })
            .collect();
        // A function sampled while the rank ran may have been called only between two
        // windows: 0 calls seen, still a lower bound.
        for id in self
            .governor
            .iter()
            .flat_map(|g| g.sampled_within(life.0, life.1))
        {
            rank.functions
                .entry(self.names.name(id))
                .or_insert(CallStats {
                    sampled: true,
                    ..CallStats::default()
                });
        }
    }

    /// The bounds of process `pid`'s region of interest seen so far, and its MPI calls in
    /// progress (Unix ns).
    fn region(&self, pid: u32) -> RegionMarks {
        let marks = self.totals.regions.get(&pid).copied().unwrap_or_default();
        let seen = |t: u64| (t != 0).then(|| self.clock.unix_ns(t));
        RegionMarks {
            init_return_ns: seen(marks.init_return_ns),
            finalize_entry_ns: seen(marks.finalize_entry_ns),
            open_calls_since_ns: self
                .totals
                .open_calls
                .iter()
                .filter(|c| {
                    c.pid == pid
                        && !self
                            .names
                            .all()
                            .get(c.func as usize)
                            .is_some_and(|f| is_lifecycle_function(f))
                })
                .map(|c| self.clock.unix_ns(c.entry_ns))
                .collect(),
        }
    }
}
