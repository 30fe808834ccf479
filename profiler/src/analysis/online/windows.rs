//! Windowing of a job's bursts: which window a pushed burst belongs to, and when a window
//! closes and is handed to the clustering (or carried into the next one).
//!
//! **Windows** are aligned to Unix time: window k covers [k·W, (k+1)·W), and a burst belongs to
//! the window of its start. Bursts arrive after they end, so a window is closed by the first
//! tick at or after its end + [`OnlineParams::lateness_s`]; a burst arriving for a closed window
//! is counted as late and not analysed. At most [`MAX_OPEN_WINDOWS`] windows are open; a burst
//! for a further window closes the oldest one at once (its events come with the next tick).
//! Windows without bursts are skipped: no clustering, no tracking step, so an idle job makes no
//! events. A window whose sample holds fewer than [`OnlineParams::min_window_bursts`] bursts is
//! not clustered alone either: its bursts are carried into the next window. A low-rate job is
//! thereby clustered over several windows, and a few stray bursts (the tail of a job, a window
//! cut by a pause) are not mistaken for a new structure.
//!
//! [`OnlineParams::lateness_s`]: super::OnlineParams::lateness_s
//! [`OnlineParams::min_window_bursts`]: super::OnlineParams::min_window_bursts

use super::model::Provisional;
use super::sample::WindowSample;
use super::{JobPhases, OnlineParams, PhaseEvent, ReclusterReason};
use crate::model::Burst;

/// Windows that may be open at once (the current one, the previous one waiting for late
/// bursts, and one more for bursts that already belong to the next window).
pub const MAX_OPEN_WINDOWS: usize = 3;

/// The length of the windows `params` ask for, in nanoseconds.
pub(super) fn window_ns(params: &OnlineParams) -> u64 {
    ((params.window_s * 1e9).round() as u64).max(1)
}

/// The window and slot of a burst starting at `start_ns`, in windows of `window_ns` cut into
/// `slots`, and the range of start times [lo, hi) that share them.
pub(super) fn slot_of(start_ns: u64, window_ns: u64, slots: u32) -> (u64, u32, u64, u64) {
    let w = window_ns;
    let slots = u64::from(slots);
    let window = start_ns / w;
    let slot = (start_ns % w) * slots / w;
    // slot = ⌊r·slots / w⌋ for the offset r in the window, so the slot's offsets are those
    // from ⌈slot·w / slots⌉ up to ⌈(slot + 1)·w / slots⌉.
    let from = |k: u64| window * w + (k * w).div_ceil(slots).min(w);
    (window, slot as u32, from(slot), from(slot + 1))
}

impl JobPhases {
    /// `rank` entered MPI_Finalize at `at_ns` (Unix): its last repetition ends there (see
    /// [`crate::analysis::signature::live::Repetitions::finalize`]). Repeating it changes nothing.
    /// The window it falls in closes even if no burst of the job reached it (the last bursts are
    /// often short enough for the kernel's filter), so that a cut covers the job's end.
    pub fn finalize(&mut self, rank: u32, at_ns: u64) {
        self.repetitions.finalize(rank, at_ns);
        let window = at_ns / self.window_ns;
        if window >= self.closed_before {
            self.buffers.entry(window).or_default();
        }
    }

    /// Classifies a burst against the current model and adds it to its window's sample.
    pub fn push(&mut self, burst: &Burst) {
        self.push_all(std::slice::from_ref(burst));
    }

    /// Pushes `bursts` in order, as [`push`](Self::push) would one by one. A drain's batch comes
    /// in long runs of one rank's bursts: a run within one (slot, rank) stratum of one window is
    /// checked, and its window and stratum looked up, once.
    pub fn push_all(&mut self, bursts: &[Burst]) {
        let mut rest = bursts;
        while let Some(first) = rest.first() {
            let (window, slot, lo, hi) = self.slot_of(first.start_ns);
            let rank = first.rank;
            let n = rest
                .iter()
                .position(|b| b.rank != rank || b.start_ns < lo || b.start_ns >= hi)
                .unwrap_or(rest.len());
            let (run, next) = rest.split_at(n);
            self.push_run(run, window, slot);
            rest = next;
        }
    }

    /// The window and slot of a burst starting at `start_ns`, and the range of start times
    /// [lo, hi) that share them.
    fn slot_of(&self, start_ns: u64) -> (u64, u32, u64, u64) {
        slot_of(start_ns, self.window_ns, self.params.window_slots)
    }

