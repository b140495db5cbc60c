"""Scrape cost: rendering `/metrics` for 20 targets with full histograms.

    .venv/bin/python bench/perf_scrape.py [--targets 20] [--results 500] [--repeats 5]

Builds the daemon's real app (`prober.web.build_app`: Metrics plus the capacity collector) for
N targets without starting it, records `--results` synthetic results per target and mode
(probe and load: log-normal TTFT, 64 tokens with log-normal gaps, a few failures, server
timings), which fills every histogram's buckets, exemplars included, then times, interleaved:

- prometheus-client's encoders (`generate_latest`, text 0.0.4, and the OpenMetrics one);
- the daemon's renderer (`prober.exposition.FastExposition`) in both formats, checking once
  that its output is byte-identical to the library's; its first render, which builds every
  series' prefix, is reported apart ("cold"); and the part of an OpenMetrics render the
  event loop does (`plan`: the collectors' reads, the capacity collector's estimates), the
  rest being formatted in the metrics worker;
- `GET /metrics` over HTTP as Prometheus asks for it (OpenMetrics Accept header, gzip), round
  trip on loopback, through the daemon's handler and through `make_aiohttp_handler`.

Each figure is the median of `--repeats` medians of 30 renders, and the ratio column is
library ÷ daemon for the same format. The renders here run in one go, as the on-loop
handler ran them; the daemon formats them off the loop, one render for all the scrapes that
arrive while it is in progress (`prober/scrapes.py`, measured by `perf_scrape_storm.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from perf_common import fmt, median, serve_app

PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
RENDERS = 30


def build(targets: int, results: int) -> tuple[object, object]:
    """The daemon's app and registry, with `results` results recorded per target and mode."""
    from prober.capacity.target import TargetCapacity
    from prober.record import ScrapeRecorder
    from prober.result import Outcome, RequestResult, TokenSource
    from prober.settings import load_settings
    from prober.targets import Target
    from prober.web import FLEET, METRICS, build_app

    lines = ["targets:"]
    for i in range(targets):
        lines += [
            f"  - name: target-{i:02d}",
            f"    url: http://127.0.0.1:{20000 + i}/v1",
            f"    model: model-{i % 4}",
            f"    metrics_url: http://127.0.0.1:{20000 + i}/metrics",
        ]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yml"
        path.write_text("\n".join(lines) + "\n")
        settings = load_settings(path)
        app = build_app(settings)
    metrics = app[METRICS]
    # The fleet's capacities as a started daemon holds them (its collector reads them live).
    capacity = app[FLEET].capacity
    targets = {t.name: Target.from_config(t) for t in settings.targets}
    for name, target in targets.items():
        capacity[name] = TargetCapacity(target, ScrapeRecorder(metrics))
    rng = random.Random(1)
    outcomes = [Outcome.OK] * 95 + [Outcome.HTTP_5XX, Outcome.TIMEOUT_FIRST_TOKEN, Outcome.STALLED,
                                    Outcome.HTTP_429, Outcome.PROTOCOL_ERROR]  # fmt: skip
    base = time.perf_counter_ns()
    for name, target in targets.items():
        metrics.describe_target(target.labels, target.slo, 15.0)
        for mode in ("probe", "load"):
            for n in range(results):
                t_sched = base + n * 10**9
                t_send = t_sched + int(rng.lognormvariate(-9, 1) * 1e9)
                first = t_send + int(rng.lognormvariate(-1.5, 1.0) * 1e9)
                stamps = [first]
                for _ in range(63):
                    stamps.append(stamps[-1] + int(rng.lognormvariate(-4, 0.6) * 1e9))
                outcome = rng.choice(outcomes)
                ok = outcome is Outcome.OK
                result = RequestResult(
                    outcome, t_sched, t_send, stamps[-1] + 100_000,
                    request_id=f"chatcmpl-{rng.getrandbits(128):032x}", http_status=200,
                    t_first_byte_ns=first - 1000, t_first_token_ns=first if ok else None,
                    t_first_content_ns=first if ok else None,
                    t_last_token_ns=stamps[-1] if ok else None,
                    token_event_ns=tuple(stamps) if ok else (), prompt_tokens=64,
                    output_tokens=64 if ok else 0, token_source=TokenSource.USAGE,
                    server_prefill_seconds=rng.lognormvariate(-3, 0.5),
                    server_decode_per_token_seconds=rng.lognormvariate(-4, 0.5),
                    wall_start=time.time(),
                )  # fmt: skip
                metrics.record(result, target.labels, mode, target.slo)
                # The queue wait the capacity returns, written as the daemon's recorder does.
                wait = capacity[name].observe(result)
                if wait is not None:
                    key = target.labels
                    metrics.queue_wait.labels(key.target, key.model).observe(wait)
    return app, metrics.registry


