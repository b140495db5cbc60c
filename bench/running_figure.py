"""The probes-alone running figure below saturation: where its error comes from.

The simulator (4 slots, a 20 ms step that grows by 0.3 of itself a sequence, so β is 6 ms)
serves Poisson traffic at half its capacity from another process; the daemon probes it with
the slots hinted, as `tests/integration/test_queue_probes_alone_sim.py` does. At every scrape
the bench keeps what the estimator read (each recent probe's stretches, whether it found every
slot busy, the pairs' jumps, the waiting figure) beside the engine's own running count
averaged over the trailing 5 s (from the daemon's word on whether the slowdown can be read,
as the test scores), and figures the running count again from the same data:

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
import functools
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prober.capacity import probes  # noqa: E402
from prober.capacity.probes import ProbeSample  # noqa: E402
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
FORMULAS = ("q·slots + (1 − q)·b", "blend by min(waiting, 1)")
BETAS = ("pairs' median", "true")


@dataclass(frozen=True)
class Read:
    """One scrape's estimate: what `_running` read (None where a queue lasted the whole
    window: every slot, whatever the formula) and the waiting figure."""

    at: float  # monotonic s
    waiting: float | None
    running: float | None  # exported
    recent: list[ProbeSample] | None
    own: float
    alpha: float
    median: float | None  # the pairs' median jump


@contextlib.contextmanager
def recording(reads: list[Read]) -> Iterator[None]:
    """Keep what the estimator read at each scrape."""
    cls = probes.ProbesAloneEstimator
    running, estimate = cls._running, cls.estimate
    seen: list[tuple[list[ProbeSample], float, float, float | None]] = []

    def kept_running(self: Any, recent: Any, slots: int, own_holding: float) -> Any:
        jumps = list(self.decode._jumps)
        median = statistics.median(jumps) if jumps else None
        seen.append((list(recent), own_holding, self.decode.alpha or 0.0, median))
        return running(self, recent, slots, own_holding)

    def kept_estimate(self: Any, prefill_guess: float) -> Any:
        seen.clear()
        figure = estimate(self, prefill_guess)
        recent, own, alpha, median = seen[-1] if seen else (None, 0.0, 0.0, None)
        reads.append(Read(time.monotonic(), figure.waiting, figure.running, recent, own, alpha,
                          median))  # fmt: skip
        return figure

    cls._running = kept_running  # type: ignore[method-assign]
    cls.estimate = kept_estimate  # type: ignore[method-assign]
    try:
        yield
    finally:
        cls._running = running  # type: ignore[method-assign]
        cls.estimate = estimate  # type: ignore[method-assign]


def estimator_with(read: Read, beta: float) -> Any:
    """A stand-in for the estimator whose decode model reads `(gap − α) / β` others, so the
    shipped `_running` and `_beside` figure the read again with `beta`."""
    stub = SimpleNamespace(
        decode=SimpleNamespace(others=lambda gap, _slots: max(0.0, (gap - read.alpha) / beta))
    )
    stub._beside = functools.partial(probes.ProbesAloneEstimator._beside, stub)  # type: ignore[arg-type]
    return stub


def shipped(read: Read, beta: float) -> float | None:
    """`q·slots + (1 − q)·b`: the estimator's own `_running`."""
    assert read.recent is not None
    return probes.ProbesAloneEstimator._running(estimator_with(read, beta), read.recent, SLOTS,
                                                read.own)  # fmt: skip


def old_blend(read: Read, beta: float) -> float | None:
    """The formula it replaced: every stretch's batch, moved toward every slot by
    `min(waiting, 1)`."""
    assert read.recent is not None
    stub = estimator_with(read, beta)
    every = [v for s in read.recent for v in stub._beside(s, SLOTS) or ()]
    if not every:
        return None
    batch = min(statistics.fmean(every) + read.own, SLOTS)
    share = min(read.waiting or 0.0, 1.0)
    return SLOTS if share >= 1 else batch + (SLOTS - batch) * share


async def one_run(seconds: float) -> dict[str, tuple[float, float]]:
    reads: list[Read] = []
    truths: list[tuple[float, float]] = []  # (monotonic s, the engine's running, trailing 5 s)
    sample = fa._sample

    def kept_sample(score: Any, truth: Any, samples: Any) -> None:
        sample(score, truth, samples)
        truths.append((time.monotonic(), score.pairs[-1][2]))

    fa._sample = kept_sample
    try:
        with recording(reads), fa.sim_process(*ENGINE) as base:
            capacity = await fa.measure_capacity(base, 2 * SLOTS, 12)
            level = fa.Level("poisson0.5", "poisson", rate=0.5 * capacity)
            # Scored from the daemon's word on the slowdown, as the test is: before it the
            # figure comes and goes with the pairs' running judgement.
            await fa.run_levels(base, [level], PROBE, settle=10, seconds=seconds, learn=20,
                                learn_grace=90, until_word=True)  # fmt: skip
    finally:
        fa._sample = sample
    when = [r.at for r in reads]
    variants: dict[str, list[tuple[float, float]]] = {}
    for t, true in truths:
        i = bisect.bisect_right(when, t) - 1
        if i < 0:
            continue
        read = reads[i]
        if read.recent is None:  # a queue throughout: every slot, both formulas
            if read.running is not None:
                for formula in FORMULAS:
                    for beta_name in BETAS:
                        variants.setdefault(f"{formula}, β {beta_name}", []).append(
                            (true, read.running)
                        )
            continue
        if read.median is None or read.median <= 0:
            continue
        for beta_name, beta in zip(BETAS, (read.median, TRUE_BETA), strict=True):
            figures = (shipped(read, beta), old_blend(read, beta))
            for formula, figure in zip(FORMULAS, figures, strict=True):
                if figure is not None:
                    variants.setdefault(f"{formula}, β {beta_name}", []).append((true, figure))
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
