"""The simulator's aiohttp application: routes, lifecycle, and a runner for serving it.

`build_app` owns the lifecycle: the engine loop starts in `cleanup_ctx` and stops after the
app; `on_shutdown` cancels every open generation first, so streams that would run "forever"
(endless, stalled, hung faults) end with the server instead of holding shutdown for aiohttp's
full grace period.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from prober.sim import ollama_api, openai_api
from prober.sim.config import SimConfig
from prober.sim.engine import Engine
from prober.sim.faults import FaultPicker
from prober.sim.metrics import build_registry
from prober.sim.stamps import StampStore
from prober.sim.state import STATE, SimState

# Cancelled handlers finish within a few loop turns; this only bounds a misbehaving one.
_STREAM_CANCEL_WAIT_SECONDS = 2.0
# What aiohttp waits for handlers that were not ours to cancel (e.g. a /metrics scrape).
_SHUTDOWN_TIMEOUT_SECONDS = 2.0


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _stamps(request: web.Request) -> web.Response:
    record = request.app[STATE].stamps.get(request.match_info["id"])
    if record is None:
        return web.json_response({"error": "unknown or evicted request id"}, status=404)
    return web.json_response(record.as_json())


async def _engine_loop(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(app[STATE].engine.run(), name="sim-engine")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _end_streams(app: web.Application) -> None:
    tasks = [task for task in app[STATE].streams if not task.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=_STREAM_CANCEL_WAIT_SECONDS)


def build_app(cfg: SimConfig) -> web.Application:
    """A simulator app with its own engine, fault picker, stamp store and registry."""
    engine = Engine(cfg)
    app = web.Application()
    app[STATE] = SimState(
        cfg=cfg,
        engine=engine,
        faults=FaultPicker(cfg.fault_rates, cfg.seed),
        stamps=StampStore(),
        registry=build_registry(engine, cfg.model),
    )
    app.router.add_post("/v1/chat/completions", openai_api.chat_completions)
    app.router.add_post("/v1/completions", openai_api.completions)
    app.router.add_get("/v1/models", openai_api.models)
    app.router.add_post("/api/chat", ollama_api.chat)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/health", _health)
    app.router.add_get("/sim/requests/{id}", _stamps)
    app.cleanup_ctx.append(_engine_loop)
    app.on_shutdown.append(_end_streams)
    return app


async def serve(cfg: SimConfig, host: str, port: int) -> web.AppRunner:
    """Start the simulator on host:port (0 picks a free port; see `bound_port`).

    Stop it with `await runner.cleanup()`.
    """
    runner = web.AppRunner(
        build_app(cfg), access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT_SECONDS
    )
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def bound_port(runner: web.AppRunner) -> int:
    """The TCP port the runner's first site listens on."""
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    raise ValueError("runner has no TCP site")
