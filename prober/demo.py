"""`llm-prober demo`: the simulator and the daemon in one process, URLs printed.

The daemon probes the simulator every few seconds and drives open-loop background load at
it, so every panel of the dashboards has data within a minute. Both ports are bound before
anything starts: the simulator's on a free port by default (no engine's default port is taken
from a real engine running beside it), and a port in use is one line naming it and the flag
that changes it.
"""

from __future__ import annotations

import asyncio
import signal
import socket
from pathlib import Path

from aiohttp import web

from prober.logs import setup_logging
from prober.settings import ConfigError, LoadConfig, ServerConfig, Settings, TargetConfig
from prober.sim import SimConfig
from prober.sim import build_app as build_sim
from prober.web import build_app

DEFAULT_PORT = 9470
DEFAULT_SIM_PORT = 0  # a free port, printed: 8000 is vLLM's, 8080 llama-server's and TGI's
_DASHBOARDS = Path(__file__).resolve().parent.parent / "grafana" / "dashboards"


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


def bind_local(port: int, flag: str) -> socket.socket:
    """A listening socket on 127.0.0.1:`port`, or ConfigError naming the port and `flag`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(128)
    except OSError as exc:
        sock.close()
        why = exc.strerror or str(exc)
        raise ConfigError(
            [f"demo: port {port} is not free ({why}); choose another with {flag}"]
        ) from None
    return sock


def next_steps(port: int, sim_port: int) -> list[str]:
    """What to try once the demo runs."""
    base = f"http://127.0.0.1:{port}"
    dashboards = _DASHBOARDS if _DASHBOARDS.is_dir() else Path("grafana/dashboards")
    return [
        f"simulator:    http://127.0.0.1:{sim_port}/v1  (its true queue: /metrics)",
        f"metrics:      curl -s {base}/metrics | grep llmprober_ttft",
        f"probe now:    curl -s '{base}/probe?target=sim'",
        f"landing page: {base}/",
        f"dashboards:   import {dashboards}/*.json into Grafana,",
        "              or run it all: docker compose -f deploy/compose/compose.yml up",
        "Ctrl-C to stop.",
    ]


async def _run(port: int, sim_port: int, load_rate: float) -> None:
    daemon_sock = bind_local(port, "--port")
    try:
        sim_sock = bind_local(sim_port, "--sim-port")
    except ConfigError:
        daemon_sock.close()
        raise
    sim_port = sim_sock.getsockname()[1]
    sim_runner = web.AppRunner(build_sim(SimConfig(model="sim", reasoning_tokens=4)))
    await sim_runner.setup()
    await web.SockSite(sim_runner, sim_sock).start()
    runner = web.AppRunner(build_app(demo_settings(port, sim_port, load_rate)), access_log=None)
    await runner.setup()
    await web.SockSite(runner, daemon_sock).start()
    for line in next_steps(port, sim_port):
        print(line, flush=True)
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
