"""What ended an attempt, as an outcome: the taxonomy (docs/design.md §3), pure functions
tested row by row (tests/unit/test_classify.py).

`classify` maps a fault (one of `FAULTS`) and where the attempt stood (`Attempt`: its `Phase`,
whether the stream had ended, the deadlines) to an outcome and its error text, or says what
the attempt does instead (`Next`); `status_outcome` maps a status other than 200. The error
texts quote a server through `printable`: one printable line, cut.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import aiohttp

from prober.logs import printable_line
from prober.request.exchange import ResponseTooLarge
from prober.request.stream import InStreamError
from prober.request.timeouts import Timeouts
from prober.result import Outcome

_ERROR_CHARS = 200


class Phase(StrEnum):
    """Where an attempt stands: it decides what a timeout or a broken connection means."""

    CONNECT = "connect"  # no response yet
    FIRST_TOKEN = "first_token"  # a status line, no token yet
    STREAMING = "streaming"  # a token came: a deadline now is the total's or a stall


@dataclass(frozen=True, slots=True)
class Attempt:
    """Where an attempt stood when a fault ended it: all `classify` reads besides the fault."""

    phase: Phase
    stream_done: bool  # the stream had reached its end (`[DONE]`, a finish, `done: true`)
    total_reached: bool  # the total deadline had passed
    may_retry: bool  # a first attempt whose connection failed within the stale window
    timeouts: Timeouts
    proxy: str = ""  # the forward proxy it went through (no credentials), or ""


class Next(StrEnum):
    """What an attempt does with a fault that is no outcome of its own."""

    CONCLUDE = "conclude"  # the stream had ended before it: the stream's own verdict stands
    RETRY = "retry"  # a pooled connection the server was closing: send once more


# Invalid JSON (ValueError, with StreamError and InStreamError) or an event of the wrong shape.
_MALFORMED = (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError)
# Every fault an attempt turns into an outcome; anything else (cancellation) propagates.
FAULTS = (TimeoutError, aiohttp.ClientError, OSError, *_MALFORMED)


def classify(fault: BaseException, at: Attempt) -> tuple[Outcome, str] | Next:
    """The outcome of a fault (one of `FAULTS`) that ended an attempt, and its error text
    (docs/design.md §3). Pure; the kinds are tested in the order they nest (a certificate
    failure is a connector error and a ValueError; aiohttp's connect timeout a TimeoutError)."""
    if isinstance(fault, ResponseTooLarge):  # past a bound of the exchange: cut, closed
        if at.stream_done:  # what came after the end went past it
            return Next.CONCLUDE
        return Outcome.PROTOCOL_ERROR, f"response cut: {fault}"
    if isinstance(fault, TimeoutError):
        if at.stream_done:  # the deadline fell while reading past the end
            return Next.CONCLUDE
        return _timeout(fault, at)
    if isinstance(fault, InStreamError):
        return Outcome.HTTP_5XX, f"server error in stream: {fault}"
    if isinstance(fault, aiohttp.ClientProxyConnectionError) and at.proxy:
        return Outcome.CONNECT_ERROR, f"cannot connect to proxy {at.proxy}: {fault.os_error}"
    if isinstance(fault, aiohttp.ClientConnectorError):
        return Outcome.CONNECT_ERROR, f"cannot connect: {fault}"
    if isinstance(fault, aiohttp.ClientHttpProxyError) and at.proxy:  # CONNECT answered non-2xx
        refusal = f"HTTP {fault.status} {printable(str(fault.message))}"
        return Outcome.CONNECT_ERROR, f"proxy {at.proxy} refused the tunnel: {refusal}"
    if isinstance(fault, aiohttp.ClientResponseError):
        # An unparsable status line or header block. Never repr() it: its request_info holds
        # the request headers, credentials included.
        return Outcome.PROTOCOL_ERROR, f"invalid HTTP response: {printable(str(fault.message))}"
    if isinstance(fault, _MALFORMED):
        return Outcome.PROTOCOL_ERROR, f"malformed stream: {_describe(fault)}"
    if at.stream_done:
        return Next.CONCLUDE
    if at.phase is not Phase.CONNECT:
        return Outcome.PROTOCOL_ERROR, f"connection broke mid-body: {_describe(fault)}"
    # Connected (connect failures are ClientConnectorError, above), then the server closed or
    # reset it before a status line. A stale pooled connection fails at once: retried; a
    # server that does it to a fresh one too answered badly.
    if isinstance(fault, aiohttp.ClientOSError | aiohttp.ServerDisconnectedError):
        if at.may_retry:
            return Next.RETRY
        return Outcome.PROTOCOL_ERROR, f"connection closed before a response: {_describe(fault)}"
    return Outcome.CONNECT_ERROR, f"connection failed: {_describe(fault)}"


def _timeout(fault: TimeoutError, at: Attempt) -> tuple[Outcome, str]:
    timeouts = at.timeouts
    # aiohttp's own connect timeout; every other TimeoutError is our deadline expiring.
    if isinstance(fault, aiohttp.ConnectionTimeoutError):
        return Outcome.TIMEOUT_CONNECT, f"no connection in {timeouts.connect_seconds}s"
    # Before the first token the first-token deadline decides, also when it equals the total
    # (`probe --timeout`); only a total shorter than it makes this timeout_total.
    waiting = at.phase is not Phase.STREAMING
    if waiting and timeouts.first_token_seconds <= timeouts.total_seconds:
        return Outcome.TIMEOUT_FIRST_TOKEN, f"no token in {timeouts.first_token_seconds}s"
    if at.total_reached or waiting:
        return Outcome.TIMEOUT_TOTAL, f"no end in {timeouts.total_seconds}s"
    return Outcome.STALLED, f"no event for {timeouts.idle_seconds}s"


def status_outcome(status: int) -> Outcome:
    """The outcome of an answer whose status is not 200 (a 3xx is never followed)."""
    if status == 429:
        return Outcome.HTTP_429
    if 400 <= status < 500:
        return Outcome.HTTP_4XX
    if status >= 500:
        return Outcome.HTTP_5XX
    return Outcome.PROTOCOL_ERROR


def _describe(exc: BaseException) -> str:
    """Type and message of an exception on one line, never its repr (which may carry
    request headers)."""
    return printable(f"{type(exc).__name__}: {exc}", 300)


def printable(text: str, limit: int = _ERROR_CHARS) -> str:
    """`text` on one line, printable, at most `limit` characters (`logs.printable_line`)."""
    return printable_line(text, limit)
