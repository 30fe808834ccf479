//! The probe governor: keeps what the probes of polling functions cost within
//! `governor.budget_percent` of a thread's time. A polling loop can call MPI_Test every 10 to
//! 300 ns, and a probe hit costs 0.5 to 1 µs here, so probing every call can make such a loop many
//! times slower.
//!
//! The BPF side counts each thread's polling calls per 10 ms window and reports a thread that
//! reaches the function's limit (`budget × window / cost of a hit`) at once. The governor then
//! demotes the function node-wide, in two steps:
//! 1. **count-only**: the entry counts the call and the return is not probed (one trap, not
//!    two); every call is still counted, but its time stays in the burst;
//! 2. **sampled**: the function's probes are detached, and attached again for
//!    `sample_window_us` now and then, at random points, spaced so that the windows cost at most
//!    half the budget. Only the calls in the windows are counted: the counts become a lower bound.
//!    The windows tell whether the calls came back within the budget.
//!
//! A count-only function is probed in full again once no thread has, for `restore_after_s`,
//! called it fast enough to storm if it were (the probes stamp the function when a thread does;
//! without that a rate between the two limits would restore it and demote it again at once); a
//! sampled one once its windows have shown the calls within half the budget for that long. Every
//! change is logged and counted, and the stretches of time a function was demoted are kept, so
//! that the counts and times of every rank that ran meanwhile are marked.
//!
//! It runs on a thread of its own: attaching a link waits for a grace period of the kernel (tens
//! of ms on a VM; the probes are set at its end), as does closing one (they go at its start).

use std::{
    collections::{BTreeMap, VecDeque},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use profiler_common::{mode, Governance, Sample, StormEvent, ThreadFunc, STORM_WINDOW_NS};

use crate::capture::{config::GovernorConfig, usage, GovernorHandle, ProbeCost};

/// What the probe governor did (see `governor` in the config).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GovernorStats {
    /// The governed (polling) functions, by name.
    pub functions: BTreeMap<String, GovernedFunction>,
}

/// How the governor has one function probed, and how often it changed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GovernedFunction {
    /// "full", "count_only" or "sampled".
    pub mode: &'static str,
    /// Changes into each mode.
    pub changes: BTreeMap<&'static str, u64>,
    /// Sampling windows closed.
    pub windows: u64,
}

/// The longest the thread sleeps between two looks at the storm ring and the windows.
const TICK: Duration = Duration::from_millis(100);

/// A stretch of time in which the governor had a function probed less than in full.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Demotion {
    /// `COUNT_ONLY` (every call counted, the time of none) or `SAMPLED` (calls counted in the
    /// sampling windows only).
    pub mode: u32,
    /// CLOCK_MONOTONIC ns; `to_ns` is `None` while it lasts.
    pub from_ns: u64,
    pub to_ns: Option<u64>,
}

/// What the governor shares with the daemon's loop.
#[derive(Clone, Debug, Default)]
pub struct Shared {
    pub stats: GovernorStats,
    /// By function id, oldest first.
    pub demotions: BTreeMap<u32, Vec<Demotion>>,
}

impl Shared {
    /// The modes (`COUNT_ONLY`, `SAMPLED`) function `func` was in at some time within
    /// `from_ns..=to_ns` (CLOCK_MONOTONIC ns).
    pub fn modes_within(&self, func: u32, from_ns: u64, to_ns: u64) -> (bool, bool) {
        let mut modes = (false, false);
        for d in self.demotions.get(&func).into_iter().flatten() {
            if d.from_ns <= to_ns && d.to_ns.is_none_or(|t| t >= from_ns) {
                match d.mode {
                    mode::COUNT_ONLY => modes.0 = true,
                    _ => modes.1 = true,
                }
            }
        }
        modes
    }

    /// The functions sampled at some time within `from_ns..=to_ns`.
    pub fn sampled_within(&self, from_ns: u64, to_ns: u64) -> Vec<u32> {
        self.demotions
            .keys()
            .copied()
            .filter(|&func| self.modes_within(func, from_ns, to_ns).1)
            .collect()
    }

    /// Forgets the demotions that ended before `before_ns`: no process that lived then is left.
    pub fn forget_before(&mut self, before_ns: u64) {
        for list in self.demotions.values_mut() {
            list.retain(|d| d.to_ns.is_none_or(|t| t >= before_ns));
        }
    }

    fn demote(&mut self, func: u32, mode: u32, now_ns: u64) {
        self.end(func, now_ns);
        self.demotions.entry(func).or_default().push(Demotion {
            mode,
            from_ns: now_ns,
            to_ns: None,
        });
    }

