"""Hostile endpoints, one request at a time: each behaviour of `tests/support/hostile.py` is one
outcome.

Every case sends one streamed request through a session built like the daemon's, records
the result the way the daemon does, and checks what must hold beyond the outcome: nothing
was followed, decompressed, kept without bound or leaked, and recording did not raise.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from prober.logs import register_secret
from prober.metrics import Labels, Metrics
from prober.prompts import MIN_TOKENS_PER_WORD
from prober.request import Api, RequestSpec, Timeouts, stream_request
from prober.request.stream import max_events
from prober.result import Outcome, RequestResult
from prober.settings import TargetConfig
from prober.summary import result_summary
from prober.targets import Target
from prober.timings import Slo
from prober.web import client_session
from tests.support.hostile import (
    BEHAVIOURS,
    ERROR_TEXTS,
    FORGED_LOG_LINE,
    OLLAMA_BEHAVIOURS,
    Hostile,
    api_of,
    forging_server,
    leaked_pieces,
)
from tests.support.hostile import hostile_server as serve_hostile
from tests.support.servers import serve

MAX_TOKENS = 4
TIMEOUTS = Timeouts(connect_seconds=2, first_token_seconds=3, idle_seconds=1.0, total_seconds=4)
KEY = "sk-hostile-0123456789abcdef0123456789"
ALL = {**BEHAVIOURS, **OLLAMA_BEHAVIOURS}


@pytest.fixture
async def hostile() -> AsyncIterator[Hostile]:
    register_secret(KEY)  # as reading it from api_key_env would
    async with serve_hostile() as state:
        yield state


async def send(state: Hostile, name: str, **kw: Any) -> RequestResult:
    spec = RequestSpec(
        state.url(name), Api(api_of(name)), "m", "hello there", MAX_TOKENS, TIMEOUTS,
        headers={"Authorization": f"Bearer {KEY}"}, **kw,
    )  # fmt: skip
    async with client_session() as session:
        return await stream_request(session, spec, time.perf_counter_ns())


def recorded(result: RequestResult) -> dict[str, float]:
    """Record `result` as the daemon does; every sample of the registry afterwards."""
    metrics = Metrics(CollectorRegistry())
    metrics.record(result, Labels("t", "m"), "probe", Slo(2.0, 0.2))
    metrics.record_probe(result, Labels("t", "m"), time.time())
    return {
        f"{s.name}{sorted(s.labels.items())}": s.value
        for family in metrics.registry.collect()
        for s in family.samples
    }


async def eventually(predicate: Any, seconds: float = 5.0) -> bool:
    for _ in range(int(seconds * 20)):
        if predicate():
            return True
        await asyncio.sleep(0.05)
    return bool(predicate())


@pytest.mark.parametrize("name", sorted(ALL))
async def test_each_hostile_behaviour_is_one_outcome_and_records(
    hostile: Hostile, name: str
) -> None:
    result = await send(hostile, name)
    assert result.outcome.value == ALL[name][1], (result.outcome, result.error)
    samples = recorded(result)  # must not raise
    assert all(math.isfinite(v) and v >= 0 for v in samples.values()), samples
    assert len(result.token_event_ns) <= max_events(MAX_TOKENS)
    assert len(result.error) <= 300
    assert KEY not in result.error + result.request_id + result.response_id
    assert hostile.requests[name] >= 1


@pytest.mark.parametrize("name", [n for n in ALL if "gzip" in n or n in ("br", "deflate")])
async def test_compressed_bodies_are_refused_not_inflated(hostile: Hostile, name: str) -> None:
    result = await send(hostile, name)
    assert "Content-Encoding" in result.error or "body not read" in result.error
    assert result.output_tokens == 0  # nothing of the (valid) compressed stream was parsed
    sent = hostile.headers[name][-1]
    assert sent["Accept-Encoding"] == "identity"


@pytest.mark.parametrize("name", [n for n in ALL if n.startswith("redirect")])
async def test_redirects_are_not_followed(hostile: Hostile, name: str) -> None:
    result = await send(hostile, name)
    assert hostile.sink_hits == 0
    assert "redirect (not followed)" in result.error
    assert "/sink/" in result.error  # the Location, cut to a bounded length
    assert result.http_status == int(name.removeprefix("redirect_").replace("long", "302"))


@pytest.mark.parametrize("name", [n for n in ALL if "endless" in n])
async def test_endless_streams_end_at_the_bound(hostile: Hostile, name: str) -> None:
    result = await send(hostile, name)
    # Events, body or chunk framing (one chunk per write): whichever bound a read meets first.
    assert "more than" in result.error or "larger than" in result.error, result.error
    # The server's writes fail once the client is gone: the stream was really cut.
    assert await eventually(lambda: hostile.disconnects[name] >= 1)


@pytest.mark.parametrize("name", [n for n in ALL if "done_" in n])
async def test_the_end_ends_the_stream(hostile: Hostile, name: str) -> None:
    result = await send(hostile, name)
    assert result.outcome is Outcome.OK, result.error
    assert result.output_tokens >= 1
    if name.endswith("hold"):  # the held connection was closed, not left to the pool
        assert await eventually(lambda: hostile.disconnects[name] >= 1)


@pytest.mark.parametrize("name", ["close_after_request", "reset_after_request"])
async def test_a_server_that_hangs_up_after_the_request_answered_badly(
    hostile: Hostile, name: str
) -> None:
    result = await send(hostile, name)
    assert result.error.startswith("connection closed before a response"), result.error
    assert hostile.requests[name] == 2  # the first attempt and the stale-connection retry


async def test_an_id_echoing_the_key_is_never_the_request_id(hostile: Hostile) -> None:
    result = await send(hostile, "echo_key_id")
    sent = hostile.headers["echo_key_id"][-1]["X-Request-Id"]
    assert result.request_id == sent
    assert result.response_id == ""  # it held the key: not kept even apart


@pytest.mark.parametrize("name", ["prompt_tokens_1", "prompt_tokens_10", "prompt_tokens_huge"])
async def test_calibration_is_bounded_against_nonsense_counts(hostile: Hostile, name: str) -> None:
    cfg = TargetConfig(name="t", url=hostile.url(name), model="m", prompt_tokens=64)
    target = Target.from_config(cfg)
    async with client_session() as session:
        for _ in range(6):  # the unbounded builder grew ~4.7x per probe here
            result = await target.send(session, time.perf_counter_ns())
            assert result.ok, result.error
    words = hostile.prompt_words[name]
    assert max(words) <= 64 / MIN_TOKENS_PER_WORD + 16, words
    assert target.prompts.rejected >= 1


async def test_probe_timeout_without_a_first_token_is_timeout_first_token() -> None:
    async def headers_only(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(50):  # keep-alives, never a token (bounded: 5 s)
            await resp.write(b": waiting\n\n")
            await asyncio.sleep(0.1)
        return resp

    async with serve(headers_only) as url:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "prober.cli", "probe", "--url", url, "--model", "m",
            "--timeout", "0.5", "--json", stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["outcome"] == "timeout_first_token", summary


async def test_a_healthy_stream_is_not_held_up_by_hostile_ones(hostile: Hostile) -> None:
    names = ["endless_batched", "gzip", "done_hold", "endless_comments"]
    results = await asyncio.gather(
        *(send(hostile, n) for n in names), send(hostile, "done_junk_field")
    )
    assert results[-1].outcome is Outcome.OK
    assert [r.outcome.value for r in results[:-1]] == [ALL[n][1] for n in names]


def test_every_behaviour_has_an_expected_outcome() -> None:
    assert all(expected in {o.value for o in Outcome} for _, expected in ALL.values())
    assert aiohttp.__version__  # the refusal depends on per-request auto_decompress


LEAKY_ERRORS = [*ERROR_TEXTS, "echo_key_401_base64"]


@pytest.mark.parametrize("name", LEAKY_ERRORS)
async def test_error_text_is_one_printable_line_without_the_key(
    hostile: Hostile, name: str
) -> None:
    result = await send(hostile, name)
    assert result.error.isprintable()
    assert result.error == " ".join(result.error.split())
    assert not leaked_pieces(KEY, result.error), result.error
    assert not leaked_pieces(KEY, json.dumps(result_summary(result))), result.error
    if name == "error_controls":  # the forged log line is only text inside this one
        assert "[2J" not in result.error
        assert FORGED_LOG_LINE in result.error


@pytest.mark.parametrize("name", LEAKY_ERRORS)
@pytest.mark.parametrize("fmt", ["text", "json"])
async def test_probe_command_prints_error_texts_safely(
    hostile: Hostile, name: str, fmt: str
) -> None:
    """`llm-prober probe` once died of a lone surrogate (UnicodeEncodeError, exit 1),
    printed control characters raw, and showed the key split by an escape sequence or a
    zero-width space in an in-stream error, or base64-encoded in a 401's body."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "prober.cli", "probe", "--url", hostile.url(name), "--model", "m",
        "--api-key-env", "LLMPROBER_TEST_HOSTILE_KEY", "--timeout", "5",
        *(["--json"] if fmt == "json" else []),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "LLMPROBER_TEST_HOSTILE_KEY": KEY, "PYTHONIOENCODING": "utf-8"},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    text = out.decode()
    assert proc.returncode == 1, err.decode()  # a failed probe
    assert not err, err.decode()  # no traceback
    assert all(line.isprintable() for line in text.splitlines()), text
    assert ALL[name][1] in text  # http_5xx: the in-stream errors; http_4xx: the 401
    assert not leaked_pieces(KEY, text), text
    if name.startswith(("error_key", "echo_key")):  # the key's text was there, redacted
        assert "[REDACTED]" in text, text


