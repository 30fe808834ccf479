use super::*;
use crate::analysis::hashing::GOLDEN_GAMMA;
use crate::analysis::synthetic::SplitMix64;
use crate::analysis::tracking::{
    AppIdentity, EventCounts, EventKind, StableId, TrackingEvent, TrackingParams,
};
use crate::analysis::{AnalysisParams, FeatureSet};
use crate::model::{CallSite, HwCounters, Name};

/// A start time aligned to whole seconds.
pub(super) const T0: u64 = 1_700_000_000_000_000_000;
const CLOCK_GHZ: f64 = 2.5;
pub(super) const E1_PHASES: [(f64, f64); 3] = [(1e6, 2.0), (5e6, 0.6), (2e7, 1.2)];

/// A call site offset and the MPI function there.
type Site<'a> = (u64, &'a Name);

/// An SPMD loop of `phases` (instructions, IPC) with ±3 % jitter and one 2 µs burst after
/// each phase, from T0 for `seconds`. `factor(window, iteration, phase)` multiplies a phase's
/// instructions (the window of the phase's start, in windows of `window_ns` since T0); 0 or
/// less skips the phase. Every burst goes to `sink`, phase by phase.
#[allow(clippy::too_many_arguments)]
pub(super) fn spmd(
    ranks: u32,
    counters: bool,
    phases: &[(f64, f64)],
    window_ns: u64,
    seconds: f64,
    seed: u64,
    factor: impl Fn(u64, u64, usize) -> f64,
    sink: impl FnMut(Burst),
) {
    let noise = Noise {
        jitter: 0.03,
        ..Noise::default()
    };
    spmd_noisy(
        ranks, counters, phases, window_ns, seconds, seed, noise, factor, sink,
    )
}

/// Perturbations of the loop: relative jitter of instructions and IPC, a share of outlier
/// bursts (instructions ×0.2–5, IPC ×0.5–1.5) and one rank doing more work in one phase.
#[derive(Clone, Copy, Debug, Default)]
struct Noise {
    jitter: f64,
    outliers: f64,
    imbalance: Option<(u32, usize, f64)>,
}

#[allow(clippy::too_many_arguments)]
fn spmd_noisy(
    ranks: u32,
    counters: bool,
    phases: &[(f64, f64)],
    window_ns: u64,
    seconds: f64,
    seed: u64,
    noise: Noise,
    factor: impl Fn(u64, u64, usize) -> f64,
    mut sink: impl FnMut(Burst),
) {
    // splitmix64 one step past the seed: the streams these tests' expectations were set on.
    let mut random = SplitMix64(seed.wrapping_add(GOLDEN_GAMMA));
    let module = Name::new("/opt/app/bin/solver");
    let site = |offset: u64| CallSite { module, offset };
    let allreduce = Name::new("MPI_Allreduce");
    let isend = Name::new("MPI_Isend");
    let end = T0 + (seconds * 1e9) as u64;
    let mut now = T0;
    let mut iteration = 0u64;
    while now < end {
        for (k, &(instructions, ipc)) in phases.iter().enumerate() {
            let f = factor((now - T0) / window_ns, iteration, k);
            if f <= 0.0 {
                continue;
            }
            let mut phase_end = now;
            for rank in 0..ranks {
                let (low, high) = (1.0 - noise.jitter, 1.0 + noise.jitter);
                let mut instructions = instructions * f * random.uniform(low, high);
                let mut ipc = ipc * random.uniform(low, high);
                if let Some((r, phase, factor)) = noise.imbalance {
                    if (r, phase) == (rank, k) {
                        instructions *= factor;
                    }
                }
                if random.uniform(0.0, 1.0) < noise.outliers {
                    instructions *= random.uniform(0.2f64.ln(), 5f64.ln()).exp();
                    ipc *= random.uniform(0.5, 1.5);
                }
                let cycles = instructions / ipc;
                let duration_ns = (cycles / CLOCK_GHZ) as u64;
                let start_ns = now + u64::from(rank) * 100;
                let burst = |start_ns, duration_ns, instructions: f64, cycles: f64, sites| {
                    let (opened, closed): (Site<'_>, Site<'_>) = sites;
                    Burst {
                        pid: 1000 + rank,
                        tid: 1000 + rank,
                        rank,
                        start_ns,
                        duration_ns,
                        oncpu_ns: duration_ns,
                        counters: counters.then_some(HwCounters {
                            instructions: instructions as u64,
                            cycles: cycles as u64,
                        }),
                        start_func: *opened.1,
                        end_func: *closed.1,
                        start_site: site(opened.0),
                        end_site: site(closed.0),
                    }
                };
                let opening = 0x1000 * k as u64;
                if start_ns >= end {
                    continue;
                }
                sink(burst(
                    start_ns,
                    duration_ns,
                    instructions,
                    cycles,
                    ((opening, &allreduce), (opening + 1, &isend)),
                ));
                let tiny_start = start_ns + duration_ns + 5_000;
                let next = 0x1000 * ((k + 1) % phases.len()) as u64;
                if tiny_start >= end {
                    continue;
                }
                sink(burst(
                    tiny_start,
                    2_000,
                    4_000.0,
                    5_000.0,
                    ((opening + 1, &isend), (next, &allreduce)),
                ));
                phase_end = phase_end.max(tiny_start + 2_000);
            }
            now = phase_end + 5_000;
        }
        iteration += 1;
    }
}

