"""Protocol-level floods on 127.0.0.1: HTTP/1.1 that no aiohttp handler can write.

`flood_server()` answers `POST /{name}/v1/chat/completions` with the endless bytes of the
flood `name` of `FLOODS` (or the whole answer `name` of `ANSWERS`, byte for byte): a run
of 1xx responses, a status line or headers without end, chunk extensions, 1-byte chunks,
trailers. Each is a class of hostile endpoint whose every byte must count against a bound
of the request (prober/request/exchange.py). Writes are bounded in bytes (`MAX_BYTES`) and time
(`MAX_SECONDS`) and let the loop run after every 64 KiB, as `hostile.endless` does;
`Flooded` counts what was written and whether the client left.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field

from tests.support.servers import read_request

MAX_BYTES = 256 * 1024 * 1024
MAX_SECONDS = 10.0
YIELD_BYTES = 64 * 1024
EVENT = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
)


def _chunk(data: bytes, extension: bytes = b"") -> bytes:
    return b"%x" % len(data) + extension + b"\r\n" + data + b"\r\n"


def early_hints() -> Iterator[bytes]:
    """`103 Early Hints` without end (aiohttp reads 1xx responses in a loop, one by one)."""
    hint = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
    while True:
        yield hint * 64


def continues() -> Iterator[bytes]:
    while True:
        yield b"HTTP/1.1 100 Continue\r\n\r\n" * 256


def status_line() -> Iterator[bytes]:
    """A status line whose reason phrase never ends (aiohttp's own line limit: 8,190)."""
    yield b"HTTP/1.1 200 "
    while True:
        yield b"O" * 65536


def fat_headers() -> Iterator[bytes]:
    """Headers of 4 KB each, without end: aiohttp's 128-header limit would take 512 KB."""
    yield b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    for i in range(1_000_000):
        yield b"X-Pad-%d: " % i + b"a" * 4000 + b"\r\n"


def chunk_extensions() -> Iterator[bytes]:
    """1 MiB of chunk extension after each chunk size, then one event: once 2 GB parsed."""
    yield CHUNKED
    extension = b";" + b"x" * (1 << 20)
    while True:
        yield _chunk(EVENT, extension)


def tiny_chunks() -> Iterator[bytes]:
    """A keep-alive comment in 1-byte chunks: five bytes of framing per byte of body, and
    a Python call in aiohttp per chunk."""
    yield CHUNKED + _chunk(EVENT)
    comment = b"".join(_chunk(bytes([c])) for c in b": still here\n\n")
    while True:
        yield comment * 256


def trailers() -> Iterator[bytes]:
    """One event, the last chunk, then trailer fields without end."""
    yield CHUNKED + _chunk(EVENT) + b"0\r\n"
    for i in range(1_000_000):
        yield b"X-Trailer-%d: " % i + b"t" * 1000 + b"\r\n"


@dataclass(frozen=True)
class Flood:
    """A flood: its bytes, the words its request's error must hold, and the bound that
    cuts it (`interim`, `head`, `framing`; `line`: aiohttp's own 8,190-byte line limit)."""

    pieces: Callable[[], Iterator[bytes]]
    error: str
    bound: str


FLOODS: dict[str, Flood] = {
    "flood_early_hints": Flood(early_hints, "interim (1xx) responses", "interim"),
    "flood_continue": Flood(continues, "interim (1xx) responses", "interim"),
    "flood_status_line": Flood(status_line, "invalid HTTP response", "line"),
    "flood_headers": Flood(fat_headers, "response head larger than", "head"),
    "flood_chunk_extensions": Flood(chunk_extensions, "chunk framing larger than", "framing"),
    "flood_tiny_chunks": Flood(tiny_chunks, "chunk framing larger than", "framing"),
    "flood_trailers": Flood(trailers, "chunk framing larger than", "framing"),
}
END = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
END += b"data: [DONE]\n\n"
# Whole answers, byte for byte: what a well-behaved server may send, framing extras included.
ANSWERS: dict[str, bytes] = {
    "answer_chunked": CHUNKED + _chunk(EVENT) * 3 + _chunk(END) + b"0\r\n\r\n",
    "answer_extensions_trailers": (
        b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n" + CHUNKED
        + b"".join(_chunk(EVENT, b";seq=%d" % i) for i in range(3)) + _chunk(END, b";last")
        + b"0\r\nX-Checksum: 1234\r\nX-Served-By: edge-7\r\n\r\n"
    ),
}  # fmt: skip


@dataclass
class Flooded:
    """What the flood server did: requests, bytes written and client departures per flood."""

    requests: Counter[str] = field(default_factory=Counter)
    written: Counter[str] = field(default_factory=Counter)
    disconnects: Counter[str] = field(default_factory=Counter)
    base: str = ""

    def url(self, name: str) -> str:
        return f"{self.base}/{name}/v1"


async def _read_request(reader: asyncio.StreamReader) -> str:
    """One request's flood name (from its path), its body read; "" when the client left."""
    path = await read_request(reader, timeout=5)
    return path.strip("/").split("/")[0]


async def _flood(state: Flooded, name: str, writer: asyncio.StreamWriter) -> None:
    deadline = time.monotonic() + MAX_SECONDS
    unyielded = 0
    try:
        for piece in FLOODS[name].pieces():
            if writer.is_closing():  # the client has gone: asyncio warns on every write then
                raise ConnectionResetError
            writer.write(piece)
            state.written[name] += len(piece)
            unyielded += len(piece)
            if unyielded >= YIELD_BYTES:
                unyielded = 0
                await writer.drain()
                await asyncio.sleep(0)
            if state.written[name] >= MAX_BYTES or time.monotonic() > deadline:
                return
    except (ConnectionError, RuntimeError):  # the client closed (RuntimeError: uvloop)
        state.disconnects[name] += 1


@asynccontextmanager
async def flood_server(port: int = 0) -> AsyncIterator[Flooded]:
    """Serve every flood of `FLOODS` on a loopback port (a free one by default); yield the
    recorder."""
    state = Flooded()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            name = await _read_request(reader)
            state.requests[name] += 1
            if name in FLOODS:
                await _flood(state, name, writer)
            elif name in ANSWERS:
                writer.write(ANSWERS[name])
                state.written[name] += len(ANSWERS[name])
                await writer.drain()
                await reader.read(1)  # until the client closes or sends another request
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with suppress(ConnectionError):
                await writer.wait_closed()

    server = await asyncio.start_server(serve, "127.0.0.1", port)
    state.base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        server.close()
        await server.wait_closed()


@contextmanager
def flood_server_thread() -> Iterator[Flooded]:
    """`flood_server()` on an event loop of its own, in a thread: for tests that drive a
    daemon in another process from plain (synchronous) code."""
    loop = asyncio.new_event_loop()
    started: asyncio.Future[Flooded] = loop.create_future()
    stop = asyncio.Event()

    async def run() -> None:
        async with flood_server() as state:
            started.set_result(state)
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(run(),), daemon=True)
    thread.start()
    try:
        yield asyncio.run_coroutine_threadsafe(_wait(started), loop).result(timeout=10)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=MAX_SECONDS + 5)
        loop.close()


async def _wait(future: asyncio.Future[Flooded]) -> Flooded:
    return await future
