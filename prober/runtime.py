"""The daemon's event loop, garbage collector and GIL hand-over, chosen for stamp accuracy.

Every latency is a `perf_counter_ns()` taken when a task runs, so anything that delays a
task delays a stamp. Three choices; their figures, dated, are in docs/performance.md:

- **uvloop when installed** (the `fast` extra): less CPU per token and a lower dispatch lag
  on the same code (its timers wake closer to the deadline than asyncio's
  millisecond-rounded epoll wait). `event_loop: asyncio` opts out.
- **GC tuned after start-up.** A streamed token allocates a few dicts, so the default
  thresholds collect every few dozen tokens, and a full collection over the large start-up
  heap (aiohttp, pydantic, prometheus-client) stalls the loop for milliseconds.
  `gc.freeze()` moves that heap out of the collector's view and a gen-0 threshold of 10,000
  makes young collections rarer; nothing is leaked (cycles are still collected, later).
- **The GIL handed back sooner.** `/metrics` is formatted in a worker thread; while it runs,
  the loop waits up to the interpreter's switch interval each time it takes the GIL back,
  after every socket call. At CPython's 5 ms a daemon of 500 targets started probes up to 29
  ms late (p99) while a render ran; at 1 ms, 7 ms, the render as fast (§10 of the figures).
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

from prober.kinds import EventLoopChoice as EventLoopChoice  # re-exported

GC_THRESHOLDS = (10_000, 10, 10)
SWITCH_INTERVAL_SECONDS = 0.001
T = TypeVar("T")


class LoopUnavailable(RuntimeError):
    """`event_loop: uvloop` was asked for and uvloop cannot be imported."""


def new_event_loop(choice: EventLoopChoice = "auto") -> tuple[asyncio.AbstractEventLoop, str]:
    """A fresh event loop and its name: uvloop if installed (or demanded), else asyncio's."""
    if choice != "asyncio":
        try:
            uvloop = importlib.import_module("uvloop")
        except ImportError as exc:
            if choice == "uvloop":
                raise LoopUnavailable(
                    "uvloop is not installed (pip install 'llm-prober[fast]')"
                ) from exc
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop, f"uvloop {getattr(uvloop, '__version__', '')}".strip()
    return asyncio.new_event_loop(), "asyncio"


def tune_gc() -> tuple[int, int, int]:
    """Freeze what start-up allocated and make young collections rarer; old thresholds."""
    previous = gc.get_threshold()
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    return previous


def favour_the_loop() -> float:
    """The switch interval the module docstring gives; returns the previous one."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_INTERVAL_SECONDS)
    return previous


def start_now(coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """A task that runs at once, up to its first wait, where the interpreter can (Python 3.12+:
    an eager task); else one that starts at the loop's next pass.

    For a request due now: started the usual way it waits behind everything else the loop
    has queued, and behind one poll of every socket, before its first line runs (at 200
    streams, a batched step's burst of reads).
    """
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=asyncio.get_running_loop(), eager_start=True)
    return asyncio.create_task(coro)