pub(super) fn test_params() -> OnlineParams {
    OnlineParams {
        window_s: 1.0,
        lateness_s: 0.05,
        ..OnlineParams::default()
    }
}

/// What a run produced: all events, and the view of every closed window.
struct Run {
    events: Vec<PhaseEvent>,
    windows: Vec<WindowView>,
    phases: JobPhases,
}

impl Run {
    fn tracking(&self) -> Vec<&TrackingEvent> {
        self.events
            .iter()
            .filter_map(|e| match e {
                PhaseEvent::Tracking(t) => Some(t),
                _ => None,
            })
            .collect()
    }

    /// The tracking events for which `keep` holds.
    fn tracking_where(&self, keep: impl Fn(&TrackingEvent) -> bool) -> Vec<&TrackingEvent> {
        self.tracking().into_iter().filter(|&e| keep(e)).collect()
    }
}

fn closed_window_in(events: &[PhaseEvent]) -> bool {
    events
        .iter()
        .any(|e| matches!(e, PhaseEvent::Reclustered { partial: false, .. }))
}

fn run(
    ranks: u32,
    params: OnlineParams,
    seconds: f64,
    factor: impl Fn(u64, u64, usize) -> f64,
) -> Run {
    run_with(ranks, true, params, seconds, factor)
}

fn run_with(
    ranks: u32,
    counters: bool,
    params: OnlineParams,
    seconds: f64,
    factor: impl Fn(u64, u64, usize) -> f64,
) -> Run {
    let noise = Noise {
        jitter: 0.03,
        ..Noise::default()
    };
    run_noisy(ranks, counters, params, seconds, 42, noise, factor)
}

fn run_noisy(
    ranks: u32,
    counters: bool,
    params: OnlineParams,
    seconds: f64,
    seed: u64,
    noise: Noise,
    factor: impl Fn(u64, u64, usize) -> f64,
) -> Run {
    let window_ns = (params.window_s * 1e9) as u64;
    let mut phases = JobPhases::new(ranks, params).unwrap();
    let mut events = Vec::new();
    let mut windows = Vec::new();
    spmd_noisy(
        ranks,
        counters,
        &E1_PHASES,
        window_ns,
        seconds,
        seed,
        noise,
        factor,
        |b| {
            phases.push(&b);
            let new = phases.tick(b.start_ns + b.duration_ns);
            if closed_window_in(&new) {
                windows.push(phases.snapshot().last_window.unwrap());
            }
            events.extend(new);
        },
    );
    // Close the remaining windows one by one.
    let lateness_ns = (phases.params().lateness_s * 1e9) as u64;
    while phases.held().open_windows > 0 {
        let next = phases.buffers.keys().next().copied().unwrap();
        let new = phases.tick((next + 1) * window_ns + lateness_ns);
        if closed_window_in(&new) {
            windows.push(phases.snapshot().last_window.unwrap());
        }
        events.extend(new);
    }
    Run {
        events,
        windows,
        phases,
    }
}

