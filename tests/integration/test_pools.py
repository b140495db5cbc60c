"""One connection pool per target: a connection opened for one target never carries another
target's request, even to the same host and port, and every pool is closed at shutdown.

A raw keep-alive server on 127.0.0.1 notes, for each connection, the paths of the requests
it carried; two targets differ only by path. Probes of both reuse their own connections
(pooling works), and no connection saw both targets' paths.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from prober.web import FLEET
from tests.support.daemon import daemon, scrape, value, wait_for
from tests.support.hostile import whole_answer
from tests.support.servers import raw_server, read_request

REQUESTS_PER_CONNECTION = 50


@asynccontextmanager
async def keepalive_server(paths: list[list[str]]) -> AsyncIterator[str]:
    """Answers every request whole and keeps the connection; `paths[i]`: connection i's."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen: list[str] = []
        paths.append(seen)
        for _ in range(REQUESTS_PER_CONNECTION):
            if not (path := await read_request(reader)):
                break
            seen.append(path)
            writer.write(whole_answer(2))
            await writer.drain()

    async with raw_server(serve) as url:
        yield url


async def test_a_connection_never_carries_two_targets() -> None:
    paths: list[list[str]] = []
    async with keepalive_server(paths) as base:
        common = {"model": "m", "jitter_seconds": 0, "warmup": 0, "max_tokens": 2}
        # Out of step, so that one shared pool would hand each target the other's connections.
        config = {"targets": [
            {**common, "name": n, "url": f"{base}/{n}/v1", "interval_seconds": interval}
            for n, interval in (("a", 0.2), ("b", 0.33))
        ]}  # fmt: skip
        async with daemon(config) as (url, app):
            sessions = {n: m.session for n, m in app[FLEET].members.items()}

            async def probed() -> bool:
                samples = await scrape(url)
                ok = [value(samples, "llmprober_requests_total", target=n, outcome="ok")
                      for n in "ab"]  # fmt: skip
                return min(ok) >= 6

            await wait_for(probed, timeout=30)
    assert all(session.closed for session in sessions.values())
    targets = [{path.split("/")[1] for path in seen} for seen in paths if seen]
    assert all(len(t) == 1 for t in targets), paths  # no connection carried both
    assert {"a", "b"} == set().union(*targets)
    # Pooling works: within a target, connections were reused (fewer than its requests).
    for name in "ab":
        mine = [seen for seen in paths if seen and seen[0].split("/")[1] == name]
        assert len(mine) < sum(len(seen) for seen in mine), paths
