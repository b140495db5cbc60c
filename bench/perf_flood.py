"""Hostile floods beside a healthy target: its TTFT and `/-/healthy`, with and without them.

    .venv/bin/python bench/perf_flood.py [--floods all] [--rate 20] [--seconds 15]
        [--repeats 3] [--loop uvloop|asyncio]

Processes: the simulator (the healthy target's engine: a token every 10 ms, nothing queues),
the flood server (`tests/support/floods.py` and the hostile server's endless streams,
`tests/support/hostile.py`), and a worker running the daemon's app
(`prober.web.build_app`, on uvloop with the daemon's GC tuning, as `llm-prober run`) with
the healthy target (a probe every 0.5 s and Poisson load at `--rate`, 16 tokens) and, but
for the baseline, one flooding target with the same probes and load. The worker is pinned
to a core of its own; this process, the simulator and the flood server share the other,
and this process asks the worker's `/-/healthy` every 20 ms.

Each repeat runs the baseline and then every flood, `--seconds` each after 2 s of settling.
Printed per flood, medians over repeats: the healthy target's TTFT p50 / p99 (ms, every
probe and load request; from the prober's own stamps), p99 minus the baseline's of the
same repeat and p99 as a ratio to it; `/-/healthy` p50 / max and max as a ratio to the
baseline's of the same repeat; the flooding target's requests and how many ended as
`protocol_error` (cut at a bound); the worker's CPU share of its core. Goals: p99 within a
few ms of the baseline, `/-/healthy` under 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from perf_common import (
    PYTHON,
    ROOT,
    Sim,
    _affinity,
    ask,
    emit,
    fast_sim_args,
    fmt,
    free_port,
    median,
    pct,
    pinning,
    proc_cpu_seconds,
    set_loop,
    tune_gc,
    wait_http,
    wait_quiet,
)

sys.path.insert(0, str(ROOT))  # the flood server's floods live with the tests

SETTLE_SECONDS = 2.0
PING_SECONDS = 0.02
# Endless bodies (the hostile server's) beside the protocol-level floods.
BODY_FLOODS = ("endless_tokens", "endless_comments")


def flood_names() -> list[str]:
    from tests.support.floods import FLOODS

    return [*FLOODS, *BODY_FLOODS]


def target(name: str, url: str, rate: float, in_flight: int) -> dict[str, Any]:
    return {
        "name": name, "url": url, "model": "sim", "interval_seconds": 0.5, "jitter_seconds": 0,
        "warmup": 0, "max_tokens": 16,
        "timeouts": {"first_token_seconds": 3, "idle_seconds": 1, "total_seconds": 4},
        "load": {"rate": rate, "max_in_flight": in_flight, "max_tokens": 16, "seed": 1},
    }  # fmt: skip


# -- the worker: the daemon's app, recording every result -------------------------------------


async def daemon(ns: argparse.Namespace) -> dict[str, Any]:
    from aiohttp import web

    from prober.logs import setup_logging
    from prober.settings import Settings
    from prober.timings import ttft
    from prober.web import FLEET, build_app

    targets = [target("healthy", ns.sim_url, ns.rate, 64)]
    if ns.flood_url:
        targets.append(target("flood", ns.flood_url, ns.rate, 8))
    settings = Settings.model_validate(
        {"server": {"listen": f"127.0.0.1:{ns.port}"}, "logging": {"level": "error"},
         "targets": targets}
    )  # fmt: skip
    setup_logging("json", "error")
    app = build_app(settings)
    seen: list[tuple[str, float, str, float | None]] = []
    recorder = app[FLEET].recorder  # the one the scheduler and load drivers hold
    record = recorder.record

    def noting(t: Any, result: Any, mode: Any) -> None:  # every result, as recorded
        seen.append((t.name, time.monotonic(), result.outcome.value, ttft(result)))
        record(t, result, mode)

    recorder.record = noting  # type: ignore[method-assign]
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", ns.port).start()
    tune_gc()
    start = time.monotonic() + SETTLE_SECONDS
    await asyncio.sleep(SETTLE_SECONDS)
    cpu0 = time.process_time()
    await asyncio.sleep(ns.seconds)
    cpu = (time.process_time() - cpu0) / ns.seconds
    await asyncio.sleep(1.0)  # the pings end first
    await runner.cleanup()
    measured = [x for x in seen if start <= x[1] <= start + ns.seconds]
    healthy = [x[3] * 1e3 for x in measured if x[0] == "healthy" and x[3] is not None]
    flood = [x[2] for x in measured if x[0] == "flood"]
    return {
        "ttft_ms": healthy,
        "healthy_failed": sum(1 for x in measured if x[0] == "healthy" and x[2] != "ok"),
        "flood_requests": len(flood),
        "flood_protocol_errors": flood.count("protocol_error"),
        "cpu_share": cpu,
    }


# -- the flood server --------------------------------------------------------------------------


async def serve_floods(port: int) -> None:
    from tests.support.floods import flood_server
    from tests.support.hostile import hostile_server

    logging.getLogger("aiohttp").setLevel(logging.CRITICAL)  # clients that leave mid-write
    async with flood_server(port), hostile_server() as hostile:
        print(hostile.base, flush=True)  # where the endless bodies are
        await asyncio.Event().wait()


# -- this process: the runs --------------------------------------------------------------------


async def ping(port: int, seconds: float) -> list[float]:
    return await ask(port, "/-/healthy", PING_SECONDS, seconds, timeout=5.0)


def run(ns: argparse.Namespace, sim: Sim, flood_url: str, cpus: set[int] | None) -> dict[str, Any]:
    port = free_port()
    out = Path(f"/tmp/llmprober-flood-run-{port}.json")
    args = [PYTHON, __file__, "--worker", "--port", str(port), "--sim-url", sim.url,
            "--flood-url", flood_url, "--rate", str(ns.rate), "--seconds", str(ns.seconds),
            "--loop", ns.loop, "--out", str(out)]  # fmt: skip
    proc = subprocess.Popen(args, cwd=ROOT, preexec_fn=_affinity(cpus))
    try:
        wait_http(f"http://127.0.0.1:{port}/-/healthy")
        pings = asyncio.run(ping(port, SETTLE_SECONDS + ns.seconds))
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = dict(json.loads(out.read_text()))
    out.unlink()
    result["ping_ms"] = pings[int(len(pings) * SETTLE_SECONDS / (SETTLE_SECONDS + ns.seconds)) :]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--floods", default="all", help="comma-separated names, or all")
    parser.add_argument("--rate", type=float, default=20.0, help="load per target, req/s")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flood-server", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sim-url", help=argparse.SUPPRESS)
    parser.add_argument("--flood-url", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.flood_server:
        asyncio.run(serve_floods(ns.port))
        return
    if ns.worker:
        set_loop(ns.loop)
        emit(asyncio.run(daemon(ns)), ns.out)
        return
    floods = flood_names() if ns.floods == "all" else ns.floods.split(",")
    others, worker_cpu = pinning()
    flood_port = free_port()
    server = subprocess.Popen(
        [PYTHON, __file__, "--flood-server", "--port", str(flood_port)], cwd=ROOT,
        stdout=subprocess.PIPE, text=True, preexec_fn=_affinity(others),
    )  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in ["baseline", *floods]}
    try:
        assert server.stdout is not None
        hostile_base = server.stdout.readline().strip()
        with Sim(fast_sim_args(), cpus=others) as sim:
            for _ in range(ns.repeats):
                wait_quiet()
                for name in runs:
                    if name == "baseline":
                        url = ""
                    elif name in BODY_FLOODS:
                        url = f"{hostile_base}/{name}/v1"
                    else:
                        url = f"http://127.0.0.1:{flood_port}/{name}/v1"
                    cpu0 = proc_cpu_seconds(server.pid)
                    result = run(ns, sim, url, worker_cpu)
                    result["flood_server_cpu"] = proc_cpu_seconds(server.pid) - cpu0
                    runs[name].append(result)
    finally:
        server.terminate()
        server.wait(10)
    report(runs, ns)


def report(runs: dict[str, list[dict[str, Any]]], ns: argparse.Namespace) -> None:
    base_p99 = [pct(r["ttft_ms"], 99) for r in runs["baseline"]]
    base_max = [max(r["ping_ms"]) for r in runs["baseline"]]
    print(
        f"healthy target beside one flooding target, {ns.rate:g} req/s of load each and a"
        f" probe every 0.5 s; {ns.seconds:g} s a run, medians of {ns.repeats}; {ns.loop}"
    )
    print(f"{'flood':<24} {'TTFT p50':>9} {'p99':>7} {'p99 − base':>11} {'p99 ÷ base':>11}"
          f" {'healthy p50':>12} {'max':>7} {'max ÷ base':>11} {'flood req':>10} {'cut':>6}"
          f" {'worker CPU':>11}")  # fmt: skip
    for name, results in runs.items():
        p50 = median(pct(r["ttft_ms"], 50) for r in results)
        p99 = median(pct(r["ttft_ms"], 99) for r in results)
        delta = median(pct(r["ttft_ms"], 99) - b for r, b in zip(results, base_p99, strict=True))
        ratio = median(pct(r["ttft_ms"], 99) / b for r, b in zip(results, base_p99, strict=True))
        ping50 = median(pct(r["ping_ms"], 50) for r in results)
        ping_max = median(max(r["ping_ms"]) for r in results)
        ping_ratio = median(max(r["ping_ms"]) / b for r, b in zip(results, base_max, strict=True))
        requests = median(r["flood_requests"] for r in results)
        cut = median(r["flood_protocol_errors"] for r in results)
        cpu = median(r["cpu_share"] for r in results)
        failed = sum(r["healthy_failed"] for r in results)
        note = f"  ({failed} healthy failed)" if failed else ""
        print(f"{name:<24} {fmt(p50):>9} {fmt(p99):>7} {fmt(delta):>11} {fmt(ratio) + '×':>11}"
              f" {fmt(ping50):>12} {fmt(ping_max):>7} {fmt(ping_ratio) + '×':>11}"
              f" {requests:>10.0f} {cut:>6.0f} {cpu:>10.1%}{note}")  # fmt: skip


if __name__ == "__main__":
    main()
