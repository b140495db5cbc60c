"""Arrival schedules and the queue estimator's parts, with plain numbers (no server, no clock)."""

from __future__ import annotations

import bisect
import collections
import itertools
import random
import statistics

import pytest

from prober.capacity.own import OwnLoad, PrefillBaseline, QueueEstimator, SlotOccupancy
from prober.load.arrivals import RateClock, arrival_offsets, scheduled_offsets
from tests.support.results import timed_result


def test_poisson_offsets_are_seeded_and_have_the_right_mean() -> None:
    first = list(itertools.islice(arrival_offsets("poisson", 4.0, seed=1), 4000))
    again = list(itertools.islice(arrival_offsets("poisson", 4.0, seed=1), 4000))
    assert first == again
    gaps = [b - a for a, b in itertools.pairwise([0.0, *first])]
    assert statistics.mean(gaps) == pytest.approx(0.25, rel=0.05)
    # Exponential gaps: the standard deviation equals the mean.
    assert statistics.stdev(gaps) == pytest.approx(0.25, rel=0.1)
    assert all(b > a for a, b in itertools.pairwise(first))


def test_constant_offsets_do_not_drift() -> None:
    offsets = list(itertools.islice(arrival_offsets("constant", 3.0), 30_000))
    assert offsets[-1] == 30_000 / 3.0  # an absolute schedule: no accumulated rounding


def test_rate_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rate must be positive"):
        next(arrival_offsets("poisson", 0.0))


def _gaps(offsets: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise([0.0, *offsets])]


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_gamma_gaps_have_the_rate_and_a_cv_of_one_over_root_shape(shape: float) -> None:
    """As `vllm bench --burstiness`: mean gap 1/rate whatever the shape, CV = 1/√shape."""
    offsets = list(itertools.islice(arrival_offsets("gamma", 5.0, 3, burstiness=shape), 40_000))
    gaps = _gaps(offsets)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.2, rel=0.03)
    assert statistics.stdev(gaps) / mean == pytest.approx(1 / shape**0.5, rel=0.05)
    assert offsets == list(itertools.islice(arrival_offsets("gamma", 5.0, 3, burstiness=shape),
                                            40_000))  # fmt: skip


def test_burstier_gamma_clusters_arrivals() -> None:
    """Shape 0.25 puts more arrivals in the busiest second than Poisson at the same rate."""

    def busiest(kind: str, shape: float) -> int:
        offsets = itertools.islice(arrival_offsets(kind, 10.0, 1, burstiness=shape), 20_000)  # type: ignore[arg-type]
        return max(collections.Counter(int(t) for t in offsets).values())

    assert busiest("gamma", 0.25) > 1.5 * busiest("poisson", 1.0)


STEPS = [(10.0, 2.0), (4.0, 0.0), (6.0, 5.0)]  # 20, 0 and 30 arrivals a pass


def _per_step(offsets: list[float], steps: list[tuple[float, float]]) -> list[int]:
    period = sum(s for s, _ in steps)
    bounds = list(itertools.accumulate(s for s, _ in steps))
    counts = [0] * len(steps)
    for t in offsets:
        counts[bisect.bisect_right(bounds, t % period)] += 1
    return counts


def test_constant_schedule_sends_exactly_rate_times_seconds_per_step() -> None:
    offsets = list(itertools.islice(scheduled_offsets("constant", STEPS, loop=True), 50 * 50))
    assert _per_step(offsets, STEPS) == [50 * 20, 0, 50 * 30]
    assert offsets[:3] == [0.5, 1.0, 1.5]  # 2/s in the first step
    assert offsets[19] == 14.0  # the 20th lands where the pause ends: 10 s + 4 s
    assert offsets[50 * 50 - 1] == pytest.approx(50 * 20.0, abs=1e-9)  # no drift in 50 passes


def test_poisson_schedule_follows_the_steps() -> None:
    offsets = list(itertools.islice(scheduled_offsets("poisson", STEPS, loop=True, seed=5),
                                    100_000))  # fmt: skip
    counts = _per_step(offsets, STEPS)
    passes = offsets[-1] / 20.0
    assert counts[1] == 0  # nothing during the pause
    assert counts[0] / passes == pytest.approx(20, rel=0.03)
    assert counts[2] / passes == pytest.approx(30, rel=0.03)
    assert all(b > a for a, b in itertools.pairwise(offsets))


def test_gamma_schedule_keeps_its_burstiness_inside_a_step() -> None:
    steps = [(1000.0, 4.0), (1000.0, 1.0)]
    offsets = list(scheduled_offsets("gamma", steps, loop=False, seed=2, burstiness=0.25))
    first = _gaps([t for t in offsets if t < 1000.0])
    assert len(first) == pytest.approx(4000, rel=0.1)
    assert statistics.stdev(first) / statistics.fmean(first) == pytest.approx(2.0, rel=0.15)


def test_a_schedule_that_does_not_loop_ends_with_its_last_step() -> None:
    offsets = list(scheduled_offsets("constant", STEPS, loop=False))
    assert len(offsets) == 49  # the 50th would be the first of a second pass
    assert max(offsets) < 20.0
    poisson = list(scheduled_offsets("poisson", STEPS, loop=False, seed=1))
    assert poisson
    assert max(poisson) < 20.0


