"""Where `t_send` is stamped: just before the request is written to the connection.

Ordering only, never durations: the connection is handed to the request before it can be
written (a connector subclass notes when), and the server (same process, same clock) sees
the request after it was written.
"""

from __future__ import annotations

import asyncio
import sys
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.client_reqrep import ClientRequest
from aiohttp.connector import Connection
from aiohttp.tracing import Trace

from prober.request import stream_request
from prober.request.wire import request_session
from prober.result import Outcome
from tests.support.net import closed_port
from tests.support.servers import fast_spec, serve
from tests.support.sse import chunk, sse, start_stream, streaming


class MarkingConnector(aiohttp.TCPConnector):
    """Notes, per X-Request-Id, when a connection was handed to the request, and when the loop
    next ran a callback after that."""

    def __init__(self) -> None:
        super().__init__(limit=0)
        self.connected_ns: dict[str, int] = {}
        self.next_callback_ns: dict[str, int] = {}

    async def connect(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> Connection:
        conn = await super().connect(req, traces, timeout)
        request_id = req.headers["X-Request-Id"]
        self.connected_ns[request_id] = time.perf_counter_ns()
        asyncio.get_running_loop().call_soon(self._mark, request_id)
        return conn

    def _mark(self, request_id: str) -> None:
        self.next_callback_ns[request_id] = time.perf_counter_ns()


async def test_t_send_lies_between_connection_and_arrival_in_a_burst() -> None:
    # The events carry no "id", so each result keeps its X-Request-Id as request_id.
    arrived_ns: dict[str, int] = {}

    async def handler(request: web.Request) -> web.StreamResponse:
        arrived_ns[request.headers["X-Request-Id"]] = time.perf_counter_ns()
        resp = await start_stream(request)
        await resp.write(sse({"choices": [{"index": 0, "delta": {"content": "a"}}]}))
        await resp.write(sse("[DONE]"))
        return resp

    connector = MarkingConnector()
    async with serve(handler) as url, request_session(connector) as session:
        t_sched = time.perf_counter_ns()
        results = await asyncio.gather(
            *(stream_request(session, fast_spec(url), t_sched) for _ in range(50))
        )
    for r in results:
        assert r.outcome is Outcome.OK, r.error
        assert r.t_first_byte_ns is not None
        connected, arrived = connector.connected_ns[r.request_id], arrived_ns[r.request_id]
        assert r.t_sched_ns <= connected <= r.t_send_ns <= arrived <= r.t_first_byte_ns


@pytest.mark.skipif(sys.version_info >= (3, 12), reason="aiohttp writes inside send() there")
async def test_t_send_is_the_deferred_write_not_the_request_set_up() -> None:
    # Python < 3.12: aiohttp builds and buffers the request right after connecting, then
    # writes it from a task that runs after callbacks already queued, such as the
    # connector's mark. A stamp taken while the request is set up (at the start, or on the
    # headers signal) comes before the mark; the write comes after it.
    connector = MarkingConnector()
    handler = streaming([chunk({"content": "a"}), sse("[DONE]")])
    async with serve(handler) as url, request_session(connector) as session:
        r = await stream_request(session, fast_spec(url), time.perf_counter_ns())
    assert r.outcome is Outcome.OK, r.error
    [marked] = connector.next_callback_ns.values()
    assert marked <= r.t_send_ns


async def test_nothing_written_falls_back_to_the_attempt_start() -> None:
    async with request_session(aiohttp.TCPConnector()) as session:
        t_sched = time.perf_counter_ns()
        spec = fast_spec(f"http://127.0.0.1:{closed_port()}/v1")
        r = await stream_request(session, spec, t_sched)
    assert r.outcome is Outcome.CONNECT_ERROR
    assert t_sched <= r.t_send_ns <= r.t_end_ns


async def test_after_a_stale_connection_t_send_is_the_retry_write() -> None:
    """The first request keeps its connection alive; the second, sent on it, finds the server
    closing it and is retried on a connection of its own."""
    body = chunk({"content": "a"}) + sse("[DONE]")
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    answer += b"Content-Length: %d\r\n\r\n" % len(body) + body
    seen_ns: list[int] = []  # when each request reached the server

    async def read_request(reader: asyncio.StreamReader) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        seen_ns.append(time.perf_counter_ns())
        length = next(
            int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
            if line.startswith(b"content-length:")
        )  # fmt: skip
        await reader.readexactly(length)

    async def serve_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(answer)
        if len(seen_ns) == 1:
            await read_request(reader)  # the second request, on the kept-alive connection
        writer.close()

    server = await asyncio.start_server(serve_once, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    async with server, request_session(aiohttp.TCPConnector()) as session:
        first = await stream_request(session, fast_spec(url), time.perf_counter_ns())
        second = await stream_request(session, fast_spec(url), time.perf_counter_ns())
    assert (first.outcome, second.outcome) == (Outcome.OK, Outcome.OK), second.error
    assert len(seen_ns) == 3
    _, stale_seen, retry_seen = seen_ns
    assert stale_seen < second.t_send_ns <= retry_seen
