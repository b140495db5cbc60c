"""A real engine that is full, never stopped, and what the daemon's engine state says of it
(issue 36 item 1): the floods of the engine-state tests and of `bench/engine_state.py`.

Each flood is driven by a separate process (`foreign_load`) the daemon is never told of: closed
loops of 3x and 10x the engine's slots, and open-loop Poisson arrivals at twice its measured
capacity (a queue that only grows while the flood lasts). The engine is never stopped, so every
poll of `/-/engine` that reads `stalled` or `down` is false.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.support.daemon import daemon
from tests.support.probes_alone_accuracy import (
    Level,
    drain,
    engine_truth,
    foreign_load,
    measure_capacity,
)
from tests.support.stall import Watched, until_state, watch_states

FALSE_STATES = ("stalled", "down")
# What each flooding client asks: short answers, so a level turns its queue over many times.
FLOOD_ANSWER = ("--max-tokens", "32", "--prompt-words", "24")


def floods(slots: int, capacity: float) -> list[Level]:
    """Closed loops of 3x and 10x `slots` clients, and Poisson arrivals at 2x `capacity`
    (completions per second)."""
    return [
        Level("closed3x", "closed", workers=3 * slots),
        Level("closed10x", "closed", workers=10 * slots),
        Level("open2x", "poisson", rate=2 * capacity),
    ]


@dataclass(frozen=True)
class FloodRow:
    """What `/-/engine` said of one target through one flood."""

    level: str
    shares: dict[str, float]  # state -> share of the polls
    false_polls: int
    longest_false_s: float  # the longest run of consecutive false polls
    first_false_reason: str | None
    engine_waiting_mean: float  # the engine's own waiting count (its /metrics), sampled each second

    def line(self) -> str:
        shares = ", ".join(f"{state} {share:.0%}" for state, share in self.shares.items())
        false = f"; first: {self.first_false_reason}" if self.first_false_reason else ""
        return (
            f"{self.level}: {shares}; false polls {self.false_polls} (longest "
            f"{self.longest_false_s:.1f} s){false}; engine waiting mean "
            f"{self.engine_waiting_mean:.1f}"
        )


def longest_false_run(watched: Watched) -> float:
    """The longest stretch, in seconds, of consecutive polls that read stalled or down."""
    longest, start = 0.0, None
    for at, _, state in watched.seen:
        if state in FALSE_STATES:
            start = at if start is None else start
            longest = max(longest, at - start)
        else:
            start = None
    return longest


async def _waiting_mean(base: str, stop: asyncio.Event) -> float:
    """The engine's own waiting count, sampled every second until `stop`; its mean."""
    seen: list[float] = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                seen.append((await engine_truth(session, base))[0])
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
    return statistics.fmean(seen) if seen else float("nan")


async def busy_never_stalled(
    base: str, target: dict[str, Any], slots: int, *, ready_seconds: float, seconds: float = 20
) -> None:
    """The suite's check: the engine at `base`'s capacity measured, then a daemon probing it as
    `target` (the default stall window, a 20 s first-token timeout) through the three floods,
    `seconds` each, the engine drained after each; no poll `stalled` or `down`, and `busy`
    seen in each."""
    capacity = await measure_capacity(base, 2 * slots, 20, *FLOOD_ANSWER)
    assert capacity > 0, "no completion while the capacity was measured"
    config = {**target, "slots": slots, "stall_seconds": None,
              "timeouts": {"connect_seconds": 2, "first_token_seconds": 20}}  # fmt: skip
    rows = []
    async with daemon({"targets": [config]}) as (url, _):
        await until_state(url, config["name"], "ok", timeout=ready_seconds)
        for flood in floods(slots, capacity):
            rows.append(await flood_row(url, base, config["name"], flood, seconds))
            print(f"{slots} slots, capacity {capacity:.2f}/s; {rows[-1].line()}")
            await drain(base, timeout=180)
    for row in rows:
        assert row.false_polls == 0, row.line()
        assert "busy" in row.shares, row.line()


async def flood_row(url: str, base: str, target: str, flood: Level, seconds: float) -> FloodRow:
    """Flood the engine at `base` for `seconds` while polling the daemon at `url` about
    `target`. The engine is not drained afterwards (`probes_alone_accuracy.drain`)."""
    stop = asyncio.Event()
    truth = asyncio.create_task(_waiting_mean(base, stop))
    try:
        async with foreign_load(base, flood, *FLOOD_ANSWER, seconds=seconds):
            watched = await watch_states(url, target, seconds=seconds)
    finally:
        stop.set()
    counts = Counter(state for _, _, state in watched.seen)
    polls = len(watched.seen)
    false = [
        r for (_, _, s), r in zip(watched.seen, watched.reasons, strict=True) if s in FALSE_STATES
    ]
    return FloodRow(
        level=flood.name,
        shares={state: n / polls for state, n in counts.most_common()},
        false_polls=len(false),
        longest_false_s=longest_false_run(watched),
        first_false_reason=false[0] if false else None,
        engine_waiting_mean=await truth,
    )
