"""Can a probe's token gaps tell the batch it decodes in? The decode slowdown of an engine.

Below saturation the probes-alone estimate reads the running count from how much a probe's
gap grew over α, the gap of a probe decoding alone, at β a sequence: `(gap − α) / β` others.
It makes that figure only where one more sequence lengthens the step by at least a fifth of α
(`_MIN_SLOWDOWN` in prober/capacity/decode.py). This bench measures why. An engine serves
Poisson traffic from another process (`tests/support/foreign_load.py`) at a quarter, half and
three quarters of its capacity, then a closed loop of twice its slots. The daemon probes it,
and the bench keeps every probe it learned from. Each stretch of a probe's decode (before its
companion joined, and beside it) is set against the engine's own running count over that
stretch:

    .venv/bin/python bench/decode_slowdown.py --engine sim     # the tests' simulator
    .venv/bin/python bench/decode_slowdown.py --engine llama   # llama-server -np 4
    .venv/bin/python bench/decode_slowdown.py --engine vllm    # vLLM --max-num-seqs 4

It prints the foreign-accuracy table first: each level's true running count, the daemon's
figure and the share of samples that had one. Then, per batch size, the median and spread of
the stretches' gaps; the least-squares α and β with β/α; the spread between probes at one
batch size, relative to the gap; and β/α as the daemon reads it (the pairs' median jump over
the least gap). Figures: `bench/README.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from prober.capacity import own  # noqa: E402
from prober.capacity.decode import median_gap  # noqa: E402
from prober.result import RequestResult  # noqa: E402
from tests.support import probes_alone_accuracy as fa  # noqa: E402

SLOTS = 4
SIM_FLAGS = ("--slots", str(SLOTS), "--decode-step", "0.02")  # + --decode-slowdown


@dataclass(frozen=True)
class Stretch:
    """A run of a probe's token stamps (ns) at one count of its own sequences."""

    stamps: tuple[int, ...]

    def gap(self) -> float | None:
        return median_gap(self.stamps, 1.0)


@dataclass
class Record:
    stretches: list[Stretch]
    jumps: list[float]  # a probe's gap right after its companion joined less right before
    truth: list[tuple[int, float]]  # (ns, the engine's running count)


@contextlib.contextmanager
def recording(record: Record) -> Iterator[None]:
    """Keep every probe the daemon's estimator learns from (its token stamps)."""
    observe, observe_pair = own.QueueEstimator.observe, own.QueueEstimator.observe_pair

    def lone(self: Any, result: RequestResult, *, probe: bool = False) -> float | None:
        if probe:
            record.stretches.append(Stretch(result.token_event_ns))
        return observe(self, result, probe=probe)

    def pair(self: Any, primary: RequestResult, companion: RequestResult) -> Any:
        # The daemon's own split and the gaps its jumps are read from (`observe_pair`).
        before, after = own._split_at_companion(primary, companion)
        record.stretches += [Stretch(tuple(before)), Stretch(tuple(after))]
        near = (
            median_gap(before[-own._PAIR_GAPS - 1 :], 1.0),
            median_gap(after[: own._PAIR_GAPS + 1], 1.0),
        )
        if near[0] is not None and near[1] is not None:
            record.jumps.append(near[1] - near[0])
        return observe_pair(self, primary, companion)

    own.QueueEstimator.observe, own.QueueEstimator.observe_pair = lone, pair  # type: ignore[method-assign]
    try:
        yield
    finally:
        own.QueueEstimator.observe, own.QueueEstimator.observe_pair = observe, observe_pair  # type: ignore[method-assign]


async def read_truth(base: str, record: Record, stop: asyncio.Event) -> None:
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            _, running = await fa.engine_truth(session, base)
            record.truth.append((time.perf_counter_ns(), running))
            await asyncio.sleep(0.2)


def batch_over(record: Record, first: int, last: int) -> float | None:
    """The engine's mean running count from `first` to `last` (ns), the reads either side too."""
    at = [t for t, _ in record.truth]
    i, j = bisect.bisect_left(at, first), bisect.bisect_right(at, last)
    reads = [r for _, r in record.truth[max(0, i - 1) : j + 1]]
    return statistics.fmean(reads) if reads else None


