"""Arrival schedules and the queue estimator's parts, with plain numbers (no server, no clock)."""

from __future__ import annotations

import itertools
import random
import statistics

import pytest

from prober.arrivals import arrival_offsets
from prober.estimate import OwnLoad, PrefillBaseline, QueueEstimator, SlotOccupancy
from prober.result import Outcome, RequestResult

S = 1_000_000_000


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


def _result(send: float, first: float, end: float, prefill: float) -> RequestResult:
    return RequestResult(
        Outcome.OK, int(send * S), int(send * S), int(end * S),
        t_first_token_ns=int(first * S), t_first_content_ns=int(first * S),
        t_last_token_ns=int(end * S), token_event_ns=(int(first * S), int(end * S)),
        prompt_tokens=64, output_tokens=2, server_prefill_seconds=prefill,
    )  # fmt: skip


def test_own_load_waiting_is_in_flight_beyond_learned_slots() -> None:
    clock = [100.0]
    own = OwnLoad()
    estimator = QueueEstimator(clock=lambda: clock[0], own_load=own)
    # Three requests held slots together: the engine has at least three.
    for start in (0.0, 0.1, 0.2):
        estimator.observe(_result(start, start + 0.2, start + 2.0, prefill=0.2))
    assert own.slots == 3
    for _ in range(7):
        own.sent()
    for _ in range(3):
        own.first_token()
    estimate = estimator.estimate()
    assert (estimate.waiting, estimate.running) == (4.0, 3.0)


def test_queue_wait_is_ttft_minus_server_prefill() -> None:
    estimator = QueueEstimator()
    assert estimator.observe(_result(0.0, 1.5, 2.0, prefill=0.25)) == pytest.approx(1.25)


def test_littles_law_path_uses_the_server_drain_rate() -> None:
    clock = [10.0]
    estimator = QueueEstimator(clock=lambda: clock[0], server_drain_rate=lambda: 2.0)
    estimator.observe(_result(0.0, 1.2, 3.2, prefill=0.2))  # waited 1.0 s, decoded 2.0 s
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
        estimator.observe(_result(0.0, prefill + wait, prefill + wait + 1.0, prefill=prefill))
        kept.append((clock[0], wait))
        window = [w for t, w in kept if t >= clock[0] - 10.0]
        assert estimator.estimate().wait_seconds == pytest.approx(sum(window) / len(window))
    clock[0] += 11.0
    assert estimator.estimate().wait_seconds is None
