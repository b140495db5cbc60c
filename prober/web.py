"""The daemon's aiohttp application: one factory owns the whole lifecycle.

Routes: `/metrics` (prometheus-client's aiohttp handler on the daemon's own registry, with
the common formats rendered by `exposition.py`: the same bytes, faster, one render shared by
concurrent scrapes and made off the loop, `scrapes.py`; figures in docs/performance.md),
`/probe?target=NAME` (one probe now, its metrics in a fresh registry: the blackbox-exporter
pattern; only configured names are accepted, so it cannot be turned into a proxy),
`/-/healthy`, `/-/ready` and a landing page. With `server.web_config_file`, basic auth guards
every route but the two health checks, and `WEB_CONFIG.ssl_context()` serves them over TLS
(`webconfig.py`). The client sessions and the probe scheduler
start in `cleanup_ctx` and stop in reverse order.

Each target has a client session of its own, and with it a connection pool of its own
(`SESSIONS`): a connection opened for one target never carries another's request, even to
the same host and port (a forged answer left in a pooled connection could otherwise be
read by another target's request; `request/wire.py` closes such a connection too). Probes, load,
`/probe` and the engine `/metrics` scrape of a target all use its session.

Shutdown has one deadline, `server.grace_seconds` from the moment it begins (`on_shutdown`):
scheduled probes, background load and `/probe` requests in flight all drain at once within
it, and whatever is left then is cancelled. `/probe` runs at most one probe per target at a
time; a second request for a busy target is answered 429 at once, with `Retry-After`.
"""

from __future__ import annotations

import asyncio
import html
import time
import zlib
from collections.abc import AsyncIterator, Iterable

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest

from prober import __version__
from prober.capacity.own import OwnLoad
from prober.capacity.target import CapacityCollector, TargetCapacity
from prober.load import LoadDriver
from prober.metrics import Metrics
from prober.record import Mode, Recorder, ScrapeRecorder, cancelled
from prober.request.wire import client_session, report_stamping
from prober.result import RequestResult
from prober.schedule import ProbeScheduler
from prober.scrapes import metrics_handler
from prober.settings import Settings
from prober.targets import Target
from prober.webconfig import WebConfig

SETTINGS = web.AppKey("settings", Settings)
TARGETS = web.AppKey("targets", dict[str, Target])
PROBED = web.AppKey("probed", set[str])
METRICS = web.AppKey("metrics", Metrics)
SESSIONS = web.AppKey("sessions", dict[str, aiohttp.ClientSession])  # by target name
SCHEDULER = web.AppKey("scheduler", ProbeScheduler)
CAPACITY = web.AppKey("capacity", dict[str, TargetCapacity])
RECORDER = web.AppKey("recorder", Recorder)
LOADS = web.AppKey("loads", list[LoadDriver])
WEB_CONFIG = web.AppKey("web_config", WebConfig)


class Inflight:
    """What shutdown and `/probe` share: the targets with a `/probe` in flight and the one
    drain task, once shutdown began (set on the app before it starts, changed after)."""

    def __init__(self) -> None:
        self.probing: set[str] = set()
        self.sends: set[asyncio.Task[RequestResult]] = set()  # the upstream requests of /probe
        self.drain: asyncio.Task[None] | None = None

    async def drain_sends(self, grace_seconds: float) -> None:
        """Give `/probe` requests in flight the grace, then cancel them (aiohttp's own wait
        would take up to twice its timeout for a handler that does not end)."""
        if self.sends:
            _, pending = await asyncio.wait(set(self.sends), timeout=grace_seconds)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)


INFLIGHT = web.AppKey("inflight", Inflight)
# A /probe for a target whose previous one is still running is refused, and asked back later.
PROBE_RETRY_AFTER_SECONDS = 1


def build_app(settings: Settings, registry: CollectorRegistry | None = None) -> web.Application:
    # No `_created` series, in either format (docs/design.md, "Series hygiene"): each would be
    # one more series per counter and histogram child, which Prometheus stores as a gauge.
    # prometheus-client's switch is process-wide; a daemon process serves this exposition.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in the library
    web_config = settings.server.web_config  # read and validated once, by load_settings
    app = web.Application(middlewares=web_config.middlewares())
    app[SETTINGS] = settings
    app[WEB_CONFIG] = web_config
    keep = settings.logging.log_prompts
    shard = settings.shard
    app[TARGETS] = {t.name: Target.from_config(t, keep_text=keep) for t in settings.targets}
    app[PROBED] = {n for n in app[TARGETS] if owns_target(n, shard.index, shard.count)}
    app[METRICS] = Metrics(registry if registry is not None else CollectorRegistry())
    # A replica reports capacity for the targets it probes and those it sends load to; a
    # target's load driver counts its requests in flight in its capacity's `own_load`.
    scrapes = ScrapeRecorder(app[METRICS])
    app[CAPACITY] = {
        n: TargetCapacity(t, scrapes, own_load=OwnLoad() if t.config.load else None)
        for n, t in app[TARGETS].items()
        if n in app[PROBED] or t.config.load is not None
    }
    app[RECORDER] = Recorder(app[METRICS], app[CAPACITY])
    app[METRICS].registry.register(CapacityCollector(app[CAPACITY].values()))
    app[INFLIGHT] = Inflight()
    app.cleanup_ctx.append(_session_ctx)
    app.cleanup_ctx.append(_capacity_ctx)
    app.cleanup_ctx.append(_scheduler_ctx)
    app.on_shutdown.append(_begin_drain)
    app.router.add_get("/metrics", metrics_handler(app[METRICS].registry))
    app.router.add_get("/probe", _probe_now)
    app.router.add_get("/-/healthy", _healthy)
    app.router.add_get("/-/ready", _ready)
    app.router.add_get("/", _landing)
    return app