/// The phase (index into E1_PHASES) of a window phase, from its code region.
fn phase_of(view: &PhaseView) -> u64 {
    view.stats.regions[0].start.offset / 0x1000
}

/// Per window: (phase index, stable id) of its phases, sorted.
fn ids_by_window(run: &Run) -> Vec<Vec<(u64, StableId)>> {
    run.windows
        .iter()
        .map(|w| {
            let mut v: Vec<(u64, StableId)> =
                w.phases.iter().map(|p| (phase_of(p), p.id)).collect();
            v.sort_unstable();
            v
        })
        .collect()
}

const W0: u64 = T0 / 1_000_000_000;

#[test]
fn stable_phases_keep_their_ids_and_make_no_events_after_the_first_window() {
    for (ranks, counters) in [(4, true), (2, true), (8, true), (4, false)] {
        stable_phases(ranks, counters);
    }
}

fn stable_phases(ranks: u32, counters: bool) {
    let run = run_with(ranks, counters, test_params(), 6.0, |_, _, _| 1.0);
    let ids = ids_by_window(&run);
    assert!(ids.len() >= 6, "{} windows", ids.len());
    for (w, window) in ids.iter().enumerate() {
        assert_eq!(window.len(), 3, "window {w}: {window:?}");
        assert_eq!(window, &ids[0], "window {w}");
    }
    for view in &run.windows {
        assert!(!view.partial);
        assert!((view.spmd_score - 1.0).abs() < 1e-9, "{}", view.spmd_score);
        assert!(view.time_filtered_share > 0.0 && view.time_filtered_share < 0.01);
        let expected = if counters {
            FeatureSet::InstructionsIpc
        } else {
            FeatureSet::OnCpuTimePerRegion
        };
        assert_eq!(view.features.used, expected);
        for p in &view.phases {
            assert_eq!(p.stats.spmd_score, 1.0);
            assert_eq!(p.stats.id, p.id);
        }
        // The per-rank sequences in stable ids: each rank runs the three phases in order.
        assert_eq!(view.sequences.len(), ranks as usize);
        let order: Vec<StableId> = [0, 1, 2]
            .iter()
            .map(|&k| ids[0].iter().find(|(p, _)| *p == k).unwrap().1)
            .collect();
        for s in &view.sequences {
            let start = s.phases.iter().position(|&id| id == order[0]).unwrap();
            for (n, &id) in s.phases[start..].iter().enumerate() {
                assert_eq!(id, order[n % 3], "rank {}", s.rank);
            }
        }
    }
    for event in run.tracking() {
        assert_eq!(event.window, W0, "{event:?}");
    }
    let counts = run.phases.snapshot().event_counts;
    assert_eq!(
        counts,
        EventCounts {
            appear: 3,
            ..Default::default()
        }
    );
    // The first window got a model before it closed (no model yet counts as noise) when it
    // had enough bursts (≈ 580 per rank and window: 1 600 pushes take 3 ranks), and the
    // provisional classification agrees with the clustering: no early re-clustering later.
    let early = u64::from(ranks >= 3);
    assert_eq!(run.phases.snapshot().totals.reclusters_noise, early);
    assert_eq!(
        run.events.iter().any(|e| matches!(
            e,
            PhaseEvent::Reclustered {
                window: W0,
                partial: true,
                reason: ReclusterReason::NoiseShare,
                ..
            }
        )),
        early == 1
    );
    let snapshot = run.phases.snapshot();
    assert_eq!(snapshot.totals.late_bursts, 0);
    let cumulative = snapshot.cumulative.unwrap();
    let mut phases: Vec<(StableId, u32)> = cumulative
        .clusters
        .iter()
        .map(|c| (c.phase, c.part))
        .collect();
    phases.sort_unstable();
    let mut expected: Vec<(StableId, u32)> = ids[0].iter().map(|&(_, id)| (id, 0)).collect();
    expected.sort_unstable();
    assert_eq!(phases, expected);
}

