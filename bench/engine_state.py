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
import sys
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the engines live with the tests

from prober.logs import setup_logging
from tests.support.daemon import daemon
from tests.support.engine import llama_server
from tests.support.engine_floods import FLOOD_ANSWER, flood_row, floods
from tests.support.probes_alone_accuracy import drain, measure_capacity


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


async def main(args: argparse.Namespace) -> None:
    setup_logging("json", "warning", sys.stderr)  # the daemon's warnings only, apart from the rows
    with engine(args.engine, args.slots) as (base, model, slots):
        capacity = await measure_capacity(base, 2 * slots, 20, *FLOOD_ANSWER)
        target = {
            "name": "engine", "url": f"{base}/v1", "model": model, "interval_seconds": 1.0,
            "prompt_tokens": 32, "max_tokens": 8, "metrics_url": f"{base}/metrics",
            "metrics_interval_seconds": 1.0, "slots": slots,
        }  # fmt: skip
        print(
            f"{args.engine}, {slots} slots, capacity {capacity:.2f} req/s; levels of "
            f"{args.seconds:g} s; the default stall window",
            flush=True,
        )
        async with daemon({"targets": [target]}) as (url, _):
            await asyncio.sleep(5)  # the warm-up and a first probe
            for flood in floods(slots, capacity):
                started = time.monotonic()
                row = await flood_row(url, base, "engine", flood, args.seconds)
                print(f"{row.line()}; took {time.monotonic() - started:.0f} s", flush=True)
                await drain(base, timeout=600)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine", choices=("llama", "vllm"), default="llama")
    parser.add_argument("--seconds", type=float, default=600.0, help="each level (default 600)")
    parser.add_argument("--slots", type=int, default=2, help="llama-server's -np (default 2)")
    asyncio.run(main(parser.parse_args()))