def analyse(record: Record) -> str:
    points = []
    for stretch in record.stretches:
        gap = stretch.gap()
        batch = gap and batch_over(record, stretch.stamps[0], stretch.stamps[-1])
        if gap is not None and batch:
            points.append((batch, gap))
    lines = [f"{'batch':>5} {'stretches':>9} {'gap median':>10} {'spread':>7} {'spread/gap':>10}"]
    spreads = []
    for b in range(1, SLOTS + 1):
        gaps = [g for x, g in points if b - 0.5 <= x < b + 0.5]
        if len(gaps) >= 3:
            mid, spread = statistics.median(gaps), statistics.stdev(gaps)
            spreads.append(spread / mid)
            row = f"{b:5d} {len(gaps):9d} {mid * 1e3:8.1f}ms {spread * 1e3:5.1f}ms"
            lines.append(f"{row} {spread / mid:10.2f}")
    fit = statistics.linear_regression([x - 1 for x, _ in points], [g for _, g in points])
    alpha, beta = fit.intercept, fit.slope
    least = min(g for _, g in points)
    pair_beta = statistics.median(record.jumps) if record.jumps else float("nan")
    lines += [
        f"fit over {len(points)} stretches: alpha {alpha * 1e3:.1f} ms, beta {beta * 1e3:.2f} ms a "
        f"sequence, beta/alpha {beta / alpha:.2f}; spread between probes at one batch "
        f"{statistics.median(spreads) if spreads else float('nan'):.2f} of the gap",
        f"as the daemon reads it: {len(record.jumps)} pairs, median jump {pair_beta * 1e3:.2f} ms, "
        f"least gap {least * 1e3:.1f} ms, ratio {pair_beta / least:.2f} (a figure needs 0.20)",
    ]  # fmt: skip
    return "\n".join(lines)


@contextlib.contextmanager
def engine(kind: str, slowdown: float) -> Iterator[str]:
    if kind == "llama":
        from tests.support.engine import llama_server

        with llama_server(SLOTS) as base:
            yield base
    elif kind == "vllm":
        from tests.support.vllm import vllm_server

        with vllm_server() as base:
            yield base
    else:
        with fa.sim_process(*SIM_FLAGS, "--decode-slowdown", str(slowdown)) as base:
            yield base


async def run(base: str, answer: int, seconds: float) -> str:
    load_args = ("--max-tokens", str(answer))
    capacity = await fa.measure_capacity(base, 2 * SLOTS, 20, *load_args)
    levels = [
        *(fa.Level(f"poisson{k}", "poisson", rate=k * capacity) for k in (0.25, 0.5, 0.75)),
        fa.paced(fa.Level("closed2x", "closed", workers=2 * SLOTS), capacity, SLOTS, 10, 30),
    ]
    record = Record([], [], [])
    stop = asyncio.Event()
    truth = asyncio.create_task(read_truth(base, record, stop))
    with recording(record):
        scores = await fa.run_levels(
            base, levels, fa.probes_like_traffic(SLOTS, answer), settle=10, seconds=seconds,
            learn=20, load_args=load_args,
        )  # fmt: skip
    stop.set()
    await truth
    note = f"capacity {capacity:.2f}/s, slots hint {SLOTS}, answers of {answer} tokens"
    return f"{fa.table(scores, note)}\n\n{analyse(record)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("sim", "llama", "vllm"), default="sim")
    parser.add_argument("--sim-slowdown", type=float, default=0.3, help="the tests' 0.3")
    parser.add_argument("--answer", type=int, default=16, help="tokens in every answer")
    parser.add_argument("--seconds", type=float, default=60.0, help="scored seconds a level")
    args = parser.parse_args()
    with engine(args.engine, args.sim_slowdown) as base:
        print(asyncio.run(run(base, args.answer, args.seconds)))


if __name__ == "__main__":
    main()
