"""The prober against a real llama-server (gemma-3-270m on CPU): what the core must get right.

Tolerances: prompt calibration lands within 5 % of the requested prompt tokens after four
probes; `output_tokens` equals the server's own usage count exactly.
"""

from __future__ import annotations

import time

import aiohttp
import pytest

from prober.result import Outcome, TokenSource
from prober.settings import TargetConfig
from prober.targets import Target
from prober.timings import tpot, ttft
from prober.web import client_session
from tests.support.daemon import daemon, scrape, value, wait_for
from tests.support.engine import llama_server_fixture
from tests.support.margins import holds

pytestmark = pytest.mark.engine
engine = llama_server_fixture(2)


@pytest.mark.parametrize("api", ["chat", "completions"])
async def test_probes_succeed_and_calibrate(engine: str, api: str) -> None:
    requested = 200
    cfg = TargetConfig(
        name="llama", url=f"{engine}/v1", model="gemma", api=api, prompt_tokens=requested,
        max_tokens=8,
    )  # fmt: skip
    target = Target.from_config(cfg)
    seen = []
    async with client_session() as session:
        for _ in range(6):
            result = await target.send(session, time.perf_counter_ns())
            assert result.outcome is Outcome.OK, result.error
            seen.append(result)
    for result in seen:
        assert result.token_source is TokenSource.USAGE
        assert 1 <= result.output_tokens <= 8
        assert ttft(result) is not None
        assert ttft(result) > 0
        assert result.server_prefill_seconds is not None
        if result.output_tokens >= 2:
            assert tpot(result) is not None
    prompt_tokens = [r.prompt_tokens or 0 for r in seen]
    print(f"{api}: prompt tokens per probe {prompt_tokens} (requested {requested})")
    for got in prompt_tokens[4:]:
        off = abs(got - requested)
        assert holds(f"{api} prompt tokens off the requested", off, at_most=0.05 * requested)


async def test_output_tokens_equal_server_usage(engine: str) -> None:
    """Count the content events ourselves and compare with the server's usage and /metrics."""
    cfg = TargetConfig(
        name="llama", url=f"{engine}/v1", model="gemma", max_tokens=12,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    target = Target.from_config(cfg)
    async with aiohttp.ClientSession() as s, s.get(f"{engine}/metrics") as r:
        before = _counter(await r.text(), "llamacpp:tokens_predicted_total")
    async with client_session() as session:
        result = await target.send(session, time.perf_counter_ns())
    async with aiohttp.ClientSession() as s, s.get(f"{engine}/metrics") as r:
        after = _counter(await r.text(), "llamacpp:tokens_predicted_total")
    assert result.outcome is Outcome.OK, result.error
    assert result.output_tokens == 12
    assert after - before == result.output_tokens
    assert len(result.token_event_ns) == 12  # one event per token from llama-server


async def test_daemon_exports_server_truth_beside_estimate(engine: str) -> None:
    target = {
        "name": "llama", "url": f"{engine}/v1", "model": "gemma", "interval_seconds": 2,
        "jitter_seconds": 0, "max_tokens": 4, "metrics_url": f"{engine}/metrics",
        "metrics_interval_seconds": 1,
    }  # fmt: skip
    async with daemon({"targets": [target]}) as (url, _app):

        async def both() -> bool:
            s = await scrape(url)
            return (
                any(k[0] == "llmprober_queue_depth" and ("source", "server") in k[1] for k in s)
                and value(s, "llmprober_requests_total", outcome="ok") >= 1
            )

        await wait_for(both, timeout=60)
        samples = await scrape(url)
    assert value(samples, "llmprober_queue_depth", source="server", state="waiting") == 0
    assert value(samples, "llmprober_server_scrape_errors_total", target="llama") == 0
    assert value(samples, "llmprober_server_prefill_seconds_count", mode="probe") >= 1


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in llama-server /metrics")
