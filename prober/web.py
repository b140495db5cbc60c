"""The daemon's aiohttp application: one factory owns the whole lifecycle.

Routes: `/metrics` (prometheus-client's aiohttp handler on the daemon's own registry, with
the common formats rendered by `exposition.py`: the same bytes, faster, one render shared by
concurrent scrapes and made off the loop, `scrapes.py`; figures in docs/performance.md),
`/probe?target=NAME` (one probe now, its metrics in a fresh registry: the blackbox-exporter
pattern; only configured names are accepted, so it cannot be turned into a proxy),
`POST /-/reload` (the configuration read again and applied, `fleet/reload.py`: 200 with what
changed, 400 with the one line `check-config` would print, and nothing applied),
`/-/engine?target=NAME` (the engine's state, `capacity/state.py`: 200 for ok and busy, 503 for
stalled and down, the reason in one line: a liveness check for the engine, which never fails
for a full engine), `/-/healthy`, `/-/ready`, and the status page at `/` and `/targets/NAME`
(`status/`; `/probe?target=NAME&debug=true` answers the probe's own account as text). With
`server.web_config_file`, basic auth guards every route but the two health checks (`/-/engine`
too: its answers name targets; a kubelet sends the header, docs/design.md §12), and
`WEB.ssl_context` serves them over TLS (`webconfig.py`); a reload swaps both. The targets live
in the `FLEET` (`fleet/`): each target's session, capacity, load and probe job belong to its
name and change with a reload.
`DISCOVERY` (`discovery/`) is the one composer of the set the fleet runs: the static targets
and the discovered ones, at start, at each answer of a source and at each reload (the
`RELOADER` hands it the new configuration); its series are a collector on the registry. The
fleet and discovery start in `cleanup_ctx` and stop, drained, at shutdown.

Each target has a client session of its own, and with it a connection pool of its own
(`Member.session`): a connection opened for one target never carries another's request, even
to the same host and port (a forged answer left in a pooled connection could otherwise be
read by another target's request; `request/wire.py` closes such a connection too). Probes,
load, `/probe` and the engine `/metrics` scrape of a target all use its session.

Shutdown has one deadline, `server.grace_seconds` from the moment it begins (`on_shutdown`):
scheduled probes, background load and `/probe` requests in flight all drain at once within
it, and whatever is left then is cancelled. `/probe` runs at most one probe per target at a
time; a second request for a busy target is answered 429 at once, with `Retry-After`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterable

from aiohttp import web
from prometheus_client import CollectorRegistry, disable_created_metrics, generate_latest

from prober.fleet.compose import Discovery
from prober.fleet.fleet import Fleet
from prober.fleet.reload import ConfigSource, Reloader
from prober.metrics import Metrics
from prober.record import Mode, Recorder, cancelled
from prober.request.debug import ProbeTrace, tracing
from prober.request.wire import client_session, report_stamping
from prober.scrapes import metrics_handler
from prober.settings import Settings
from prober.status import add_status_routes, probe_account
from prober.webconfig import LiveWebConfig

SETTINGS = web.AppKey("settings", Settings)  # as at start; the one in use is RELOADER's
METRICS = web.AppKey("metrics", Metrics)
FLEET = web.AppKey("fleet", Fleet)
DISCOVERY = web.AppKey("discovery", Discovery)
RELOADER = web.AppKey("reloader", Reloader)
WEB = web.AppKey("web", LiveWebConfig)


class Inflight:
    """What shutdown and `/probe` share: the targets with a `/probe` in flight and the one
    drain task, once shutdown began (set on the app before it starts, changed after)."""

    def __init__(self) -> None:
        self.probing: set[str] = set()
        self.drain: asyncio.Task[None] | None = None


INFLIGHT = web.AppKey("inflight", Inflight)
# A /probe for a target whose previous one is still running is refused, and asked back later.
PROBE_RETRY_AFTER_SECONDS = 1


def build_app(
    settings: Settings,
    registry: CollectorRegistry | None = None,
    *,
    source: ConfigSource | None = None,
) -> web.Application:
    """The daemon on `settings`; `source` is where a reload reads the configuration again
    (`run --config`'s file; None: a reload is refused)."""
    # No `_created` series, in either format (docs/design.md, "Series hygiene"): each would be
    # one more series per counter and histogram child, which Prometheus stores as a gauge.
    # prometheus-client's switch is process-wide; a daemon process serves this exposition.
    disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped in the library
    live_web = LiveWebConfig(settings.server.web_config)  # read and validated by load_settings
    app = web.Application(middlewares=[live_web])
    app[SETTINGS] = settings
    app[WEB] = live_web
    app[METRICS] = Metrics(registry if registry is not None else CollectorRegistry())
    grace = settings.server.grace_seconds
    keep = settings.logging.log_prompts
    app[FLEET] = Fleet(app[METRICS], grace_seconds=grace, keep_text=keep)
    app[DISCOVERY] = Discovery(settings, app[FLEET])
    app[METRICS].registry.register(app[DISCOVERY])
    app[RELOADER] = Reloader(source, settings, app[DISCOVERY], live_web, app[METRICS].registry)
    app[INFLIGHT] = Inflight()
    app.cleanup_ctx.append(_fleet_ctx)
    app.on_shutdown.append(_begin_drain)
    app.router.add_get("/metrics", metrics_handler(app[METRICS].registry))
    app.router.add_get("/probe", _probe_now)
    app.router.add_post("/-/reload", _reload)
    app.router.add_get("/-/engine", _engine)
    app.router.add_get("/-/healthy", _healthy)
    app.router.add_get("/-/ready", _ready)
    add_status_routes(app, app[FLEET], app[RELOADER])  # /, /targets/NAME
    return app


async def _fleet_ctx(app: web.Application) -> AsyncIterator[None]:
    """The fleet on the configuration at start, probes scheduled, load running; at the end
    drained (the one drain) and closed.

    Every replica carries 1/count of each target's load; only the replica that probes a
    target (its shard) scrapes its server metrics, so summing across replicas counts the
    truth once."""
    async with client_session() as session:  # every session is made the same way
        report_stamping(session, app[METRICS].registry)
    fleet = app[FLEET]
    fleet.scheduler.start()
    await app[RELOADER].start()
    yield
    await app[RELOADER].close()
    await app[DISCOVERY].stop()
    await _drained(app)
    await fleet.close()


async def _begin_drain(app: web.Application) -> None:
    """Start draining probes and load as shutdown begins: aiohttp then waits for `/probe`
    handlers (its `shutdown_timeout`, the same grace) while they drain, not before."""
    inflight = app[INFLIGHT]
    if inflight.drain is None:
        grace = app[SETTINGS].server.grace_seconds
        inflight.drain = asyncio.create_task(app[FLEET].drain(grace), name="drain")


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
    members = request.app[FLEET].members
    member = members.get(name)
    if member is None:  # the names are the configuration's: no request text but the quote
        raise web.HTTPNotFound(text=unknown_target(name, members) + "\n")
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
    target = member.target
    t_sched_ns = time.perf_counter_ns()
    trace = ProbeTrace()  # with `debug=true`, the response's head and first lines
    debug = request.query.get("debug") == "true"
    with tracing(trace) if debug else contextlib.nullcontext(trace):
        send = asyncio.create_task(target.send(member.session, t_sched_ns))
    member.sends.add(send)  # drained with its member: at shutdown, or when a reload removes it
    try:
        result = await asyncio.shield(send)  # the drain, not the client, may cancel it
    except asyncio.CancelledError:
        if not send.cancelled():
            send.cancel()  # the handler itself was cancelled: take the request along
            raise
        result = cancelled(t_sched_ns, Mode.ON_DEMAND)  # cut at the deadline
    finally:
        member.sends.discard(send)
        probing.discard(name)
    registry = CollectorRegistry()
    recorder = Recorder(Metrics(registry))
    recorder.describe(target)
    recorder.record(target, result, Mode.ON_DEMAND)
    if debug:
        account = probe_account(target, result, trace, generate_latest(registry).decode())
        return web.Response(text=account, content_type="text/plain", charset="utf-8")
    return web.Response(body=generate_latest(registry), content_type="text/plain", charset="utf-8")


async def _reload(request: web.Request) -> web.Response:
    """`POST /-/reload`: 200 and what changed, or 400 and why nothing did."""
    reloaded = await request.app[RELOADER].reload("http")
    return web.Response(status=200 if reloaded.ok else 400, text=reloaded.message + "\n")


async def _engine(request: web.Request) -> web.Response:
    """`/-/engine?target=`: 200 while the engine serves (ok, busy), 503 when it is stalled or
    down; the body says why in one line. A target this replica does not watch (another
    shard probes it, and it has no load here) answers 200: nothing says it failed."""
    name = request.query.get("target", "")
    fleet = request.app[FLEET]
    if name not in fleet.members:
        raise web.HTTPNotFound(text=unknown_target(name, fleet.members) + "\n")
    cap = fleet.capacity.get(name)
    if cap is None:
        return web.Response(text=f"unknown: {name} is not probed by this replica\n")
    verdict = cap.engine_state()
    return web.Response(status=200 if verdict.serving else 503, text=verdict.reason + "\n")


async def _healthy(_: web.Request) -> web.Response:
    return web.Response(text="OK\n")


async def _ready(request: web.Request) -> web.Response:
    if not request.app[FLEET].scheduler.ready:
        return web.Response(status=503, text="waiting for the first probe of every target\n")
    return web.Response(text="OK\n")
