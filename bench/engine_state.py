"""False stalls under floods (issue 36 item 1): what the engine state says of a real engine that
is full, never stopped.

    .venv/bin/python bench/engine_state.py [--engine llama|vllm] [--seconds 600] [--slots 2]

One engine (llama-server with `-np SLOTS` and 2 threads, or the suite's vLLM with 4 sequences),
then three floods from a separate process (`tests/support/foreign_load.py`), each `--seconds`
long: closed loops of 3x and 10x the slots, and open-loop Poisson arrivals at twice the
capacity measured first (a queue that only grows). The daemon, never told of the floods,
probes the engine every second with `metrics_url` set and the default stall window
(first-token timeout + 2 intervals); `/-/engine` is polled every 0.25 s. The engine is never
stopped, so every `stalled` or `down` is false.

Printed per level: the share of polls in each state, the false ones (stalled, down) and the
longest run of them, and the engine's own mean waiting count over the level (its `/metrics`,
read by this script, never given to the daemon). Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the engines live with the tests

from tests.support.daemon import daemon
from tests.support.engine import llama_server
from tests.support.probes_alone_accuracy import (
    Level,
    drain,
    engine_truth,
    foreign_load,
    measure_capacity,
)
from tests.support.stall import Watched, watch_states

FALSE = ("stalled", "down")
ANSWER = ("--max-tokens", "32", "--prompt-words", "24")


@contextlib.contextmanager
def engine(kind: str, slots: int) -> Iterator[tuple[str, str, int]]:
    """(base URL, model name, slots) of a running engine."""
    if kind == "llama":
        with llama_server(slots) as base:
            yield base, "gemma", slots
    else:
        from tests.support.vllm import MODEL_NAME, SLOTS, vllm_server

        with vllm_server() as base:
            yield base, MODEL_NAME, SLOTS


def longest_false_run(watched: Watched) -> float:
    """The longest stretch, in seconds, of consecutive polls that read stalled or down."""
    longest, start = 0.0, None
    for at, _, state in watched.seen:
        if state in FALSE:
            start = at if start is None else start
            longest = max(longest, at - start)
        else:
            start = None
    return longest


async def waiting_mean(base: str, stop: asyncio.Event) -> float:
    """The engine's own waiting count, sampled every second until `stop`; its mean."""
    seen: list[float] = []
    async with aiohttp.ClientSession() as session:
        while not stop.is_set():
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                seen.append((await engine_truth(session, base))[0])
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=1.0)
    return statistics.fmean(seen) if seen else float("nan")


async def level(url: str, base: str, flood: Level, seconds: float) -> dict[str, Any]:
    stop = asyncio.Event()
    truth = asyncio.create_task(waiting_mean(base, stop))
    async with foreign_load(base, flood, *ANSWER, seconds=seconds):
        watched = await watch_states(url, "engine", seconds=seconds)
    stop.set()
    counts = Counter(state for _, _, state in watched.seen)
    polls = len(watched.seen)
    false = [r for (_, _, s), r in zip(watched.seen, watched.reasons, strict=True) if s in FALSE]
    return {
        "level": flood.name,
        "shares": {s: round(n / polls, 3) for s, n in counts.most_common()},
        "false_polls": len(false),
        "longest_false_s": round(longest_false_run(watched), 1),
        "first_false_reason": false[0] if false else None,
        "engine_waiting_mean": round(await truth, 2),
    }


async def main(args: argparse.Namespace) -> None:
    with engine(args.engine, args.slots) as (base, model, slots):
        capacity = await measure_capacity(base, 2 * slots, 20, *ANSWER)
        floods = [
            Level("closed3x", "closed", workers=3 * slots),
            Level("closed10x", "closed", workers=10 * slots),
            Level("open2x", "poisson", rate=2 * capacity),
        ]
        target = {
            "name": "engine", "url": f"{base}/v1", "model": model, "interval_seconds": 1.0,
            "prompt_tokens": 32, "max_tokens": 8, "metrics_url": f"{base}/metrics",
            "metrics_interval_seconds": 1.0,
        }  # fmt: skip
        print(
            f"{args.engine}, {slots} slots, capacity {capacity:.2f} req/s; levels of "
            f"{args.seconds:g} s; the default stall window",
            flush=True,
        )
        async with daemon({"targets": [target]}) as (url, _):
            await asyncio.sleep(5)  # the warm-up and a first probe
            for flood in floods:
                started = time.monotonic()
                row = await level(url, base, flood, args.seconds)
                row["took_s"] = round(time.monotonic() - started)
                print(row, flush=True)
                await drain(base, timeout=300)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("llama", "vllm"), default="llama")
    parser.add_argument("--seconds", type=float, default=600.0, help="each level (default 600)")
    parser.add_argument("--slots", type=int, default=2, help="llama-server's -np (default 2)")
    asyncio.run(main(parser.parse_args()))