async def _session_ctx(app: web.Application) -> AsyncIterator[None]:
    sessions = {name: client_session() for name in app[TARGETS]}
    app[SESSIONS] = sessions
    # Every session is made the same way: one says which stamping is live for all.
    report_stamping(next(iter(sessions.values())), app[METRICS].registry)
    yield
    await asyncio.gather(*(session.close() for session in sessions.values()))


def owns_target(name: str, index: int, count: int) -> bool:
    """Deterministic shard assignment: every replica agrees without coordination."""
    return zlib.crc32(name.encode()) % count == index


async def _capacity_ctx(app: web.Application) -> AsyncIterator[None]:
    """Background load and server-metrics scrapes.

    Every replica carries 1/count of each target's load; only the replica that probes a
    target scrapes its server metrics, so summing across replicas counts the truth once.
    """
    sessions, settings, recorder = app[SESSIONS], app[SETTINGS], app[RECORDER]
    capacity = app[CAPACITY]
    loads: list[LoadDriver] = []
    for target in app[TARGETS].values():
        cfg = target.config.load
        if cfg is None:
            continue
        cap = capacity[target.name]
        session = sessions[target.name]
        shard = (settings.shard.index, settings.shard.count)
        loads.append(LoadDriver(session, target, cfg, recorder, own_load=cap.own_load, shard=shard))
    app[LOADS] = loads
    watchers = [
        asyncio.create_task(cap.watch(sessions[name]))
        for name, cap in capacity.items()
        if name in app[PROBED]
    ]
    for driver in loads:
        driver.start()
    yield
    await _drained(app)
    for task in watchers:
        task.cancel()
    await asyncio.gather(*watchers, return_exceptions=True)


async def _scheduler_ctx(app: web.Application) -> AsyncIterator[None]:
    probed = [t for name, t in app[TARGETS].items() if name in app[PROBED]]
    sessions: dict[str, aiohttp.ClientSession] = app[SESSIONS]
    scheduler = ProbeScheduler(sessions, probed, app[RECORDER])
    app[SCHEDULER] = scheduler
    scheduler.start()
    yield
    await _drained(app)


async def _begin_drain(app: web.Application) -> None:
    """Start draining probes and load as shutdown begins: aiohttp then waits for `/probe`
    handlers (its `shutdown_timeout`, the same grace) while they drain, not before."""
    inflight = app[INFLIGHT]
    if inflight.drain is None:
        inflight.drain = asyncio.create_task(_drain_all(app), name="drain")


async def _drain_all(app: web.Application) -> None:
    grace = app[SETTINGS].server.grace_seconds
    scheduler = app.get(SCHEDULER)
    drains = [d.stop(grace) for d in app.get(LOADS, [])]
    drains.append(app[INFLIGHT].drain_sends(grace))
    if scheduler is not None:
        drains.append(scheduler.drain(grace))
    await asyncio.gather(*drains)


async def _drained(app: web.Application) -> None:
    """Wait for the one drain (started now if shutdown skipped `on_shutdown`)."""
    await _begin_drain(app)
    drain = app[INFLIGHT].drain
    assert drain is not None
    await asyncio.shield(drain)


# An unknown `/probe?target=` lists this many configured names, then how many more.
LISTED_TARGETS = 20


def unknown_target(name: str, names: Iterable[str]) -> str:
    """One line for a `/probe` of no configured target: the names it could have been."""
    known = list(names)
    listed = ", ".join(known[:LISTED_TARGETS])
    more = f" and {len(known) - LISTED_TARGETS} more" if len(known) > LISTED_TARGETS else ""
    return f"unknown target {name[:64]!r}: the configured targets are {listed}{more}"


async def _probe_now(request: web.Request) -> web.Response:
    name = request.query.get("target", "")
    targets = request.app[TARGETS]
    target = targets.get(name)
    if target is None:  # the names are the configuration's: no request text but the quote
        raise web.HTTPNotFound(text=unknown_target(name, targets) + "\n")
    inflight = request.app[INFLIGHT]
    probing = inflight.probing
    if inflight.drain is not None:
        raise web.HTTPServiceUnavailable(text="shutting down\n")
    if name in probing:  # one in flight per target, as blackbox_exporter does
        raise web.HTTPTooManyRequests(
            text=f"a probe of {name} is in flight; retry later\n",
            headers={"Retry-After": str(PROBE_RETRY_AFTER_SECONDS)},
        )
    probing.add(name)
    t_sched_ns = time.perf_counter_ns()
    send = asyncio.create_task(target.send(request.app[SESSIONS][name], t_sched_ns))
    inflight.sends.add(send)
    try:
        result = await asyncio.shield(send)  # the drain, not the client, may cancel it
    except asyncio.CancelledError:
        if not send.cancelled():
            send.cancel()  # the handler itself was cancelled: take the request along
            raise
        result = cancelled(t_sched_ns, Mode.ON_DEMAND)  # cut at the shutdown deadline
    finally:
        inflight.sends.discard(send)
        probing.discard(name)
    registry = CollectorRegistry()
    recorder = Recorder(Metrics(registry))
    recorder.describe(target)
    recorder.record(target, result, Mode.ON_DEMAND)
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
