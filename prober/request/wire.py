"""Where bytes meet the clock: the client session whose requests are stamped on the wire.

Two stamps would be late if taken where the request code runs, because a task only runs when
the event loop gets to it, after every callback queued before it:

- **send**: on Python < 3.12 aiohttp writes a request from a task of its own, one loop
  iteration after the request was set up. `t_send` comes from aiohttp's client trace
  (`on_request_chunk_sent`): aiohttp buffers the request line and headers and writes them
  with the first body chunk right after that signal, on every Python version.
- **arrival**: when a batched engine step sends a token to 200 streams at once, the loop
  receives all 200 sockets' bytes in one go (each `data_received` takes ~2 µs), then runs
  the 200 reading tasks one after another (~10-15 µs each). A stamp taken in the task would
  be late by the tasks ahead of it: up to ~2-3 ms for the last stream. The protocol notes
  when the loop last handed it bytes from the socket, and the reader stamps each read with
  that instant: never before the bytes it returns arrived, never after the read returned.

The same trace notes the connection's set-up for the phases (docs/design.md §2): name
resolution (`on_dns_resolvehost_*`, absent for an IP address or a cached name), whether a
pooled connection was reused (`on_connection_reuseconn`), and when a new one was ready
(`on_connection_create_end`). TCP-connected-before-TLS comes from the protocol itself:
asyncio builds it as soon as the socket is connected and calls `connection_made` only after
the TLS handshake, so the two stamps bracket the handshake.

Arrival stamping swaps aiohttp's private `connector._factory` (pinned in pyproject.toml to
the versions tests/unit/test_wire.py ran on). Where the swap cannot be made, reads are
stamped when they return (`fallback`: late by the tasks ahead, under batching); the daemon
says which at start-up (`report_stamping`: the `stamping` log event and
`llmprober_stamping_info{method="protocol"|"fallback"}`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import time
from collections import deque
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any, Literal

import aiohttp
from aiohttp.client_proto import ResponseHandler
from prometheus_client import CollectorRegistry

from prober import __version__
from prober.logs import get_logger
from prober.metric_specs import STAMPING_INFO, gauge
from prober.request.exchange import SLICE_BYTES, ExchangeMeter, ResponseTooLarge, exchange_meter

Stamping = Literal["protocol", "fallback"]
_SLICE_NS = 50_000  # parsing between two polls of the loop's sockets (`ReadPump`)
_OVERDUE_NS = 5_000_000  # a read waiting this long is parsed on the pump's next pass
_MAX_KEPT_BYTES = 256 * 1024  # read but not yet parsed, on one connection
_MAX_KEPT_READS = 8  # reads kept apart on one connection, each with its own stamp
_log = get_logger("prober.wire")


class SendStamp:
    """One request's trace stamps (0 until seen): `ns` when its first bytes were written,
    name resolution start and end, when a new connection was ready, and whether a pooled one
    was reused."""

    __slots__ = ("created_ns", "dns_end_ns", "dns_start_ns", "ns", "reused")

    def __init__(self) -> None:
        self.ns = 0
        self.dns_start_ns = 0
        self.dns_end_ns = 0
        self.created_ns = 0
        self.reused = False


class ReadPump:
    """Parses the pending reads of a session's connections, a slice of the loop at a time.

    A read is stamped in `data_received`; the parsing of its bytes (`on_read`) waits here, in
    the order the reads arrived. The pump runs from the loop's queue and hands the loop back
    after `_SLICE_NS` of parsing: the loop then polls the sockets again, stamping what arrived
    meanwhile, and runs what the parsed reads woke (a closed-loop worker writing its next
    request, a load driver's timer) before the rest of a burst is parsed. With one task woken
    per read instead, a batched step's 200 reads were all parsed before anything else ran: a
    request that ended early in the burst waited for the whole burst before its worker could
    send the next, and every socket's next read waited as long to be stamped.

    A slice is a share of the loop, so when the loop is busy with other work the pump would
    fall behind: reads that have waited `_OVERDUE_NS` are all parsed on the next pass,
    slice or not. Parsing is never later than that plus one pass of the loop (it is what
    notices a body past its bound, or a first token that moves a deadline).
    """

    __slots__ = ("_pending", "_scheduled")

    def __init__(self) -> None:
        self._pending: deque[ArrivalStampingHandler] = deque()
        self._scheduled = False

    def want(self, protocol: ArrivalStampingHandler) -> None:
        self._pending.append(protocol)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._run)

    def _run(self) -> None:
        pending = self._pending
        clock = time.perf_counter_ns
        start = clock()
        end, overdue = start + _SLICE_NS, start - _OVERDUE_NS
        try:
            while pending:
                pending.popleft().read_pending()
                if pending and clock() >= end and pending[0].waiting_ns > overdue:
                    break
        finally:
            if pending:
                asyncio.get_running_loop().call_soon(self._run)
            else:
                self._scheduled = False


class ArrivalStampingHandler(ResponseHandler):
    """aiohttp's client protocol, noting when the loop last handed it bytes (`received_ns`),
    when its socket was connected (`tcp_ns`: it is built then) and when the connection was
    made (`made_ns`: after the TLS handshake on a TLS connection).

    While `on_read` is set (by `body.BodyReader`, for a streamed body) a read is only stamped
    and kept when the loop hands it over: the session's `ReadPump` later gives it to aiohttp
    to parse, then calls `on_read`, outside any task (after each slice of a large read, too:
    once it says it wants no more, the rest of the read stays kept, unparsed). The loop's
    poll of its sockets thus costs a stamp and an append per read, so every socket of a
    burst is stamped within microseconds, however slow the parsing. Bytes reach aiohttp in
    the order they came; whatever is kept is given to it before anything else (a read while
    `on_read` is unset, the end of the connection).

    A connection goes back to the pool only after an exchange that ended cleanly with
    nothing unread (aiohttp's `should_close`); any byte the server sends between two
    exchanges closes it (`_unsolicited`).

    Every byte of an exchange is counted against its bounds (`exchange.py`): as it arrives,
    and as aiohttp parses it, a slice at a time. Past a bound nothing more is parsed, the
    exchange ends with `ResponseTooLarge` and the connection is closed (`_cut_off`)."""

    received_ns = 0
    read_ns = 0  # when the bytes aiohttp is parsing now arrived: their events' stamp
    made_ns = 0
    waiting_ns = 0  # the first read not parsed yet arrived then (the pump's queue)
    on_read: Callable[[], bool] | None = None  # False: the reader wants no more of the body

    def __init__(self, *args: Any, pump: ReadPump | None = None, **kwargs: Any) -> None:
        self.tcp_ns = time.perf_counter_ns()
        self._pump = ReadPump() if pump is None else pump
        self._kept: list[tuple[bytes, int]] = []  # each read not parsed yet, and its arrival
        self._kept_bytes = 0
        self._read_soon = False
        self.meter = ExchangeMeter()
        self._cut: ResponseTooLarge | None = None
        self._answer: Any = None  # the final response's payload (a StreamReader), once parsed
        super().__init__(*args, **kwargs)

    def set_response_params(self, **kwargs: Any) -> None:
        """aiohttp's call as it sends a request on this connection, in the request's task:
        an exchange begins, counted by the meter that task opened (`exchange.bounded`)."""
        self._answer = None
        self.meter = exchange_meter()
        self.meter.begin()
        super().set_response_params(**kwargs)

    def resume_reading(self, resume_parser: bool = True) -> None:
        # aiohttp's body buffer calls this for every chunk taken from it below its low-water
        # mark, paused or not; unpaused there is nothing to resume, and the call fed the
        # parser an empty read each time (a round through `data_received` per token, three
        # aiohttp calls per chunk of a flood of small chunks).
        if self._reading_paused or getattr(self, "_buffer_paused", False):
            super().resume_reading(resume_parser)

    def set_exception(self, exc: BaseException, *args: Any, **kwargs: Any) -> None:
        # Once cut, the cut is the exchange's error, whatever aiohttp sets after it: the loss
        # of the connection that follows would read as a server that hung up on a request.
        super().set_exception(self._cut or exc, *args, **kwargs)

    def _unsolicited(self) -> bool:
        """Bytes between two exchanges (the last answer ended whole, nothing unread, and no
        request since): a server that answers what was never asked (a forged response
        waiting in the pool for the next request, maybe another target's) has its connection
        closed, never reused."""
        answer = self._answer
        if answer is None or not answer.is_eof() or self._buffer or self._tail:
            return False
        self.force_close()
        if self.transport is not None:
            self.transport.close()
        return True

    def _parse(self, data: bytes) -> None:
        """aiohttp parses `data`, counted against the exchange's bounds."""
        if self._cut is not None:
            return
        meter = self.meter
        if not data or self._parser is None:  # resuming the parser, or no exchange begun
            super().data_received(data)
        elif meter.head_done and len(data) <= SLICE_BYTES:  # most reads: one slice of body
            super().data_received(data)
            meter.fed += len(data)
            if meter.fed - self._answer.total_bytes > meter.framing_line:
                self._cut_off(meter.framing_problem())
        else:
            self._parse_sliced(data)

    def _parse_sliced(self, data: bytes) -> None:
        """Parse `data` a slice at a time, checking the bounds after each: a flood of 1xx
        responses, of chunk extensions or of 1-byte chunks is cut within a slice."""
        meter, pos, end = self.meter, 0, len(data)
        while pos < end and self._cut is None and self.exception() is None:
            if meter.head_done:
                size = min(SLICE_BYTES, end - pos)
                super().data_received(data[pos : pos + size])
                meter.fed += size
                if meter.fed - self._answer.total_bytes > meter.framing_line:
                    problem = meter.framing_problem()
                elif pos + size < end and self.on_read is not None and not self.on_read():
                    # The reader is done with the body (its end, or a fault it found): what
                    # follows waits, unparsed. An endless stream thus costs the parsing up to
                    # its bound, not a whole read past it (256 KiB: ~3,000 chunks of events).
                    self._kept.insert(0, (data[pos + size :], self.read_ns))
                    self._kept_bytes += end - pos - size
                    return
                else:
                    problem = ""
            else:
                size = meter.head_room(end - pos)
                queued = len(self._buffer)
                super().data_received(data[pos : pos + size] if size < end else data)
                responses = [m for (m, _), _ in itertools.islice(self._buffer, queued, None)]
                problem = meter.headed(size, (m.code for m in responses))
                if meter.head_done and self._answer is None:
                    self._answer = self._payload
            pos += size
            if problem or not size:  # no size: the head is full (`headed` said so)
                self._cut_off(problem)

    def _cut_off(self, problem: str) -> None:
        """Past a bound: nothing more is parsed, the exchange (its response, or the body being
        read) ends with `ResponseTooLarge`, and the connection is closed."""
        exc = ResponseTooLarge(problem)
        self._cut = exc
        self._kept, self._kept_bytes = [], 0
        self.set_exception(exc)
        if self._answer is not None:
            self._answer.set_exception(exc)
        if self.transport is not None:
            self.transport.close()
        if self.on_read is not None:
            self.on_read()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made_ns = time.perf_counter_ns()
        super().connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._cut is not None:
            return
        if data:  # aiohttp also calls it with b"" to resume its parser: no arrival
            self.received_ns = time.perf_counter_ns()
            if self._unsolicited():
                return
            meter = self.meter
            meter.arrived += len(data)
            if meter.arrived > meter.total:
                self._cut_off(meter.total_problem())
                return
        if not data or self.on_read is None:
            self._give_kept()
            self.read_ns = self.received_ns
            self._parse(data)
            return
        self._kept.append((data, self.received_ns))
        self._kept_bytes += len(data)
        if self._kept_bytes > _MAX_KEPT_BYTES or len(self._kept) > _MAX_KEPT_READS:
            self.read_pending()  # a flood is parsed at once, as aiohttp alone would
        elif not self._read_soon:
            self._read_soon = True
            self.waiting_ns = self.received_ns
            self._pump.want(self)

    def eof_received(self) -> None:
        self._give_kept()
        super().eof_received()

    def connection_lost(self, exc: BaseException | None) -> None:
        answer = self._answer
        self.read_pending()  # aiohttp drops unread bytes once it has set the loss
        super().connection_lost(exc)
        if self._cut is not None and answer is not None:
            answer.set_exception(self._cut)  # aiohttp set "payload not completed" over it
        if self.on_read is not None:
            self.on_read()
        # The answer refers back to this protocol: as aiohttp drops its `_payload`, so that
        # a connection lost mid-body is freed when its last user lets go, not by a full
        # collection (a fleet's ended streams: thousands a minute).
        self._answer = None

    def read_pending(self) -> None:
        """Give aiohttp each kept read in turn and `on_read` what it parsed, stamped when that
        read arrived (the pump's call): joined, every event took the last read's stamp."""
        self._read_soon = False
        if self.on_read is None:
            self._give_kept()
            return
        while True:
            if self._kept:  # read again each turn: a cut off exchange drops what was kept
                data, self.read_ns = self._kept.pop(0)
                self._kept_bytes -= len(data)
                self._parse(data)
            if self.on_read is None or not self.on_read() or not self._kept:
                return

    def _give_kept(self) -> None:
        if kept := self._kept:
            data = kept[0][0] if len(kept) == 1 else b"".join(d for d, _ in kept)
            self.read_ns = kept[-1][1]
            self._kept, self._kept_bytes = [], 0
            self._parse(data)


def arrival_clock(resp: aiohttp.ClientResponse) -> ArrivalStampingHandler | None:
    """The protocol stamping `resp`'s arrivals while its connection still carries them, or
    None: a session not from `request_session`, or a body that came whole with its headers
    (the connection is back in the pool, perhaps carrying another request: `carried_by`
    for what is fixed per connection)."""
    connection = resp.connection
    protocol = connection.protocol if connection is not None else None
    return protocol if isinstance(protocol, ArrivalStampingHandler) else None


def carried_by(resp: aiohttp.ClientResponse) -> ArrivalStampingHandler | None:
    """The protocol of the connection `resp` came on, even once that connection went back to
    the pool: a body complete with its headers (a short answer read in one go) releases it
    before the response is handed over, and `resp.connection` is None by then. Through a
    proxy's CONNECT tunnel that lost the TLS phase of 3 probes in 200. For what is fixed per
    connection (when it connected), never its arrivals. aiohttp keeps the protocol in
    `_protocol` from `start` on (the versions pyproject.toml pins); where a later one does
    not, this falls back to the connection, as `arrival_clock`."""
    protocol = getattr(resp, "_protocol", None)
    return protocol if isinstance(protocol, ArrivalStampingHandler) else arrival_clock(resp)


def request_session(
    connector: aiohttp.BaseConnector, headers: Mapping[str, str] | None = None
) -> aiohttp.ClientSession:
    """A session for `stream_request`: no cookies (probes must not share state), the trace
    that stamps the send, and connections whose protocol stamps arrivals."""
    _stamp_arrivals(connector)
    trace = aiohttp.TraceConfig()
    trace.on_request_chunk_sent.append(_on_request_chunk_sent)
    trace.on_dns_resolvehost_start.append(_on_dns_start)
    trace.on_dns_resolvehost_end.append(_on_dns_end)
    trace.on_connection_create_end.append(_on_created)
    trace.on_connection_reuseconn.append(_on_reused)
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        headers=headers,
        trace_configs=[trace],
    )


def client_session() -> aiohttp.ClientSession:
    """The session every command streams through: `request_session` on a pooled connector."""
    # No pool limit: the load driver's in-flight cap is the only bound, so a queued connection
    # never adds hidden client-side latency.
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60, enable_cleanup_closed=True)
    return request_session(connector, {"User-Agent": f"llm-prober/{__version__}"})


def stamping(session: aiohttp.ClientSession) -> Stamping:
    """How `session`'s arrivals are stamped: by the protocol, or when a read returns."""
    factory = getattr(session.connector, "_factory", None)
    return "protocol" if getattr(factory, "func", None) is ArrivalStampingHandler else "fallback"


def report_stamping(session: aiohttp.ClientSession, registry: CollectorRegistry) -> Stamping:
    """Say once, at start-up, which stamping is live: a log event and an info gauge."""
    method = stamping(session)
    gauge(STAMPING_INFO, registry).labels(method).set(1)
    if method == "protocol":
        _log.info("stamping", method=method)
    else:
        _log.warning(
            "stamping",
            method=method,
            aiohttp=aiohttp.__version__,
            note="arrivals stamped when each read returns: up to ms late under batching",
        )
    return method


def _stamp_arrivals(connector: aiohttp.BaseConnector) -> None:
    # aiohttp makes each connection's protocol with `connector._factory`, a partial of
    # ResponseHandler. Anything else (another aiohttp) is left alone: reads are then stamped
    # when they return, as before, `stamping()` says "fallback" and tests/unit/test_wire.py
    # fails.
    factory = getattr(connector, "_factory", None)
    if isinstance(factory, functools.partial) and factory.func is ResponseHandler:
        stamped = functools.partial(
            ArrivalStampingHandler, *factory.args, pump=ReadPump(), **factory.keywords
        )
        with contextlib.suppress(AttributeError, TypeError):  # read-only there: the fallback
            connector._factory = stamped  # type: ignore[assignment]


async def _on_request_chunk_sent(
    session: aiohttp.ClientSession,
    ctx: SimpleNamespace,
    params: aiohttp.TraceRequestChunkSentParams,
) -> None:
    # The first chunk is the send (see the module's docstring). Not the headers signal: it
    # fires before the write is even scheduled.
    stamp = ctx.trace_request_ctx
    if isinstance(stamp, SendStamp) and not stamp.ns:
        stamp.ns = time.perf_counter_ns()


def _stamps(ctx: SimpleNamespace) -> SendStamp | None:
    stamp = ctx.trace_request_ctx
    return stamp if isinstance(stamp, SendStamp) else None


async def _on_dns_start(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: object) -> None:
    if (stamp := _stamps(ctx)) is not None:
        stamp.dns_start_ns = time.perf_counter_ns()


async def _on_dns_end(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: object) -> None:
    if (stamp := _stamps(ctx)) is not None:
        stamp.dns_end_ns = time.perf_counter_ns()


async def _on_created(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: object) -> None:
    if (stamp := _stamps(ctx)) is not None:
        stamp.created_ns = time.perf_counter_ns()


async def _on_reused(_: aiohttp.ClientSession, ctx: SimpleNamespace, __: object) -> None:
    if (stamp := _stamps(ctx)) is not None:
        stamp.reused = True
