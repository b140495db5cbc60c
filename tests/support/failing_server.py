"""Targets that fail in the ways an outage makes, on loopback: what `bench/failing_fleet.py` and
`tests/integration/test_failing_fleet.py` point a fleet of targets at.

    python -m tests.support.failing_server --port PORT   # prints the blackhole's port, serves

Each target's path picks its way of failing (`http://127.0.0.1:PORT/<way>/v1`):
`drip` (a 200 head, then one byte every 0.5 s), `slow_lines` (an SSE content line every 2 s),
`keepalive` (an SSE comment every 0.1 s and never a token); every connection ends after
`HOLD_SECONDS`. `blackhole` is another port, a listener whose backlog is full, so a connect
there never completes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import time

WAYS = ("blackhole", "drip", "slow_lines", "keepalive")
HOLD_SECONDS = 30.0  # every connection ends after this
HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n\r\n"
LINE = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
PIECES = {"drip": (b":", 0.5), "slow_lines": (LINE, 2.0), "keepalive": (b": ka\n\n", 0.1)}


def blackhole() -> tuple[socket.socket, list[socket.socket]]:
    """A listener whose backlog is full (and the sockets that fill it: keep them open)."""
    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(0)
    fillers = []
    for _ in range(8):  # fill the backlog: later connects never complete
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", hole.getsockname()[1]))
        fillers.append(s)
    return hole, fillers


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        await asyncio.wait_for(reader.readexactly(length), 10)
        piece, gap = PIECES[head.split(b" ")[1].split(b"/")[1].decode()]
        deadline = time.monotonic() + HOLD_SECONDS
        writer.write(HEAD)
        while time.monotonic() < deadline:
            writer.write(piece)
            await writer.drain()
            await asyncio.sleep(gap)
    except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, KeyError, ValueError):
        pass
    finally:
        writer.close()


async def serve_failing(port: int) -> None:
    """`drip`, `slow_lines` and `keepalive` on `port`; prints the blackhole's port; forever."""
    hole, _fillers = blackhole()
    server = await asyncio.start_server(_serve, "127.0.0.1", port, backlog=4096)
    print(hole.getsockname()[1], flush=True)
    async with server:
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve_failing(parser.parse_args().port))
