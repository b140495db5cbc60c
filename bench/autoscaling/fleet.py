"""The fleet: replicas of the simulator, each with its sidecar llm-prober, as processes.

A replica is a pod: `llm-prober sim` (the engine) and `llm-prober run` (the sidecar, target
`vllm`, `slots:` = the engine's slots, probes only, optionally the engine's `metrics_url`).
It costs from the moment it is created; it becomes *ready* after the start-up delay that
stands for loading weights, and only then is it in the Service's endpoints and in
Prometheus's targets (file_sd). Scaling in removes a replica from the endpoints first, lets
its requests finish (bounded by a grace period), then stops both processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Engine:
    """The replica's engine profile: `llm-prober sim` flags and the sidecar's SLO."""

    slots: int
    prefill_tps: float
    prefill_base: float
    decode_step: float
    decode_slowdown: float
    max_tokens: int
    prompt_tokens: int
    slo_ttft: float

    def sim_args(self) -> list[str]:
        return [
            "--slots",
            str(self.slots),
            "--prefill-tps",
            repr(self.prefill_tps),
            "--prefill-base",
            repr(self.prefill_base),
            "--decode-step",
            repr(self.decode_step),
            "--decode-slowdown",
            repr(self.decode_slowdown),
            "--max-tokens",
            str(self.max_tokens),
        ]


@dataclass(frozen=True, slots=True)
class Sidecar:
    """How the sidecar probes, time scaled: interval, engine scrape, with or without truth."""

    interval: float
    metrics_interval: float
    server_truth: bool

    def config(self, engine: Engine, sim: str, listen: str) -> dict[str, Any]:
        target: dict[str, Any] = {
            "name": "vllm",
            "url": f"{sim}/v1",
            "model": "sim",
            "interval_seconds": self.interval,
            "jitter_seconds": self.interval / 10,
            "prompt_tokens": engine.prompt_tokens,
            "max_tokens": engine.max_tokens,
            "slots": engine.slots,
            "traffic": {"prompt_tokens": engine.prompt_tokens, "output_tokens": engine.max_tokens},
            "slo": {"ttft_seconds": engine.slo_ttft, "tpot_seconds": 60.0},
            "timeouts": {
                "connect_seconds": 2.0,
                "first_token_seconds": 30.0,
                "idle_seconds": 30.0,
                "total_seconds": 60.0,
            },
        }
        if self.server_truth:
            target["metrics_url"] = f"{sim}/metrics"
            target["metrics_interval_seconds"] = self.metrics_interval
        return {
            "server": {"listen": listen, "grace_seconds": 1.0},
            "logging": {"level": "warning", "format": "json"},
            "targets": [target],
        }


@dataclass(eq=False)
class Replica:
    index: int
    sim_port: int
    prober_port: int
    created: float
    ready_at: float
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)
    ready: bool = False
    stopped: float | None = None

    @property
    def sim(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"


class Fleet:
    """Creates, readies and removes replicas; writes the endpoints and file_sd files."""

    def __init__(
        self, work: Path, engine: Engine, sidecar: Sidecar, startup: float, grace: float
    ) -> None:
        self.work, self.engine, self.sidecar = work, engine, sidecar
        self.startup, self.grace = startup, grace
        self.replicas: list[Replica] = []  # every replica ever created, in order
        self._draining: set[asyncio.Task[None]] = set()
        self._leaving: set[Replica] = set()
        self.endpoints = work / "endpoints.txt"
        self.sd_probers = work / "sd-probers.json"
        self.sd_engines = work / "sd-engines.json"
        self._publish()

    @property
    def live(self) -> list[Replica]:
        """Created and not being removed (the Deployment's status.replicas)."""
        return [r for r in self.replicas if r.stopped is None and r not in self._leaving]

    def ready_count(self) -> int:
        return sum(r.ready for r in self.live)

    async def create(self, now: float, *, warm: bool = False) -> Replica:
        r = Replica(
            len(self.replicas), free_port(), free_port(), now, now if warm else now + self.startup
        )
        cfg = self.work / f"prober-{r.index}.yml"
        listen = f"127.0.0.1:{r.prober_port}"
        cfg.write_text(yaml.safe_dump(self.sidecar.config(self.engine, r.sim, listen)))
        py = sys.executable
        with (self.work / f"replica-{r.index}.log").open("ab") as log:
            r.procs.append(
                await asyncio.create_subprocess_exec(
                    py,
                    "-m",
                    "prober.cli",
                    "sim",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(r.sim_port),
                    *self.engine.sim_args(),
                    stdout=log,
                    stderr=log,
                )
            )
            r.procs.append(
                await asyncio.create_subprocess_exec(
                    py, "-m", "prober.cli", "run", "--config", str(cfg), stdout=log, stderr=log
                )
            )
        self.replicas.append(r)
        return r

    async def tick(self, session: aiohttp.ClientSession, now: float) -> None:
        """Mark replicas ready whose start-up delay has passed and whose engine answers."""
        changed = False
        for r in self.live:
            if not r.ready and now >= r.ready_at and await _healthy(session, r.sim):
                r.ready = changed = True
        if changed:
            self._publish()

    def remove(self, count: int) -> None:
        """Scale in by `count`: not-ready replicas first, then the newest (as a ReplicaSet)."""
        newest = sorted(self.live, key=lambda r: r.created, reverse=True)
        order = [r for r in newest if not r.ready] + [r for r in newest if r.ready]
        for r in order[:count]:
            self._leaving.add(r)
            task = asyncio.create_task(self._drain(r))
            self._draining.add(task)
            task.add_done_callback(self._draining.discard)
        self._publish()

    async def _drain(self, r: Replica) -> None:
        if r.ready:
            async with aiohttp.ClientSession() as session:
                for _ in range(max(1, int(self.grace / 0.2))):
                    if not await _busy(session, r.sim):
                        break
                    await asyncio.sleep(0.2)
        await _stop(r.procs)
        r.stopped = time.monotonic()
        self._leaving.discard(r)

    async def close(self) -> None:
        for task in list(self._draining):
            task.cancel()
        for r in self.replicas:
            await _stop(r.procs)
            if r.stopped is None:
                r.stopped = time.monotonic()
        self._leaving.clear()

    def _publish(self) -> None:
        ready = [r for r in self.live if r.ready]
        _atomic(self.endpoints, "".join(f"{r.sim}\n" for r in ready))
        probers = [
            {"targets": [f"127.0.0.1:{r.prober_port}"], "labels": {"replica": str(r.index)}}
            for r in ready
        ]
        engines = [
            {"targets": [f"127.0.0.1:{r.sim_port}"], "labels": {"replica": str(r.index)}}
            for r in ready
        ]
        _atomic(self.sd_probers, json.dumps(probers))
        _atomic(self.sd_engines, json.dumps(engines))


def _atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


async def _healthy(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=1)) as r:
            return r.status == 200
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


async def _busy(session: aiohttp.ClientSession, url: str) -> bool:
    """Whether the engine still holds requests (waiting or running), from its /metrics."""
    try:
        async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=1)) as r:
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False
    for line in text.splitlines():
        queue = line.startswith(("vllm:num_requests_waiting", "vllm:num_requests_running"))
        if queue and float(line.rsplit(" ", 1)[1]) > 0:
            return True
    return False


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    for p in procs:
        if p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
    for p in procs:
        try:
            await asyncio.wait_for(p.wait(), timeout=5)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()
