"""Test helpers: run the simulator and the daemon in-process on free ports, scrape metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from prober.settings import Settings
from prober.sim import SimConfig, bound_port, serve
from prober.web import build_app


@asynccontextmanager
async def simulator(**kwargs: Any) -> AsyncIterator[str]:
    """A running simulator; yields its base URL (without /v1)."""
    runner = await serve(SimConfig(**kwargs), "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def daemon(config: dict[str, Any]) -> AsyncIterator[tuple[str, web.Application]]:
    """A running daemon built from a settings dict; yields its base URL and app."""
    config = {"server": {"listen": "127.0.0.1:0", "grace_seconds": 2.0}, **config}
    app = build_app(Settings.model_validate(config))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = bound_port(runner)
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


def bound_port_of(runner: web.AppRunner) -> int:
    return bound_port(runner)


async def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """`/metrics` as {(sample name, sorted labels): value}.

    Parsed in a thread: a daemon with many targets exposes thousands of samples, and parsing
    them on the loop the daemon shares with the test would stall its probes for a tenth of a
    second a scrape (a thread gives the loop back every few milliseconds)."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return await asyncio.to_thread(parse_samples, text)


def parse_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A `/metrics` text as {(sample name, sorted labels): value}."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(samples: dict[Any, float], name: str, **labels: str) -> float:
    """Sum of the samples named `name` whose labels include `labels`."""
    total = 0.0
    for (sample_name, sample_labels), v in samples.items():
        if sample_name == name and all((k, w) in sample_labels for k, w in labels.items()):
            total += v
    return total


async def wait_for(predicate: Any, timeout: float, interval: float = 0.2) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(interval)