#[test]
fn a_changed_phase_keeps_its_id_with_one_moved_event() {
    // Phase 1's work ×1.6 from window 3 on.
    let run = run(4, test_params(), 6.0, |w, _, k| {
        if k == 1 && w >= 3 {
            1.6
        } else {
            1.0
        }
    });
    let ids = ids_by_window(&run);
    assert!(ids.len() >= 6);
    for (w, window) in ids.iter().enumerate() {
        assert_eq!(window, &ids[0], "window {w}: every phase keeps its id");
    }
    let after_first = run.tracking_where(|e| e.window != W0);
    assert_eq!(after_first.len(), 1, "{after_first:?}");
    let moved = after_first[0];
    assert_eq!(moved.kind, EventKind::Moved);
    assert_eq!(moved.window, W0 + 3);
    let phase_one = ids[0].iter().find(|(p, _)| *p == 1).unwrap().1;
    assert_eq!(
        (moved.from.clone(), moved.to.clone()),
        (vec![phase_one], vec![phase_one])
    );
    let distance = moved.distance.unwrap();
    assert!((distance - 1.6f64.ln()).abs() < 0.05, "moved by {distance}");
    assert_eq!(
        run.phases.snapshot().event_counts,
        EventCounts {
            appear: 3,
            moved: 1,
            ..Default::default()
        }
    );
    // The statistics follow: phase 1's instructions step up by 1.6 under the same id.
    let instructions = |view: &WindowView| {
        view.phases
            .iter()
            .find(|p| p.id == phase_one)
            .unwrap()
            .stats
            .instructions_mean
            .unwrap()
    };
    let ratio = instructions(&run.windows[4]) / instructions(&run.windows[1]);
    assert!((ratio - 1.6).abs() < 0.02, "{ratio}");
    // The cumulative view shows both behaviours of the phase, as two parts.
    let cumulative = run.phases.snapshot().cumulative.unwrap();
    let parts: Vec<u32> = cumulative
        .clusters
        .iter()
        .filter(|c| c.phase == phase_one)
        .map(|c| c.part)
        .collect();
    assert_eq!(parts, vec![0, 1]);
}

#[test]
fn a_phase_that_turns_bimodal_splits() {
    // From window 3 on, phase 1 does 1.3× the work on odd iterations.
    let run = run(4, test_params(), 6.0, |w, i, k| {
        if k == 1 && w >= 3 && i % 2 == 1 {
            1.3
        } else {
            1.0
        }
    });
    let ids = ids_by_window(&run);
    let phase_one = ids[0].iter().find(|(p, _)| *p == 1).unwrap().1;
    let splits = run.tracking_where(|e| e.kind == EventKind::Split);
    assert_eq!(splits.len(), 1, "{:?}", run.tracking());
    let split = splits[0];
    assert_eq!(split.window, W0 + 3);
    assert_eq!(split.from, vec![phase_one]);
    assert_eq!(split.to.len(), 2);
    assert_eq!(split.to[0], phase_one, "the unchanged half keeps the id");
    assert!(split.to[1] > *ids[0].iter().map(|(_, id)| id).max().unwrap());
    assert_eq!(
        run.phases.snapshot().event_counts,
        EventCounts {
            appear: 3,
            split: 1,
            ..Default::default()
        }
    );
    for window in &ids[3..] {
        let mut expected = ids[0].clone();
        expected.push((1, split.to[1]));
        expected.sort_unstable();
        assert_eq!(window, &expected);
    }
}

