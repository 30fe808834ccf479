//! The signature of a running job, live and job-wide: the repetitions of every code region,
//! summed over the job's ranks as the bursts arrive, cut at window ends.
//!
//! A run's signature ([`super::signature`]) needs every burst of the run. A running job's daemon
//! does not keep them, and the aggregator sees only samples, so each daemon counts instead, per
//! code region, how many repetitions its ranks ran and how long they took. A repetition is what
//! [`super::signature`] calls one: a burst and what follows until its thread's next burst (the
//! MPI call that ends it, and the bursts too short for the kernel filter). These are sums over
//! ranks, so the sums of a job's nodes add up to what one daemon seeing all ranks counts, exactly.
//!
//! **Cuts.** The sums are cut at the end of each closed window ([`Repetitions::close`]):
//! repetitions that started before the cut, with their time up to it. Windows are aligned to
//! Unix time, so every node cuts at the same instants, and the job-wide signature of window k is
//! the sum of every node's cut k. A repetition that spans a cut is split at it.
//!
//! **Phases.** Which regions are phases comes from the clustering of the same window: each region
//! a phase ran belongs to that phase, named by the phase's dominant region, as the offline
//! signature names its phases. Repetitions of regions no phase ran are the time the phases do
//! not cover (`other_ns`), with the time before each rank's first burst.
//!
//! **Differences from the offline signature**, which sees each burst's cluster: a region's
//! repetitions all count for the phase the region belongs to, even those of its bursts the
//! clustering filtered out or left as noise (the offline one folds the filtered ones into the
//! repetition before); and a rank's repetitions are those of its first thread to end a burst
//! (usually the one that called MPI_Init), not of the thread with the most bursts.
//!
//! **Bounds.** At most [`MAX_REGIONS`] regions per job are counted (later ones count as other
//! time); the state is a few numbers per rank and per region, whatever the burst rate. A burst
//! that arrives after a cut it precedes counts in the next cut.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::{assemble, AppSignature, PhaseKey, PhaseRepetitions, SignatureError};
use crate::analysis::{hashing::FastMap, stats::RegionCount, ClusterId};
use crate::model::{Burst, CallSite, Name, FINALIZE_FUNCTION};

/// Distinct code regions counted per job.
pub const MAX_REGIONS: usize = 4_096;

/// Repetitions of one code region: how many started before the cut, and their time up to it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionRepetitions {
    pub start: CallSite,
    pub end: CallSite,
    pub count: u64,
    pub time_ns: u64,
}

/// The repetitions of a job's ranks up to a cut, summed over ranks: what a node sends of each
/// closed window, and what the job-wide signature is computed from.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepetitionSums {
    /// Unix ns of the cut: the end of the window.
    pub cut_ns: u64,
    /// Ranks with a burst before the cut.
    pub ranks: u32,
    /// The longest region of interest of those ranks up to the cut (their first burst's start
    /// to MPI_Finalize's entry or the cut): the slowest rank's run time so far.
    pub runtime_ns: u64,
    /// By code region.
    pub regions: Vec<RegionRepetitions>,
}

/// Sums cut at different instants, or of the same rank twice.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SumsError {
    #[error("repetitions cut at different instants ({0} and {1} ns) cannot be added")]
    Cuts(u64, u64),
}

impl RepetitionSums {
    /// Adds the sums of other ranks (another node's) cut at the same instant.
    pub fn add(&mut self, other: &RepetitionSums) -> Result<(), SumsError> {
        if self.cut_ns != other.cut_ns {
            return Err(SumsError::Cuts(self.cut_ns, other.cut_ns));
        }
        self.ranks += other.ranks;
        self.runtime_ns = self.runtime_ns.max(other.runtime_ns);
        let mut regions: BTreeMap<(CallSite, CallSite), (u64, u64)> = BTreeMap::new();
        for r in self.regions.iter().chain(&other.regions) {
            let sums = regions.entry((r.start.clone(), r.end.clone())).or_default();
            sums.0 += r.count;
            sums.1 += r.time_ns;
        }
        self.regions = regions
            .into_iter()
            .map(|((start, end), (count, time_ns))| RegionRepetitions {
                start,
                end,
                count,
                time_ns,
            })
            .collect();
        Ok(())
    }

