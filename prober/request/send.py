"""One streamed request → `RequestResult`. With `body` (the response body) and `wire` (the
session), the only modules that stream completions (`capacity.server` scrapes engine `/metrics` with
the same session).

`stream_request` never raises for server or network faults: every fault becomes an outcome
(docs/design.md §3; which one is `classify`'s, the deadlines `timeouts`'). Only cancellation
propagates. Stamps are taken before any parsing, so JSON decoding never inflates a latency.

With a session from `wire.request_session` (the daemon's, the bench's), `t_send` is when the
request is written and each read is stamped when the loop received its bytes from the socket
(`wire.py` says why both). With any other session `t_send` is the attempt's start (early by
the connection's set-up and, on Python < 3.12, by the loop iteration aiohttp waits before
writing) and a read's stamp is when the read returned to this task.
"""

from __future__ import annotations

import asyncio
import math
import ssl
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp
from multidict import CIMultiDict

from prober.kinds import Api
from prober.logs import safe_line
from prober.request import debug
from prober.request.activity import StreamActivity
from prober.request.body import BodyReader, stream_bounds
from prober.request.classify import (
    FAULTS,
    Attempt,
    Next,
    Phase,
    classify,
    printable,
    status_outcome,
)
from prober.request.exchange import ExchangeMeter, bounded
from prober.request.sse import DEFAULT_MAX_LINE_BYTES, LineSplitter, SSEParser
from prober.request.stream import StreamState, answer_chars, max_events, max_lines
from prober.request.timeouts import DEFAULT_TIMEOUTS, Timeouts
from prober.request.wire import SendStamp, carried_by, request_session
from prober.result import ConnectionFacts, Outcome, RequestResult

_ERROR_BODY_BYTES = 2048
_ERROR_BODY_SECONDS = 1.0  # an error body that trickles is cut here, not at the deadline
_RESULT_ERROR_CHARS = 300  # a prefix ("server error in stream: ") and a 200-character quote
_STALE_WITHIN_SECONDS = 0.25
_READ_BUFSIZE = 16 * 1024
MAX_RETRY_AFTER_SECONDS = 86_400.0


@dataclass(frozen=True, slots=True)
class RequestSpec:
    """What to send. `headers` already carry any credentials; they are never logged."""

    base_url: str
    api: Api
    model: str
    prompt: str
    max_tokens: int
    timeouts: Timeouts = DEFAULT_TIMEOUTS
    headers: Mapping[str, str] = field(default_factory=dict)
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    ssl: ssl.SSLContext | bool = True
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    keep_text: bool = False
    # Keep the answer's text for an answer check, up to `stream.answer_chars(max_tokens)`.
    keep_answer: bool = False
    # Open a connection of its own instead of a pooled one (what a new user meets).
    fresh_connection: bool = False
    # The forward proxy to go through (`http://host:port`, no credentials: what errors
    # name), and its credentials; None: direct.
    proxy: str | None = None
    proxy_headers: Mapping[str, str] = field(default_factory=dict)  # Proxy-Authorization
    # The target's live view of its streams: each token event is stamped on it as it arrives.
    activity: StreamActivity | None = field(default=None, compare=False)


def endpoint(base_url: str, api: Api) -> str:
    """The API's path joined to the base URL's, its query (Azure's `?api-version=`) kept."""
    base, sep, query = base_url.partition("?")  # a fragment is refused by `config.urls`
    base = base.rstrip("/")
    tail = "/chat/completions" if api is Api.CHAT else "/completions"
    path = base.removesuffix("/v1") + "/api/chat" if api is Api.OLLAMA else base + tail
    return path + sep + query


def request_body(spec: RequestSpec) -> dict[str, Any]:
    body: dict[str, Any] = {"model": spec.model, "stream": True}
    if spec.api is Api.COMPLETIONS:
        body["prompt"] = spec.prompt
    else:
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    if spec.api is Api.OLLAMA:
        body["options"] = {"num_predict": spec.max_tokens}
    else:
        body["max_tokens"] = spec.max_tokens
        body["stream_options"] = {"include_usage": True}
    body.update(spec.extra_body)
    return body


