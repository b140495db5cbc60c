"""`llm-prober demo`: the simulator and the daemon in one process, URLs printed.

The daemon probes the simulator every few seconds and drives open-loop background load at
it, so every panel of the dashboards has data within a minute.
"""

from __future__ import annotations

import asyncio
import signal

from aiohttp import web

from prober.logs import setup_logging
from prober.settings import LoadConfig, ServerConfig, Settings, TargetConfig
from prober.sim import SimConfig, serve
from prober.web import build_app


def demo_settings(port: int, sim_port: int, load_rate: float) -> Settings:
    sim = f"http://127.0.0.1:{sim_port}"
    target = TargetConfig(
        name="sim",
        url=f"{sim}/v1",
        model="sim",
        interval_seconds=5.0,
        metrics_url=f"{sim}/metrics",
        load=LoadConfig(rate=load_rate, max_in_flight=64) if load_rate > 0 else None,
    )
    return Settings(server=ServerConfig(listen=f"127.0.0.1:{port}"), targets=[target])


async def _run(port: int, sim_port: int, load_rate: float) -> None:
    settings = demo_settings(port, sim_port, load_rate)
    sim_runner = await serve(SimConfig(model="sim", reasoning_tokens=4), "127.0.0.1", sim_port)
    runner = web.AppRunner(build_app(settings), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"simulator: http://127.0.0.1:{sim_port}/v1  (its truth: /metrics)", flush=True)
    print(f"llm-prober metrics: http://127.0.0.1:{port}/metrics", flush=True)
    print(f"landing page: http://127.0.0.1:{port}/   — Ctrl-C to stop", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()
    await sim_runner.cleanup()


def run_demo(port: int, sim_port: int, load_rate: float) -> int:
    setup_logging("auto", "info")
    asyncio.run(_run(port, sim_port, load_rate))
    return 0
