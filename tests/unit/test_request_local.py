"""prober.request against tiny purpose-built aiohttp servers on 127.0.0.1 (one per test).

Every case awaits `stream_request` directly: a fault that raised instead of becoming an
outcome would fail the test.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prober.request import DEFAULT_TIMEOUTS, Api, RequestSpec, Timeouts, stream_request
from prober.request.send import parse_retry_after
from prober.request.stream import StreamState
from prober.result import Outcome, RequestResult, TokenSource
from tests.support.net import closed_port
from tests.support.servers import FAST, serve
from tests.support.sse import chunk, sse, start_stream, streaming

OLLAMA = Path(__file__).resolve().parents[1] / "fixtures" / "ollama"

# Timeouts beside the defaults: a stall watched at 0.3 s; a total shorter than the stall.
STALL = replace(DEFAULT_TIMEOUTS, first_token_seconds=3, idle_seconds=0.3, total_seconds=5)
SHORT_TOTAL = replace(DEFAULT_TIMEOUTS, first_token_seconds=3, idle_seconds=3, total_seconds=0.5)


async def probe(
    base_url: str, timeouts: Timeouts = FAST, api: Api = Api.CHAT, **kw: Any
) -> RequestResult:
    spec = RequestSpec(
        base_url=base_url, api=api, model="m", prompt="hi", max_tokens=4, timeouts=timeouts, **kw
    )
    async with aiohttp.ClientSession() as session:
        return await stream_request(session, spec, time.perf_counter_ns())


USAGE = sse({"id": "chatcmpl-local", "choices": [], "usage": {
    "prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}})  # fmt: skip
NORMAL = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"content": "Hello"}),
    chunk({"content": " there"}),
    chunk({"content": "!"}),
    chunk({}, finish="length"),
    USAGE,
    sse("[DONE]"),
]


def summary(r: RequestResult) -> tuple[Any, ...]:
    return (
        r.outcome,
        r.error,
        r.http_status,
        r.prompt_tokens,
        r.output_tokens,
        r.reasoning_tokens,
        r.token_source,
        len(r.token_event_ns),
        r.response_id,
    )


# -- successful streams --------------------------------------------------------------------


async def test_normal_stream_with_usage() -> None:
    seen: list[dict[str, Any]] = []
    sent_ids: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(await request.json())
        sent_ids.append(request.headers["X-Request-Id"])
        return await streaming(NORMAL)(request)

    async with serve(handler) as url:
        r = await probe(url)
    assert r.outcome is Outcome.OK, r.error
    assert r.error == ""
    assert r.http_status == 200
    assert (r.prompt_tokens, r.output_tokens, r.reasoning_tokens) == (9, 3, 0)
    assert r.token_source is TokenSource.USAGE
    assert len(r.token_event_ns) == 3
    # Results carry the id the prober sent; the server's own is kept apart, never exported.
    assert [r.request_id] == sent_ids
    assert r.response_id == "chatcmpl-local"
    assert r.t_sched_ns <= r.t_send_ns
    assert r.t_first_byte_ns is not None
    assert r.t_first_token_ns is not None
    assert r.t_send_ns <= r.t_first_byte_ns <= r.t_first_token_ns <= r.t_end_ns
    body = seen[0]
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["model"], body["max_tokens"]) == ("m", 4)
    assert body["messages"] == [{"role": "user", "content": "hi"}]


async def test_one_byte_writes_give_the_same_result(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[bytes] = []
    feed = StreamState.feed

    def counting_feed(self: StreamState, reader: Any, data: bytes, t_ns: int) -> int:
        reads.append(data)
        return feed(self, reader, data, t_ns)

    monkeypatch.setattr(StreamState, "feed", counting_feed)
    async with serve(streaming(NORMAL)) as url:
        whole = await probe(url)
    whole_reads, reads[:] = len(reads), []
    async with serve(streaming(NORMAL, bytewise=True)) as url:
        split = await probe(url)
    assert summary(split) == summary(whole)
    assert whole.outcome is Outcome.OK
    # The premise: the client really saw the events in many small reads.
    assert len(reads) > 10 * whole_reads, (len(reads), whole_reads)


async def test_ollama_fixture_over_http() -> None:
    lines = (OLLAMA / "chat_plain.ndjson").read_bytes().splitlines(keepends=True)

    async def handler(request: web.Request) -> web.StreamResponse:
        assert request.path == "/api/chat"
        resp = await start_stream(request, "application/x-ndjson")
        for line in lines:
            await resp.write(line)
        await resp.write_eof()
        return resp

    async with serve(handler) as url:
        r = await probe(url, api=Api.OLLAMA)
    assert r.outcome is Outcome.OK, r.error
    assert (r.prompt_tokens, r.output_tokens) == (31, 35)
    assert len(r.token_event_ns) == 35


# -- HTTP errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "outcome"),
    [(401, Outcome.HTTP_4XX), (404, Outcome.HTTP_4XX), (503, Outcome.HTTP_5XX)],
)
async def test_http_error_status(status: int, outcome: Outcome) -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.json_response({"error": {"message": "nope"}}, status=status)

    async with serve(handler) as url:
        r = await probe(url)
    assert r.outcome is outcome
    assert r.http_status == status
    assert r.error == f'HTTP {status}: {{"error": {{"message": "nope"}}}}'
    assert r.retry_after_seconds is None


async def test_http_429_with_retry_after() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(status=429, text="slow down", headers={"Retry-After": "3"})

    async with serve(handler) as url:
        r = await probe(url)
    assert r.outcome is Outcome.HTTP_429
    assert r.http_status == 429
    assert r.retry_after_seconds == 3
    assert r.error == "HTTP 429: slow down"


# -- connection faults ---------------------------------------------------------------------


async def test_connection_refused() -> None:
    r = await probe(f"http://127.0.0.1:{closed_port()}/v1")
    assert r.outcome is Outcome.CONNECT_ERROR
    assert r.error.startswith("cannot connect:")
    assert r.http_status is None


async def test_unresolvable_host() -> None:
    r = await probe("http://nonexistent.invalid/v1")
    assert r.outcome is Outcome.CONNECT_ERROR


async def test_server_closing_every_connection_is_a_protocol_error() -> None:
    # It accepted the connection and read the request: not a connect_error (issue 12).
    accepted = 0

    async def slam(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(slam, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        r = await probe(f"http://127.0.0.1:{port}/v1")
    assert r.outcome is Outcome.PROTOCOL_ERROR
    assert r.error.startswith("connection closed before a response:")
    assert accepted == 2  # the stale-connection retry, once


async def test_total_timeout_bounds_the_stale_connection_retry() -> None:
    async def take_then_drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await asyncio.sleep(0.4)
        writer.close()

    server = await asyncio.start_server(take_then_drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        started = time.monotonic()
        await probe(f"http://127.0.0.1:{port}/v1", Timeouts(2, 0.5, 0.5, 0.5))
    assert time.monotonic() - started < 0.65


# -- timeouts ------------------------------------------------------------------------------


async def test_headers_never_sent_is_timeout_first_token() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(10)
        raise AssertionError("unreachable")

    async with serve(handler) as url:
        started = time.monotonic()
        r = await probe(url, replace(DEFAULT_TIMEOUTS, connect_seconds=2, first_token_seconds=0.3))
    assert r.outcome is Outcome.TIMEOUT_FIRST_TOKEN
    assert r.error == "no token in 0.3s"
    assert 0.25 < time.monotonic() - started < 2


async def test_role_chunk_then_silence_is_timeout_first_token() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        await resp.write(chunk({"role": "assistant", "content": ""}))
        await asyncio.sleep(10)
        return resp

    async with serve(handler) as url:
        r = await probe(url, replace(DEFAULT_TIMEOUTS, connect_seconds=2, first_token_seconds=0.3))
    assert r.outcome is Outcome.TIMEOUT_FIRST_TOKEN
    assert r.http_status == 200


async def test_tokens_then_silence_is_stalled() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        await resp.write(chunk({"content": "a"}) + chunk({"content": "b"}))
        await asyncio.sleep(10)
        return resp

    async with serve(handler) as url:
        r = await probe(url, STALL)
    assert r.outcome is Outcome.STALLED
    assert r.error == "no event for 0.3s"
    assert r.output_tokens == 2


async def test_tokens_spaced_below_idle_rearm_the_watch_until_silence() -> None:
    # Each token lands before the idle timer fires, so the timer must re-arm from the last
    # token (not expire, not go quiet) until the real silence after the tenth.
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        for _ in range(10):
            await resp.write(chunk({"content": "t"}))
            await asyncio.sleep(0.1)
        await asyncio.sleep(10)
        return resp

    async with serve(handler) as url:
        r = await probe(url, STALL)
    assert r.outcome is Outcome.STALLED, r.error
    assert r.error == "no event for 0.3s"
    assert r.output_tokens == 10
    assert len(r.token_event_ns) == 10


async def test_keepalives_alone_do_not_count_as_events() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        await resp.write(chunk({"content": "a"}))
        for _ in range(100):
            await asyncio.sleep(0.05)
            await resp.write(b": keep-alive\n\n")
        return resp

    async with serve(handler) as url:
        r = await probe(url, STALL)
    assert r.outcome is Outcome.STALLED


async def test_endless_tokens_is_timeout_total() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        for _ in range(1000):
            await resp.write(chunk({"content": "x"}))
            await asyncio.sleep(0.01)
        return resp

    async with serve(handler) as url:
        started = time.monotonic()
        r = await probe(url, SHORT_TOTAL)
    assert r.outcome is Outcome.TIMEOUT_TOTAL
    assert r.error == "no end in 0.5s"
    assert r.output_tokens > 5
    assert time.monotonic() - started < 2


# -- malformed streams ---------------------------------------------------------------------


async def test_truncated_stream_without_done() -> None:
    async with serve(streaming(NORMAL[:3])) as url:
        r = await probe(url)
    assert r.outcome is Outcome.PROTOCOL_ERROR
    assert r.error == "stream ended without [DONE]"
    assert r.output_tokens == 2


async def test_connection_dropped_mid_body() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        await resp.write(chunk({"content": "a"}))
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()
        return resp

    async with serve(handler) as url:
        r = await probe(url)
    assert r.outcome is Outcome.PROTOCOL_ERROR
    assert r.error.startswith("connection broke mid-body")


@pytest.mark.parametrize(
    ("events", "detail"),
    [
        ([chunk({"content": "a"}), b"data: {not json\n\n"], "JSONDecodeError"),
        ([b"data: [1, 2]\n\n"], "not a JSON object"),
        ([b'data: {"choices": ["x"]}\n\n'], "AttributeError"),
        ([b"data: \xff\n\n"], "not UTF-8"),
        ([b'{"id": "chatcmpl-1", "choices": []}\n'], "not an SSE field"),
    ],
    ids=["bad-json", "not-object", "bad-shape", "bad-utf8", "plain-json-body"],
)
async def test_malformed_stream_is_protocol_error(events: list[bytes], detail: str) -> None:
    async with serve(streaming(events)) as url:
        r = await probe(url)
    assert r.outcome is Outcome.PROTOCOL_ERROR
    assert r.error.startswith("malformed stream: ")
    assert detail in r.error


async def test_over_long_line_is_protocol_error() -> None:
    async with serve(streaming([chunk({"content": "x" * 500})])) as url:
        r = await probe(url, max_line_bytes=128)
    assert r.outcome is Outcome.PROTOCOL_ERROR
    assert "line longer than 128 bytes" in r.error


async def test_error_inside_200_stream() -> None:
    error = sse({"error": {"message": "CUDA out of memory", "type": "server_error"}})
    async with serve(streaming([chunk({"content": "a"}), error])) as url:
        r = await probe(url)
    assert r.outcome is Outcome.HTTP_5XX
    assert r.error == "server error in stream: CUDA out of memory"


# -- Retry-After -----------------------------------------------------------------------------


def test_parse_retry_after_seconds() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(" 120 ") == 120.0
    assert parse_retry_after("0") == 0.0
    assert parse_retry_after("-4") == 0.0


def test_parse_retry_after_http_date() -> None:
    later = datetime.now(UTC) + timedelta(seconds=60)
    assert parse_retry_after(format_datetime(later, usegmt=True)) == pytest.approx(60, abs=2)
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past


@pytest.mark.parametrize("value", [None, "", "soon", "Wed, 99 Foo 2015", "3 seconds"])
def test_parse_retry_after_garbage(value: str | None) -> None:
    assert parse_retry_after(value) is None


@pytest.mark.parametrize("value", ["inf", "nan", "1e999", "Infinity"])
def test_parse_retry_after_non_finite(value: str) -> None:
    assert parse_retry_after(value) is None
