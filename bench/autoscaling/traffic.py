"""The traffic process: the trace's requests, spread over ready replicas like a Service.

Run as `python -m bench.autoscaling.traffic SPEC.json` from the repository. The spec names
the trace (and the file it replays, if any), the capacity that scales it, the request shape,
the endpoints file (written by the controller: one base URL per line, the ready replicas, as
an EndpointSlice lists them) and where to write the records. Arrivals follow an absolute
schedule; each is a task, never awaited before the next (open loop). The replica is chosen
round-robin over the endpoints read at most `endpoints_refresh` seconds ago (kube-proxy's
propagation). One JSON line per request: scheduled offset, TTFT and end (seconds from the
run's start), outcome and replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from .trace import Segment, Trace, arrivals, replayed

_MAX_IN_FLIGHT = 5000
Record = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Spec:
    trace: Trace
    capacity: float
    prompt_tokens: int
    max_tokens: int
    endpoints: Path
    out: Path
    seed: int
    timeout: float
    endpoints_refresh: float
    # A replayed trace's answers are its own lengths times this: the engine profile's token
    # compression (16 tokens standing for 160), so a request takes the time it stands for.
    output_scale: float = 1.0

    @staticmethod
    def load(path: Path) -> Spec:
        raw = json.loads(path.read_text())
        trace = Trace(
            tuple(Segment(**s) for s in raw["trace"]),
            raw.get("replay", ""),
            float(raw.get("replay_seconds", 0.0)),
        )
        return Spec(
            trace,
            float(raw["capacity"]),
            int(raw["prompt_tokens"]),
            int(raw["max_tokens"]),
            Path(raw["endpoints"]),
            Path(raw["out"]),
            int(raw["seed"]),
            float(raw["timeout"]),
            float(raw["endpoints_refresh"]),
            float(raw.get("output_scale", 1.0)),
        )


class Endpoints:
    """Ready replicas from the controller's file, re-read at most every `refresh` seconds."""

    def __init__(self, path: Path, refresh: float) -> None:
        self._path, self._refresh = path, refresh
        self._urls: list[str] = []
        self._read_at = -1e9
        self._next = 0

    def pick(self, now: float) -> str | None:
        if now - self._read_at >= self._refresh:
            self._read_at = now
            with contextlib.suppress(OSError):
                self._urls = [u for u in self._path.read_text().split() if u]
        if not self._urls:
            return None
        self._next = (self._next + 1) % len(self._urls)
        return self._urls[self._next]


async def one(
    session: aiohttp.ClientSession, url: str, body: bytes, t0: float, sched: float
) -> Record:
    rec: Record = {"sched": sched, "replica": url, "ttft": None, "end": None}
    try:
        async with session.post(
            f"{url}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as resp:
            if resp.status != 200:
                rec["outcome"] = f"http_{resp.status}"
                return rec
            async for line in resp.content:
                if rec["ttft"] is None and _has_token(line):
                    rec["ttft"] = time.monotonic() - t0 - sched
            rec["end"] = time.monotonic() - t0
            rec["outcome"] = "ok" if rec["ttft"] is not None else "protocol_error"
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        rec["outcome"] = type(exc).__name__
    return rec


def _has_token(line: bytes) -> bool:
    """Whether an SSE line carries content (the opening chunk holds only the role)."""
    if not line.startswith(b"data: {"):
        return False
    try:
        choices = json.loads(line[6:]).get("choices") or [{}]
        return bool((choices[0].get("delta") or {}).get("content"))
    except (ValueError, AttributeError, IndexError):
        return False


def _body(prompt_tokens: int, max_tokens: int) -> bytes:
    words = " ".join(["w"] * max(1, prompt_tokens - 8))
    return json.dumps(
        {
            "model": "sim",
            "stream": True,
            "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": words}],
        }
    ).encode()


def _schedule(spec: Spec) -> Iterator[tuple[float, bytes]]:
    """(offset, body) of every arrival: the replayed file's requests with their lengths, or
    Poisson arrivals of the profile's one shape."""
    if spec.trace.replay:
        for r in replayed(spec.trace, spec.capacity, spec.seed):
            answer = max(1, round(r.max_tokens * spec.output_scale))
            yield r.offset, _body(r.prompt_tokens, answer)
        return
    body = _body(spec.prompt_tokens, spec.max_tokens)
    for offset in arrivals(spec.trace, spec.capacity, spec.seed):
        yield offset, body


def _done(
    task: asyncio.Task[Record], tasks: set[asyncio.Task[Record]], records: list[Record]
) -> None:
    tasks.discard(task)
    if not task.cancelled() and task.exception() is None:
        records.append(task.result())


async def run(spec: Spec) -> int:
    endpoints = Endpoints(spec.endpoints, spec.endpoints_refresh)
    records: list[Record] = []
    tasks: set[asyncio.Task[Record]] = set()
    timeout = aiohttp.ClientTimeout(total=spec.timeout)
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=conn) as session:
        t0 = time.monotonic()
        for sched, body in _schedule(spec):
            # Always yield: arrivals that fell due together still let responses be read.
            await asyncio.sleep(max(0.0, t0 + sched - time.monotonic()))
            url = endpoints.pick(time.monotonic())
            if url is None or len(tasks) >= _MAX_IN_FLIGHT:
                outcome = "no_endpoint" if url is None else "dropped"
                records.append(
                    {"sched": sched, "replica": None, "ttft": None, "end": None, "outcome": outcome}
                )
                continue
            task = asyncio.create_task(one(session, url, body, t0, sched))
            tasks.add(task)
            task.add_done_callback(lambda t: _done(t, tasks, records))
        if tasks:
            await asyncio.wait(set(tasks), timeout=spec.timeout)
    records.sort(key=lambda r: float(r["sched"]))
    spec.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    return 0


def main() -> int:
    return asyncio.run(run(Spec.load(Path(sys.argv[1]))))


if __name__ == "__main__":
    sys.exit(main())
