"""The status page and `/probe?debug=true` over HTTP, against the simulator and a hostile
engine (tests/support/status.py): what they show agrees with /metrics, a server's strings are
escaped and redacted, and the page is bounded (paginated, a ring of probes per target)."""

from __future__ import annotations

import re

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from prober.recent import RECENT_PROBES
from prober.status.view import PAGE_TARGETS
from tests.support.daemon import daemon, scrape, simulator, value, wait_for
from tests.support.net import closed_port
from tests.support.status import KEY, KEY_ENV, hostile_engine, targets


async def get(url: str) -> tuple[int, str, CIMultiDictProxy[str]]:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        return resp.status, await resp.text(), resp.headers


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, KEY)


async def test_the_pages_agree_with_metrics_and_show_hostile_text_inert() -> None:
    async with (
        simulator(slots=4) as sim,
        hostile_engine() as hostile,
        daemon({"targets": targets(sim, hostile, interval=0.2)}) as (url, _),
    ):

        async def probed() -> bool:
            s = await scrape(url)
            return all(
                value(s, "llmprober_requests_total", target=t, mode="probe") > RECENT_PROBES
                for t in ("sim", "hostile")
            )

        await wait_for(probed, timeout=40)
        before = await scrape(url)
        status, index, headers = await get(url + "/")
        _, detail, _ = await get(url + "/targets/hostile")
        after = await scrape(url)
        missing, _, _ = await get(url + "/targets/nobody")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert '<meta http-equiv="refresh" content="15">' in index
    assert 'name="viewport"' in index
    assert "<script" not in index
    assert "<script" not in detail
    # The hostile error text: escaped markup, no control character, the key redacted.
    for page in (index, detail):
        assert "&lt;script&gt;alert(1)&lt;/script&gt;&lt;img src=x onerror=" in page
        assert "<img" not in page
        assert KEY not in page
        assert KEY[:12] not in page
        assert "[REDACTED]" in page
        assert not re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]", page)
    # The probes shown are the probes /metrics counts, read between the two scrapes.
    for name in ("sim", "hostile"):
        found = re.search(rf'href="/targets/{name}">.*?<dt>probes</dt><dd>(\d+)', index, re.S)
        assert found is not None, name
        shown = int(found[1])
        low = value(before, "llmprober_requests_total", target=name, mode="probe")
        high = value(after, "llmprober_requests_total", target=name, mode="probe")
        assert low <= shown <= high, name
    assert value(after, "llmprober_probe_success", target="hostile") == 0
    assert value(after, "llmprober_probe_success", target="sim") == 1
    assert re.search(
        r'href="/targets/hostile">.*?<span class="pill bad">http_5xx</span>', index, re.S
    )
    assert re.search(r'href="/targets/sim">.*?<span class="pill (ok|slow)">ok</span>', index, re.S)
    # The detail page: the last 20 probes, each with its error; the others' figures beside.
    assert detail.count("<tr>") == RECENT_PROBES + 1  # and the header row
    assert "Waiting depth withheld: set traffic:" in detail
    assert "api-version=1" in detail  # the query kept
    assert "engine scrape" in index
    assert "failing" in index
    assert "ok " in index
    assert "2.00 req/s" in index  # the simulator target's load
    assert missing == 404


async def test_the_index_is_paginated_and_bounded() -> None:
    port = closed_port()
    many = [
        {"name": f"t{i:03}", "url": f"http://127.0.0.1:{port}/v1", "model": "m",
         "interval_seconds": 3600, "warmup": 0}
        for i in range(PAGE_TARGETS + 5)
    ]  # fmt: skip
    async with daemon({"targets": many}) as (url, _):
        _, first, _ = await get(url + "/")
        _, second, _ = await get(url + "/?page=2")
        _, clamped, _ = await get(url + "/?page=999999999")
    assert first.count('class="card target"') == PAGE_TARGETS
    assert second.count('class="card target"') == 5
    assert "page 1 of 2" in first
    assert 'href="/?page=2"' in first
    assert 'class="card target"' in clamped
    assert "page 2 of 2" in clamped
    assert len(first) < 200_000


async def test_probe_debug_is_the_probes_own_account_redacted() -> None:
    async with hostile_engine() as hostile:
        target = {
            "name": "sse", "url": f"{hostile}/sse/v1", "model": "m", "api_key_env": KEY_ENV,
            "interval_seconds": 3600, "warmup": 0,
        }  # fmt: skip
        async with daemon({"targets": [target]}) as (url, _):
            status, text, headers = await get(url + "/probe?target=sse&debug=true")
            _, plain, _ = await get(url + "/probe?target=sse")
    assert status == 200
    assert headers["Content-Type"].startswith("text/plain")
    assert "Outcome: ok: the stream ended normally" in text
    assert "HTTP status: 200" in text
    for phase in ("request_written", "first_byte", "first_token"):
        assert re.search(rf"^  {phase} +[\d.]+ (ms|s)$", text, re.M), phase
    assert "Set-Cookie: [REDACTED]" in text
    assert "X-Api-Key: [REDACTED]" in text
    assert "X-Note: <script>alert(4)</script> [REDACTED]" in text  # text/plain: inert as is
    assert '"content": "[REDACTED]"' in text  # the key split by a zero-width space, in an event
    assert "data: [DONE]" in text
    assert KEY not in text
    assert 'llmprober_requests_total{mode="probe",model="m",outcome="ok",target="sse"} 1.0' in text
    assert plain.startswith("# HELP")  # without debug, the metrics alone, as before


async def test_a_probe_that_fails_says_why() -> None:
    async with hostile_engine() as hostile:
        target = {"name": "h", "url": f"{hostile}/v1", "model": "m", "api_key_env": KEY_ENV,
                  "interval_seconds": 3600, "warmup": 0}  # fmt: skip
        async with daemon({"targets": [target]}) as (url, _):
            _, text, _ = await get(url + "/probe?target=h&debug=true")
    assert "Outcome: http_5xx: the server failed" in text
    assert "Error: HTTP 500: <script>alert(1)</script>" in text
    assert KEY not in text
    assert "\x1b" not in text
    assert "Response headers (" in text
