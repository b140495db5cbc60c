"""Saturation rises before users feel the knee; skipped probe runs are counted.

Saturation (busy slots ÷ slots below the knee, 1 + waiting ÷ slots above it) is exported per
target from the probes-alone estimate. On a ramp of someone else's Poisson traffic through
the simulator's capacity, it must have risen past half the slots, and clearly above where the
ramp began, at the last step before the probes' TTFT p95 breaks the SLO: the signal to scale
on before users feel it.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from tests.support.daemon import daemon, scrape, value
from tests.support.foreign_accuracy import Level, foreign_load, measure_capacity, sim_process

SLOTS = 4
ENGINE = ("--slots", str(SLOTS), "--decode-step", "0.02", "--decode-slowdown", "0.3")
TTFT_SLO = 0.5
RAMP = (0.3, 0.5, 0.65, 0.8, 0.9, 1.0, 1.3)  # × capacity: finer near the knee
# With 4 slots a queue builds well before every slot is busy all the time (Erlang C: the
# fewer the slots, the earlier the knee). Before the probes' TTFT p95 breaks the SLO,
# saturation must already have risen past half the slots and by a clear step above where the
# ramp began (runs here: 0.37 → 0.64, 0.32 → 0.50, 0.27 → 0.52 at the step before the break),
# so a threshold below the knee fires before users feel it.
RISEN = 0.45
RISE = 0.15


def _probe_ttft_buckets(samples: dict[Any, float]) -> dict[float, float]:
    out: dict[float, float] = {}
    for (name, labels), v in samples.items():
        fields = dict(labels)
        if name == "llmprober_ttft_seconds_bucket" and fields.get("mode") == "probe":
            out[float(fields["le"])] = v
    return out


def p95(before: dict[float, float], after: dict[float, float]) -> float:
    """The upper bound of the bucket holding the 95th percentile of what arrived between."""
    delta = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = delta[-1][1]
    return next(le for le, n in delta if n >= 0.95 * total) if total else math.nan


async def test_saturation_rises_before_ttft_p95_breaks_the_slo() -> None:
    with sim_process(*ENGINE) as base:
        capacity = await measure_capacity(base, 2 * SLOTS, 10)
        target = {
            "name": "engine", "url": f"{base}/v1", "model": "m", "interval_seconds": 0.5,
            "jitter_seconds": 0.1, "prompt_tokens": 40, "max_tokens": 16, "slots": SLOTS,
            "slo": {"ttft_seconds": TTFT_SLO}, "pair_share": 0.5,
        }  # fmt: skip
        steps: list[tuple[float, float, float]] = []
        async with daemon({"targets": [target]}) as (url, _):
            await asyncio.sleep(8)  # the first pairs: the decode slowdown is learned
            for factor in RAMP:
                level = Level(f"x{factor}", "poisson", rate=factor * capacity)
                async with foreign_load(base, level, seconds=12):
                    await asyncio.sleep(4)
                    before = _probe_ttft_buckets(await scrape(url))
                    sats = []
                    end = time.monotonic() + 8
                    while time.monotonic() < end:
                        samples = await scrape(url)
                        sats.append(value(samples, "llmprober_saturation", source="estimate"))
                        await asyncio.sleep(0.5)
                    after = _probe_ttft_buckets(samples)
                steps.append((factor, sum(sats) / len(sats), p95(before, after)))
    report = "\n".join(
        f"x{f:<4} saturation {s:5.2f}  probe TTFT p95 ≤ {t:.3f} s" for f, s, t in steps
    )
    print("\n" + report)
    breaks = next((i for i, (_, _, t) in enumerate(steps) if t > TTFT_SLO), len(steps))
    assert 1 < breaks < len(steps), f"the ramp must break the TTFT SLO midway:\n{report}"
    before = steps[breaks - 1][1]  # saturation at the last step the SLO held
    assert before >= RISEN, report
    assert before >= steps[0][1] + RISE, report
    assert steps[-1][1] > 1.0, report  # past the knee: waiting requests push it above 1


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
