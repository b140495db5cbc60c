"""Saturation follows the engine's own as the load nears the knee; skipped probe runs are counted.

Saturation (busy slots ÷ slots below the knee, 1 + waiting ÷ slots above it) is exported per
target from the probes-alone estimate. On a ramp of someone else's Poisson traffic through
the simulator's capacity, at every step before the probes' TTFT p95 breaks the SLO (where an
autoscaler must act), the estimate stays within the running figure's accuracy bound of the
engine's own saturation over the same window, it rises as the engine's does, and past the
knee waiting requests push it above 1.

What it does not claim: a fixed level at the step before the break. Where the SLO breaks is
a coarse bucket of a noisy p95 (0.65x to 0.9x of capacity), and the engine's own saturation
there read 0.53 to 0.67 (2026-12-06); below 0.65x the engine's own rose by as little as 0.08
from 0.3x to 0.5x. An earlier form asserted a rise of 0.15 and a level of 0.45 by that step,
and failed on a fresh machine with the estimate at 0.38 -> 0.49: the engine's own rise, not
the estimate, was too small for that bound.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import aiohttp

from tests.support.daemon import daemon, scrape, value
from tests.support.margins import holds
from tests.support.probes_alone_accuracy import (
    Level,
    engine_truth,
    foreign_load,
    measure_capacity,
    sim_process,
)

SLOTS = 4
ENGINE = ("--slots", str(SLOTS), "--decode-step", "0.02", "--decode-slowdown", "0.3")
TTFT_SLO = 0.5
RAMP = (0.3, 0.5, 0.65, 0.8, 0.9, 1.0, 1.3)  # × capacity: finer near the knee
# The running figure's bound in the probes-alone accuracy tests: max(1, 25 % of the slots)
# requests, here one slot of four.
TRACKS = 0.25
# Its rise from the first step to the last before the break may fall short of the engine's
# own by as much: each step is one 8-s read of a noisy figure, and the last before the break is
# the one nearest the knee, where the batch moves most. Over seven runs (five on a quiet
# machine, 2026-12-07, one before them, CI's at e89f302) the error at 0.3x moved by 0.013
# (sd), at 0.8x by 0.077: the running figure there off by -0.46 to +0.28 requests, read from
# some 30 probe gaps of a batch that moves between 1 and 4. The shortfall read -0.08 to 0.104
# (mean 0.02, sd 0.073); two of the seven went past the 0.1 of before, a bound within that
# noise. 0.25 is 3.1 sd out, and a flat estimate still fails wherever the engine's own rise
# exceeds it (0.24 to 0.65 in those runs, 0.37 or more in six).
RISE_TRACKS = TRACKS
# The estimate's windows (prober/capacity/probes.py): running averages the probes of the last
# 10 s (`_RUNNING_SECONDS`), waiting those of the last 5 s (`_RECENT_SECONDS`). The engine's
# saturation, running/slots + waiting/slots, is averaged over the same windows, part by part.
RUNNING_WINDOW_SECONDS = 10.0
WAITING_WINDOW_SECONDS = 5.0


def _probe_ttft_buckets(samples: dict[Any, float]) -> dict[float, float]:
    out: dict[float, float] = {}
    for (name, labels), v in samples.items():
        fields = dict(labels)
        if name == "llmprober_ttft_seconds_bucket" and fields.get("mode") == "probe":
            out[float(fields["le"])] = v
    return out


def sample(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    """The one sample named `name` with `labels`; None where it is not exported."""
    found = [
        v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items()
    ]
    return found[0] if found else None


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def p95(before: dict[float, float], after: dict[float, float]) -> float:
    """The upper bound of the bucket holding the 95th percentile of what arrived between."""
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1]
    return next(le for le, n in delta if n >= 0.95 * total) if total else math.nan


async def test_saturation_follows_the_engines_before_ttft_p95_breaks_the_slo() -> None:
    with sim_process(*ENGINE) as base:
        capacity = await measure_capacity(base, 2 * SLOTS, 10)
        target = {
            "name": "engine", "url": f"{base}/v1", "model": "m", "interval_seconds": 0.5,
            "jitter_seconds": 0.1, "prompt_tokens": 40, "max_tokens": 16, "slots": SLOTS,
            "slo": {"ttft_seconds": TTFT_SLO}, "pair_share": 0.5,
            "traffic": "probes",  # the load's prompts and answers are the probes' lengths
        }  # fmt: skip
        steps: list[tuple[float, float, float, float]] = []
        parts: list[str] = []  # each step's running and waiting, estimate beside engine
        truth: list[tuple[float, float, float]] = []  # (monotonic time, waiting, running)
        session = aiohttp.ClientSession()
        async with session, daemon({"targets": [target]}) as (url, _):
            sampler = asyncio.create_task(_sample_truth(session, base, truth))
            await asyncio.sleep(8)  # the first pairs: the decode slowdown is learned
            for factor in RAMP:
                level = Level(f"x{factor}", "poisson", rate=factor * capacity)
                async with foreign_load(base, level, seconds=12):
                    await asyncio.sleep(4)
                    before = _probe_ttft_buckets(await scrape(url))
                    sats, ours, theirs = [], [], []
                    end = time.monotonic() + 8
                    while time.monotonic() < end:
                        samples = await scrape(url)
                        sat = sample(samples, "llmprober_saturation", source="estimate")
                        if sat is not None:
                            sats.append(sat)
                            ours.append(_estimated_parts(samples))
                            theirs.append(_engine_parts(truth, time.monotonic()))
                        await asyncio.sleep(0.5)
                    after = _probe_ttft_buckets(samples)
                engine = mean([(running + waiting) / SLOTS for running, waiting in theirs])
                steps.append((factor, mean(sats), engine, p95(before, after)))
                parts.append(_parts_line(factor, ours, theirs))
            sampler.cancel()
    report = "\n".join(
        f"x{f:<4} saturation {s:5.2f} (engine {e:5.2f} over the same window)  "
        f"probe TTFT p95 ≤ {t:.3f} s"
        for f, s, e, t in steps
    )
    report += "\nrunning and waiting requests, estimate (engine):\n" + "\n".join(parts)
    print("\n" + report)
    breaks = next((i for i, (_, _, _, t) in enumerate(steps) if t > TTFT_SLO), len(steps))
    assert 1 < breaks < len(steps), f"the ramp must break the TTFT SLO midway:\n{report}"
    for factor, estimate, engine, _ in steps[:breaks]:
        off = abs(estimate - engine)
        assert holds(f"x{factor} |estimate - engine|", off, at_most=TRACKS), report
    (_, first, engine_first, _), (_, last, engine_last, _) = steps[0], steps[breaks - 1]
    short = (engine_last - engine_first) - (last - first)
    assert holds("rise short of the engine's", short, at_most=RISE_TRACKS), report
    assert holds("x1.3 saturation", steps[-1][1], at_least=1.0), report  # past the knee


async def _sample_truth(
    session: aiohttp.ClientSession, base: str, truth: list[tuple[float, float, float]]
) -> None:
    """The engine's own waiting and running every quarter second, until cancelled."""
    while True:
        truth.append((time.monotonic(), *await engine_truth(session, base)))
        await asyncio.sleep(0.25)


