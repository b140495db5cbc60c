"""When a target's probes fire (`prober.cadence`): a grid of its interval at a phase of its own."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from prober.cadence import phase, phased

NOW = datetime(2026, 12, 6, 7, 0, 0, 250_000, tzinfo=UTC)


def _runs(name: str, interval: float, jitter: float | None, n: int) -> list[float]:
    """The first `n` runs after the one at once, as the scheduler asks its trigger."""
    trigger = phased(name, interval, jitter, NOW)
    fire = trigger.get_next_fire_time(None, NOW)
    runs = []
    for _ in range(n):
        runs.append(fire.timestamp())
        fire = trigger.get_next_fire_time(fire, fire)
    return runs


def test_a_phase_is_the_names_own_and_the_same_in_every_process() -> None:
    assert phase("vllm/10.0.0.7:8000", 15) == phase("vllm/10.0.0.7:8000", 15)
    assert 0 <= phase("a", 15) < 15
    assert phase("a", 15) != phase("b", 15)
    # a stable hash (blake2b), not Python's salted one: the value is known in advance
    assert phase("vllm/10.0.0.7:8000", 15) == pytest.approx(1.76025469700)


def test_the_second_run_is_on_the_grid_at_least_one_interval_after_the_first() -> None:
    for name in ("a", "b", "gw", "vllm/10.0.0.7:8000"):
        [second, third, fourth] = _runs(name, 15, None, 3)
        assert NOW.timestamp() + 15 <= second < NOW.timestamp() + 30
        assert math.fmod(second - phase(name, 15), 15) == pytest.approx(0, abs=1e-6)
        assert (third - second, fourth - third) == (pytest.approx(15), pytest.approx(15))


def test_jitter_moves_a_run_within_its_slot_and_never_the_next_one() -> None:
    """apscheduler's own trigger counted each run from the last one's jittered time: a mean
    spacing of interval + jitter / 2 and a drift. On the grid each run lies in its slot."""
    random.seed(7)
    runs = _runs("a", 15, 1.0, 200)
    start = _runs("a", 15, None, 1)[0]
    for k, run in enumerate(runs):
        assert start + 15 * k <= run < start + 15 * k + 1.0
    spacing = (runs[-1] - runs[0]) / (len(runs) - 1)
    assert spacing == pytest.approx(15, abs=0.02)  # 15.5 with the library's trigger


def test_a_fleet_started_together_spreads_over_the_interval() -> None:
    """500 targets of a group, all added at one instant: their runs spread over the 15 s
    instead of all falling in the jitter's first second."""
    names = [f"vllm/10.0.{i // 250}.{i % 250}:8000" for i in range(500)]
    seconds = Counter(math.floor(_runs(name, 15, None, 1)[0] % 15) for name in names)
    assert len(seconds) == 15  # every second of the interval has some
    assert max(seconds.values()) <= 2 * 500 / 15  # none holds more than twice its share


def test_a_run_late_past_its_slot_is_followed_by_the_next_slot_not_by_now() -> None:
    """A run that came late (a stalled loop) leaves the next one on the grid; one past due is
    the scheduler's to coalesce or count as missed, as before."""
    trigger = phased("a", 10, None, NOW)
    second = trigger.get_next_fire_time(None, NOW)
    late = second + timedelta(seconds=3)
    after = trigger.get_next_fire_time(late, late + timedelta(seconds=30))
    assert after - second == timedelta(seconds=10)


@pytest.mark.parametrize("interval", [0.1, 0.2, 0.33, 1.0, 2.5, 15.0])
def test_runs_always_move_on_at_any_interval(interval: float) -> None:
    """A run on the grid reads a hair before its instant once a datetime has rounded it; the
    next run must still be the next slot, never the same instant again (which kept the
    scheduler in its loop for good at 0.2 s)."""
    for name in ("a", "b", "pool/x"):
        runs = _runs(name, interval, None, 2000)
        gaps = [b - a for a, b in itertools.pairwise(runs)]
        assert min(gaps) == pytest.approx(interval, abs=2e-5)
        assert max(gaps) == pytest.approx(interval, abs=2e-5)
