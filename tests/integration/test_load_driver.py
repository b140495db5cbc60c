"""prober.load.driver.LoadDriver against the simulator: the schedule is absolute, the cap holds,
a new rate starts a fresh schedule, and stopping leaves nothing behind."""

from __future__ import annotations

import asyncio
import itertools
import time

from prober.load.driver import LoadDriver
from prober.result import RequestResult
from prober.settings import LoadConfig, TargetConfig
from prober.targets import Target
from prober.web import client_session
from tests.support.daemon import simulator
from tests.support.results import recorder

RATE = 20.0


def target(url: str) -> Target:
    cfg = TargetConfig(name="sim", url=f"{url}/v1", model="sim", prompt_tokens=8, max_tokens=2)
    return Target.from_config(cfg)


async def test_constant_arrivals_follow_the_absolute_schedule() -> None:
    results: list[RequestResult] = []
    twenty = asyncio.Event()

    def record(result: RequestResult) -> None:
        results.append(result)
        if len(results) >= 20:
            twenty.set()

    load = LoadConfig(rate=RATE, arrival="constant", max_in_flight=64, seed=1)
    async with simulator(slots=64, decode_step_seconds=0.005) as url, client_session() as session:
        driver = LoadDriver(session, target(url), load, recorder(), on_result=record)
        driver.start()
        await asyncio.wait_for(twenty.wait(), timeout=10)
        await driver.set_rate(0)  # no arrival after this
        sent = driver.sent
        await asyncio.sleep(3 / RATE)
        assert driver.sent == sent
        await driver.stop(grace_seconds=5)
    assert len(results) == sent
    assert all(r.ok for r in results), [r.error for r in results]
    sched = sorted(r.t_sched_ns for r in results)
    gaps = [b - a for a, b in itertools.pairwise(sched)]
    # n / rate from one start instant: every gap is 50 ms to the nanosecond, however late the
    # loop woke for any one of them.
    assert all(abs(gap - 1e9 / RATE) <= 1 for gap in gaps), gaps
    assert all(r.t_send_ns >= r.t_sched_ns for r in results)


async def test_overdue_arrivals_are_sent_at_once_or_dropped_at_the_cap() -> None:
    results: list[RequestResult] = []
    load = LoadConfig(rate=RATE, arrival="constant", max_in_flight=3, seed=1)
    async with simulator(slots=1, decode_step_seconds=0.2) as url, client_session() as session:
        driver = LoadDriver(session, target(url), load, recorder(), on_result=results.append)
        driver.start()
        peak = 0
        for _ in range(20):
            await asyncio.sleep(0.05)
            peak = max(peak, driver.own_load.total)
        # The loop stalls for 0.5 s: ten arrivals fall due at once when it comes back.
        before = driver.sent + driver.dropped
        asyncio.get_running_loop().call_soon(time.sleep, 0.5)
        await asyncio.sleep(0.05)
        after = driver.sent + driver.dropped
        await driver.stop(grace_seconds=0)
    assert peak == 3  # the cap, never above it
    assert driver.dropped > 0
    assert after - before >= 10  # the overdue ones were all handled on the loop's return
    assert driver.own_load.total == 0  # stop() cancelled and counted every request


async def test_arrivals_falling_due_together_respect_the_cap() -> None:
    """The loop stalls before any arrival ran: ten fall due at once, only the cap is sent."""
    load = LoadConfig(rate=RATE, arrival="constant", max_in_flight=3, seed=1)
    async with simulator(slots=1, decode_step_seconds=0.2) as url, client_session() as session:
        driver = LoadDriver(session, target(url), load, recorder())
        driver.start()
        await asyncio.sleep(0.01)  # the schedule has started; its first arrival is at 50 ms
        time.sleep(0.5)  # the loop is held: arrivals 1..10 are all overdue when it returns
        await asyncio.sleep(0.05)
        in_flight, sent, dropped = driver.own_load.total, driver.sent, driver.dropped
        await driver.stop(grace_seconds=0)
    assert in_flight == 3
    assert sent == 3
    assert dropped >= 7
