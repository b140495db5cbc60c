"""The client-bottleneck verdict of a bench level: plain figures in, the report's block out;
and the watch itself on a real loop (what it counts, never how fast)."""

from __future__ import annotations

import asyncio
import time

import pytest

from prober.bench.watch import (
    CPU_BUSY_SHARE,
    CPU_SHARE_LIMIT,
    LAG_SHARE_OF_SCALE,
    LOOP_LAG_P99_LIMIT_SECONDS,
    ClientLoad,
    ClientWatch,
    verdict,
)


def test_an_idle_client_is_trusted() -> None:
    block = verdict(ClientLoad(10.0, 1.0, (0.0005,) * 100), "uvloop 0.23.0")
    assert block["client_bound"] is False
    assert block["latencies_trustworthy"] is True
    assert block["reasons"] == []
    assert block["cpu_share"] == pytest.approx(0.1)
    assert block["event_loop"] == "uvloop 0.23.0"


def test_a_client_near_a_core_is_the_bottleneck() -> None:
    block = verdict(ClientLoad(10.0, 10.0 * CPU_SHARE_LIMIT, ()), "asyncio")
    assert block["client_bound"] is True
    assert block["latencies_trustworthy"] is False
    assert [r.split(" (")[0] for r in block["reasons"]] == ["client CPU 0.90 of a core"]


def lagging(late: float) -> tuple[float, ...]:
    return (0.0001,) * 90 + (late,) * 10  # p99 = late


def test_a_busy_lagging_loop_is_the_bottleneck() -> None:
    # Lag p99 8 ms against a 50 ms ITL (16 %), the client busy at half a core.
    late = 0.008
    block = verdict(ClientLoad(10.0, 5.0, lagging(late)), "asyncio", scale_seconds=0.05)
    assert block["client_bound"] is True
    assert block["reasons"][0].startswith(
        f"event-loop lag p99 {late * 1000:.1f} ms = 16% of the latency measured at client CPU "
        "0.50 of a core"
    )
    assert block["lag_p99_share_of_scale"] == pytest.approx(0.16)


def test_a_lag_at_an_idle_client_is_only_noted() -> None:
    # What a new user saw: lag p99 3.5 ms (over the absolute 3 ms) at 0.01 cores. The client
    # was not what held the level up: never BOUND, a note for the JSON.
    block = verdict(ClientLoad(10.0, 0.1, lagging(0.0035)), "uvloop", scale_seconds=0.03)
    assert block["client_bound"] is False
    assert block["latencies_trustworthy"] is True
    assert isinstance(block["note"], str)
    assert block["note"].startswith("event-loop lag p99 3.5 ms = 12% of the latency measured")
    assert "while the client was idle (0.01 of a core)" in block["note"]
    # Just below the busy line it is still only a note; at it, the lag counts.
    just_idle = ClientLoad(10.0, 10.0 * CPU_BUSY_SHARE - 0.01, lagging(0.0035))
    assert verdict(just_idle, "uvloop", scale_seconds=0.03)["client_bound"] is False
    busy = ClientLoad(10.0, 10.0 * CPU_BUSY_SHARE, lagging(0.0035))
    assert verdict(busy, "uvloop", scale_seconds=0.03)["client_bound"] is True


def test_a_lag_small_against_what_is_measured_is_no_bottleneck() -> None:
    # A busy client, lag p99 3.5 ms, but the level's finest latency is 300 ms: 1 %, under 5 %.
    busy = ClientLoad(10.0, 5.0, lagging(0.0035))
    block = verdict(busy, "uvloop", scale_seconds=0.3)
    assert block["client_bound"] is False
    assert block["note"] is None
    # The limit is the larger of 3 ms and 5 % of the scale: 15 ms here.
    limit = LAG_SHARE_OF_SCALE * 0.3
    assert (
        verdict(ClientLoad(10.0, 5.0, lagging(limit * 0.99)), "uvloop", 0.3)["client_bound"]
        is False
    )
    assert verdict(ClientLoad(10.0, 5.0, lagging(limit * 1.01)), "uvloop", 0.3)["client_bound"]
    # Without a scale (nothing measured) the absolute limit alone applies.
    late = LOOP_LAG_P99_LIMIT_SECONDS * 1.2
    assert verdict(ClientLoad(10.0, 5.0, lagging(late)), "uvloop")["client_bound"] is True


def test_the_watch_samples_the_loop_and_its_cpu() -> None:
    async def run() -> ClientLoad:
        watch = ClientWatch(interval=0.005)
        watch.start()
        await asyncio.sleep(0.05)
        time.sleep(0.03)  # the loop is blocked: the next sample is late by about this
        await asyncio.sleep(0.02)
        return watch.stop()

    load = asyncio.run(run())
    assert len(load.lags) >= 5
    assert max(load.lags) >= 0.02
    assert load.cpu_seconds > 0
    assert load.wall_seconds >= 0.1