async def stream_request(
    session: aiohttp.ClientSession,
    spec: RequestSpec,
    t_sched_ns: int,
    on_first_token: Callable[[], None] | None = None,
) -> RequestResult:
    """Send `spec` as one streaming request scheduled at `t_sched_ns`; return what it yielded.

    `on_first_token` is called once, when the first token arrives (the load driver counts
    its requests still waiting for one). After a stale-connection retry, `t_send` is the
    retry's write, the one that reached the server; the deadlines stay the first attempt's.
    With `spec.fresh_connection` the request gets a connection of its own, closed after it.
    """
    if spec.fresh_connection:
        connector = aiohttp.TCPConnector(force_close=True)
        async with request_session(connector, session.headers) as own:
            # A new connection cannot be stale: nothing to retry.
            return await _Exchange(own, spec, t_sched_ns, on_first_token).run(retry=False)
    first = _Exchange(session, spec, t_sched_ns, on_first_token)
    try:
        return await first.run()
    except _StaleConnection:
        # A pooled keep-alive connection the server was closing as we reused it (llama-server
        # closes after every stream without saying so): nothing reached the server, so send
        # once more on a connection of its own, within the first attempt's deadlines.
        connector = aiohttp.TCPConnector(force_close=True)
        async with request_session(connector, session.headers) as fresh:
            retry = _Exchange(fresh, spec, t_sched_ns, on_first_token)
            return await retry.run(deadlines=first.deadlines, t_begin_ns=first.t_start_ns)


class _StaleConnection(Exception):
    pass


