"""Scrape storms: `/-/healthy` while 50 scrapes of a 32-target daemon arrive at once.

    .venv/bin/python bench/perf_scrape_storm.py [--targets 32] [--results 500] [--scrapes 50]
        [--rounds 8] [--repeats 3] [--handlers daemon,onloop]

A server process builds the daemon's app for N targets with full histograms
(`perf_scrape.build`: the registry `bench/perf_scrape.py` times; 32 targets make ~780 KB of
OpenMetrics) and serves `/metrics` and `/-/healthy` on uvloop with the daemon's GC tuning,
pinned to a core of its own. `/metrics` is served by:

- `daemon`: the daemon's handler (`prober.scrapes`: one render shared by the scrapes that
  arrive while it is in progress, formatted and compressed once, off the loop);
- `onloop`: the handler as it was before it (each scrape rendered on the event loop by
  `FastExposition.render`, one after another, each compressed by aiohttp on its own).

This process (the other core) asks `/-/healthy` every 10 ms on a connection of its own:
first alone for `--rounds` × 0.5 s, then while `--rounds` rounds of `--scrapes` concurrent
scrapes (Prometheus's Accept header and gzip) run one after another. Printed, medians of
`--repeats`: `/-/healthy` p50 / max alone and in the storm and their ratio, and how long a
scrape took in the storm (p50 / max). Goal: `/-/healthy` under 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from typing import Any

from perf_common import (
    PYTHON,
    ROOT,
    _affinity,
    fmt,
    free_port,
    median,
    pct,
    pinning,
    set_loop,
    tune_gc,
    wait_http,
    wait_quiet,
)
from perf_scrape import PROMETHEUS_ACCEPT, build, daemon_handler

PING_SECONDS = 0.01
ALONE_SECONDS = 0.5  # per round


def onloop_handler(registry: Any) -> Any:
    """`/metrics` as the daemon served it before `prober.scrapes`: rendered on the loop."""
    from aiohttp import hdrs, web
    from prometheus_client.aiohttp import make_aiohttp_handler

    from prober.exposition import FastExposition, negotiate

    library = make_aiohttp_handler(registry)
    fast = FastExposition(registry)

    async def handler(request: web.Request) -> web.StreamResponse:
        form, escaping, content_type = negotiate(",".join(request.headers.getall(hdrs.ACCEPT, [])))
        body = fast.render(form, escaping) if form is not None else None
        if body is None:
            return await library(request)
        response = web.Response(body=body, headers={hdrs.CONTENT_TYPE: content_type})
        response.enable_compression()
        return response

    return handler


def serve(ns: argparse.Namespace) -> None:
    from aiohttp import web

    from prober.web import METRICS

    app, _ = build(ns.targets, ns.results)
    bare = web.Application()
    handler = daemon_handler(app) if ns.handler == "daemon" else onloop_handler(
        app[METRICS].registry
    )  # fmt: skip
    bare.router.add_get("/metrics", handler)

    async def healthy(_: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    bare.router.add_get("/-/healthy", healthy)
    set_loop("uvloop")
    tune_gc()
    web.run_app(bare, host="127.0.0.1", port=ns.port, print=None, access_log=None)


async def pings(session: Any, url: str, stop: asyncio.Event) -> list[float]:
    times: list[float] = []
    while not stop.is_set():
        t0 = time.perf_counter()
        async with session.get(url) as resp:
            await resp.read()
        times.append((time.perf_counter() - t0) * 1e3)
        await asyncio.sleep(PING_SECONDS)
    return times


async def storm(port: int, ns: argparse.Namespace) -> dict[str, Any]:
    import aiohttp

    root = f"http://127.0.0.1:{port}"
    headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(connector=connector, auto_decompress=False) as scrapes,
        aiohttp.ClientSession() as pinger,
    ):

        async def scrape() -> tuple[float, int]:
            t0 = time.perf_counter()
            async with scrapes.get(f"{root}/metrics", headers=headers) as resp:
                body = await resp.read()
            return (time.perf_counter() - t0) * 1e3, len(body)

        await scrape()  # the cold render, building every series' prefix
        async with scrapes.get(f"{root}/metrics", headers={**headers, "Accept-Encoding": ""}) as r:
            plain = len(await r.read())
        stop = asyncio.Event()
        task = asyncio.create_task(pings(pinger, f"{root}/-/healthy", stop))
        await asyncio.sleep(ALONE_SECONDS * ns.rounds)
        stop.set()
        alone = await task
        stop = asyncio.Event()
        task = asyncio.create_task(pings(pinger, f"{root}/-/healthy", stop))
        times: list[float] = []
        size = 0
        for _ in range(ns.rounds):
            done = await asyncio.gather(*(scrape() for _ in range(ns.scrapes)))
            times += [t for t, _ in done]
            size = done[0][1]
        stop.set()
        during = await task
    return {"alone": alone, "storm": during, "scrapes": times, "gzip_bytes": size, "bytes": plain}


def run(ns: argparse.Namespace, handler: str, cpus: tuple[Any, Any]) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen(
        [PYTHON, __file__, "--serve", "--handler", handler, "--port", str(port),
         "--targets", str(ns.targets), "--results", str(ns.results)],
        cwd=ROOT, preexec_fn=_affinity(cpus[0]),
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/-/healthy", timeout=120)
        return asyncio.run(storm(port, ns))
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=32)
    parser.add_argument("--results", type=int, default=500)
    parser.add_argument("--scrapes", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--handlers", default="daemon,onloop")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--handler", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.serve:
        serve(ns)
        return
    server_cpu, client_cpu = pinning()
    if client_cpu is not None:
        import os

        os.sched_setaffinity(0, client_cpu)
    handlers = ns.handlers.split(",")
    runs: dict[str, list[dict[str, Any]]] = {h: [] for h in handlers}
    for _ in range(ns.repeats):
        wait_quiet()
        for handler in handlers:
            runs[handler].append(run(ns, handler, (server_cpu, client_cpu)))
    last = runs[handlers[0]][-1]
    print(
        f"{ns.targets} targets, {ns.results} results each; {ns.rounds} rounds of {ns.scrapes}"
        f" concurrent scrapes (OpenMetrics, {last['bytes']} bytes, {last['gzip_bytes']} gzipped);"
        f" medians of {ns.repeats}; ms"
    )
    print(
        f"{'handler':<8} {'healthy alone p50':>18} {'max':>7} {'in the storm p50':>17} {'max':>8}"
        f" {'ratio p50':>10} {'ratio max':>10} {'scrape p50':>11} {'max':>8}"
    )
    for handler, results in runs.items():
        alone50 = median(pct(r["alone"], 50) for r in results)
        alone_max = median(max(r["alone"]) for r in results)
        storm50 = median(pct(r["storm"], 50) for r in results)
        storm_max = median(max(r["storm"]) for r in results)
        scrape50 = median(pct(r["scrapes"], 50) for r in results)
        scrape_max = median(max(r["scrapes"]) for r in results)
        print(
            f"{handler:<8} {fmt(alone50):>18} {fmt(alone_max):>7} {fmt(storm50):>17}"
            f" {fmt(storm_max):>8} {storm50 / alone50:>9.1f}× {storm_max / alone_max:>9.1f}×"
            f" {fmt(scrape50):>11} {fmt(scrape_max):>8}"
        )


if __name__ == "__main__":
    sys.exit(main())