def time_median(fn: Callable[[], object], renders: int = RENDERS) -> tuple[float, int]:
    times = []
    size = 0
    for _ in range(renders):
        t0 = time.perf_counter()
        out = fn()
        times.append((time.perf_counter() - t0) * 1e3)
        size = len(out) if isinstance(out, bytes) else size  # a plan: no bytes yet
    return statistics.median(times), size


async def time_http(handler: object, renders: int = RENDERS) -> tuple[float, int]:
    import aiohttp
    from aiohttp import web

    bare = web.Application()
    bare.router.add_get("/metrics", handler)
    headers = {"Accept": PROMETHEUS_ACCEPT, "Accept-Encoding": "gzip"}
    times = []
    size = 0
    async with serve_app(bare) as port, aiohttp.ClientSession(auto_decompress=False) as session:
        for _ in range(renders):
            t0 = time.perf_counter()
            async with session.get(f"http://127.0.0.1:{port}/metrics", headers=headers) as r:
                body = await r.read()
            times.append((time.perf_counter() - t0) * 1e3)
            size = len(body)
    return statistics.median(times), size


def daemon_handler(app: object) -> object:
    return next(
        r.handler
        for r in app.router.routes()  # type: ignore[attr-defined]
        if r.method == "GET" and r.resource is not None and r.resource.canonical == "/metrics"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=20)
    parser.add_argument("--results", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    ns = parser.parse_args()
    from prometheus_client import generate_latest
    from prometheus_client.aiohttp import make_aiohttp_handler
    from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

    from prober.exposition import OPENMETRICS, TEXT, FastExposition

    app, registry = build(ns.targets, ns.results)
    fast = FastExposition(registry)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    cold = fast.render(OPENMETRICS)
    cold_ms = (time.perf_counter() - t0) * 1e3
    assert cold == generate_openmetrics(registry), "OpenMetrics output differs from the library's"
    assert fast.render(TEXT) == generate_latest(registry), "text output differs"  # type: ignore[arg-type]
    runs: dict[str, Callable[[], object]] = {
        "text/library": lambda: generate_latest(registry),  # type: ignore[arg-type]
        "text/daemon": lambda: fast.render(TEXT),
        "openmetrics/library": lambda: generate_openmetrics(registry),
        "openmetrics/daemon": lambda: fast.render(OPENMETRICS),
        "openmetrics/loop": lambda: fast.plan(OPENMETRICS),
    }
    handlers = {
        "http/library": make_aiohttp_handler(registry),  # type: ignore[arg-type]
        "http/daemon": daemon_handler(app),
    }
    figures: dict[str, list[float]] = {key: [] for key in [*runs, *handlers]}
    sizes: dict[str, int] = {}
    for _ in range(ns.repeats):
        for key, fn in runs.items():
            ms, sizes[key] = time_median(fn)
            figures[key].append(ms)
        for key, handler in handlers.items():
            ms, sizes[key] = asyncio.run(time_http(handler))
            figures[key].append(ms)
    text = generate_latest(registry).decode()  # type: ignore[arg-type]
    series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    print(f"{ns.targets} targets × 2 modes, {ns.results} results each: {series} series")
    print(f"medians of {ns.repeats} × {RENDERS} renders, ms (goal < 10 ms); outputs identical")
    print(f"{'what':<46} {'median ms':>10} {'min':>7} {'max':>7} {'bytes':>9} {'library ÷':>10}")
    names = {
        "text/library": "prometheus-client generate_latest (text)",
        "text/daemon": "daemon renderer (text)",
        "openmetrics/library": "prometheus-client OpenMetrics (exemplars)",
        "openmetrics/daemon": "daemon renderer (OpenMetrics, exemplars)",
        "openmetrics/loop": "  of which on the event loop (`plan`)",
        "http/library": "GET /metrics, make_aiohttp_handler (OM+gzip)",
        "http/daemon": "GET /metrics, daemon handler (OM+gzip)",
    }
    for key, label in names.items():
        values = figures[key]
        ratio = ""
        if key.endswith("/daemon"):
            ratio = f"{median(figures[key.replace('daemon', 'library')]) / median(values):.1f}×"
        print(
            f"{label:<46} {fmt(median(values)):>10} {fmt(min(values)):>7} {fmt(max(values)):>7} "
            f"{sizes[key]:>9} {ratio:>10}"
        )
    print(f"daemon renderer, first (cold) render building every prefix: {fmt(cold_ms)} ms")


if __name__ == "__main__":
    main()