async def test_an_event_of_many_lines_fails_at_its_line_bound(hostile: Hostile) -> None:
    """500,000 `data:` lines in one event once grew ~45 MB and stalled the loop 314 ms."""
    result = await send(hostile, "event_many_lines")
    assert "data lines in one event" in result.error, result.error


@pytest.mark.parametrize("name", ["huge_int_ignored", "huge_int_usage"])
async def test_a_huge_integer_is_nonsense_not_a_failed_stream(hostile: Hostile, name: str) -> None:
    result = await send(hostile, name)
    assert result.outcome is Outcome.OK, result.error
    if name == "huge_int_usage":  # the count is ignored: the events are counted instead
        assert result.prompt_tokens is None
        assert result.output_tokens == 2
        assert "completion_tokens" in result.token_fallback
    else:
        assert result.prompt_tokens == 5


async def test_a_forged_answer_between_exchanges_never_reaches_another_target() -> None:
    """A second, unsolicited response left in a pooled connection was read by the next
    request, to another target on the same host and port: `ok`, 777 tokens (really 5)."""
    connections: list[int] = []
    async with forging_server(connections) as base, client_session() as session:
        results = []
        for name in ("a", "b", "c"):
            spec = RequestSpec(f"{base}/{name}/v1", Api.CHAT, "m", "hi", MAX_TOKENS, TIMEOUTS)
            results.append(await stream_request(session, spec, time.perf_counter_ns()))
            await asyncio.sleep(0.3)  # the forgery arrives while the connection is pooled
    assert [r.output_tokens for r in results] == [5, 5, 5], [r.error for r in results]
    assert all(r.ok for r in results)
    assert len(connections) == 3  # each forgery closed its connection