def test_rate_clock_mean_and_refusals() -> None:
    assert RateClock(STEPS, loop=True).mean_rate == pytest.approx(50 / 20)
    with pytest.raises(ValueError, match="above 0"):
        RateClock([(5.0, 0.0)], loop=True)
    with pytest.raises(ValueError, match="positive durations"):
        RateClock([(0.0, 1.0)], loop=True)


def test_prefill_baseline_is_the_interpolated_lower_envelope() -> None:
    baseline = PrefillBaseline()
    for tokens, seconds in [(64, 0.30), (64, 0.20), (64, 0.50), (256, 0.80), (256, 0.60)]:
        baseline.observe(tokens, seconds)
    assert baseline(64) == pytest.approx(0.20)
    assert baseline(256) == pytest.approx(0.60)
    assert baseline(160) == pytest.approx(0.40)  # halfway between the envelope points
    assert baseline(512) == pytest.approx(1.13, abs=0.01)  # extrapolated along the last segment


def test_slot_occupancy_reaches_the_slot_count_and_ignores_handoffs() -> None:
    occupancy = SlotOccupancy()
    # Two slots, saturated: each slot serves back-to-back requests of 1 s.
    for slot_offset in (0.0, 0.5):
        for k in range(4):
            occupancy.add(slot_offset + k, slot_offset + k + 1.0)
    assert occupancy.peak == 2


def _saturated(slots: int, requests: int, seconds: float = 1.0) -> list[tuple[float, float]]:
    """Back-to-back requests of `seconds` in each of `slots` slots, the slots out of step."""
    return [
        (slot * seconds / slots + k * seconds, slot * seconds / slots + (k + 1) * seconds)
        for k in range(requests // slots)
        for slot in range(slots)
    ]


def test_slot_occupancy_is_not_raised_by_a_stray_handoff() -> None:
    """One start read 0.2 s early (more than the handoff margin) overlaps its predecessor:
    five held at once for four slots, at one start in a hundred."""
    occupancy = SlotOccupancy()
    intervals = _saturated(4, 100)
    start, end = intervals[50]
    intervals[50] = (start - 0.2, end)
    for start, end in intervals:
        occupancy.add(start, end)
    assert occupancy.peak == 4
    strays = SlotOccupancy()
    for k, (start, end) in enumerate(_saturated(4, 100)):
        strays.add(start - 0.2 * (k % 2), end)  # half of the handoffs misread: not a stray
    assert strays.peak == 5


def test_slot_occupancy_learns_slots_full_only_now_and_then() -> None:
    """Five slots, mostly four busy: the fifth is held at one start in four."""
    occupancy = SlotOccupancy()
    for start, end in _saturated(4, 60):
        occupancy.add(start, end)
    assert occupancy.peak == 4
    for start, end in _saturated(5, 20):
        occupancy.add(start + 100.0, end + 100.0)
    assert occupancy.peak == 5


def test_own_load_waiting_is_in_flight_beyond_learned_slots() -> None:
    clock = [100.0]
    own = OwnLoad()
    estimator = QueueEstimator(clock=lambda: clock[0], own_load=own)
    # Three requests held slots together: the engine has at least three.
    for start in (0.0, 0.1, 0.2):
        estimator.observe(
            timed_result(start, start + 0.2, start + 2.0, prefill=0.2, prompt_tokens=64)
        )
    assert own.slots == 3
    for _ in range(7):
        own.sent()
    for _ in range(3):
        own.first_token()
    estimate = estimator.estimate()
    assert (estimate.waiting, estimate.running) == (4.0, 3.0)


def test_queue_wait_is_ttft_minus_server_prefill() -> None:
    estimator = QueueEstimator()
    queued = timed_result(0.0, 1.5, 2.0, prefill=0.25, prompt_tokens=64)
    assert estimator.observe(queued) == pytest.approx(1.25)


def test_littles_law_path_uses_the_server_drain_rate() -> None:
    clock = [10.0]
    estimator = QueueEstimator(clock=lambda: clock[0], server_drain_rate=lambda: 2.0)
    # Waited 1.0 s, decoded 2.0 s.
    estimator.observe(timed_result(0.0, 1.2, 3.2, prefill=0.2, prompt_tokens=64))
    estimate = estimator.estimate()
    assert estimate.wait_seconds == pytest.approx(1.0)
    assert estimate.waiting == pytest.approx(2.0)  # L_q = μ · W_q
    assert estimate.running == pytest.approx(4.0)  # μ · decode time
    clock[0] += 60  # outside the window: nothing recent, no figure
    assert estimator.estimate().waiting is None


def test_window_means_follow_the_window_as_it_slides() -> None:
    """The running sums give the same means as summing the window afresh, at every step."""
    clock = [0.0]
    estimator = QueueEstimator(
        window_seconds=10.0, clock=lambda: clock[0], server_drain_rate=lambda: 1.0
    )
    rng = random.Random(3)
    kept: list[tuple[float, float]] = []  # (finish time, queue wait) of each observation
    for _ in range(2000):
        clock[0] += rng.expovariate(20.0)
        prefill = rng.uniform(0.01, 0.1)
        wait = rng.choice([0.0, rng.uniform(0.0, 30.0)])
        first = prefill + wait
        estimator.observe(timed_result(0.0, first, first + 1.0, prefill=prefill, prompt_tokens=64))
        kept.append((clock[0], wait))
        window = [w for t, w in kept if t >= clock[0] - 10.0]
        assert estimator.estimate().wait_seconds == pytest.approx(sum(window) / len(window))
    clock[0] += 11.0
    assert estimator.estimate().wait_seconds is None
