"""prober.scrapes: concurrent scrapes share one render and one compression of it; a scrape
after a render ended gets a fresh one. Renders are counted, never timed: the endpoint's
worker is held until every scrape has arrived, so all of them come while one is in progress.
"""

from __future__ import annotations

import asyncio
import gzip
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client import Counter as Requests

from prober.scrapes import MetricsEndpoint, content_coding
from tests.support.servers import serve_app

SCRAPES = 24
OPENMETRICS = "application/openmetrics-text;version=1.0.0"
IDENTITY = {"Accept-Encoding": "identity"}  # aiohttp's client asks for gzip and deflate else


class Gated(ThreadPoolExecutor):
    """One worker that waits for `gate` before its first task; counts tasks by function."""

    def __init__(self) -> None:
        super().__init__(1)
        self.gate = threading.Event()
        self.tasks: Counter[str] = Counter()
        super().submit(self.gate.wait, 10)

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.tasks[getattr(fn, "__name__", "?")] += 1
        return super().submit(fn, *args, **kwargs)


def registry() -> tuple[CollectorRegistry, Requests]:
    reg = CollectorRegistry()
    requests = Requests("requests", "Requests.", ["target"], registry=reg)
    for i in range(50):
        requests.labels(f"t{i}").inc(i)
    return reg, requests


async def serve_counted(endpoint: MetricsEndpoint, arrived: list[int]) -> Any:
    @web.middleware
    async def count(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        arrived[0] += 1
        return await handler(request)

    app = web.Application(middlewares=[count])
    app.router.add_get("/metrics", endpoint.handle)
    return serve_app(app)


async def scrape_all(root: str, headers: list[dict[str, str]]) -> list[tuple[str, bytes]]:
    async with aiohttp.ClientSession(auto_decompress=False) as session:

        async def one(h: dict[str, str]) -> tuple[str, bytes]:
            async with session.get(f"{root}/metrics", headers=h) as resp:
                assert resp.status == 200
                body = await resp.read()
                if resp.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                return resp.headers["Content-Type"], body

        return await asyncio.gather(*(one(h) for h in headers))


async def until(predicate: Callable[[], bool]) -> None:
    for _ in range(200):
        if predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("not reached")


async def test_concurrent_scrapes_share_one_render_and_one_compression() -> None:
    reg, _ = registry()
    executor = Gated()
    endpoint = MetricsEndpoint(reg, executor)
    arrived = [0]
    headers = [{"Accept-Encoding": "gzip"}] * SCRAPES
    async with await serve_counted(endpoint, arrived) as root:
        scrapes = asyncio.ensure_future(scrape_all(root, headers))
        await until(lambda: arrived[0] == SCRAPES)  # every one is waiting for the render
        executor.gate.set()
        answers = await scrapes
    assert endpoint.shared.renders == 1
    assert executor.tasks == {"assemble": 1, "_compress": 1}
    assert len(set(answers)) == 1
    assert b'requests_total{target="t49"} 49.0' in answers[0][1]
    executor.shutdown()


async def test_each_format_has_its_own_render() -> None:
    reg, _ = registry()
    executor = Gated()
    endpoint = MetricsEndpoint(reg, executor)
    arrived = [0]
    headers = [{"Accept": OPENMETRICS if i % 2 else "", "Accept-Encoding": "identity"}
               for i in range(SCRAPES)]  # fmt: skip
    async with await serve_counted(endpoint, arrived) as root:
        scrapes = asyncio.ensure_future(scrape_all(root, headers))
        await until(lambda: arrived[0] == SCRAPES)
        executor.gate.set()
        answers = await scrapes
    assert endpoint.shared.renders == 2
    assert executor.tasks == {"assemble": 2}
    assert len(set(answers)) == 2
    assert all(body.endswith(b"# EOF\n") == ("openmetrics" in ctype) for ctype, body in answers)
    executor.shutdown()


async def test_a_scrape_after_a_render_ended_gets_a_fresh_one() -> None:
    reg, requests = registry()
    executor = Gated()
    executor.gate.set()
    endpoint = MetricsEndpoint(reg, executor)
    async with await serve_counted(endpoint, [0]) as root:
        (first,) = await scrape_all(root, [IDENTITY])
        requests.labels("t0").inc(7)
        (second,) = await scrape_all(root, [IDENTITY])
    assert endpoint.shared.renders == 2
    assert b'requests_total{target="t0"} 0.0' in first[1]
    assert b'requests_total{target="t0"} 7.0' in second[1]
    executor.shutdown()


def test_the_coding_is_the_one_aiohttp_would_choose() -> None:
    assert content_coding("gzip") == "gzip"
    assert content_coding("GZIP, deflate") == "deflate"  # aiohttp's order: deflate first
    assert content_coding("br") == "identity"
    assert content_coding("") == "identity"
