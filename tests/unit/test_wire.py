"""prober.request.wire: reads are stamped when the loop received their bytes, not when they were
parsed; the parsing gives the loop back between slices. Ordering and wide margins only: the
loop is blocked on purpose for 100 ms, and the assertions allow half of that."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import aiohttp
import pytest
from aiohttp import web

from prober.request import Api, RequestSpec, stream_request, wire
from prober.request.wire import ArrivalStampingHandler, request_session
from prober.result import RequestResult
from prober.runtime import EventLoopChoice, new_event_loop
from tests.support.servers import fast_spec, serve
from tests.support.sse import chunk, sse, start_stream

BLOCK_SECONDS = 0.1


HEADERS = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


@contextmanager
def two_stream_server(go: threading.Event) -> Iterator[tuple[str, threading.Event, list[int]]]:
    """A plain-socket server in a thread: answers two requests with SSE headers, then, once
    `go` is set, writes one token to both sockets back to back and notes when (perf_counter
    ns, the same clock as the client's), then ends both streams."""
    listener = socket.create_server(("127.0.0.1", 0))
    headers_sent = threading.Event()
    written: list[int] = []

    def run() -> None:
        conns = []
        for _ in range(2):
            conn, _ = listener.accept()
            request = b""
            while b"\r\n\r\n" not in request:
                request += conn.recv(65536)
            head, _, body = request.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            while len(body) < length:
                body += conn.recv(65536)
            conn.sendall(HEADERS)
            conns.append(conn)
        headers_sent.set()
        go.wait(10)
        written.append(time.perf_counter_ns())
        for conn in conns:
            conn.sendall(chunk({"content": "hi"}))
        time.sleep(2 * BLOCK_SECONDS)
        for conn in conns:
            conn.sendall(chunk({}, "stop") + sse("[DONE]"))
            conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1", headers_sent, written
    finally:
        go.set()
        thread.join(5)
        listener.close()


async def test_a_busy_reader_does_not_delay_the_next_streams_stamp() -> None:
    """Two streams get their first token in the same loop iteration; whichever task runs
    first blocks the loop for 100 ms. The other stream's stamp must not include that wait."""
    go = threading.Event()
    with two_stream_server(go) as (url, headers_sent, written):
        async with request_session(aiohttp.TCPConnector(limit=0)) as session:

            def block() -> None:
                time.sleep(BLOCK_SECONDS)

            tasks = [
                asyncio.create_task(
                    stream_request(session, fast_spec(url), time.perf_counter_ns(), block)
                )
                for _ in range(2)
            ]
            assert await asyncio.to_thread(headers_sent.wait, 5)
            await asyncio.sleep(0.05)  # both tasks are now waiting in their first read
            go.set()
            time.sleep(0.05)  # the loop is held while both tokens arrive: one poll sees both
            results = await asyncio.gather(*tasks)
    assert [r.outcome.value for r in results] == ["ok", "ok"], [r.error for r in results]
    first = [r.t_first_token_ns for r in results]
    assert all(t is not None and t >= written[0] for t in first)
    assert abs(first[0] - first[1]) < BLOCK_SECONDS / 2 * 1e9  # type: ignore[operator]


async def test_every_read_stamp_is_an_arrival(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each token's stamp is the instant some `data_received` noted, never a later one."""
    arrivals: set[int] = set()
    original = ArrivalStampingHandler.data_received

    def noting(self: ArrivalStampingHandler, data: bytes) -> None:
        original(self, data)
        arrivals.add(self.received_ns)

    monkeypatch.setattr(ArrivalStampingHandler, "data_received", noting)

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        for token in ("a", "b", "c"):
            await asyncio.sleep(0.02)
            await resp.write(chunk({"content": token}))
        await resp.write(chunk({}, "stop") + sse("[DONE]"))
        return resp

    async with serve(handler) as url, request_session(aiohttp.TCPConnector()) as session:
        result = await stream_request(session, fast_spec(url), 0)
    assert result.output_tokens == 3
    assert set(result.token_event_ns) <= arrivals
    assert result.t_first_byte_ns in arrivals


async def test_reads_parsed_late_keep_their_own_stamps(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two tokens 30 ms apart, both kept before the pump gets to them (it runs 80 ms after
    the first arrived, as behind a busy loop): each is stamped when its own read arrived. Joined
    into one parse, both took the second's stamp: the first token late by 30 ms, the gap 0."""
    arrivals: set[int] = set()
    original = ArrivalStampingHandler.data_received

    def noting(self: ArrivalStampingHandler, data: bytes) -> None:
        original(self, data)
        arrivals.add(self.received_ns)

    def late(self: wire.ReadPump, protocol: ArrivalStampingHandler) -> None:
        self._pending.append(protocol)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(0.08, self._run)

    monkeypatch.setattr(ArrivalStampingHandler, "data_received", noting)

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        await asyncio.sleep(0.05)  # the body's reader is waiting: what follows is kept
        monkeypatch.setattr(wire.ReadPump, "want", late)
        for token in ("a", "b"):
            await resp.write(chunk({"content": token}))
            await asyncio.sleep(0.03)
        await resp.write(chunk({}, "stop") + sse("[DONE]"))
        return resp

    async with serve(handler) as url, request_session(aiohttp.TCPConnector()) as session:
        result = await stream_request(session, fast_spec(url), 0)
    assert result.output_tokens == 2, result.error
    first, second = result.token_event_ns
    assert {first, second} <= arrivals
    assert second - first > 15_000_000  # written 30 ms apart


async def test_no_empty_read_is_fed_to_the_parser_while_nothing_is_paused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """aiohttp's body buffer resumes its protocol for every chunk taken below its low-water
    mark: unpaused, that fed the parser an empty read per token. A stream of 40 tokens
    never fills the buffer, so no empty read may reach `data_received`."""
    empty = [0]
    original = ArrivalStampingHandler.data_received

    def counting(self: ArrivalStampingHandler, data: bytes) -> None:
        empty[0] += not data
        original(self, data)

    monkeypatch.setattr(ArrivalStampingHandler, "data_received", counting)

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        for _ in range(40):
            await resp.write(chunk({"content": "a"}))
            await asyncio.sleep(0.001)
        await resp.write(chunk({}, "stop") + sse("[DONE]"))
        return resp

    async with serve(handler) as url, request_session(aiohttp.TCPConnector()) as session:
        result = await stream_request(session, RequestSpec(url, Api.CHAT, "m", "hi", 64), 0)
    assert result.ok, result.error
    assert result.output_tokens == 40
    assert empty[0] == 0


async def test_a_plain_session_still_stamps_reads() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        await resp.write(chunk({"content": "a"}) + chunk({}, "stop") + sse("[DONE]"))
        return resp

    async with serve(handler) as url, aiohttp.ClientSession() as session:
        before = time.perf_counter_ns()
        result = await stream_request(session, fast_spec(url), before)
    assert result.ok
    assert before <= result.t_send_ns <= result.token_event_ns[0] <= result.t_end_ns


class _Pending:
    """A connection with a read waiting: each parse moves the fake clock on by `cost`."""

    def __init__(self, clock: list[int], cost: int, log: list[str], name: str) -> None:
        self.clock, self.cost, self.log, self.name = clock, cost, log, name
        self.waiting_ns = clock[0]
        self.wakes: str | None = None  # what the parse wakes (a task woken by a stream's end)

    def read_pending(self) -> None:
        self.clock[0] += self.cost
        self.log.append(self.name)
        if self.wakes is not None:
            asyncio.get_running_loop().call_soon(self.log.append, self.wakes)


async def test_the_pump_gives_the_loop_back_between_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ten reads of 0.4 slice each: three fill a slice; what a parse woke (the worker
    whose stream ended, about to send its next request) runs before the next slice, and
    every read is parsed in the order it came."""
    clock = [10**9]
    monkeypatch.setattr(wire.time, "perf_counter_ns", lambda: clock[0])
    log: list[str] = []
    pump = wire.ReadPump()
    reads = [_Pending(clock, wire._SLICE_NS * 4 // 10, log, str(i)) for i in range(10)]
    reads[1].wakes = "send"
    for read in reads:
        pump.want(cast(ArrivalStampingHandler, read))
    for _ in range(20):
        await asyncio.sleep(0)
    assert log == ["0", "1", "2", "send", "3", "4", "5", "6", "7", "8", "9"]
    # Empty again: the next read schedules a run of its own.
    pump.want(cast(ArrivalStampingHandler, _Pending(clock, 0, log, "late")))
    await asyncio.sleep(0)
    assert log[-1] == "late"


async def test_reads_that_waited_too_long_are_parsed_on_the_next_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The loop was busy elsewhere: reads queued longer ago than the overdue bound are all
    parsed in one pass, slice or not; fresh ones behind them wait for the next slice."""
    clock = [10**9]
    monkeypatch.setattr(wire.time, "perf_counter_ns", lambda: clock[0])
    log: list[str] = []
    pump = wire.ReadPump()
    old = [_Pending(clock, wire._SLICE_NS, log, f"old{i}") for i in range(4)]
    clock[0] += wire._OVERDUE_NS + 1  # they have waited past the bound when the pump runs
    fresh = [_Pending(clock, wire._SLICE_NS, log, f"new{i}") for i in range(3)]
    for read in old + fresh:
        pump.want(cast(ArrivalStampingHandler, read))
    await asyncio.sleep(0)  # one pass
    assert log == ["old0", "old1", "old2", "old3"]
    await asyncio.sleep(0)
    assert log[4:] == ["new0"]  # a slice each
    for _ in range(5):
        await asyncio.sleep(0)
    assert log[5:] == ["new1", "new2"]


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_an_end_followed_by_a_close_is_parsed_before_the_loss(loop_kind: str) -> None:
    """`[DONE]` and then the server's close arrive while the client's loop is held, the
    chunked body unterminated: what came before the loss is parsed before the loss is
    handled, so the stream has ended, not broken; on both loops."""
    if loop_kind == "uvloop":
        pytest.importorskip("uvloop")
    listener = socket.create_server(("127.0.0.1", 0))
    headers_sent, go = threading.Event(), threading.Event()

    def run() -> None:
        conn, _ = listener.accept()
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(65536)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        headers_sent.set()
        go.wait(10)
        body = chunk({"content": "hi"}) + chunk({}, "stop") + sse("[DONE]")
        conn.sendall(b"%x\r\n%s\r\n" % (len(body), body))
        conn.close()  # no terminating 0-chunk

    async def client() -> RequestResult:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
        async with request_session(aiohttp.TCPConnector()) as session:
            sent = stream_request(session, fast_spec(url), time.perf_counter_ns())
            task = asyncio.create_task(sent)
            assert await asyncio.to_thread(headers_sent.wait, 5)
            await asyncio.sleep(0.05)  # the headers are parsed, the body is being waited for
            go.set()
            time.sleep(0.05)  # the loop is held while the body and the close arrive
            return await task

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    loop, _ = new_event_loop(cast(EventLoopChoice, loop_kind))
    try:
        result = loop.run_until_complete(client())
    finally:
        loop.close()
        go.set()
        thread.join(5)
        listener.close()
    assert result.ok, result.error
    assert result.output_tokens == 1