#[test]
fn a_bimodal_phase_that_turns_uniform_merges() {
    // Until window 3, phase 1 does 1.3× the work on odd iterations.
    let run = run(4, test_params(), 6.0, |w, i, k| {
        if k == 1 && w < 3 && i % 2 == 1 {
            1.3
        } else {
            1.0
        }
    });
    let ids = ids_by_window(&run);
    let halves: Vec<StableId> = ids[0]
        .iter()
        .filter(|(p, _)| *p == 1)
        .map(|&(_, id)| id)
        .collect();
    assert_eq!(halves.len(), 2, "{:?}", ids[0]);
    let merges = run.tracking_where(|e| e.kind == EventKind::Merge);
    assert_eq!(merges.len(), 1, "{:?}", run.tracking());
    let merge = merges[0];
    assert_eq!(merge.window, W0 + 3);
    assert_eq!(merge.from, halves);
    // The merged phase lies where the even iterations were: that half's id continues.
    let even = ids[0]
        .iter()
        .filter(|(p, _)| *p == 1)
        .map(|&(_, id)| id)
        .find(|&id| {
            let v = run.windows[0].phases.iter().find(|p| p.id == id).unwrap();
            v.stats.instructions_mean.unwrap() < 5.5e6
        })
        .unwrap();
    assert_eq!(merge.to, vec![even]);
    assert_eq!(
        run.phases.snapshot().event_counts,
        EventCounts {
            appear: 4,
            merge: 1,
            ..Default::default()
        }
    );
    for window in &ids[3..] {
        assert_eq!(window.len(), 3);
        assert!(window.contains(&(1, even)));
    }
}

#[test]
fn a_skipped_window_keeps_the_id_and_a_phase_gone_vanishes() {
    // Phase 2 skips window 3 only; phase 0 stops at window 3.
    let params = OnlineParams {
        tracking: TrackingParams {
            vanish_after_windows: 2,
            ..TrackingParams::default()
        },
        ..test_params()
    };
    let run = run(4, params, 6.0, |w, _, k| match (k, w) {
        (2, 3) => 0.0,
        (0, w) if w >= 3 => 0.0,
        _ => 1.0,
    });
    let ids = ids_by_window(&run);
    let id_of = |phase: u64| ids[0].iter().find(|(p, _)| *p == phase).unwrap().1;
    assert_eq!(ids[3], vec![(1, id_of(1))]);
    for window in &ids[4..] {
        assert_eq!(window, &vec![(1, id_of(1)), (2, id_of(2))]);
    }
    let after_first = run.tracking_where(|e| e.window != W0);
    assert_eq!(after_first.len(), 1, "{after_first:?}");
    let vanish = after_first[0];
    assert_eq!(vanish.kind, EventKind::Vanish);
    assert_eq!(vanish.from, vec![id_of(0)]);
    assert_eq!(
        (vanish.window, vanish.last_seen_window),
        (W0 + 4, Some(W0 + 2))
    );
    let snapshot = run.phases.snapshot();
    assert!(!snapshot.live_ids.contains(&id_of(0)));
    assert!(snapshot.dormant_ids.is_empty());
}

#[test]
fn the_same_stream_gives_the_same_snapshot() {
    let factor = |w: u64, i: u64, k: usize| {
        if k == 1 && w >= 2 && i.is_multiple_of(3) {
            1.4
        } else {
            1.0
        }
    };
    let first = run(4, test_params(), 4.0, factor);
    let second = run(4, test_params(), 4.0, factor);
    let json = |r: &Run| serde_json::to_string(&r.phases.snapshot()).unwrap();
    assert_eq!(json(&first), json(&second));
    assert_eq!(first.events, second.events);
    let parsed: PhasesSnapshot = serde_json::from_str(&json(&first)).unwrap();
    assert_eq!(parsed.event_counts, first.phases.snapshot().event_counts);
    assert_eq!(parsed.live_ids, first.phases.snapshot().live_ids);
    // The signature of the job is deterministic too.
    let app = AppIdentity {
        build_id: Some("ab12".into()),
        executable: "/opt/app/bin/solver".into(),
    };
    let signature = |r: &Run| {
        serde_json::to_string(&r.phases.signature(app.clone(), "job").unwrap().unwrap()).unwrap()
    };
    assert_eq!(signature(&first), signature(&second));
}

