"""Simulator capacity: the streams and tokens per second the built-in simulator sustains.

    .venv/bin/python bench/perf_sim.py [--levels 200,400,800,1600] [--seconds 10] [--repeats 3]

The simulator (`llm-prober sim`, one process, so at most one core) runs with a 10 ms decode
step, no batch slowdown, no prefill cost and more slots than streams: N streams in flight
should get N × 100 tokens/s. A client process (the raw client of `perf_client.py`, on uvloop
when installed, on a core of its own) keeps N streams of `--tokens` tokens in flight,
starting a new one as each ends, for `--seconds`. Printed per level: tokens/s and streams/s
delivered, their share of the ideal, the median and p99 gap between a stream's tokens (10 ms
while the engine keeps up), and the simulator's CPU share of one core. A level is sustained
while the engine keeps its step (median gap within 10 % of it) with the simulator under 95 %
of its core; tokens per simulator CPU-second is the rate one full core would deliver.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sys
import time
from collections.abc import Sequence

from perf_client import raw_stream, request_bytes
from perf_common import (
    STEP_SECONDS,
    Sim,
    add_run_args,
    add_worker_args,
    emit,
    exit_on_sigterm,
    fast_sim_args,
    fmt,
    median,
    pct,
    pinning,
    set_loop,
    wait_quiet,
)


def sim_args(level: int) -> tuple[str, ...]:
    # No prefill cost: each admission would lengthen every step (1 ms at --prefill-base 0.001,
    # 6 admissions a step at 400 streams), and the engine model, not the process, would be
    # what runs out.
    return fast_sim_args(slots=max(level * 2, 512), prefill_base=0)


async def _lane(port: int, request: bytes, deadline: int, out: list[list[int]]) -> None:
    """Streams one after another on one keep-alive connection until `deadline`."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while time.perf_counter_ns() < deadline:
            stream = await raw_stream(reader, writer, request)
            out.append(stream["tokens"])  # type: ignore[arg-type]
    finally:
        writer.close()


async def _keep_in_flight(port: int, level: int, seconds: float, tokens: int) -> list[list[int]]:
    request = request_bytes(port, tokens, keep_alive=True)
    deadline = time.perf_counter_ns() + int(seconds * 1e9)
    out: list[list[int]] = []
    await asyncio.gather(*(_lane(port, request, deadline, out) for _ in range(level)))
    return out