    /// Pushes `run`: bursts of one rank in `slot` of `window`.
    fn push_run(&mut self, run: &[Burst], window: u64, slot: u32) {
        let Some(first) = run.first() else { return };
        let run_ns: u64 = run.iter().map(|b| b.duration_ns).sum();
        self.totals.bursts_seen += run.len() as u64;
        self.totals.time_seen_ns += run_ns;
        for burst in run {
            self.repetitions.push(burst);
        }
        self.see_rank(first.rank);
        if window < self.closed_before {
            self.totals.late_bursts += run.len() as u64;
            return;
        }
        // A new window when as many are open: it opens in place of the oldest, unless it is
        // older still.
        if !self.buffers.contains_key(&window) && self.buffers.len() >= MAX_OPEN_WINDOWS {
            let oldest = *self.buffers.keys().next().expect("buffers are full");
            if window < oldest {
                self.totals.late_bursts += run.len() as u64;
                return;
            }
            let mut events = Vec::new();
            self.close_window(oldest, ReclusterReason::OpenWindowLimit, &mut events);
            self.pending.extend(events);
        }

        let every = u64::from(self.params.classify_every);
        for burst in run {
            self.accepted += 1;
            if self.accepted.is_multiple_of(every) {
                match self.model.as_ref().map(|m| m.classify(burst)) {
                    Some(Provisional::Filtered) => self.provisional.filtered += 1,
                    Some(Provisional::Phase(id)) => {
                        *self.provisional.phases.entry(id).or_default() += 1
                    }
                    Some(Provisional::Noise) | None => self.provisional.noise += 1,
                }
            }
        }

        // A rank outside the rank sample keeps nothing: its bursts are left out by the bound.
        let quota = if self.rank_sample.keeps(first.rank) {
            self.rank_sample.stratum_quota(&self.params)
        } else {
            0
        };
        let max = self.params.max_window_bursts;
        let buffer = self.buffers.entry(window).or_default();
        self.totals.dropped_bursts += buffer.add(run, run_ns, slot, quota, max);
    }

    /// Closes the windows that are over, re-clusters when the provisional noise asks for it,
    /// and returns what happened (including events of windows a push had to close early).
    pub fn tick(&mut self, now_ns: u64) -> Vec<PhaseEvent> {
        self.now_ns = Some(now_ns);
        let mut events = std::mem::take(&mut self.pending);
        while let Some(&window) = self.buffers.keys().next() {
            let end = (window + 1).saturating_mul(self.window_ns);
            if end.saturating_add(self.lateness_ns) > now_ns {
                break;
            }
            self.close_window(window, ReclusterReason::WindowClosed, &mut events);
        }
        let over = now_ns.saturating_sub(self.lateness_ns) / self.window_ns;
        self.closed_before = self
            .closed_before
            .max(over.min(self.buffers.keys().next().copied().unwrap_or(over)));
        self.recluster_early(&mut events);
        events
    }

    /// Closes `window`: its sample, after the bursts carried from smaller windows, is clustered,
    /// or carried into the next window when it is too small for a clustering of its own.
    fn close_window(&mut self, window: u64, reason: ReclusterReason, events: &mut Vec<PhaseEvent>) {
        let buffer = self
            .buffers
            .remove(&window)
            .expect("closing an open window");
        self.closed_before = self.closed_before.max(window + 1);
        self.totals.windows_closed += 1;
        let mut own = buffer.bursts;
        // By rank, then start: the order bursts arrived in (drains interleave the ranks, and the
        // nodes of a job each hold some of them) does not change the clustering.
        own.sort_by_key(|b| (b.rank, b.start_ns, b.tid));
        let repetitions = self.repetitions.close(window);
        self.keep_sample(WindowSample {
            window,
            seen: buffer.seen,
            seen_time_ns: buffer.seen_time_ns,
            dropped: buffer.dropped,
            bursts: own.clone(),
            repetitions,
        });
        let mut bursts = std::mem::take(&mut self.carry);
        bursts.extend(own);
        bursts.sort_by_key(|b| (b.rank, b.start_ns, b.tid));
        if bursts.len() < self.params.min_window_bursts {
            self.totals.windows_carried += 1;
            self.carry = bursts;
            return;
        }
        let Some(labels) = self.recluster(
            window,
            &bursts,
            (buffer.seen, buffer.seen_time_ns, buffer.dropped),
            true,
            reason,
            events,
        ) else {
            return;
        };
        if self
            .cumulative
            .offer(window, &bursts, &labels, &self.params, self.window_ns)
        {
            self.recluster_cumulative(events);
        }
    }
}
