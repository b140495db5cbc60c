"""The daemon's aiohttp application: one factory owns the whole lifecycle.

Routes: `/metrics` (prometheus-client's aiohttp handler on the daemon's own registry, with
the common formats rendered by `exposition.py`: the same bytes, ~15× faster),
`/probe?target=NAME` (one probe now, its metrics in a fresh registry: the blackbox-exporter
pattern; only configured names are accepted, so it cannot be turned into a proxy),
`/-/healthy`, `/-/ready` and a landing page. With `server.web_config_file`, basic auth guards
every route but the two health checks, and `WEB_CONFIG.ssl_context()` serves them over TLS
(`webconfig.py`). The client session and the probe scheduler
start in `cleanup_ctx` and stop in reverse order; on shutdown in-flight probes get the
configured grace period.
"""

from __future__ import annotations

import asyncio
import html
import time
import zlib
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from prober import __version__
from prober.capacity import CapacityCollector, TargetCapacity
from prober.exposition import metrics_handler
from prober.load import LoadDriver
from prober.metrics import Metrics
from prober.schedule import ProbeScheduler
from prober.settings import Settings
from prober.targets import Target
from prober.webconfig import WebConfig, load_web_config
from prober.wire import request_session

SETTINGS = web.AppKey("settings", Settings)
TARGETS = web.AppKey("targets", dict[str, Target])
PROBED = web.AppKey("probed", set[str])
METRICS = web.AppKey("metrics", Metrics)
SESSION = web.AppKey("session", aiohttp.ClientSession)
SCHEDULER = web.AppKey("scheduler", ProbeScheduler)
CAPACITY = web.AppKey("capacity", dict[str, TargetCapacity])
LOADS = web.AppKey("loads", list[LoadDriver])
WEB_CONFIG = web.AppKey("web_config", WebConfig)


def client_session() -> aiohttp.ClientSession:
    # No pool limit: the load driver's in-flight cap is the only bound, so a queued connection
    # never adds hidden client-side latency.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, enable_cleanup_closed=True)
    return request_session(connector, {"User-Agent": f"llm-prober/{__version__}"})


def build_app(settings: Settings, registry: CollectorRegistry | None = None) -> web.Application:
    web_file = settings.server.web_config_file
    web_config = load_web_config(web_file) if web_file is not None else WebConfig()
    app = web.Application(middlewares=web_config.middlewares())
    app[SETTINGS] = settings
    app[WEB_CONFIG] = web_config
    keep = settings.logging.log_prompts
    shard = settings.shard
    app[TARGETS] = {t.name: Target.from_config(t, keep_text=keep) for t in settings.targets}
    app[PROBED] = {n for n in app[TARGETS] if owns_target(n, shard.index, shard.count)}
    app[METRICS] = Metrics(registry if registry is not None else CollectorRegistry())
    # A replica reports capacity for the targets it probes and those it sends load to.
    app[CAPACITY] = {
        n: TargetCapacity(t, app[METRICS])
        for n, t in app[TARGETS].items()
        if n in app[PROBED] or t.config.load is not None
    }
    app[METRICS].registry.register(CapacityCollector(app[CAPACITY].values()))
    app.cleanup_ctx.append(_session_ctx)
    app.cleanup_ctx.append(_capacity_ctx)
    app.cleanup_ctx.append(_scheduler_ctx)
    app.router.add_get("/metrics", metrics_handler(app[METRICS].registry))
    app.router.add_get("/probe", _probe_now)
    app.router.add_get("/-/healthy", _healthy)
    app.router.add_get("/-/ready", _ready)
    app.router.add_get("/", _landing)
    return app


async def _session_ctx(app: web.Application) -> AsyncIterator[None]:
    app[SESSION] = client_session()
    yield
    await app[SESSION].close()


def owns_target(name: str, index: int, count: int) -> bool:
    """Deterministic shard assignment: every replica agrees without coordination."""
    return zlib.crc32(name.encode()) % count == index


async def _capacity_ctx(app: web.Application) -> AsyncIterator[None]:
    """Background load and server-metrics scrapes.

    Every replica carries 1/count of each target's load; only the replica that probes a
    target scrapes its server metrics, so summing across replicas counts the truth once.
    """
    session, settings = app[SESSION], app[SETTINGS]
    capacity = app[CAPACITY]
    loads: list[LoadDriver] = []
    for target in app[TARGETS].values():
        cfg = target.config.load
        if cfg is None:
            continue
        cap = capacity[target.name]
        rate = cfg.rate / settings.shard.count
        driver = LoadDriver(session, target, cfg, app[METRICS], rate=rate, on_result=cap.observe)
        cap.estimator.own_load = driver.in_flight
        loads.append(driver)
    app[LOADS] = loads
    watchers = [
        asyncio.create_task(cap.watch(session))
        for name, cap in capacity.items()
        if name in app[PROBED]
    ]
    for driver in loads:
        driver.start()
    yield
    grace = settings.server.grace_seconds
    await asyncio.gather(*(d.stop(grace) for d in loads))
    for task in watchers:
        task.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)


async def _scheduler_ctx(app: web.Application) -> AsyncIterator[None]:
    probed = [t for name, t in app[TARGETS].items() if name in app[PROBED]]
    scheduler = ProbeScheduler(app[SESSION], probed, app[METRICS], app[CAPACITY])
    app[SCHEDULER] = scheduler
    scheduler.start()
    yield
    await scheduler.drain(app[SETTINGS].server.grace_seconds)


async def _probe_now(request: web.Request) -> web.Response:
    name = request.query.get("target", "")
    target = request.app[TARGETS].get(name)
    if target is None:
        raise web.HTTPBadRequest(text=f"unknown target {name[:64]!r}: use a configured name\n")
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.describe_target(target.labels, target.slo, target.config.interval_seconds)
    result = await target.send(request.app[SESSION], time.perf_counter_ns())
    metrics.record(result, target.labels, "probe", target.slo)
    metrics.record_probe(result, target.labels, time.time())
    return web.Response(body=generate_latest(registry), content_type="text/plain", charset="utf-8")


async def _healthy(_: web.Request) -> web.Response:
    return web.Response(text="OK\n")


async def _ready(request: web.Request) -> web.Response:
    scheduler = request.app.get(SCHEDULER)
    if scheduler is None or not scheduler.ready:
        return web.Response(status=503, text="waiting for the first probe of every target\n")
    return web.Response(text="OK\n")


async def _landing(request: web.Request) -> web.Response:
    probed = request.app[PROBED]
    rows = "".join(
        f"<li>{html.escape(t.name)} ({html.escape(t.config.model)}"
        f"{'' if t.name in probed else ', probed by another shard'}) — "
        f'<a href="/probe?target={html.escape(t.name)}">probe now</a></li>'
        for t in request.app[TARGETS].values()
    )
    page = (
        f"<html><head><title>llm-prober</title></head><body><h1>llm-prober {__version__}</h1>"
        f'<p><a href="/metrics">Metrics</a> · <a href="/-/ready">Ready</a></p>'
        f"<h2>Targets</h2><ul>{rows}</ul></body></html>"
    )
    return web.Response(text=page, content_type="text/html")