def worker(ns: argparse.Namespace) -> None:
    # The client on uvloop where installed: the cheapest client there is, so the simulator
    # runs out of core first.
    with contextlib.suppress(ImportError):
        set_loop("uvloop")
    # Warm-up: one wave, then the measured window.
    asyncio.run(_keep_in_flight(ns.port, ns.level, 1.0, ns.tokens))
    t0 = time.perf_counter_ns()
    stamps = asyncio.run(_keep_in_flight(ns.port, ns.level, ns.seconds, ns.tokens))
    t1 = time.perf_counter_ns()
    # Tokens and stream ends inside [t0, t0 + seconds]: a steady-state window.
    end = t0 + int(ns.seconds * 1e9)
    tokens = sum(1 for s in stamps for t in s if t0 <= t <= end)
    finished = sum(1 for s in stamps if s and t0 <= s[-1] <= end)
    gaps = [(b - a) / 1e6 for s in stamps[:2000] for a, b in itertools.pairwise(s)]
    emit({
        "tokens": tokens, "streams": finished, "window": ns.seconds,
        "gap_p50_ms": pct(gaps, 50), "gap_p99_ms": pct(gaps, 99), "wall": (t1 - t0) / 1e9,
    }, ns.out)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="200,400,800,1600")
    parser.add_argument("--seconds", type=float, default=10.0)
    add_run_args(parser)
    parser.add_argument("--sim-loop", default="asyncio", choices=["asyncio", "uvloop"])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--level", type=int, help=argparse.SUPPRESS)
    add_worker_args(parser, client=False)
    ns = parser.parse_args(argv)
    if ns.worker:
        worker(ns)
        return
    exit_on_sigterm()
    sim_cpus, client_cpus = pinning()
    levels = [int(x) for x in ns.levels.split(",")]
    runs: dict[int, list[dict[str, float]]] = {}
    for level in levels:
        for repeat in range(ns.repeats):
            wait_quiet(ns.quiet)
            with Sim(sim_args(level), ns.sim_loop, sim_cpus) as sim:
                args = [
                    __file__, "--worker", "--port", str(sim.port), "--level", str(level),
                    "--seconds", str(ns.seconds), "--tokens", str(ns.tokens),
                ]  # fmt: skip
                run = sim.run_worker(args, cpus=client_cpus)
            ideal = level / STEP_SECONDS
            sim_share = float(run["sim_cpu_share"])  # type: ignore[arg-type]
            tokens_s = float(run["tokens"]) / float(run["window"])  # type: ignore[arg-type]
            figures = {
                "tokens_s": tokens_s,
                "streams_s": float(run["streams"]) / float(run["window"]),  # type: ignore[arg-type]
                "share_of_ideal": tokens_s / ideal,
                "gap_p50": float(run["gap_p50_ms"]),  # type: ignore[arg-type]
                "gap_p99": float(run["gap_p99_ms"]),  # type: ignore[arg-type]
                "sim_cpu": sim_share,
                "tokens_per_cpu_s": tokens_s / sim_share if sim_share else float("nan"),
                "other_load": float(run["other_load"]),  # type: ignore[arg-type]
            }
            runs.setdefault(level, []).append(figures)
            print(
                f"  {level:>5} streams run {repeat + 1}: {tokens_s:,.0f} tok/s "
                f"({figures['share_of_ideal']:.2f} of ideal), sim cpu {sim_share:.2f}, "
                f"other load {figures['other_load']:.2f}",
                file=sys.stderr,
            )
    report(levels, runs, ns.tokens)


def report(levels: list[int], runs: dict[int, list[dict[str, float]]], tokens: int) -> None:
    def med(level: int, key: str) -> float:
        return median(r[key] for r in runs[level])

    print(f"\nmedians of {len(runs[levels[0]])} runs; {tokens} tokens per stream, 10 ms step")
    print(
        f"{'streams':>7} {'tokens/s':>9} {'of ideal':>9} {'streams/s':>10} {'gap p50':>8} "
        f"{'gap p99':>8} {'sim cpu':>8} {'tok/cpu-s':>10} {'other':>6}"
    )
    for level in levels:
        print(
            f"{level:>7} {med(level, 'tokens_s'):>9,.0f} {fmt(med(level, 'share_of_ideal')):>9} "
            f"{med(level, 'streams_s'):>10,.1f} {fmt(med(level, 'gap_p50')):>8} "
            f"{fmt(med(level, 'gap_p99')):>8} {fmt(med(level, 'sim_cpu')):>8} "
            f"{med(level, 'tokens_per_cpu_s'):>10,.0f} {fmt(med(level, 'other_load')):>6}"
        )
    sustained = [
        lv
        for lv in levels
        if med(lv, "gap_p50") <= 1.1 * STEP_SECONDS * 1e3 and med(lv, "sim_cpu") < 0.95
    ]
    best = max(sustained) if sustained else None
    if best is not None:
        print(
            f"sustained (step kept, simulator under 95 % of a core): {best} streams, "
            f"{med(best, 'tokens_s'):,.0f} tokens/s, {med(best, 'streams_s'):,.1f} streams/s"
        )
    top = max(levels, key=lambda lv: med(lv, "tokens_s"))
    print(
        f"most delivered: {med(top, 'tokens_s'):,.0f} tokens/s at {top} streams "
        f"(simulator at {med(top, 'sim_cpu'):.2f} of a core)"
    )


if __name__ == "__main__":
    main()
