"""prober.request.body: a body pushed from the protocol's callbacks is read to its end, through
aiohttp's flow control (a buffer past its high-water mark pauses the socket and the parser,
and taking from it resumes them)."""

from __future__ import annotations

import socket
import threading
import time

import aiohttp
import pytest

from prober.request import Api, RequestSpec, Timeouts, stream_request
from prober.request.wire import request_session
from prober.result import Outcome

LINE_LIMIT = 64 * 1024
CHUNK_BYTES = 700 * 1024  # each far above aiohttp's 128 KiB high-water mark


@pytest.mark.parametrize("chunks", [1, 2, 3])
async def test_a_flood_of_comments_hits_the_body_bound_not_a_timeout(chunks: int) -> None:
    """HTTP chunks of comment lines (no event, each far past aiohttp's high-water mark), sent
    at once, then the connection is held. Every byte must be read: past the body's bound
    (2 lines + 4 KiB an event for 4 tokens, 1.2 MiB) the stream is refused as the bytes
    come, not left to time out with bytes unread; under it, the held connection times out
    having read them all."""
    listener = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()
    # Long comment lines: a stream's line bound (`stream.max_lines`) stays out of the way.
    comments = (b": " + b"k" * 1000 + b"\n") * (CHUNK_BYTES // 1003)

    def run() -> None:
        conn, _ = listener.accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(65536)
        body = b"".join(b"%x\r\n%s\r\n" % (len(comments), comments) for _ in range(chunks))
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + body
        )
        done.wait(10)  # held open: nothing more comes
        conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    spec = RequestSpec(
        url, Api.CHAT, "m", "hi", 4, max_line_bytes=LINE_LIMIT,
        timeouts=Timeouts(connect_seconds=2, first_token_seconds=1.5, idle_seconds=1.5,
                          total_seconds=1.5),
    )  # fmt: skip
    try:
        async with request_session(aiohttp.TCPConnector()) as session:
            started = time.monotonic()
            result = await stream_request(session, spec, time.perf_counter_ns())
            elapsed = time.monotonic() - started
    finally:
        done.set()
        thread.join(5)
        listener.close()
    if chunks * CHUNK_BYTES > 2 * LINE_LIMIT + 4096 * 272:
        assert result.outcome is Outcome.PROTOCOL_ERROR, result.error
        # The body's bound, or the exchange's in all (prober/request/exchange.py): it counts the
        # bytes as they arrive, before aiohttp has parsed them into the body.
        assert "larger than its bound" in result.error or "in all" in result.error
        assert elapsed < 1.2  # refused when the bytes came, not at the deadline
    else:  # under the bound: the held connection times out, every byte having been read
        assert result.outcome is Outcome.TIMEOUT_FIRST_TOKEN, result.error