#[test]
fn memory_stays_bounded_over_a_million_bursts() {
    // Short phases (≈ 0.25 ms per iteration) on 8 ranks: about 190 000 bursts per second.
    let phases = [(2e4, 2.0), (1e5, 0.6), (4e5, 1.2)];
    let params = OnlineParams {
        window_s: 0.25,
        lateness_s: 0.01,
        max_window_bursts: 4_000,
        max_cumulative_bursts: 2_000,
        cumulative_chunks: 4,
        ..OnlineParams::default()
    };
    let window_ns = (params.window_s * 1e9) as u64;
    let (max_window, max_cumulative) = (params.max_window_bursts, params.max_cumulative_bursts);
    let mut job = JobPhases::new(8, params).unwrap();
    let mut pushed = 0u64;
    let mut largest = Held::default();
    let mut check = |job: &JobPhases| {
        let held = job.held();
        assert!(held.open_windows <= MAX_OPEN_WINDOWS);
        assert!(
            held.window_bursts <= MAX_OPEN_WINDOWS * max_window + 100,
            "{held:?}"
        );
        assert!(held.cumulative_bursts <= max_cumulative, "{held:?}");
        assert!(
            held.sample_bursts <= KEPT_WINDOW_SAMPLES * max_window,
            "{held:?}"
        );
        largest.window_bursts = largest.window_bursts.max(held.window_bursts);
        largest.cumulative_bursts = largest.cumulative_bursts.max(held.cumulative_bursts);
    };
    spmd(
        8,
        true,
        &phases,
        window_ns,
        60.0,
        7,
        |_, _, _| 1.0,
        |b| {
            if pushed == 1_000_000 {
                return;
            }
            job.push(&b);
            pushed += 1;
            if pushed.is_multiple_of(1000) {
                job.tick(b.start_ns);
                check(&job);
            }
        },
    );
    assert_eq!(pushed, 1_000_000);
    job.tick(u64::MAX);
    check(&job);
    let snapshot = job.snapshot();
    assert_eq!(snapshot.totals.bursts_seen, 1_000_000);
    assert!(
        snapshot.totals.dropped_bursts > 900_000,
        "{:?}",
        snapshot.totals
    );
    assert!(
        snapshot.totals.windows_closed >= 20,
        "{:?}",
        snapshot.totals
    );
    assert!(largest.window_bursts >= max_window);
    // The cumulative sample spans the job: 4 chunks at most, spread by a doubled stride.
    let cumulative = snapshot.cumulative.unwrap();
    assert!(cumulative.windows_sampled <= 4);
    assert!(cumulative.stride >= 4, "stride {}", cumulative.stride);
    assert_eq!(cumulative.first_window, T0 / window_ns);
    assert!(cumulative.clusters.len() >= 3);
    let window = snapshot.last_window.unwrap();
    assert!(window.bursts_seen > window.bursts_analysed);
    assert!(window.bursts_analysed as usize <= max_window);

    // All in one window without a tick: the sample still stops at its bound.
    let mut job = JobPhases::new(8, OnlineParams::default()).unwrap();
    let mut pushed = 0u64;
    spmd(
        8,
        true,
        &phases,
        30_000_000_000,
        20.0,
        9,
        |_, _, _| 1.0,
        |b| {
            if pushed < 1_000_000 {
                job.push(&b);
                pushed += 1;
            }
        },
    );
    let held = job.held();
    assert_eq!(held.open_windows, 1);
    assert!(held.window_bursts <= OnlineParams::default().max_window_bursts);
    assert_eq!(held.cumulative_bursts, 0);
}

#[test]
fn late_bursts_are_counted_and_bursts_beyond_the_open_windows_close_the_oldest() {
    let mut job = JobPhases::new(2, test_params()).unwrap();
    let mut bursts = Vec::new();
    spmd(
        2,
        true,
        &E1_PHASES,
        1_000_000_000,
        1.0,
        3,
        |_, _, _| 1.0,
        |b| bursts.push(b),
    );
    for b in &bursts {
        job.push(b);
    }
    assert!(job.tick(T0 + 2_000_000_000).iter().any(|e| matches!(
        e,
        PhaseEvent::Reclustered {
            window: W0,
            partial: false,
            ..
        }
    )));
    job.push(&bursts[0]);
    assert_eq!(job.snapshot().totals.late_bursts, 1);
    // Bursts for windows W0+5..W0+8: the fourth window closes W0+5 at once.
    for k in 5..9 {
        for b in &bursts[..300] {
            let mut b = b.clone();
            b.start_ns += k * 1_000_000_000;
            job.push(&b);
        }
    }
    assert_eq!(job.held().open_windows, MAX_OPEN_WINDOWS);
    let events = job.tick(T0 + 8_000_000_000);
    assert!(events.iter().any(|e| matches!(
        e,
        PhaseEvent::Reclustered { window, reason: ReclusterReason::OpenWindowLimit, .. }
            if *window == W0 + 5
    )));

    // A window with a handful of bursts is carried into the next one, not clustered alone.
    let mut job = JobPhases::new(2, test_params()).unwrap();
    for b in bursts.iter().take(20) {
        job.push(b);
    }
    for b in &bursts[..300] {
        let mut b = b.clone();
        b.start_ns += 1_000_000_000;
        job.push(&b);
    }
    let events = job.tick(T0 + 3_000_000_000);
    let reclustered: Vec<(u64, u64)> = events
        .iter()
        .filter_map(|e| match e {
            PhaseEvent::Reclustered { window, bursts, .. } => Some((*window, *bursts)),
            _ => None,
        })
        .collect();
    assert_eq!(reclustered, vec![(W0 + 1, 320)]);
    assert_eq!(job.snapshot().totals.windows_carried, 1);
}

