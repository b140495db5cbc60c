"""prober.exposition's guard: when a prometheus-client internal it reads is not what it
expects, `/metrics` is still the library's answer, byte for byte, counted and logged once."""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.aiohttp import make_aiohttp_handler

from prober.exposition import FastExposition, fallback_counter, negotiate
from prober.logs import setup_logging
from prober.scrapes import metrics_handler

FALLBACKS = "llmprober_exposition_fallback_total"
# Accept headers the fast path serves itself (text 0.0.4 and 1.0.0, OpenMetrics 1.0.0).
FAST_ACCEPTS = [
    "",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "application/openmetrics-text;version=1.0.0",
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8",
]


class RenamedValue:
    """A value with prometheus-client's public face (`get`, `inc`) and another private
    layout, as an upgrade might bring: `_value` is gone. The library's encoders only call
    `get()`; the fast path reads `_value` and fails."""

    def __init__(self, value: float) -> None:
        self._amount = value

    def get(self) -> float:
        return self._amount

    def inc(self, amount: float) -> None:
        self._amount += amount


def registry_with_a_histogram() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    Counter("events", "Events.", ["target"], registry=registry).labels("a").inc(2)
    Gauge("level", "A gauge.", registry=registry).set(1.5)
    hist = Histogram("latency_seconds", "Latency.", ["target"], registry=registry)
    for value in (0.02, 0.3, 7.0):
        hist.labels("a").observe(value, {"request_id": "r1"})
    hist.labels("b").observe(0.5)
    return registry, hist


@asynccontextmanager
async def daemon_and_library(
    registry: CollectorRegistry,
) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    app = web.Application()
    app.router.add_get("/daemon", metrics_handler(registry))
    app.router.add_get("/library", make_aiohttp_handler(registry))
    async with TestClient(TestServer(app)) as client:
        yield client


async def answers(
    client: TestClient[web.Request, web.Application], accept: str
) -> list[tuple[int, str, bytes]]:
    """(status, content type, body) from the daemon's handler, then the library's."""
    out = []
    for path in ("/daemon", "/library"):
        headers = {"Accept": accept, "Accept-Encoding": "identity"}
        async with client.get(path, headers=headers) as resp:
            out.append((resp.status, resp.headers["Content-Type"], await resp.read()))
    return out


async def test_a_moved_internal_serves_the_librarys_bytes_counted_and_logged_once() -> None:
    registry, hist = registry_with_a_histogram()
    child = hist.labels("a")
    intact = child._sum
    child._sum = RenamedValue(intact.get())  # type: ignore[assignment]
    logs = io.StringIO()
    setup_logging("json", "info", stream=logs)
    try:
        async with daemon_and_library(registry) as client:
            for i, accept in enumerate(FAST_ACCEPTS, start=1):
                assert negotiate(accept)[0] is not None, accept  # a scrape the fast path takes
                daemon, library = await answers(client, accept)
                assert daemon == library, accept
                assert daemon[0] == 200
                assert f"{FALLBACKS} {float(i)}".encode() in daemon[2]
                assert b'latency_seconds_sum{target="a"} 7.32' in daemon[2]
            child._sum = intact  # put back: the fast path serves again, uncounted
            daemon, library = await answers(client, FAST_ACCEPTS[0])
            assert daemon == library
    finally:
        setup_logging("json", "info")
    assert registry.get_sample_value(FALLBACKS) == len(FAST_ACCEPTS)
    lines = [json.loads(x) for x in logs.getvalue().splitlines() if x.startswith("{")]
    fallbacks = [x for x in lines if x["event"] == "exposition_fallback"]
    assert len(fallbacks) == 1, fallbacks
    assert fallbacks[0]["level"] == "warning"
    assert fallbacks[0]["error"].startswith("AttributeError")
    assert "_value" in fallbacks[0]["error"]


def test_a_registry_without_its_internals_is_a_counted_fallback() -> None:
    """Any exception is a fallback, also where the registry's own lists are read."""
    registry, _ = registry_with_a_histogram()
    counter = fallback_counter(CollectorRegistry())
    fast = FastExposition(registry, counter)
    assert fast.render("text") is not None
    del registry._collector_to_names
    assert fast.render("text") is None
    assert fast.render("openmetrics") is None
    assert counter._value.get() == 2
