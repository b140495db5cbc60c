"""prober.request.classify.classify: the outcome taxonomy as one pure function, table by table.

Each row is a fault that ended an attempt and where the attempt stood; the verdict is an
outcome and its error text, or `Next` (the stream's own verdict stands; a stale connection is
retried). The integration tests (test_faults, test_hostile) meet the same faults on a wire.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest

from prober.request import Timeouts
from prober.request.classify import FAULTS, Attempt, Next, Phase, classify, status_outcome
from prober.request.exchange import ResponseTooLarge
from prober.request.sse import StreamError
from prober.request.stream import InStreamError
from prober.result import Outcome

TIMEOUTS = Timeouts(connect_seconds=2.0, first_token_seconds=10.0, idle_seconds=3.0,
                    total_seconds=60.0)  # fmt: skip
CONNECTING = Attempt(Phase.CONNECT, stream_done=False, total_reached=False, may_retry=False,
                     timeouts=TIMEOUTS)  # fmt: skip
WAITING = replace(CONNECTING, phase=Phase.FIRST_TOKEN)
STREAMING = replace(CONNECTING, phase=Phase.STREAMING)
DONE = replace(STREAMING, stream_done=True)
KEY: Any = SimpleNamespace(host="127.0.0.1", port=1, ssl=True, is_ssl=True)


def refused() -> aiohttp.ClientConnectorError:
    return aiohttp.ClientConnectorError(KEY, ConnectionRefusedError(111, "Connection refused"))


def bad_certificate() -> aiohttp.ClientConnectorCertificateError:
    return aiohttp.ClientConnectorCertificateError(KEY, ssl.SSLCertVerificationError("bad cert"))


def bad_status_line() -> aiohttp.ClientResponseError:
    return aiohttp.ClientResponseError(None, (), message='Invalid status line "HTTP/9"')  # type: ignore[arg-type]


def outcome_of(fault: BaseException, at: Attempt) -> Outcome:
    verdict = classify(fault, at)
    assert isinstance(verdict, tuple), verdict
    return verdict[0]


OUTCOMES = [
    # (fault, where the attempt stood, outcome, the error's start)
    (ResponseTooLarge("headers past 64 KiB"), WAITING, Outcome.PROTOCOL_ERROR,
     "response cut: headers past 64 KiB"),
    (aiohttp.ConnectionTimeoutError(), CONNECTING, Outcome.TIMEOUT_CONNECT,
     "no connection in 2.0s"),
    (TimeoutError(), CONNECTING, Outcome.TIMEOUT_FIRST_TOKEN, "no token in 10.0s"),
    (TimeoutError(), WAITING, Outcome.TIMEOUT_FIRST_TOKEN, "no token in 10.0s"),
    (TimeoutError(), STREAMING, Outcome.STALLED, "no event for 3.0s"),
    (TimeoutError(), replace(STREAMING, total_reached=True), Outcome.TIMEOUT_TOTAL,
     "no end in 60.0s"),
    # A total shorter than the first-token deadline ends a wait as the total.
    (TimeoutError(), replace(WAITING, timeouts=replace(TIMEOUTS, total_seconds=5.0)),
     Outcome.TIMEOUT_TOTAL, "no end in 5.0s"),
    (InStreamError("model overloaded"), STREAMING, Outcome.HTTP_5XX,
     "server error in stream: model overloaded"),
    (refused(), CONNECTING, Outcome.CONNECT_ERROR, "cannot connect: Cannot connect to host"),
    # A certificate failure is also a ValueError: a connector error first.
    (bad_certificate(), CONNECTING, Outcome.CONNECT_ERROR, "cannot connect:"),
    (bad_status_line(), CONNECTING, Outcome.PROTOCOL_ERROR,
     'invalid HTTP response: Invalid status line "HTTP/9"'),
    (json.JSONDecodeError("Expecting value", "{x", 1), STREAMING, Outcome.PROTOCOL_ERROR,
     "malformed stream: JSONDecodeError: Expecting value"),
    (StreamError("line longer than 65536 bytes"), STREAMING, Outcome.PROTOCOL_ERROR,
     "malformed stream: StreamError: line longer"),
    (KeyError("choices"), STREAMING, Outcome.PROTOCOL_ERROR, "malformed stream: KeyError"),
    (RecursionError("deep"), STREAMING, Outcome.PROTOCOL_ERROR,
     "malformed stream: RecursionError"),
    (aiohttp.ClientPayloadError("Response payload is not completed"), STREAMING,
     Outcome.PROTOCOL_ERROR, "connection broke mid-body: ClientPayloadError"),
    (ConnectionResetError(104, "reset"), WAITING, Outcome.PROTOCOL_ERROR,
     "connection broke mid-body: ConnectionResetError"),
    (aiohttp.ServerDisconnectedError(), CONNECTING, Outcome.PROTOCOL_ERROR,
     "connection closed before a response: ServerDisconnectedError"),
    (aiohttp.ClientOSError(104, "reset"), CONNECTING, Outcome.PROTOCOL_ERROR,
     "connection closed before a response: ClientOSError"),
    (aiohttp.ClientConnectionError("gone"), CONNECTING, Outcome.CONNECT_ERROR,
     "connection failed: ClientConnectionError: gone"),
]  # fmt: skip


@pytest.mark.parametrize(("fault", "at", "outcome", "error"), OUTCOMES)
def test_each_fault_where_it_fell_is_one_outcome(
    fault: BaseException, at: Attempt, outcome: Outcome, error: str
) -> None:
    assert isinstance(fault, FAULTS)
    verdict = classify(fault, at)
    assert isinstance(verdict, tuple), verdict
    assert verdict[0] is outcome
    assert verdict[1].startswith(error), verdict[1]


@pytest.mark.parametrize(
    "fault",
    [ResponseTooLarge("past the end"), TimeoutError(), aiohttp.ClientPayloadError("cut"),
     ConnectionResetError(104, "reset")],
)  # fmt: skip
def test_a_fault_after_the_streams_end_leaves_the_streams_verdict(fault: BaseException) -> None:
    assert classify(fault, DONE) is Next.CONCLUDE


def test_a_stream_error_after_the_end_is_still_malformed() -> None:
    # A wrong event is a fault of the stream, not of the connection after it.
    assert outcome_of(KeyError("choices"), DONE) is Outcome.PROTOCOL_ERROR


def test_only_a_closed_young_first_attempt_is_retried() -> None:
    young = replace(CONNECTING, may_retry=True)
    assert classify(aiohttp.ServerDisconnectedError(), young) is Next.RETRY
    assert classify(aiohttp.ClientOSError(104, "reset"), young) is Next.RETRY
    # Not closed by the server: a failure, not a stale connection.
    assert outcome_of(aiohttp.ClientConnectionError("gone"), young) is Outcome.CONNECT_ERROR
    # Once a response came, a closed connection is never retried (the server had the request).
    after = replace(WAITING, may_retry=True)
    assert outcome_of(aiohttp.ServerDisconnectedError(), after) is Outcome.PROTOCOL_ERROR


def test_error_texts_never_carry_the_request() -> None:
    # ClientResponseError's repr holds request_info (headers, credentials): only its message.
    fault = aiohttp.ClientResponseError(
        SimpleNamespace(headers={"Authorization": "Bearer sk-secret"}),  # type: ignore[arg-type]
        (), message="Invalid header",
    )  # fmt: skip
    verdict = classify(fault, CONNECTING)
    assert isinstance(verdict, tuple)
    assert "sk-secret" not in verdict[1]


def test_cancellation_is_no_fault() -> None:
    assert not isinstance(asyncio.CancelledError(), FAULTS)


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(429, Outcome.HTTP_429), (400, Outcome.HTTP_4XX), (404, Outcome.HTTP_4XX),
     (499, Outcome.HTTP_4XX), (500, Outcome.HTTP_5XX), (503, Outcome.HTTP_5XX),
     (599, Outcome.HTTP_5XX), (302, Outcome.PROTOCOL_ERROR), (204, Outcome.PROTOCOL_ERROR),
     (101, Outcome.PROTOCOL_ERROR)],
)  # fmt: skip
def test_a_status_other_than_200_is_one_outcome(status: int, outcome: Outcome) -> None:
    assert status_outcome(status) is outcome