    fn end(&mut self, func: u32, now_ns: u64) {
        if let Some(last) = self.demotions.get_mut(&func).and_then(|l| l.last_mut()) {
            last.to_ns.get_or_insert(now_ns);
        }
    }
}

/// How the governor has one function probed.
enum Level {
    CountOnly {
        last_storm: Instant,
    },
    Sampled {
        /// The next window's start.
        next: Instant,
        /// When it was sampled.
        since: Instant,
        /// The highest share of a thread's time full probes would have cost, per recent window.
        recent: VecDeque<f64>,
    },
}

pub struct Governor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    pub shared: Arc<Mutex<Shared>>,
}

impl Governor {
    /// Starts the governor's thread for the functions `governed`, with the storm limits of what
    /// a probe hit costs here (`measured`, see `Capture::measure_probe_cost`).
    pub fn start(
        handle: GovernorHandle,
        config: GovernorConfig,
        functions: Vec<String>,
        governed: Vec<u32>,
        measured: Option<ProbeCost>,
    ) -> Governor {
        let cost = match measured {
            // Back to back: a storm's calls are.
            Some(ProbeCost {
                full_ns,
                count_only_ns: Some(count_only_ns),
                ..
            }) => HitCost {
                full_ns,
                count_only_ns,
            },
            _ => {
                tracing::warn!(
                    "what a probe hit costs was not measured: the governor assumes 2 µs with the \
                     return probed and 1 µs without"
                );
                HitCost {
                    full_ns: 2000.0,
                    count_only_ns: 1000.0,
                }
            }
        };
        let shared = Arc::new(Mutex::new(Shared::default()));
        let mut state = State {
            handle,
            config,
            cost,
            functions,
            levels: BTreeMap::new(),
            shared: shared.clone(),
            seed: usage::clock_ns(libc::CLOCK_MONOTONIC) | 1,
        };
        tracing::info!(
            "probe governor: a probe hit back to back costs {:.0} ns here ({:.0} ns at entry \
             only); a thread that makes {} calls of a polling function within {} ms gets it \
             counted at entry only, and {} calls counted so get it sampled (budget {} %)",
            cost.full_ns,
            cost.count_only_ns,
            state.storm_calls(cost.full_ns),
            STORM_WINDOW_NS / 1_000_000,
            state.storm_calls(cost.count_only_ns),
            state.config.budget_percent
        );
        for &func in &governed {
            state.set(func, mode::FULL);
            state.record(func, mode::FULL, false);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::Builder::new()
            .name("mpiburst-governor".into())
            .spawn(move || state.run(&stopped))
            .map_err(|e| tracing::warn!("cannot start the governor's thread ({e}): it is off"))
            .ok();
        Governor {
            stop,
            thread,
            shared,
        }
    }

    /// Stops the thread; the functions keep the probes they had.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Governor {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the governor takes a probe hit to cost, in ns.
#[derive(Clone, Copy)]
struct HitCost {
    full_ns: f64,
    count_only_ns: f64,
}

struct State {
    handle: GovernorHandle,
    config: GovernorConfig,
    cost: HitCost,
    functions: Vec<String>,
    levels: BTreeMap<u32, Level>,
    shared: Arc<Mutex<Shared>>,
    /// xorshift state for the windows' random phases.
    seed: u64,
}

impl State {
    fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            let next = self
                .levels
                .values()
                .filter_map(|l| match l {
                    Level::Sampled { next, .. } => Some(*next),
                    Level::CountOnly { .. } => None,
                })
                .min()
                .unwrap_or(now + TICK);
            wait_readable(
                self.handle.storms_fd(),
                next.saturating_duration_since(now).min(TICK),
            );
            for event in self.handle.drain_storms() {
                self.storm(event);
            }
            self.step(stop);
        }
    }

    /// The storm limit for a probe that costs `cost_ns` per call.
    fn storm_calls(&self, cost_ns: f64) -> u32 {
        let allowed_ns = STORM_WINDOW_NS as f64 * self.config.budget_percent / 100.0;
        (allowed_ns / cost_ns.max(1.0)).clamp(2.0, u32::MAX as f64) as u32
    }

    fn set(&mut self, func: u32, mode: u32) {
        let full_calls = self.storm_calls(self.cost.full_ns);
        let (storm_calls, full_storm_calls) = match mode {
            mode::FULL => (full_calls, 0),
            mode::COUNT_ONLY => (self.storm_calls(self.cost.count_only_ns), full_calls),
            _ => (0, 0),
        };
        let governance = Governance {
            mode,
            storm_calls,
            full_storm_calls,
            ..Governance::default()
        };
        if let Err(e) = self.handle.set(func, governance) {
            tracing::warn!("{e}");
        }
    }

