"""The knee, the capacity and the warnings, judged on intervals, from fixed synthetic sweeps
(`tests/support/bench_synthetic.py`: a FIFO server of N slots with seeded noise): a noisy flat
series yields no knee, a clear one is found where it is, a dip is not mistaken for one, and a
level with too few requests is named instead of judged."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from prober.bench.intervals import MIN_REQUESTS
from prober.bench.text import print_summary, verdict_lines, warning_lines
from prober.bench.verdicts import capacity, knee, warnings
from tests.support.bench_synthetic import closed_level, open_level

Level = dict[str, Any]


def relabel(level: Level, concurrency: int) -> Level:
    key = {"concurrency": concurrency}
    return {**level, **key, "level": key}


def flat_sweep(seed: int) -> list[Level]:
    """Four levels measured under the same conditions (2 workers on 2 slots, ±20 % noise on
    service and prefill, 16 requests each), labelled as if the load rose: only noise differs."""
    return [
        relabel(closed_level(2, 16, slots=2, seed=seed * 10 + i, noise=0.2), c)
        for i, c in enumerate((1, 2, 4, 8))
    ]


def test_a_noisy_flat_series_yields_no_knee() -> None:
    for seed in range(20):
        levels = flat_sweep(seed)
        found = knee(levels)
        assert found["level"] is None, (seed, found)
        assert warnings(levels) == []


def test_a_clear_knee_is_found_where_it_is() -> None:
    # 4 slots: throughput rises until c=4, then flat; from c=8 half the requests wait a whole
    # service time for a slot, so TTFT rises. ±5 % noise, 16 requests a level.
    for seed in range(5):
        levels = [closed_level(c, 16, slots=4, seed=seed, noise=0.05) for c in (1, 2, 4, 8, 16)]
        found = knee(levels)
        assert found["level"] == {"concurrency": 8}, (seed, found)
        assert found["last_scaling_level"] == {"concurrency": 4}
        assert found["throughput_gain_ci"][1] < 0.10
        assert found["ttft_p50_ratio_ci"][0] > 1
        assert found["ttft_p50_ratio"] > 3
        cap = capacity(levels, 0.9, None)  # the synthetic SLO (30 s TTFT) is met everywhere
        assert cap["level"] == {"concurrency": 16}
        assert cap["trend"] == "flat"
        assert cap["plateau_from"] == {"concurrency": 4}
        assert cap["bounded_by"] == "sweep_end"
        assert cap["lower_bound"] is False


def test_a_dip_is_not_a_knee() -> None:
    # What a new user saw, on -np 4 -t 1: c=1 1.0 req/s, c=2 slower than c=1 (the machine
    # was busy: everything 2.4x slower), c=4 1.5x c=1 (one thread batches 4 at 2.6x the cost
    # of one), c=8 the same: the queue. At c=2 TTFT rose while throughput fell: saturation
    # holds throughput flat, so a fall is named, not called a knee; the knee is c=8.
    slow = {1: 1.0, 2: 2.4, 4: 2.6, 8: 2.6}
    levels = [closed_level(c, 16, slots=4, seed=1, noise=0.05, slow=slow[c]) for c in slow]
    found = knee(levels)
    assert [(u["level"], u["reason"]) for u in found["undecided"]] == [
        ({"concurrency": 2}, "throughput_fell")
    ]
    assert found["undecided"][0]["throughput_gain_ci"][1] < -0.10
    assert found["level"] == {"concurrency": 8}
    assert found["last_scaling_level"] == {"concurrency": 4}
    dips = [w for w in warnings(levels) if w["kind"] == "dip"]
    assert dips == [{"level": {"concurrency": 2}, "kind": "dip", "below": [{"concurrency": 1}],
                     "rose_at": {"concurrency": 4}}]  # fmt: skip
    line = warning_lines({"warnings": dips})[0]
    assert line.startswith("warning: c=2: throughput fell below c=1 and rose again at c=4")
    lines = verdict_lines({"knee": found, "capacity": capacity(levels, 0.9, None)})
    assert lines[0].startswith("knee: c=8: TTFT p50 ")
    assert not any(line.startswith("  c=2") for line in lines)  # a knee found: no notes


def test_a_flat_step_that_rises_later_is_not_a_knee() -> None:
    # c=2 ran 2x slower (the machine): its throughput equals c=1's and its TTFT doubled, the
    # shape of a knee; but c=4 rose beyond both intervals, so c=2 was noise, and the knee
    # (c=8) is found after it.
    slow = {1: 1.0, 2: 2.0, 4: 2.6, 8: 2.6}
    levels = [closed_level(c, 16, slots=4, seed=1, noise=0.05, slow=slow[c]) for c in slow]
    found = knee(levels)
    assert {"level": {"concurrency": 2}, "reason": "rose_later",
            "rose_at": {"concurrency": 4}} in found["undecided"]  # fmt: skip
    assert found["level"] == {"concurrency": 8}
    no_knee = knee(levels[:3])
    lines = verdict_lines({"knee": no_knee, "capacity": capacity(levels[:3], 0.9, None)})
    assert lines[1] == (
        "  c=2: TTFT rose with flat throughput, but throughput rose again at c=4: a dip, not a knee"
    )


def test_too_few_requests_are_named_not_judged() -> None:
    few = MIN_REQUESTS - 2
    levels = [closed_level(c, few, slots=4, seed=2, noise=0.05) for c in (1, 2, 4, 8)]
    assert knee(levels)["level"] is None  # the same shape that gives a knee with 16
    named = warnings(levels)
    assert [w["kind"] for w in named] == ["too_few_requests"] * 4
    assert named[0]["requests_ok"] == few
    line = warning_lines({"warnings": named})[0]
    assert line.startswith(f"warning: c=1: {few} successful requests, fewer than {MIN_REQUESTS}:")


def test_an_unclear_step_says_so() -> None:
    # ±40 % service noise over 12 requests: c=4 to c=8 on 4 slots is flat in truth, but the
    # intervals cannot rule out a 10 % rise, so no knee, and the report says why.
    levels = [closed_level(c, 12, slots=4, seed=3, noise=0.4) for c in (1, 2, 4, 8)]
    found = knee(levels)
    assert found["level"] is None
    assert [u["level"] for u in found["undecided"]] == [{"concurrency": 8}]
    assert found["undecided"][0]["reason"] == "throughput_unclear"
    lines = verdict_lines({"knee": found, "capacity": capacity(levels, 0.9, None)})
    assert lines[1].startswith("  c=8: TTFT rose, but the throughput's gain (")
    assert "does not rule out +10% or more" in lines[1]


def test_capacity_bounded_by_the_slo_and_sized_by_littles_law() -> None:
    levels = [closed_level(c, 16, slots=4, seed=4, noise=0.05) for c in (1, 2, 4, 8)]
    levels[3] = {**levels[3], "goodput": {"ratio": 0.5, "requests_per_second": 1.0}}
    cap = capacity(levels, 0.9, target_rate=10.0)
    assert cap["level"] == {"concurrency": 4}
    assert cap["bounded_by"] == "slo"
    assert cap["next_level"] == {"concurrency": 8}
    assert cap["next_goodput_ratio"] == 0.5
    assert cap["trend"] == "rising"  # c=2 to c=4 still doubled: bounded by the SLO, not flat
    assert cap["lower_bound"] is False
    low, high = cap["request_throughput_ci"]
    assert low < cap["request_throughput"] < high
    w, service = cap["mean_e2e_from_send_seconds"], cap["mean_service_seconds"]
    assert cap["slots_needed"] == pytest.approx(10 * w, abs=1)
    assert cap["slots_needed_service"] <= cap["slots_needed"]
    assert service <= w
    line = verdict_lines({"knee": knee(levels), "capacity": cap})[-2]
    assert "req/s served (" in line
    assert "bounded by the SLO (c=8 has goodput 50%)" in line
    assert "throughput still rising into it" in line
    assert capacity([levels[3]], 0.9, None)["level"] is None


def test_capacity_still_rising_at_the_sweep_end_is_a_lower_bound() -> None:
    levels = [closed_level(c, 16, slots=8, seed=5, noise=0.05) for c in (1, 2, 4)]
    cap = capacity(levels, 0.9, None)
    assert cap["level"] == {"concurrency": 4}
    assert cap["trend"] == "rising"
    assert cap["lower_bound"] is True
    line = verdict_lines({"knee": knee(levels), "capacity": cap})[-1]
    assert line.startswith("capacity: at least ")
    assert line.endswith("the highest level measured; throughput still rising into it: extend "
                         "the sweep")  # fmt: skip


def test_open_loop_capacity_in_achieved_terms() -> None:
    # 16 seeded arrivals at a nominal 0.5/s can fall in far less than 32 s: the capacity
    # line gives what arrived and what was served, beside the nominal rate.
    levels = [open_level(rate, 16, slots=2, seed=7) for rate in (0.5, 1.0)]
    achieved = levels[0]["arrival_rate"]["achieved"]
    assert achieved != pytest.approx(0.5, rel=0.1)  # seed 7: the schedule ran fast or slow
    cap = capacity(levels, 0.9, None)
    assert cap["arrival_rate"]["nominal"] == 1.0
    line = verdict_lines({"knee": knee(levels), "capacity": cap})[-1]
    served = cap["request_throughput"]
    arrived = cap["arrival_rate"]["achieved"]
    assert line.startswith(f"capacity: at least {served:.2f} req/s served (")
    assert f"at 1/s nominal, {arrived:.2f}/s arrived" in line
    doc = {"config": {"model": "m", "url": "http://x/v1", "mode": "rate"}, "levels": levels,
           "knee": knee(levels), "capacity": cap, "warnings": []}  # fmt: skip
    buffer = io.StringIO()
    print_summary(doc, Console(file=buffer, width=250))
    text = buffer.getvalue()
    assert "arrived/s" in text
    assert f"{achieved:.2f}" in text