class _Exchange:
    """One attempt: its phase decides how a timeout or a broken connection is classified."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        spec: RequestSpec,
        t_sched_ns: int,
        on_first_token: Callable[[], None] | None,
    ) -> None:
        self.session = session
        self.spec = spec
        self.t_sched_ns = t_sched_ns
        request_id = uuid.uuid4().hex
        self.state = StreamState(
            request_id,
            ndjson=spec.api is Api.OLLAMA,
            keep_text=spec.keep_text,
            on_first_token=on_first_token,
            event_limit=max_events(spec.max_tokens),
            # An answer check's bound; `keep_text` (log_prompts) keeps more, and decides.
            text_limit=None
            if spec.keep_text or not spec.keep_answer
            else answer_chars(spec.max_tokens),
            activity=spec.activity,
        )
        self.phase = Phase.CONNECT  # FIRST_TOKEN once a response came; `body` says the rest
        self.body: BodyReader | None = None
        self.wall_start = time.time()
        self.t_start_ns = 0
        self.sent = SendStamp()  # set by the session's trace as the request is written
        self.deadlines = (0.0, 0.0)  # (first token, total) on the loop's clock
        self.t_begin_ns = 0  # the request's begin: this attempt's start, or the first's
        self.tcp_ns: int | None = None  # TLS only: socket connected, before the handshake
        # Every byte the server sends for this exchange counts against these (exchange.py).
        self.bounds = stream_bounds(self.state.event_limit or 0, spec.max_line_bytes)
        self.meter: ExchangeMeter | None = None  # what arrived, as the connection counted it

    def finish(
        self,
        outcome: Outcome,
        error: str = "",
        status: int | None = None,
        *,
        retry_after_seconds: float | None = None,
    ) -> RequestResult:
        """The attempt's one result: the stream's counts, this attempt's connection stamps."""
        sent = self.sent
        return self.state.result(
            outcome,
            # The one filter every error passes, whatever path made it: one printable line,
            # the key redacted (also split by an escape sequence the filter removes).
            error=safe_line(error, _RESULT_ERROR_CHARS),
            status=status,
            t_sched_ns=self.t_sched_ns,
            # Nothing written (no connection) or no trace on the session: the attempt's start.
            t_send_ns=sent.ns or self.t_start_ns,
            # A stream that reached its end ended then, whatever happened to the connection after.
            t_end_ns=self.state.t_done_ns or time.perf_counter_ns(),
            wall_start=self.wall_start,
            connection=ConnectionFacts(
                t_begin_ns=self.t_begin_ns,
                t_resolved_ns=sent.dns_end_ns or None,
                t_tcp_ns=self.tcp_ns,
                # A reused connection was ready as the attempt began (docs/design.md §2).
                t_connected_ns=self.t_start_ns if sent.reused else (sent.created_ns or None),
                reused=True if sent.reused else (False if sent.created_ns else None),
                retry_after_seconds=retry_after_seconds,
                response_bytes=self.meter.arrived if self.meter and self.meter.engaged else None,
            ),
        )

    def concluded(self) -> RequestResult:
        """The result of a body that ended without a transport fault: the stream's verdict."""
        verdict = self.state.conclude()
        return self.finish(verdict.outcome, verdict.error)

    def _note_connection(self, resp: aiohttp.ClientResponse) -> None:
        """On a new TLS connection, when its socket connected (the handshake followed)."""
        if self.sent.reused or not self.spec.base_url.startswith("https://"):
            return
        protocol = carried_by(resp)
        if protocol is not None and self.t_start_ns <= protocol.tcp_ns <= protocol.made_ns:
            self.tcp_ns = protocol.tcp_ns

    async def run(
        self,
        *,
        deadlines: tuple[float, float] | None = None,
        t_begin_ns: int | None = None,
        retry: bool = True,
    ) -> RequestResult:
        """One attempt; `deadlines` (a first attempt's) make this a retry that may not retry."""
        loop = asyncio.get_running_loop()
        timeouts = self.spec.timeouts
        self.t_start_ns = time.perf_counter_ns()
        self.t_begin_ns = self.t_start_ns if t_begin_ns is None else t_begin_ns
        started = loop.time()
        may_retry = deadlines is None and retry
        if deadlines is None:
            total_deadline = started + timeouts.total_seconds
            deadlines = (
                min(started + timeouts.first_token_seconds, total_deadline),
                total_deadline,
            )
        self.deadlines = deadlines
        first_token_deadline, total_deadline = deadlines
        try:
            async with asyncio.timeout_at(first_token_deadline) as deadline:
                with bounded(self.bounds) as self.meter:
                    async with self._post() as resp:
                        return await self._answer(resp, deadline, total_deadline)
        except FAULTS as exc:
            now = loop.time()
            streaming = self.body is not None and self.body.streaming
            at = Attempt(
                phase=Phase.STREAMING if streaming else self.phase,
                stream_done=self.state.done,
                total_reached=now >= total_deadline - 1e-3,
                may_retry=may_retry and now - started < _STALE_WITHIN_SECONDS,
                timeouts=self.spec.timeouts,
                proxy=self.spec.proxy or "",
            )
            verdict = classify(exc, at)
            if verdict is Next.RETRY:
                raise _StaleConnection from exc
            _let_frames_go(exc)
            if verdict is Next.CONCLUDE:
                return self.concluded()
            outcome, error = verdict
            return self.finish(outcome, error)

    async def _answer(
        self, resp: aiohttp.ClientResponse, deadline: asyncio.Timeout, total_deadline: float
    ) -> RequestResult:
        """The response, from its status to the end of its body."""
        self.phase = Phase.FIRST_TOKEN
        self._note_connection(resp)
        trace = debug.current()  # `/probe?debug=true` only
        if trace is not None:
            trace.response(resp.status, resp.headers)
        if resp.status != 200:
            return await self._http_failure(resp)
        if encoding := _compressed(resp):
            return self.finish(
                Outcome.PROTOCOL_ERROR,
                f"compressed body refused (Content-Encoding: {encoding})",
                resp.status,
            )
        self.body = BodyReader(
            self.state,
            _reader(self.spec),
            resp.content,
            max_line_bytes=self.spec.max_line_bytes,
            idle_seconds=self.spec.timeouts.idle_seconds,
            deadline=deadline,
            total_deadline=total_deadline,
            tee=None if trace is None else trace.chunk,
        )
        await self.body.read(resp)
        return self.concluded()

    def _post(self) -> Any:
        spec = self.spec
        timeouts = spec.timeouts
        headers = CIMultiDict(spec.headers)
        headers["X-Request-Id"] = self.state.request_id  # what results and exemplars show
        # A compressed body would be inflated inside aiohttp's read, on the event loop, at any
        # ratio the server likes: ask for none, and refuse one that comes anyway.
        headers["Accept-Encoding"] = "identity"
        if spec.proxy and not spec.base_url.startswith("https://"):
            # Plain http goes to the proxy as the request itself: its credentials with it
            # (aiohttp sends `proxy_headers` only with a CONNECT).
            headers.update(spec.proxy_headers)
        return self.session.post(
            endpoint(spec.base_url, spec.api),
            json=request_body(spec),
            headers=headers,
            ssl=spec.ssl,
            allow_redirects=False,  # a 3xx is a failure (`_http_failure`), never followed
            auto_decompress=False,
            # aiohttp de-chunks a read into the body until 2 × this is buffered, then pauses:
            # an endless stream of small chunks cost that much parsing (64 KiB: 128 KiB,
            # ~1,700 chunks and events) past its event bound. A stream's reads are events.
            read_bufsize=_READ_BUFSIZE,
            trace_request_ctx=self.sent,
            proxy=spec.proxy,
            proxy_headers=spec.proxy_headers or None,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=timeouts.connect_seconds, sock_connect=timeouts.connect_seconds
            ),
        )

    async def _http_failure(self, resp: aiohttp.ClientResponse) -> RequestResult:
        status = resp.status
        if 300 <= status < 400:
            # Not followed: a 302 would turn the POST into a GET elsewhere, a 307 re-send the
            # prompt (and headers) to wherever the server points.
            location = printable(resp.headers.get("Location", ""))
            message = f"HTTP {status} redirect (not followed) to {location!r}"
            return self.finish(Outcome.PROTOCOL_ERROR, message, status)
        message = f"HTTP {status}: {await _error_snippet(resp)}"
        if self.spec.proxy:  # a plain-http request's answer may be the proxy's own
            if "Proxy-Authenticate" in resp.headers:  # the proxy's refusal: no way through
                refused = f"proxy {self.spec.proxy} refused: {message}"
                return self.finish(Outcome.CONNECT_ERROR, refused, status)
            message += f" (via proxy {self.spec.proxy})"
        retry_after = None
        if status == 429:
            retry_after = parse_retry_after(resp.headers.get("Retry-After"))
        return self.finish(status_outcome(status), message, status, retry_after_seconds=retry_after)