    /// The signature of the job up to the cut, the phases being `phases`: each cluster's id with
    /// its code regions, dominant first (see the module docs).
    pub fn signature<'a>(
        &self,
        phases: impl IntoIterator<Item = (ClusterId, &'a [RegionCount])>,
    ) -> Result<AppSignature, SignatureError> {
        if self.ranks == 0 || self.runtime_ns == 0 {
            return Err(SignatureError::NoRegion);
        }
        let keys: Vec<(ClusterId, PhaseKey, &[RegionCount])> = phases
            .into_iter()
            .filter_map(|(id, regions)| Some((id, PhaseKey::dominant(regions)?, regions)))
            .collect();
        let mut phase_of: HashMap<(&CallSite, &CallSite), (&PhaseKey, ClusterId)> = HashMap::new();
        for (id, key, regions) in &keys {
            for r in regions.iter() {
                phase_of.entry((&r.start, &r.end)).or_insert((key, *id));
            }
        }
        let mut repetitions: PhaseRepetitions = BTreeMap::new();
        for r in self.regions.iter().filter(|r| r.count > 0) {
            let Some(&(key, id)) = phase_of.get(&(&r.start, &r.end)) else {
                continue;
            };
            let entry = repetitions.entry(key).or_default();
            if !entry.0.contains(&id) {
                entry.0.push(id);
            }
            entry.1 += r.count;
            entry.2 += r.time_ns;
        }
        assemble(self.ranks as usize, self.runtime_ns, repetitions)
    }
}

/// Index of a region in [`Repetitions::regions`]; [`UNLISTED`] past [`MAX_REGIONS`].
type RegionId = u32;
const UNLISTED: RegionId = MAX_REGIONS as RegionId;

/// Count and time of one region's repetitions.
#[derive(Clone, Copy, Debug, Default)]
struct Sums {
    count: u64,
    time_ns: u64,
}

/// The sums of `region` among sums by region id: every burst finds its own by index.
fn slot(sums: &mut Vec<Sums>, region: RegionId) -> &mut Sums {
    let index = region as usize;
    if sums.len() <= index {
        sums.resize(index + 1, Sums::default());
    }
    &mut sums[index]
}

/// What is known of one rank's thread.
#[derive(Clone, Debug)]
struct RankThread {
    pid: u32,
    tid: u32,
    first_start_ns: u64,
    /// The repetition running: its region and the start of its time not yet counted (its start,
    /// or the last cut it spanned). `None` after MPI_Finalize.
    running: Option<(RegionId, u64)>,
    /// MPI_Finalize's entry.
    finalized_ns: Option<u64>,
}

/// The repetition counter of one job on one node (see the module docs).
#[derive(Clone, Debug)]
pub struct Repetitions {
    window_ns: u64,
    regions: Vec<(CallSite, CallSite)>,
    /// Looked up for every burst: a fast hash of the sites' identities.
    index: FastMap<[(usize, u64); 2], RegionId>,
    /// The last region looked up, which a rank's next burst often repeats.
    last_region: ([(usize, u64); 2], RegionId),
    ranks: BTreeMap<u32, RankThread>,
    /// Counts and time of windows not cut yet, by window.
    open: BTreeMap<u64, Vec<Sums>>,
    /// Up to the last cut.
    cut: Vec<Sums>,
    /// The last cut's window (its end is the cut).
    cut_window: Option<u64>,
    /// MPI_Finalize's name, which ends a rank's last repetition.
    finalize: Name,
}

impl Repetitions {
    pub fn new(window_ns: u64) -> Repetitions {
        Repetitions {
            window_ns,
            regions: Vec::new(),
            index: FastMap::default(),
            last_region: ([(0, 0); 2], UNLISTED),
            ranks: BTreeMap::new(),
            open: BTreeMap::new(),
            cut: Vec::new(),
            cut_window: None,
            finalize: Name::new(FINALIZE_FUNCTION),
        }
    }

    fn region(&mut self, burst: &Burst) -> RegionId {
        let key = [burst.start_site.identity(), burst.end_site.identity()];
        if self.last_region.0 == key {
            return self.last_region.1;
        }
        if let Some(&id) = self.index.get(&key) {
            self.last_region = (key, id);
            return id;
        }
        if self.regions.len() >= MAX_REGIONS {
            return UNLISTED;
        }
        let id = self.regions.len() as RegionId;
        self.regions
            .push((burst.start_site.clone(), burst.end_site.clone()));
        self.index.insert(key, id);
        id
    }

    /// The sums of `window` by region, or those up to the last cut when it is cut already.
    fn window_sums(&mut self, window: u64) -> &mut Vec<Sums> {
        if self.cut_window.is_some_and(|cut| window <= cut) {
            &mut self.cut
        } else {
            self.open.entry(window).or_default()
        }
    }

