"""Phases and connections on real loopback servers (issue 13 item 4), `/probe` bounded per
target (issue 12 item 8), each probe logged with its request id (issue 13 item 8), and the
simulator's stamps found by the prober's X-Request-Id."""

from __future__ import annotations

import asyncio
import io
import json
import ssl
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from prober import timings
from prober.logs import setup_logging
from prober.request import Api, RequestSpec, Timeouts, stream_request
from prober.result import Outcome, RequestResult
from prober.web import INFLIGHT, client_session
from tests.support.daemon import daemon, simulator
from tests.support.servers import serve_tls, tls_simulator
from tests.support.tls import self_signed_cert

pytestmark = pytest.mark.timeout(120)
FAST = Timeouts(connect_seconds=5, first_token_seconds=20, idle_seconds=20, total_seconds=30)


def spec(base_url: str, **kw: Any) -> RequestSpec:
    return RequestSpec(base_url=base_url, api=Api.CHAT, model="sim", prompt="hello there",
                       max_tokens=4, timeouts=FAST, **kw)  # fmt: skip


async def two(base_url: str, **kw: Any) -> tuple[RequestResult, RequestResult]:
    async with client_session() as session:
        first = await stream_request(session, spec(base_url, **kw), time.perf_counter_ns())
        second = await stream_request(session, spec(base_url, **kw), time.perf_counter_ns())
    assert first.ok, first.error
    assert second.ok, second.error
    return first, second


def names(r: RequestResult) -> list[str]:
    return [name for name, _ in timings.phases(r)]


async def test_pooled_connection_is_fresh_then_reused_and_phases_add_up() -> None:
    async with simulator(decode_step_seconds=0.002) as sim:
        first, second = await two(f"{sim}/v1")
    assert first.reused is False
    assert names(first) == ["connect", "request_written", "first_byte", "first_token"]
    assert second.reused is True
    assert names(second) == ["request_written", "first_byte", "first_token"]
    for r in (first, second):
        assert all(seconds >= 0 for _, seconds in timings.phases(r))
        ttft = timings.ttft(r)
        assert ttft is not None
        total = sum(seconds for _, seconds in timings.phases(r))
        assert total == pytest.approx(ttft - timings.dispatch_lag(r), abs=1e-9)


async def test_a_name_is_resolved_as_its_own_phase() -> None:
    async with simulator(decode_step_seconds=0.002) as sim:
        first, _ = await two(f"{sim.replace('127.0.0.1', 'localhost')}/v1")
    assert names(first)[:2] == ["resolve", "connect"]


async def test_fresh_connection_option_opens_one_per_request() -> None:
    async with simulator(decode_step_seconds=0.002) as sim:
        first, second = await two(f"{sim}/v1", fresh_connection=True)
    assert (first.reused, second.reused) == (False, False)
    assert names(second)[0] == "connect"


async def test_tls_handshake_is_a_phase_of_a_fresh_connection(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    context = ssl.create_default_context(cafile=str(cert))
    async with tls_simulator(cert, key) as url:
        first, second = await two(f"{url}/v1", ssl=context)
    assert names(first) == ["connect", "tls", "request_written", "first_byte", "first_token"]
    assert dict(timings.phases(first))["tls"] > 0
    assert "tls" not in names(second)


async def test_tls_is_a_phase_of_an_answer_that_came_whole_with_its_headers(
    tmp_path: Path,
) -> None:
    """A short answer read in one go with its headers releases the connection before the
    response is handed over; the handshake is still its connection's (through a proxy's
    tunnel it was lost in 3 probes of 200)."""
    cert, key = self_signed_cert(tmp_path)
    chunk = {"choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
    whole = (f"data: {json.dumps(chunk)}\n\n" * 4 + "data: [DONE]\n\n").encode()

    async def answer(_: web.Request) -> web.Response:
        return web.Response(body=whole, content_type="text/event-stream")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", answer)
    async with serve_tls(app, cert, key) as root:
        context = ssl.create_default_context(cafile=str(cert))
        first, _ = await two(f"{root}/v1", ssl=context)
    assert names(first)[:3] == ["connect", "tls", "request_written"]
    assert dict(timings.phases(first))["tls"] > 0


async def test_simulator_stamps_are_found_by_the_prober_request_id() -> None:
    async with simulator(decode_step_seconds=0.002) as sim:
        first, _ = await two(f"{sim}/v1")
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"{sim}/sim/requests/{first.request_id}") as resp,
        ):
            assert resp.status == 200
            record = await resp.json()
    assert len(record["token_write_ns"]) == len(first.token_event_ns)


async def test_probe_endpoint_allows_one_in_flight_per_target() -> None:
    # 16 tokens at 0.1 s a step: the first /probe is in flight for over a second.
    async with simulator(decode_step_seconds=0.1) as sim:
        target = {"name": "slow", "url": f"{sim}/v1", "model": "sim", "interval_seconds": 3600,
                  "warmup": 0}  # fmt: skip
        async with daemon({"targets": [target]}) as (url, app), aiohttp.ClientSession() as s:
            probing = app[INFLIGHT].probing

            async def fetch() -> tuple[int, str, str | None]:
                async with s.get(f"{url}/probe?target=slow") as resp:
                    return resp.status, await resp.text(), resp.headers.get("Retry-After")

            first = asyncio.create_task(fetch())
            for _ in range(200):  # until the first is in flight (bounded)
                if "slow" in probing:
                    break
                await asyncio.sleep(0.01)
            assert "slow" in probing
            status, text, retry_after = await fetch()
            assert status == 429
            assert retry_after == "1"
            assert "in flight" in text
            assert not first.done(), "the refusal did not wait for the probe in flight"
            status, text, _ = await first
            assert status == 200
            assert 'llmprober_requests_total{mode="probe",model="sim",outcome="ok"' in text
            assert (await fetch())[0] == 200  # free again once it ended


async def test_each_probe_is_logged_once_with_the_exemplar_request_id() -> None:
    out = io.StringIO()
    setup_logging("json", "info", stream=out)
    try:
        async with simulator(decode_step_seconds=0.002) as sim:
            target = {"name": "t", "url": f"{sim}/v1", "model": "sim", "interval_seconds": 3600,
                      "warmup": 0}  # fmt: skip
            async with daemon({"targets": [target]}) as (url, app), aiohttp.ClientSession() as s:
                for _ in range(500):  # the first scheduled probe (bounded)
                    if app[INFLIGHT] and "probe_ok" in out.getvalue():
                        break
                    await asyncio.sleep(0.02)
                headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
                async with s.get(f"{url}/metrics", headers=headers) as resp:
                    exposition = await resp.text()
    finally:
        setup_logging("json", "info")
    lines = [json.loads(x) for x in out.getvalue().splitlines() if x.startswith("{")]
    probes = [x for x in lines if x["event"] in ("probe_ok", "probe_failed")]
    assert len(probes) == 1
    line = probes[0]
    assert line["level"] == "info"
    assert line["outcome"] == Outcome.OK.value
    assert line["ttft_seconds"] > 0
    assert line["output_tokens"] > 0
    assert "prompt" not in line
    assert f'request_id="{line["request_id"]}"' in exposition  # the exemplar leads here
