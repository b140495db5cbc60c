"""Small local servers on 127.0.0.1: any aiohttp app (plain or behind TLS), one handler on
every endpoint, the simulator behind TLS, a server whose HTTP is unparsable, and raw asyncio
servers that write each byte themselves (`raw_server`, `read_request`).

Each is an async context manager that yields the server's URL and tears it down on exit.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from aiohttp import web

from prober.request import Api, RequestSpec, Timeouts
from prober.sim import SimConfig, bound_port
from prober.sim import build_app as build_sim

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
# Client timeouts that suit these servers: short enough that a fault case ends in seconds.
FAST = Timeouts(connect_seconds=2, first_token_seconds=3, idle_seconds=3, total_seconds=5)
# A quick simulator with room for many targets at once.
SIM: dict[str, Any] = {"slots": 64, "prefill_base_seconds": 0.001, "decode_step_seconds": 0.01}
BAD_HTTP_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nBad Header Line\r\n\r\n"


def fast_spec(url: str) -> RequestSpec:
    """A 4-token chat request ("hi") to the OpenAI base `url`, with the `FAST` timeouts."""
    return RequestSpec(url, Api.CHAT, "m", "hi", 4, timeouts=FAST)


@asynccontextmanager
async def serve_app(
    app: web.Application, ssl_context: ssl.SSLContext | None = None
) -> AsyncIterator[str]:
    """Serve `app` on a free loopback port, behind TLS where `ssl_context` is given; yield its
    root URL (`http://127.0.0.1:N`, or `https://`)."""
    # Cancel handlers when the client goes away, so a sleeping handler never delays teardown.
    runner = web.AppRunner(app, shutdown_timeout=0.2, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    scheme = "http" if ssl_context is None else "https"
    try:
        yield f"{scheme}://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[str]:
    """Serve `handler` on every endpoint; yield the OpenAI base URL (`http://127.0.0.1:N/v1`)."""
    app = web.Application()
    for path in ("/v1/chat/completions", "/v1/completions", "/api/chat"):
        app.router.add_post(path, handler)
    async with serve_app(app) as root:
        yield f"{root}/v1"


@asynccontextmanager
async def serve_tls(app: web.Application, cert: Path, key: str | Path) -> AsyncIterator[str]:
    """Serve `app` behind TLS with a self-signed certificate; yield its https root."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    async with serve_app(app, context) as root:
        yield root


@asynccontextmanager
async def tls_simulator(cert: Path, key: str | Path) -> AsyncIterator[str]:
    """The simulator (`SIM`) behind TLS with a self-signed certificate; yields its https base."""
    async with serve_tls(build_sim(SimConfig(**SIM)), cert, key) as base:
        yield base


@asynccontextmanager
async def bad_http_server() -> AsyncIterator[str]:
    """Answers every request with an unparsable HTTP header block; yields its base URL."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(BAD_HTTP_RESPONSE)
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


RawServe = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def raw_server(serve: RawServe) -> AsyncIterator[str]:
    """An asyncio server on 127.0.0.1 calling `serve` for each connection (a client that
    hangs up ends it quietly; the connection is closed after it); yields its URL."""

    async def each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await serve(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(each, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        await server.wait_closed()


async def read_request(reader: asyncio.StreamReader, timeout: float = 30.0) -> str:
    """The path of one HTTP/1.1 request, its Content-Length body read; "" once the client
    has gone (or sent nothing for `timeout` seconds), or for a request line without one."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=timeout)
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
        return ""
    lines = head.split(b"\r\n")
    length = next(
        (int(x.split(b":")[1]) for x in lines if x.lower().startswith(b"content-length:")), 0
    )
    await reader.readexactly(length)
    parts = lines[0].split(b" ")
    return parts[1].decode() if len(parts) > 1 else ""
