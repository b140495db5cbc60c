"""One closed-loop run: a policy on a trace, from an empty Prometheus to the last request.

`run_policy` starts Prometheus and the minimum fleet (warm: a running deployment), lets the
sidecars probe for a warm-up, starts the traffic process, and then every HPA sync period
queries each trigger, computes the HPA's decision and applies it to the fleet. It returns
the requests' records, the controller's samples and every replica's lifetime; `report`
turns them into figures. Every process it starts is stopped in `finally`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from . import prometheus
from .fleet import Engine, Fleet, Sidecar, free_port
from .hpa import Hpa, desired_for_metric
from .policy import Policy
from .trace import Trace

_ROOT = Path(__file__).resolve().parents[2]  # the repository

_WARMUP_LIMIT_SECONDS = 60.0
_OVERRUN_SECONDS = 60.0


@dataclass(frozen=True, slots=True)
class Setup:
    """Everything a run needs, already time compressed (seconds are compressed seconds)."""

    factor: float
    engine: Engine
    sidecar: Sidecar
    startup: float
    sync: float
    warmup: float
    trace: Trace
    capacity: float
    prometheus_bin: Path
    rules: Path
    seed: int
    grace: float
    initial: int
    user_timeout: float


async def _warm(prom: prometheus.Client, query: str, seconds: float) -> None:
    """Wait `seconds`, then until the recording rules answer (bounded)."""
    await asyncio.sleep(seconds)
    for _ in range(int(_WARMUP_LIMIT_SECONDS / 0.5)):
        if await prom.scalar(query) is not None:
            break
        await asyncio.sleep(0.5)
    errors = await prom.rule_errors()
    if errors:
        raise RuntimeError("recording rules failing: " + "; ".join(errors[:3]))


async def _traffic(setup: Setup, fleet: Fleet, work: Path) -> asyncio.subprocess.Process:
    spec = {
        "trace": [asdict(s) for s in setup.trace.segments],
        "replay": setup.trace.replay,
        "replay_seconds": setup.trace.replay_seconds,
        "output_scale": 1.0 / setup.factor,
        "capacity": setup.capacity,
        "prompt_tokens": setup.engine.prompt_tokens,
        "max_tokens": setup.engine.max_tokens,
        "endpoints": str(fleet.endpoints),
        "out": str(work / "requests.jsonl"),
        "seed": setup.seed,
        "timeout": setup.user_timeout,
        "endpoints_refresh": 1.0 / setup.factor,
    }
    (work / "traffic.json").write_text(json.dumps(spec))
    with (work / "traffic.log").open("ab") as log:
        return await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.autoscaling.traffic",
            str(work / "traffic.json"),
            stdout=log,
            stderr=log,
            cwd=_ROOT,  # where `bench` is a package, whatever the caller's folder
        )


async def _apply(fleet: Fleet, new: int, now: float) -> None:
    live = len(fleet.live)
    for _ in range(new - live):
        await fleet.create(now)
    if new < live:
        fleet.remove(live - new)


async def _sample(prom: prometheus.Client, query: str) -> float | None:
    return await prom.scalar(f"{query} or vector(0)")


async def _control(
    setup: Setup,
    policy: Policy,
    fleet: Fleet,
    prom: prometheus.Client,
    session: aiohttp.ClientSession,
    traffic: asyncio.subprocess.Process,
    t0: float,
) -> list[dict[str, Any]]:
    hpa = Hpa(policy.behavior, policy.min_replicas, policy.max_replicas)
    spec = len(fleet.live)
    # A deployment already running at `spec`: a fresh HPA would scale it in at once.
    hpa.seed(0.0, spec)
    samples: list[dict[str, Any]] = []
    deadline = t0 + setup.trace.seconds + _OVERRUN_SECONDS
    tick = 0
    while traffic.returncode is None and time.monotonic() < deadline:
        now = time.monotonic()
        await fleet.tick(session, now)
        values = {t.name: await prom.scalar(t.query) for t in policy.triggers}
        status, ready = len(fleet.live), fleet.ready_count()
        wanted = {
            t.name: desired_for_metric(t.kind, v, t.threshold, status, max(1, ready))
            for t in policy.triggers
            if (v := values[t.name]) is not None
        }
        # The HPA keeps the count when a metric is missing (KEDA reports the scaler failing).
        if len(wanted) == len(policy.triggers):
            spec = hpa.decide(now - t0, spec, max(wanted.values()))
            await _apply(fleet, spec, now)
        samples.append(
            {
                "t": now - t0,
                "spec": spec,
                "status": status,
                "ready": ready,
                "metrics": values,
                "desired": wanted,
                "waiting": await _sample(prom, "sum(vllm:num_requests_waiting)"),
                "running": await _sample(prom, "sum(vllm:num_requests_running)"),
            }
        )
        tick += 1
        await asyncio.sleep(max(0.0, t0 + tick * setup.sync - time.monotonic()))
    return samples


async def _stop(procs: list[asyncio.subprocess.Process]) -> None:
    for p in reversed(procs):
        if p.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                p.terminate()
        try:
            await asyncio.wait_for(p.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                p.kill()
            await p.wait()


async def _start_fleet(fleet: Fleet, session: aiohttp.ClientSession, count: int) -> None:
    for _ in range(count):
        await fleet.create(time.monotonic(), warm=True)
    for _ in range(150):
        await fleet.tick(session, time.monotonic())
        if fleet.ready_count() == count:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the first replicas did not start: see {fleet.work}/replica-*.log")


async def run_policy(setup: Setup, policy: Policy, work: Path) -> dict[str, Any]:
    """Run `policy` on `setup.trace`; the raw results (see the module docstring).

    `work` must exist: it receives the configs, logs and the requests' records."""
    fleet = Fleet(work, setup.engine, setup.sidecar, setup.startup, setup.grace)
    port = free_port()
    sd = {"llm-prober": fleet.sd_probers, "engine": fleet.sd_engines}
    cfg = prometheus.config(work, setup.rules, setup.factor, sd)
    procs: list[asyncio.subprocess.Process] = []
    try:
        procs.append(await prometheus.start(setup.prometheus_bin, cfg, work, port))
        async with aiohttp.ClientSession() as session:
            prom = prometheus.Client(session, f"http://127.0.0.1:{port}")
            if not await prom.ready(30):
                raise RuntimeError(f"prometheus did not start: see {work / 'prometheus.log'}")
            await _start_fleet(fleet, session, max(policy.min_replicas, setup.initial))
            await _warm(prom, 'llmprober:ttft_seconds:p95_5m{target="vllm"}', setup.warmup)
            t0 = time.monotonic()
            procs.append(await _traffic(setup, fleet, work))
            samples = await _control(setup, policy, fleet, prom, session, procs[-1], t0)
            end = time.monotonic()
    finally:
        await _stop(procs)
        await fleet.close()
    records = [json.loads(line) for line in (work / "requests.jsonl").read_text().splitlines()]
    lifetimes = [(r.created - t0, (r.stopped or end) - t0) for r in fleet.replicas]
    return {
        "policy": policy.name,
        "samples": samples,
        "requests": records,
        "replicas": lifetimes,
        "duration": setup.trace.seconds,
    }