    fn name(&self, func: u32) -> String {
        self.functions
            .get(func as usize)
            .cloned()
            .unwrap_or_else(|| format!("#{func}"))
    }

    /// Records the function's mode; a change is counted and, for a demotion, its time kept.
    fn record(&self, func: u32, mode: u32, change: bool) {
        let name = self.name(func);
        let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
        if change {
            let now_ns = usage::clock_ns(libc::CLOCK_MONOTONIC);
            match mode {
                mode::FULL => shared.end(func, now_ns),
                _ => shared.demote(func, mode, now_ns),
            }
        }
        let f = shared.stats.functions.entry(name).or_default();
        f.mode = mode_name(mode);
        if change {
            *f.changes.entry(mode_name(mode)).or_default() += 1;
        }
    }

    fn storm(&mut self, event: StormEvent) {
        let func = event.func;
        let now = Instant::now();
        // The window's calls are those from its first to the one that reached the limit.
        let span_ns = event.at_ns.saturating_sub(event.window_start_ns).max(1);
        let rate = f64::from(event.calls.max(2) - 1) * 1e9 / span_ns as f64;
        let name = self.name(func);
        match (event.mode, self.levels.get_mut(&func)) {
            (mode::FULL, None) => {
                self.set(func, mode::COUNT_ONLY);
                self.levels
                    .insert(func, Level::CountOnly { last_storm: now });
                self.record(func, mode::COUNT_ONLY, true);
                tracing::warn!(
                    "pid {} tid {} calls {name} about {rate:.0} times a second: its probes would \
                     cost about {:.0} % of its time, over governor.budget_percent ({} %). {name} \
                     is now counted at its entry only, node-wide; its time stays in the bursts",
                    event.pid,
                    event.tid,
                    rate * self.cost.full_ns / 1e7,
                    self.config.budget_percent
                );
            }
            (mode::COUNT_ONLY, Some(Level::CountOnly { .. })) => {
                tracing::warn!(
                    "pid {} tid {} still calls {name} about {rate:.0} times a second counted at \
                     entry only (about {:.0} % of its time): {name} is now sampled, node-wide; \
                     its calls are counted in the sampling windows only, and its counts are a \
                     lower bound until it is probed in full again",
                    event.pid,
                    event.tid,
                    rate * self.cost.count_only_ns / 1e7,
                );
                self.set(func, mode::SAMPLED);
                self.record(func, mode::SAMPLED, true);
                self.handle.detach(func);
                let spacing = self.config.min_sample_period();
                let next = now + self.random_part(spacing);
                self.levels.insert(
                    func,
                    Level::Sampled {
                        next,
                        since: now,
                        recent: VecDeque::new(),
                    },
                );
            }
            (_, Some(Level::CountOnly { last_storm })) => *last_storm = now,
            // A report sent just before the function changed mode.
            _ => {}
        }
    }

    /// A random share of `span`.
    fn random_part(&mut self, span: Duration) -> Duration {
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        span.mul_f64((self.seed % 1_000_000) as f64 / 1e6)
    }

    /// Runs the windows that are due, and restores the functions whose calls came back within
    /// the budget.
    fn step(&mut self, stop: &AtomicBool) {
        let restore_after = Duration::from_secs_f64(self.config.restore_after_s);
        let funcs: Vec<u32> = self.levels.keys().copied().collect();
        for func in funcs {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            let now = Instant::now();
            match self.levels.get(&func) {
                Some(Level::CountOnly { last_storm })
                    if now.duration_since(*last_storm) >= restore_after =>
                {
                    // A rate between the two limits raises no storm counted at entry only, but
                    // would raise one at once probed in full: the probes stamp it.
                    let since_full_storm = self.handle.full_storm_ns(func).map(|at| {
                        Duration::from_nanos(
                            usage::clock_ns(libc::CLOCK_MONOTONIC).saturating_sub(at),
                        )
                    });
                    match since_full_storm {
                        Some(since) if since < restore_after => {
                            self.levels.insert(
                                func,
                                Level::CountOnly {
                                    last_storm: now.checked_sub(since).unwrap_or(now),
                                },
                            );
                        }
                        _ => self.restore(
                            func,
                            &format!(
                                "no thread called it fast enough to storm in full for {} s",
                                self.config.restore_after_s
                            ),
                        ),
                    }
                }
                Some(Level::Sampled { next, .. }) if *next <= now => self.window(func),
                _ => {}
            }
        }
    }