def _let_frames_go(exc: BaseException | None) -> None:
    """Drop the tracebacks of a fault that has been classified, and of those it came from.

    aiohttp keeps the fault on the connection's reader (`set_exception`), and its traceback
    holds the frames that read from that reader: a cycle, freed only by a full collection.
    A fleet of failing targets makes thousands a minute (a keep-alive stream ended by its
    server: ~30 objects each), so the full collection both comes sooner and takes longer."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def _reader(spec: RequestSpec) -> SSEParser | LineSplitter:
    if spec.api is Api.OLLAMA:
        return LineSplitter(spec.max_line_bytes)
    return SSEParser(spec.max_line_bytes, max_lines(spec.max_tokens))


def _compressed(resp: aiohttp.ClientResponse) -> str:
    """The body's content coding when it is not identity (shown cut and printable), else ""."""
    coding = resp.headers.get("Content-Encoding", "").strip()
    return "" if coding.lower() in ("", "identity") else printable(coding, 40)


async def _error_snippet(resp: aiohttp.ClientResponse) -> str:
    """The start of an error body, read for at most a second; "" when it is compressed."""
    if _compressed(resp):
        return f"({_compressed(resp)} body not read)"
    body = b""
    try:
        async with asyncio.timeout(_ERROR_BODY_SECONDS):
            while len(body) < _ERROR_BODY_BYTES and (chunk := await resp.content.readany()):
                body += chunk
    except (TimeoutError, aiohttp.ClientError, OSError):
        pass
    return printable(body[:_ERROR_BODY_BYTES].decode(errors="replace"))


def parse_retry_after(value: str | None) -> float | None:
    """`Retry-After` as seconds: a delta in seconds or an HTTP date; None when absent or bad."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        return min(max(0.0, seconds), MAX_RETRY_AFTER_SECONDS) if math.isfinite(seconds) else None
    try:
        seconds = parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError, OverflowError):
        return None
    return min(max(0.0, seconds), MAX_RETRY_AFTER_SECONDS)
