"""A request the daemon's own server cannot parse is one log line, never a traceback."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from prober.logs import setup_logging

HOSTILE = [
    b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 1_000_000 + b"\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\n"
    + b"".join(b"X-%d: 1\r\n" % i for i in range(10_000))
    + b"\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nX-\x1b[31m: \x1b]0;pwned\x07\r\n\r\n",
]


@pytest.fixture
async def port() -> AsyncIterator[int]:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


async def _send(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
    except ConnectionError:
        pass
    answer = await asyncio.wait_for(reader.read(200), timeout=10)
    writer.close()
    return answer


async def test_each_unparseable_request_is_one_warning_line(port: int) -> None:
    out = io.StringIO()
    setup_logging("json", "info", stream=out)
    try:
        answers = [await _send(port, raw) for raw in HOSTILE]
    finally:
        text = out.getvalue()
        setup_logging("json", "warning")
    assert all(a.startswith(b"HTTP/1.") and b" 400 " in a for a in answers), answers
    lines = [json.loads(line) for line in text.splitlines()]
    bad = [line for line in lines if line["event"] == "bad_request"]
    assert len(bad) == len(HOSTILE), text
    assert all(line["level"] == "warning" and "exception" not in line for line in bad), bad
    assert "Traceback" not in text
    assert all(len(line["error"]) <= 200 and "\x1b" not in line["error"] for line in bad), bad
