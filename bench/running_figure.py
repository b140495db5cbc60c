"""The probes-alone running figure below saturation: where its error comes from.

The simulator (4 slots, a 20 ms step that grows by 0.3 of itself a sequence, so β is 6 ms)
serves Poisson traffic at half its capacity from another process; the daemon probes it with
the slots hinted, as `tests/integration/test_queue_probes_alone_sim.py` does. At every scrape
the bench keeps what the estimator read (each recent probe's stretches, whether it found every
slot busy, the pairs' jumps, the waiting figure) beside the engine's own running count
averaged over the trailing 5 s, and figures the running count again from the same data:

- the formula `q·slots + (1 − q)·b` (q the share of the probes of the last 10 s that found
  every slot busy, b the batch the others decoded beside: `ProbesAloneEstimator._running`)
  and the blend it replaced, the batch of every stretch moved toward every slot by
  `min(waiting, 1)`;
- each with β as the daemon reads it (the pairs' median jump) and with the simulator's true β.

    .venv/bin/python bench/running_figure.py [--repeat 3] [--seconds 90]

Prints, per run and variant, the bias and mean absolute error against the engine's count
(the test's bound is an MAE of 1). About 2.5 minutes a run. Figures: `docs/flakiness.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prober.capacity import probes  # noqa: E402
from tests.support import probes_alone_accuracy as fa  # noqa: E402

SLOTS = 4
STEP, SLOWDOWN = 0.02, 0.3
TRUE_BETA = STEP * SLOWDOWN
ENGINE = ("--slots", str(SLOTS), "--decode-step", str(STEP), "--decode-slowdown", str(SLOWDOWN))
PROBE = {
    "interval_seconds": 1.0, "jitter_seconds": 0.2, "warmup": 1, "slots": SLOTS,
    "prompt_tokens": 48, "max_tokens": 32, "traffic": {"prompt_tokens": 40, "output_tokens": 16},
    "timeouts": {"first_token_seconds": 120, "total_seconds": 300},
}  # fmt: skip

# (monotonic s, own holding, α, the pairs' median jump, [(found every slot busy, stretches)])
Read = tuple[float, float, float, float | None, list[tuple[bool, list[tuple[float, int]]]]]


@contextlib.contextmanager
def recording(reads: list[Read], figures: list[tuple[float, float | None]]) -> Iterator[None]:
    """Keep what the estimator read at each scrape (`reads`) and its waiting figure."""
    running, estimate = probes.ProbesAloneEstimator._running, probes.ProbesAloneEstimator.estimate

    def kept_running(self: Any, recent: Any, slots: Any, own_holding: float) -> Any:
        decode = self.decode
        jumps = list(decode._jumps)
        median = statistics.median(jumps) if jumps else None
        seen = [(s.queued, list(s.stretches or ([(s.gap, 0)] if s.gap else []))) for s in recent]
        reads.append((time.monotonic(), own_holding, decode.alpha or 0.0, median, seen))
        return running(self, recent, slots, own_holding)

    def kept_estimate(self: Any, prefill_guess: float) -> Any:
        figure = estimate(self, prefill_guess)
        figures.append((time.monotonic(), figure.waiting))
        return figure

    probes.ProbesAloneEstimator._running = kept_running  # type: ignore[method-assign]
    probes.ProbesAloneEstimator.estimate = kept_estimate  # type: ignore[method-assign]
    try:
        yield
    finally:
        probes.ProbesAloneEstimator._running = running  # type: ignore[method-assign]
        probes.ProbesAloneEstimator.estimate = estimate  # type: ignore[method-assign]


def beside(read: Read, beta: float, keep: Callable[[bool], bool]) -> list[float]:
    """Foreign sequences beside each kept stretch, as `ProbesAloneEstimator._beside` reads."""
    _, _, alpha, _, seen = read
    return [
        min(max(0.0, (gap - alpha) / beta - ours), SLOTS - 1.0)
        for queued, stretches in seen
        if keep(queued)
        for gap, ours in stretches
    ]


def met_formula(read: Read, beta: float) -> float | None:
    seen = [queued for queued, stretches in read[4] if stretches]
    free = beside(read, beta, lambda queued: not queued)
    if not seen:
        return None
    q = sum(seen) / len(seen)
    batch = min(statistics.fmean(free) + read[1], SLOTS) if free else SLOTS
    return q * SLOTS + (1 - q) * batch


def old_blend(read: Read, beta: float, waiting: float | None) -> float | None:
    every = beside(read, beta, lambda queued: True)
    if not every:
        return None
    batch = min(statistics.fmean(every) + read[1], SLOTS)
    share = min(waiting or 0.0, 1.0)
    return SLOTS if share >= 1 else batch + (SLOTS - batch) * share


async def one_run(seconds: float) -> dict[str, tuple[float, float]]:
    reads: list[Read] = []
    figures: list[tuple[float, float | None]] = []
    truths: list[tuple[float, float]] = []  # (monotonic s, the engine's running, trailing 5 s)
    sample = fa._sample

    def kept_sample(score: Any, truth: Any, samples: Any) -> None:
        sample(score, truth, samples)
        truths.append((time.monotonic(), score.pairs[-1][2]))

    fa._sample = kept_sample
    try:
        with recording(reads, figures), fa.sim_process(*ENGINE) as base:
            capacity = await fa.measure_capacity(base, 2 * SLOTS, 12)
            level = fa.Level("poisson0.5", "poisson", rate=0.5 * capacity)
            await fa.run_levels(base, [level], PROBE, settle=10, seconds=seconds, learn=20,
                                learn_grace=30)  # fmt: skip
    finally:
        fa._sample = sample
    when, waits = [r[0] for r in reads], [f[0] for f in figures]
    variants: dict[str, list[tuple[float, float]]] = {}
    for t, true in truths:
        i, j = bisect.bisect_right(when, t) - 1, bisect.bisect_right(waits, t) - 1
        median = reads[i][3] if i >= 0 else None
        if j < 0 or median is None or median <= 0:
            continue
        read, waiting = reads[i], figures[j][1]
        for beta_name, beta in (("pairs' median", median), ("true", TRUE_BETA)):
            for name, figure in (
                ("q·slots + (1 − q)·b", met_formula(read, beta)),
                ("blend by min(waiting, 1)", old_blend(read, beta, waiting)),
            ):
                if figure is not None:
                    variants.setdefault(f"{name}, β {beta_name}", []).append((true, figure))
    return {name: bias_and_mae(pairs) for name, pairs in variants.items()}


def bias_and_mae(pairs: list[tuple[float, float]]) -> tuple[float, float]:
    """Mean error and mean absolute error of (truth, figure) pairs."""
    errors = [figure - truth for truth, figure in pairs]
    return statistics.fmean(errors), statistics.fmean(abs(e) for e in errors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=90.0, help="scored per run")
    ns = parser.parse_args()
    for run in range(1, ns.repeat + 1):
        figures = asyncio.run(one_run(ns.seconds))
        print(f"run {run}/{ns.repeat}: running figure at half the capacity, bias / MAE")
        for name, (bias, mae) in figures.items():
            print(f"  {name:<40} {bias:+.2f} / {mae:.2f}", flush=True)


if __name__ == "__main__":
    main()
