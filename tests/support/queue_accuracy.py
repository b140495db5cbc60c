"""The queue-depth acceptance experiment, shared by the simulator and real-engine tests.

Measure the engine's capacity (closed loop, twice as many workers as slots), then drive it
with one daemon's own background load at fractions of that capacity, level after level. At
every level sample the daemon's `llmprober_queue_depth{source="estimate",state="waiting"}`
and the engine's own waiting count side by side, and report mean true depth, mean estimate
and mean absolute error.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import aiohttp

from prober.request import Api, RequestSpec, stream_request
from prober.result import Outcome
from prober.web import FLEET, client_session
from tests.support.daemon import daemon, scrape, value
from tests.support.machine import LoopLag, snapshot_at
from tests.support.probes_alone_accuracy import drain, engine_truth


@dataclass(frozen=True)
class Level:
    rate: float
    true_mean: float
    estimate_mean: float
    mae: float
    samples: int
    slots: float = 0.0  # the slots the estimate used at the level's end (llmprober_engine_slots)
    lag: float = 0.0  # the test loop's worst lateness over the level (a stalled machine)
    machine: str = ""  # the machine's busiest processes halfway through the level

    @property
    def bound(self) -> float:
        return max(1.0, 0.2 * self.true_mean)


async def measure_capacity_in_process(
    base: str, workers: int, seconds: float, prompt: str, max_tokens: int,
    extra_body: dict[str, object] | None = None,
) -> float:  # fmt: skip
    """Completed requests per second with `workers` closed-loop clients in this process (the
    prober's own `stream_request`, no warm-up, nothing drained after), unlike
    `probes_alone_accuracy.measure_capacity`'s load process."""
    done = 0
    async with client_session() as session:
        stop_at = time.monotonic() + seconds

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop_at:
                spec = RequestSpec(
                    f"{base}/v1", Api.CHAT, "m", f"{time.time_ns()} {prompt}", max_tokens,
                    extra_body=extra_body or {},
                )  # fmt: skip
                result = await stream_request(session, spec, time.perf_counter_ns())
                assert result.outcome is Outcome.OK, result.error
                done += 1

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(workers)))
        return done / (time.monotonic() - started)


async def run_own_load_levels(
    base: str, rates: list[float], seconds: float, *, prompt_tokens: int, max_tokens: int,
    warmup_seconds: float, sample_every: float = 0.5, extra_body: dict[str, object] | None = None,
) -> list[Level]:  # fmt: skip
    """One daemon, as in production, stepping its own background load through `rates` (where
    `probes_alone_accuracy.run_levels` has another process load the engine and the daemon probe).

    Between levels the load pauses and the engine drains, so each level starts empty.
    """
    target = {
        "name": "engine", "url": f"{base}/v1", "model": "m", "interval_seconds": 3600,
        "warmup": 0, "prompt_tokens": prompt_tokens, "max_tokens": max_tokens,
        "extra_body": extra_body or {},
        "load": {"rate": rates[0], "max_in_flight": 500, "seed": 7},
        "timeouts": {"first_token_seconds": 600, "total_seconds": 900},
    }  # fmt: skip
    config = {"server": {"listen": "127.0.0.1:0", "grace_seconds": 0.1}, "targets": [target]}
    levels = []
    async with daemon(config) as (url, app), aiohttp.ClientSession() as session:
        [driver] = [m.load for m in app[FLEET].members.values() if m.load is not None]
        for rate in rates:
            await driver.set_rate(rate)
            await asyncio.sleep(warmup_seconds)
            pairs: list[tuple[float, float]] = []
            end = time.monotonic() + seconds
            lag = LoopLag()
            async with lag, snapshot_at(seconds / 2) as machine:
                samples = await _sample_level(session, base, url, end, sample_every, pairs)
            slots = value(samples, "llmprober_engine_slots")
            await driver.set_rate(0)
            await drain(base, timeout=300)
            levels.append(_level(rate, pairs, slots, lag.worst, "".join(machine)))
    return levels


# The experiment's levels, as fractions of the measured capacity.
FACTORS = (0.2, 0.6, 1.0, 1.5)


async def on_engine(
    base: str, *, workers: int, capacity_seconds: float, seconds: float, note: str
) -> tuple[list[Level], str]:
    """The experiment on a real engine: 48-token prompts, answers of exactly 16 tokens (so
    the capacity is stable), the capacity from `workers` closed-loop clients over
    `capacity_seconds`, then `seconds` a level; returns the levels and their report."""
    fixed: dict[str, object] = {"ignore_eos": True}
    capacity = await measure_capacity_in_process(
        base, workers=workers, seconds=capacity_seconds, prompt="hello " * 40, max_tokens=16,
        extra_body=fixed,
    )  # fmt: skip
    levels = await run_own_load_levels(
        base, [capacity * factor for factor in FACTORS], seconds=seconds, prompt_tokens=48,
        max_tokens=16, warmup_seconds=2.0, extra_body=fixed,
    )  # fmt: skip
    return levels, f"{note}\n{table(capacity, levels)}\n{evidence(levels)}"


async def _sample_level(
    session: aiohttp.ClientSession, base: str, url: str, end: float, every: float,
    pairs: list[tuple[float, float]],
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:  # fmt: skip
    """Appends (true, estimated) waiting to `pairs` until `end`; the daemon's last scrape."""
    samples = {}
    while time.monotonic() < end:
        # The truth first: llama-server computes /metrics in its own loop, when it gets to
        # it, so its figure describes the moment it answers; read the estimate then.
        true_waiting, _ = await engine_truth(session, base)
        samples = await scrape(url)
        estimate = value(samples, "llmprober_queue_depth", source="estimate", state="waiting")
        pairs.append((true_waiting, estimate))
        await asyncio.sleep(every)
    return samples


def _level(
    rate: float, pairs: list[tuple[float, float]], slots: float, lag: float, machine: str
) -> Level:
    n = len(pairs)
    return Level(
        rate=rate,
        true_mean=sum(t for t, _ in pairs) / n,
        estimate_mean=sum(e for _, e in pairs) / n,
        mae=sum(abs(t - e) for t, e in pairs) / n,
        samples=n,
        slots=slots,
        lag=lag,
        machine=machine,
    )


def table(capacity: float, levels: list[Level]) -> str:
    lines = [
        f"capacity {capacity:.3f} req/s",
        f"{'rate':>7} {'x cap':>6} {'true mean':>10} {'est mean':>9} {'MAE':>6} "
        f"{'bound':>6} {'n':>4} {'slots':>5} {'lag':>5}",
    ]
    for lv in levels:
        lines.append(
            f"{lv.rate:7.3f} {lv.rate / capacity:6.2f} {lv.true_mean:10.2f} "
            f"{lv.estimate_mean:9.2f} {lv.mae:6.2f} {lv.bound:6.2f} {lv.samples:4d} "
            f"{lv.slots:5.0f} {lv.lag:5.1f}"
        )
    return "\n".join(lines)


def evidence(levels: list[Level]) -> str:
    """What the machine was doing halfway through each level: for a failure's message."""
    return "\n".join(f"{lv.rate:.3f}/s: {lv.machine}" for lv in levels if lv.machine)
