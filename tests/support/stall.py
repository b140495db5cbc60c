"""Freezing, resuming and killing a real engine behind the daemon's back, and watching what the
daemon says of it (`/-/engine`, `llmprober_engine_state`): the engine-state tests' tools; and
what the cache probe measured (`cache_probe_figures`), which the same tests read.

The daemon is never told what the test did: it judges from its own requests and the engine's
`/metrics` alone.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from tests.support.daemon import value
from tests.support.machine import process_stats


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def server_pid(base: str) -> int:
    """The process listening for `base`: the one whose command line names its `--port`."""
    port = str(urlsplit(base).port)
    for pid, _, _ in process_stats():
        args = _cmdline(pid)
        if any(a == "--port" and b == port for a, b in itertools.pairwise(args)):
            return pid
    raise LookupError(f"no process serves {base}")


def vllm_engine_core_pid(base: str) -> int:
    """vLLM's engine-core process (its title `VLLM::EngineCore`) of the API server on `base`:
    in the API server's process group."""
    group = str(server_pid(base))
    for pid, comm, fields in process_stats():
        if fields[2:3] == [group] and "EngineCore" in comm + " ".join(_cmdline(pid)):
            return pid
    raise LookupError(f"no EngineCore process in the group of {base}'s API server")


@dataclass
class Watched:
    """What `/-/engine` answered, polled: (seconds since start, status, first word)."""

    started: float = field(default_factory=time.monotonic)
    seen: list[tuple[float, int, str]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # each answer's line, as it came

    def states(self) -> set[str]:
        return {state for _, _, state in self.seen}


async def engine_state(
    session: aiohttp.ClientSession, url: str, target: str
) -> tuple[int, str, str]:
    """`/-/engine?target=`'s status, the state its reason starts with, and the reason."""
    timeout = aiohttp.ClientTimeout(total=10)
    async with session.get(f"{url}/-/engine", params={"target": target}, timeout=timeout) as r:
        text = await r.text()
    return r.status, text.split(":", 1)[0].strip(), text.strip()


async def until_state(
    url: str, target: str, wanted: str, timeout: float, watched: Watched | None = None
) -> float:
    """Seconds until `/-/engine` says `wanted` (polled every 0.1 s); AssertionError past
    `timeout`."""
    start = time.monotonic()
    async with aiohttp.ClientSession() as session:
        while True:
            status, state, reason = await engine_state(session, url, target)
            if watched is not None:
                watched.seen.append((time.monotonic() - watched.started, status, state))
                watched.reasons.append(reason)
            if state == wanted:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(f"not {wanted} within {timeout} s: last {status} {state}")
            await asyncio.sleep(0.1)


async def watch_states(url: str, target: str, seconds: float, every: float = 0.25) -> Watched:
    """Poll `/-/engine` for `seconds`."""
    watched = Watched()
    async with aiohttp.ClientSession() as session:
        while time.monotonic() - watched.started < seconds:
            status, state, reason = await engine_state(session, url, target)
            watched.seen.append((time.monotonic() - watched.started, status, state))
            watched.reasons.append(reason)
            await asyncio.sleep(every)
    return watched


def cache_probe_figures(
    samples: dict[Any, float],
) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """From a scrape of the daemon: the cache probe's mean TTFT by result (miss, hit), and its
    requests by (result, confirmed)."""
    ttft = "llmprober_cache_probe_ttft_seconds"
    mean = {
        r: value(samples, f"{ttft}_sum", result=r) / value(samples, f"{ttft}_count", result=r)
        for r in ("miss", "hit")
    }
    confirmed = {
        (r, c): value(samples, "llmprober_cache_probe_total", result=r, confirmed=c)
        for r in ("miss", "hit")
        for c in ("true", "false", "unknown")
    }
    return mean, confirmed
