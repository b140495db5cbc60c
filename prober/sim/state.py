"""Per-application state of the simulator, shared by its handlers through one typed AppKey.

Everything a handler needs lives here and is built by `app.build_app`; nothing is global, so
two simulators in one process (as the tests run them) never share an engine or a registry.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CollectorRegistry

from prober.sim.config import SimConfig
from prober.sim.engine import Engine
from prober.sim.faults import FaultPicker
from prober.sim.stamps import StampStore


@dataclass(eq=False)
class SimState:
    """The engine, fault picker, stamp store and registry of one simulator app."""

    cfg: SimConfig
    engine: Engine
    faults: FaultPicker
    stamps: StampStore
    registry: CollectorRegistry
    # Tasks serving a generation; shutdown cancels them so "forever" faults end with the app.
    streams: set[asyncio.Task[object]] = field(default_factory=set)


STATE = web.AppKey("sim_state", SimState)