def _engine_parts(truth: list[tuple[float, float, float]], now: float) -> tuple[float, float]:
    """The engine's (running, waiting), each over its figure's window ending `now`: its
    saturation over the estimate's windows is their sum ÷ slots (busy slots, every slot while
    requests wait, and waiting requests)."""
    running = mean([r for at, _, r in truth if at >= now - RUNNING_WINDOW_SECONDS])
    waiting = mean([w for at, w, _ in truth if at >= now - WAITING_WINDOW_SECONDS])
    return running, waiting


def _estimated_parts(samples: dict[Any, float]) -> tuple[float, float]:
    """The estimate's (running, waiting); NaN where one is not exported."""
    found = (
        sample(samples, "llmprober_queue_depth", source="estimate", state=state)
        for state in ("running", "waiting")
    )
    running, waiting = (math.nan if v is None else v for v in found)
    return running, waiting


def _parts_line(
    factor: float, ours: list[tuple[float, float]], theirs: list[tuple[float, float]]
) -> str:
    """A step's mean running and waiting, the estimate's beside the engine's: where a miss
    came from."""
    (run, wait), (engine_run, engine_wait) = _means(ours), _means(theirs)
    return (
        f"x{factor:<4} running {run:5.2f} ({engine_run:5.2f})  "
        f"waiting {wait:5.2f} ({engine_wait:5.2f})"
    )


def _means(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """The mean of each member of `pairs`."""
    return mean([a for a, _ in pairs]), mean([b for _, b in pairs])


async def test_skipped_probe_runs_are_counted() -> None:
    with sim_process("--slots", "1", "--decode-step", "0.05") as base:
        target = {
            "name": "slow",
            "url": f"{base}/v1",
            "model": "m",
            "interval_seconds": 0.2,
            "jitter_seconds": 0,
            "max_tokens": 20,
            "warmup": 0,
            "pair_share": 0,
        }  # each probe takes about 1 s: four of every five runs find one in flight
        async with daemon({"targets": [target]}) as (url, _):
            await asyncio.sleep(4)
            samples = await scrape(url)
    skipped = value(samples, "llmprober_probe_skipped_total", target="slow")
    probes = value(samples, "llmprober_requests_total", target="slow", mode="probe")
    assert skipped >= 2 * probes > 0, (skipped, probes)
