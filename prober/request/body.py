"""A streamed response body into a `StreamState`, each read parsed as the loop hands it over.

On a connection from `wire.request_session` the body is **pushed**: the protocol stamps each
read as it arrives, and the session's `wire.ReadPump` later has aiohttp parse it and calls
back here, outside any task, a slice of the loop at a time (so the loop polls its sockets
between slices instead of after a whole burst of reads: docs/performance.md §6). The read is
parsed and counted in that callback; the request's task sleeps on one future until the
stream ends, fails or times out. Only `StreamReader`'s public calls are used (`read_nowait`,
`at_eof`).

On any other session (no stamping protocol: `wire.stamping` says `fallback`) the task
**pulls** with `readany`, stamping each read when it returns. Both paths parse through
`BodyReader.take`: what counts as a token, an end or a fault is one piece of code.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp

from prober.request.exchange import ExchangeBounds
from prober.request.sse import LineSplitter, SSEParser, StreamError
from prober.request.stream import StreamState
from prober.request.wire import ArrivalStampingHandler, arrival_clock

# After the end of a stream, how long and how much of what follows is read so the connection
# can go back to the pool (the chunked terminator usually follows within microseconds). A
# server that keeps sending, or holds the connection open, has its connection closed.
_AFTER_END_SECONDS = 0.05
_AFTER_END_BYTES = 64 * 1024
_BYTES_PER_EVENT = 4 * 1024  # body bytes allowed per event of the bound, beyond 2 lines
# Chunk framing allowed per event of the bound, beyond a fixed part for the trailers: a chunk
# costs 5-12 bytes of framing, and a server sends one or two per event (the event bound is
# already 4 per token asked for).
_FRAMING_PER_EVENT = 16
_FRAMING_BYTES = 4 * 1024


def stream_bounds(event_limit: int, max_line_bytes: int) -> ExchangeBounds:
    """What the exchange of a stream of at most `event_limit` events may receive: its body
    (`BodyReader.budget`), chunk framing in proportion, and the fixed head bounds."""
    body = 2 * max_line_bytes + _BYTES_PER_EVENT * event_limit
    return ExchangeBounds(body=body, framing=_FRAMING_PER_EVENT * event_limit + _FRAMING_BYTES)


class BodyReader:
    """One response body: its byte budget, its stall watch, and where the stream stands.

    At the first token the deadline moves from the first token's to `total_deadline`, and
    `streaming` turns true (the caller reads it to classify a fault)."""

    __slots__ = (
        "_content",
        "_deadline",
        "_ended",
        "_idle",
        "_idle_seconds",
        "_loop",
        "_protocol",
        "_total_deadline",
        "budget",
        "reader",
        "state",
        "tee",
    )

    def __init__(
        self,
        state: StreamState,
        reader: SSEParser | LineSplitter,
        content: aiohttp.StreamReader,
        *,
        max_line_bytes: int,
        idle_seconds: float,
        deadline: asyncio.Timeout,
        total_deadline: float,
        tee: Callable[[bytes], None] | None = None,
    ) -> None:
        """`tee` is handed every read before it is parsed (`/probe?debug=true`'s account)."""
        self.state = state
        self.tee = tee
        self.reader = reader
        self.budget = stream_bounds(state.event_limit or 0, max_line_bytes).body
        self._content = content
        self._loop = asyncio.get_running_loop()
        self._idle_seconds = idle_seconds
        self._deadline = deadline
        self._total_deadline = total_deadline
        self._idle: _IdleWatch | None = None
        self._ended: asyncio.Future[bool] | None = None
        self._protocol: ArrivalStampingHandler | None = None

    @property
    def streaming(self) -> bool:
        """A token has come: the deadline is the total's, and a stall is watched."""
        return self._idle is not None

    async def read(self, resp: aiohttp.ClientResponse) -> None:
        """Read `resp`'s body to the stream's end; raise what the stream or the connection
        raised (the caller classifies it)."""
        protocol = arrival_clock(resp)
        try:
            if protocol is not None:
                ended = await self._pushed(protocol)
            else:
                ended = await self._pulled()
            if ended:
                await _after_end(resp)
        finally:
            if self._idle is not None:
                self._idle.cancel()

    def take(self, chunk: bytes, t_ns: int) -> bool:
        """Parse one read stamped `t_ns`; True once the stream has ended (`[DONE]`)."""
        state = self.state
        state.first_byte(t_ns)
        if self.tee is not None:
            self.tee(chunk)
        self.budget -= len(chunk)
        if self.budget < 0:
            raise StreamError("body larger than its bound for max_tokens")
        if state.feed(self.reader, chunk, t_ns):
            if state.done:
                return True
            if state.t_first_token_ns is not None:
                if self._idle is not None:
                    self._idle.last = self._loop.time()
                else:
                    self._deadline.reschedule(self._total_deadline)
                    self._idle = _IdleWatch(self._loop, self._deadline, self._idle_seconds)
        return False

    async def _pulled(self) -> bool:
        content = self._content
        clock = time.perf_counter_ns
        while chunk := await content.readany():
            if self.take(chunk, clock()):
                return True
        self.state.close(self.reader, clock())
        return False

    async def _pushed(self, protocol: ArrivalStampingHandler) -> bool:
        ended: asyncio.Future[bool] = self._loop.create_future()
        self._ended = ended
        self._protocol = protocol
        protocol.on_read = self._on_read
        try:
            self._on_read()  # what came with the headers, stamped when it arrived
            return await ended
        finally:
            protocol.on_read = None
            if ended.done() and not ended.cancelled() and ended.exception() is None:
                # A whole stream: what the protocol kept after its end (the last chunk, say)
                # goes to aiohttp, so the connection can be reused (`_after_end`). After a
                # fault it stays unparsed: the connection is closed.
                protocol.read_pending()

    def _on_read(self) -> bool:
        """The protocol's callback: after each parsed read (or slice of one), and when the
        connection is lost. False once the stream has ended, failed or timed out."""
        ended, protocol = self._ended, self._protocol
        if ended is None or protocol is None or ended.done():  # ended, or cancelled (timeout)
            return False
        content = self._content
        try:
            # Until the body is empty: taking from it can resume aiohttp's parser (paused on
            # a full buffer, a flood), which refills it from bytes that came with this read,
            # and no later read may come to call again while the transport stays paused.
            while chunk := content.read_nowait():  # raises what ended the connection
                if self.take(chunk, protocol.read_ns):
                    ended.set_result(True)
                    return False
            if content.at_eof():
                self.state.close(self.reader, time.perf_counter_ns())
                ended.set_result(False)
                return False
        except Exception as exc:  # handed to the task, which classifies it
            ended.set_exception(exc)
            return False
        return True


class _IdleWatch:
    """The stall deadline: `idle` seconds after the last event, expiring `deadline` then.

    Moving the deadline on every event cost a timer-heap push and a cancelled handle per token
    (the largest item in the client's profile after parsing). Here an event only notes its
    time; the one timer, when it fires, expires the deadline if no event came since it was
    armed, else re-arms at last event + idle. It expires exactly when the per-event reschedule
    would have. Past the total deadline it is not armed: `deadline` already ends there.
    """

    __slots__ = ("_armed_for", "_deadline", "_handle", "_idle", "_loop", "last")

    def __init__(self, loop: asyncio.AbstractEventLoop, deadline: asyncio.Timeout, idle: float):
        self._loop = loop
        self._deadline = deadline
        self._idle = idle
        self._handle: asyncio.TimerHandle | None = None
        self.last = loop.time()
        self._armed_for = self.last
        self._arm()

    def _arm(self) -> None:
        when = self.last + self._idle
        total = self._deadline.when()
        if total is None or when < total:
            self._armed_for = self.last
            self._handle = self._loop.call_at(when, self._fire)
        else:
            self._handle = None

    def _fire(self) -> None:
        if self.last == self._armed_for:
            self._handle = None
            self._deadline.reschedule(self._loop.time())
        else:
            self._arm()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


async def _after_end(resp: aiohttp.ClientResponse) -> None:
    """Read briefly past the end so the connection can be reused; else close it."""
    content = resp.content
    if content.at_eof():
        return
    try:
        async with asyncio.timeout(_AFTER_END_SECONDS):
            seen = 0
            while seen <= _AFTER_END_BYTES:
                if not (chunk := await content.readany()):
                    return
                seen += len(chunk)
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass
    resp.close()