    /// The sums of `region` in `window` (see [`Self::window_sums`]).
    fn sums_of(&mut self, window: u64, region: RegionId) -> &mut Sums {
        slot(self.window_sums(window), region)
    }

    /// Adds the time [from, to) of a repetition of `region`, split at window ends.
    fn add_time(&mut self, region: RegionId, from: u64, to: u64) {
        let mut at = from;
        while at < to {
            let window = at / self.window_ns;
            let end = ((window + 1) * self.window_ns).min(to);
            self.sums_of(window, region).time_ns += end - at;
            at = end;
        }
    }

    /// Counts a burst: it ends the repetition running on its thread and starts one of its own
    /// region, which MPI_Finalize ends at the burst's end.
    pub fn push(&mut self, burst: &Burst) {
        let region = self.region(burst);
        let window_ns = self.window_ns;
        let thread = match self.ranks.get_mut(&burst.rank) {
            Some(thread) => thread,
            None => self.ranks.entry(burst.rank).or_insert(RankThread {
                pid: burst.pid,
                tid: burst.tid,
                first_start_ns: burst.start_ns,
                running: None,
                finalized_ns: None,
            }),
        };
        // A rank whose MPI_Finalize entry came first ([`Self::finalize`]): the burst that ends
        // there is counted already.
        if (thread.pid, thread.tid) != (burst.pid, burst.tid) || thread.finalized_ns.is_some() {
            return;
        }
        let previous = thread.running;
        let in_order = previous.is_none_or(|(_, from)| burst.start_ns >= from);
        let finalized = burst.end_func == self.finalize;
        let end_ns = burst.start_ns + burst.duration_ns;
        if in_order {
            thread.running = (!finalized).then_some((region, burst.start_ns));
            if finalized {
                thread.finalized_ns = Some(end_ns);
            }
        }
        let window = burst.start_ns / window_ns;
        let sums = self.window_sums(window);
        slot(sums, region).count += 1;
        match (in_order, previous) {
            // The repetition before, mostly within the burst's window: its time is in the same
            // sums.
            (true, Some((running, from))) if from >= window * window_ns => {
                slot(sums, running).time_ns += burst.start_ns - from
            }
            (true, Some((running, from))) => self.add_time(running, from, burst.start_ns),
            // Late (a cut it precedes has been made): its own time only.
            (false, _) => self.add_time(region, burst.start_ns, end_ns),
            (true, None) => {}
        }
        if finalized && in_order {
            self.add_time(region, burst.start_ns, end_ns);
        }
    }

    /// `rank` entered MPI_Finalize at `at_ns` (Unix): its running repetition ends there. The
    /// burst that ends in MPI_Finalize does that too, but the kernel's duration filter drops it
    /// when it is short, as it mostly is; without this the last repetition would run on to every
    /// later cut, and the run time with it.
    pub fn finalize(&mut self, rank: u32, at_ns: u64) {
        let Some(thread) = self.ranks.get_mut(&rank) else {
            return;
        };
        if thread.finalized_ns.is_some() {
            return;
        }
        thread.finalized_ns = Some(at_ns);
        if let Some((region, from)) = thread.running.take() {
            self.add_time(region, from, at_ns.max(from));
        }
    }

