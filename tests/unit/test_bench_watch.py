"""The client-bottleneck verdict of a bench level: plain figures in, the report's block out;
and the watch itself on a real loop (what it counts, never how fast)."""

from __future__ import annotations

import asyncio
import time

import pytest

from prober.bench.watch import (
    CPU_SHARE_LIMIT,
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


def test_a_lagging_loop_is_the_bottleneck() -> None:
    late = LOOP_LAG_P99_LIMIT_SECONDS * 2
    lags = (0.0001,) * 90 + (late,) * 10
    block = verdict(ClientLoad(10.0, 1.0, lags), "asyncio")
    assert block["client_bound"] is True
    assert block["reasons"][0].startswith(f"event-loop lag p99 {late * 1000:.1f} ms")


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