    /// One sampling window of `func`: attaches its probes for `governor.sample_window_us`, and
    /// judges from what they saw whether the calls came back within the budget.
    fn window(&mut self, func: u32) {
        // What calls made while the links closed left there is not this window's.
        self.handle.take_samples(func);
        if let Err(e) = self.handle.attach(func) {
            tracing::warn!("sampling window of {}: {e}", self.name(func));
        }
        std::thread::sleep(self.config.sample_window());
        self.handle.detach(func);
        let samples = self.handle.take_samples(func);
        let share = self.highest_share(&samples);
        let name = self.name(func);
        self.shared
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .stats
            .functions
            .entry(name)
            .or_default()
            .windows += 1;
        // A window costs `share` of a polling thread's time while open: spaced so that the
        // windows cost at most half the budget, and at least the configured period apart.
        let spacing = self
            .config
            .sample_window()
            .mul_f64(share.min(1.0) / (self.config.budget_percent / 200.0))
            .max(self.config.min_sample_period());
        let next = Instant::now() + spacing.mul_f64(0.5) + self.random_part(spacing);
        let window_count = (self.config.restore_after_s / spacing.as_secs_f64())
            .ceil()
            .max(1.0) as usize;
        let (budget, restore_after) = (
            self.config.budget_percent / 100.0,
            Duration::from_secs_f64(self.config.restore_after_s),
        );
        // What full probes would cost, from what the entry-only ones took.
        let full_share = share * self.cost.full_ns / self.cost.count_only_ns;
        let calm = match self.levels.get_mut(&func) {
            Some(Level::Sampled {
                next: n,
                since,
                recent,
            }) => {
                *n = next;
                recent.push_back(full_share);
                while recent.len() > window_count {
                    recent.pop_front();
                }
                since.elapsed() >= restore_after
                    && recent.len() == window_count
                    && recent.iter().all(|&s| s < budget / 2.0)
            }
            _ => false,
        };
        if calm {
            self.restore(func, "its calls stayed within half the budget");
        }
    }

    /// The highest share of a thread's time the entry-only probes took in a window: their cost
    /// over the mean interval between the thread's calls.
    fn highest_share(&self, samples: &[(ThreadFunc, Sample)]) -> f64 {
        samples
            .iter()
            .filter(|(_, s)| s.calls >= 2)
            .map(|(_, s)| {
                let gap = (s.last_ns - s.first_ns).max(1) as f64 / (s.calls - 1) as f64;
                (self.cost.count_only_ns / gap).min(1.0)
            })
            .fold(0.0, f64::max)
    }

    /// Probes `func` in full again.
    fn restore(&mut self, func: u32, why: &str) {
        // Full first: a call meanwhile counts in full, not in SAMPLES, where nothing would take it.
        self.set(func, mode::FULL);
        if let Some(Level::Sampled { .. }) = self.levels.get(&func) {
            if let Err(e) = self.handle.attach(func) {
                tracing::warn!("restoring the probes of {}: {e}", self.name(func));
            }
        }
        self.levels.remove(&func);
        self.record(func, mode::FULL, true);
        tracing::info!("{} is probed in full again: {why}", self.name(func));
    }
}

fn mode_name(mode: u32) -> &'static str {
    match mode {
        mode::FULL => "full",
        mode::COUNT_ONLY => "count_only",
        _ => "sampled",
    }
}

/// Waits until `fd` is readable or `timeout` passes.
fn wait_readable(fd: i32, timeout: Duration) {
    let mut pollfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: one valid pollfd, a valid timespec, no signal mask.
    unsafe { libc::ppoll(&mut pollfd, 1, &ts, std::ptr::null()) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rank_is_marked_with_the_modes_its_life_overlapped() {
        let mut shared = Shared::default();
        shared.demote(44, mode::COUNT_ONLY, 100);
        shared.demote(44, mode::SAMPLED, 200);
        shared.end(44, 300);
        shared.demote(44, mode::COUNT_ONLY, 500);
        assert_eq!(shared.modes_within(44, 0, 99), (false, false));
        assert_eq!(shared.modes_within(44, 0, 150), (true, false));
        assert_eq!(shared.modes_within(44, 250, 260), (false, true));
        assert_eq!(shared.modes_within(44, 301, 499), (false, false));
        // The last demotion lasts.
        assert_eq!(shared.modes_within(44, 900, 1000), (true, false));
        assert_eq!(shared.modes_within(45, 0, 1000), (false, false));
        assert_eq!(shared.sampled_within(250, 260), vec![44]);
        assert!(shared.sampled_within(301, 1000).is_empty());
        shared.forget_before(301);
        assert_eq!(shared.demotions[&44].len(), 1);
    }
}