#[test]
fn parameters_are_checked_and_read_from_toml() {
    let params: OnlineParams =
        toml::from_str("window_s = 10.0\n[tracking]\noutlier_share = 0.1\n").unwrap();
    assert_eq!(params.window_s, 10.0);
    assert_eq!(params.tracking.outlier_share, 0.1);
    assert_eq!(
        params.max_window_bursts,
        OnlineParams::default().max_window_bursts
    );
    assert!(toml::from_str::<OnlineParams>("windows = 10.0\n").is_err());
    for bad in [
        OnlineParams {
            window_s: 0.0,
            ..OnlineParams::default()
        },
        OnlineParams {
            max_window_bursts: 1,
            ..OnlineParams::default()
        },
        OnlineParams {
            analysis: AnalysisParams {
                clustering: crate::analysis::ClusteringMethod::Acr {
                    steps: 0,
                    min_points: None,
                    resolution: 0.05,
                },
                ..AnalysisParams::default()
            },
            ..OnlineParams::default()
        },
        OnlineParams {
            tracking: TrackingParams {
                outlier_share: 0.0,
                ..TrackingParams::default()
            },
            ..OnlineParams::default()
        },
    ] {
        assert!(JobPhases::new(4, bad).is_err());
    }
}

#[test]
fn bursts_pushed_in_runs_give_what_they_give_one_by_one() {
    // A small sample bound, so that strata fill and runs are cut where they fill.
    let params = OnlineParams {
        max_window_bursts: 2_000,
        ..test_params()
    };
    let mut bursts = Vec::new();
    spmd(
        8,
        true,
        &E1_PHASES,
        1_000_000_000,
        6.0,
        11,
        |_, _, _| 1.0,
        |b| bursts.push(b),
    );
    let mut one_by_one = JobPhases::new(8, params.clone()).unwrap();
    let mut in_runs = JobPhases::new(8, params).unwrap();
    // Drains of 700 bursts, each in runs of one rank as the loop batches them; the last one also
    // brings a late burst of the first window.
    let mut drains: Vec<Vec<Burst>> = bursts
        .chunks(700)
        .map(|drain| {
            let mut drain = drain.to_vec();
            drain.sort_by_key(|b| b.rank);
            drain
        })
        .collect();
    let last = drains.len() - 1;
    drains[last].push(bursts[0].clone());
    for drain in &drains {
        for b in drain {
            one_by_one.push(b);
        }
        in_runs.push_all(drain);
        let now = drain
            .iter()
            .map(|b| b.start_ns + b.duration_ns)
            .max()
            .unwrap();
        assert_eq!(one_by_one.tick(now), in_runs.tick(now));
        assert_eq!(one_by_one.snapshot(), in_runs.snapshot());
    }
    let snapshot = in_runs.snapshot();
    assert!(snapshot.totals.dropped_bursts > 0, "{:?}", snapshot.totals);
    assert!(snapshot.totals.late_bursts > 0, "{:?}", snapshot.totals);
    assert!(snapshot.totals.windows_closed >= 4, "{:?}", snapshot.totals);
}