    /// Cuts at the end of `window`: the sums of every repetition that started before it, with
    /// their time up to it.
    pub fn close(&mut self, window: u64) -> RepetitionSums {
        let cut_ns = (window + 1) * self.window_ns;
        let running: Vec<(u32, RegionId, u64)> = self
            .ranks
            .iter()
            .filter_map(|(&rank, t)| t.running.map(|(region, from)| (rank, region, from)))
            .filter(|&(_, _, from)| from < cut_ns)
            .collect();
        for (rank, region, from) in running {
            self.add_time(region, from, cut_ns);
            if let Some(thread) = self.ranks.get_mut(&rank) {
                thread.running = Some((region, cut_ns));
            }
        }
        let later = self.open.split_off(&(window + 1));
        for (_, sums) in std::mem::replace(&mut self.open, later) {
            for (region, s) in sums.into_iter().enumerate() {
                let total = slot(&mut self.cut, region as RegionId);
                total.count += s.count;
                total.time_ns += s.time_ns;
            }
        }
        self.cut_window = Some(self.cut_window.map_or(window, |w| w.max(window)));
        let started: Vec<&RankThread> = self
            .ranks
            .values()
            .filter(|t| t.first_start_ns < cut_ns)
            .collect();
        let mut regions: Vec<RegionRepetitions> = self
            .cut
            .iter()
            .enumerate()
            .filter(|&(id, s)| id != UNLISTED as usize && s.count > 0)
            .map(|(id, s)| {
                let (start, end) = self.regions[id].clone();
                RegionRepetitions {
                    start,
                    end,
                    count: s.count,
                    time_ns: s.time_ns,
                }
            })
            .collect();
        regions.sort_by(|a, b| (&a.start, &a.end).cmp(&(&b.start, &b.end)));
        RepetitionSums {
            cut_ns,
            ranks: started.len() as u32,
            runtime_ns: started
                .iter()
                .map(|t| t.finalized_ns.unwrap_or(cut_ns).min(cut_ns) - t.first_start_ns)
                .max()
                .unwrap_or(0),
            regions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const W: u64 = 1_000_000_000;

    fn site(offset: u64) -> CallSite {
        CallSite {
            module: Name::new("/app"),
            offset,
        }
    }

    /// A burst of `rank` from `start_ns` for `duration_ns` in region (a, a + 1).
    fn burst(rank: u32, start_ns: u64, duration_ns: u64, a: u64, end_func: &str) -> Burst {
        Burst {
            pid: 100 + rank,
            tid: 100 + rank,
            rank,
            start_ns,
            duration_ns,
            oncpu_ns: duration_ns,
            counters: None,
            start_func: Name::new("MPI_Barrier"),
            end_func: Name::new(end_func),
            start_site: site(a),
            end_site: site(a + 1),
        }
    }

    /// Ranks `ranks` alternate regions 10 (300 ms, then 50 ms of MPI) and 20 (100 ms, then
    /// 50 ms), from `t0` for `iterations`; the last burst ends in MPI_Finalize.
    fn run(ranks: std::ops::Range<u32>, t0: u64, iterations: u64) -> Vec<Burst> {
        let mut bursts = Vec::new();
        for rank in ranks {
            let mut t = t0 + u64::from(rank) * 1_000;
            for i in 0..iterations {
                bursts.push(burst(rank, t, 300_000_000, 10, "MPI_Allreduce"));
                t += 350_000_000;
                let last = i + 1 == iterations;
                let end = if last { FINALIZE_FUNCTION } else { "MPI_Send" };
                bursts.push(burst(rank, t, 100_000_000, 20, end));
                t += 150_000_000;
            }
        }
        bursts.sort_by_key(|b| b.start_ns);
        bursts
    }

    fn counted(r: &Repetitions, bursts: &[Burst]) -> Repetitions {
        let mut r = r.clone();
        for b in bursts {
            r.push(b);
        }
        r
    }

    fn region(sums: &RepetitionSums, a: u64) -> (u64, u64) {
        sums.regions
            .iter()
            .find(|r| r.start == site(a))
            .map_or((0, 0), |r| (r.count, r.time_ns))
    }

    #[test]
    fn repetitions_tile_each_ranks_time_and_are_cut_at_window_ends() {
        // 4 ranks, 10 iterations of 500 ms from t = 10 s: 5 s each.
        let bursts = run(0..4, 10 * W, 10);
        let mut r = counted(&Repetitions::new(W), &bursts);
        let at_12 = r.close(11);
        assert_eq!(at_12.cut_ns, 12 * W);
        assert_eq!(at_12.ranks, 4);
        // Rank 0 started first, 2 s before the cut.
        assert_eq!(at_12.runtime_ns, 2 * W);
        // Iterations start at 10.0, 10.5, 11.0 and 11.5 s (+ 1 µs per rank): 4 repetitions of
        // each region per rank; the last of region 20 (from 11.85 s) is cut at 12 s, so that
        // each rank's repetitions tile its 2 s less its offset.
        assert_eq!(region(&at_12, 10), (16, 16 * 350_000_000));
        let (count, time) = region(&at_12, 20);
        assert_eq!(count, 16);
        assert_eq!(time + region(&at_12, 10).1, 4 * 2 * W - 6_000);

        let end = r.close(20);
        assert_eq!(end.ranks, 4);
        // Finalize's entry at 10 s + 5 s − 50 ms (+ the rank's offset).
        assert_eq!(end.runtime_ns, 5 * W - 50_000_000);
        assert_eq!(region(&end, 10), (40, 40 * 350_000_000));
        assert_eq!(region(&end, 20), (40, 36 * 150_000_000 + 4 * 100_000_000));
    }

    #[test]
    fn a_finalize_entry_ends_the_last_repetition_when_its_burst_was_filtered_out() {
        // The kernel's duration filter dropped the bursts that end in MPI_Finalize (100 ms,
        // taken as below it here); the daemon passes each rank's MPI_Finalize entry instead, and
        // the ranks' run time and their last repetition end there, not at the cut 5 s later.
        let kept: Vec<Burst> = run(0..4, 10 * W, 10)
            .into_iter()
            .filter(|b| b.end_func.as_str() != FINALIZE_FUNCTION)
            .collect();
        let mut r = counted(&Repetitions::new(W), &kept);
        for rank in 0..4u32 {
            r.finalize(rank, 15 * W - 50_000_000 + u64::from(rank) * 1_000);
        }
        let end = r.close(20);
        assert_eq!(end.runtime_ns, 5 * W - 50_000_000);
        // The last repetition of region 10 runs from its burst to MPI_Finalize's entry (450 ms,
        // over its own 300 ms burst and the filtered 100 ms one) and is not one of region 20.
        assert_eq!(region(&end, 10).0, 40);
        assert_eq!(region(&end, 20), (36, 36 * 150_000_000));
        let (_, time_10) = region(&end, 10);
        assert_eq!(time_10, 36 * 350_000_000 + 4 * 450_000_000);
    }

    #[test]
    fn the_sums_of_two_nodes_are_those_of_one_daemon_seeing_all_ranks() {
        let all = counted(&Repetitions::new(W), &run(0..4, 10 * W, 10)).close(12);
        let mut a = counted(&Repetitions::new(W), &run(0..2, 10 * W, 10)).close(12);
        let b = counted(&Repetitions::new(W), &run(2..4, 10 * W, 10)).close(12);
        a.add(&b).unwrap();
        assert_eq!(a, all);
        let other = counted(&Repetitions::new(W), &run(2..4, 10 * W, 10)).close(13);
        assert_eq!(a.add(&other), Err(SumsError::Cuts(13 * W, 14 * W)));
    }

    #[test]
    fn the_signature_names_phases_by_their_dominant_region_and_leaves_the_rest_other() {
        let sums = counted(&Repetitions::new(W), &run(0..4, 10 * W, 10)).close(20);
        let phase = |a: u64| RegionCount {
            start: site(a),
            end: site(a + 1),
            bursts: 1,
        };
        // One phase of region 10 only: region 20 is other time.
        let one = [phase(10)];
        let s = sums.signature([(1, &one[..])]).unwrap();
        assert_eq!(s.phases.len(), 1);
        assert_eq!(s.phases[0].weight, 10.0);
        assert_eq!(s.phases[0].pet_ns, 350_000_000.0);
        assert_eq!(s.phases[0].clusters, vec![1]);
        assert_eq!(s.runtime_ns, 5 * W - 50_000_000);
        assert!((s.other_ns - (s.runtime_ns as f64 - 3.5e9)).abs() < 1.0);
        // A phase that ran both regions, region 20 dominant: one phase of both, named by 20.
        let both = [phase(20), phase(10)];
        let s = sums.signature([(2, &both[..])]).unwrap();
        assert_eq!(s.phases.len(), 1);
        assert_eq!(s.phases[0].key.start, site(20));
        assert_eq!(s.phases[0].weight, 20.0);
        let none: [(ClusterId, &[RegionCount]); 0] = [];
        assert_eq!(sums.signature(none), Err(SignatureError::NoPhase));
        assert_eq!(
            RepetitionSums::default().signature([(1, &one[..])]),
            Err(SignatureError::NoRegion)
        );
    }

    #[test]
    fn other_threads_and_late_bursts_do_not_double_count() {
        let mut r = Repetitions::new(W);
        r.push(&burst(0, 10 * W, 1_000, 10, "MPI_Send"));
        // A second thread of rank 0: left out.
        let mut helper = burst(0, 10 * W + 5, 1_000, 30, "MPI_Send");
        helper.tid = 999;
        r.push(&helper);
        let cut = r.close(10);
        assert_eq!(region(&cut, 10), (1, W));
        assert_eq!(region(&cut, 30), (0, 0));
        // A burst that precedes the cut, arriving after it: counted in the next cut, its own
        // time only, while the repetition running goes on.
        r.push(&burst(0, 10 * W + 900_000_000, 1_000, 40, "MPI_Send"));
        let next = r.close(11);
        assert_eq!(region(&next, 40), (1, 1_000));
        assert_eq!(region(&next, 10), (1, 2 * W));
    }
}
