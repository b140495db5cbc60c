"""The server scrape against a real vLLM: normalised figures equal vLLM's own gauges.

The daemon is given vLLM's `metrics_url` (engine auto-detected) and scrapes it every 0.5 s;
another process drives a closed loop of 2× the slots. Every 0.5 s the test reads vLLM's
gauges itself and the daemon's `source="server"` figures. The daemon's copy is up to one
scrape interval old (vLLM's gauges move every engine step), so the levels are compared as
means over the run. Once the load stops and vLLM drains, both read exactly the same.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.support.daemon import daemon, scrape, value
from tests.support.machine import LoopLag, snapshot_at
from tests.support.probes_alone_accuracy import Level, drain, foreign_load
from tests.support.vllm import MODEL_NAME, SLOTS, Samples, engine_samples, log_tail

pytestmark = pytest.mark.vllm
SCRAPE_SECONDS = 0.5
LOAD_SECONDS = 20  # the window the figures are compared over, after 5 s of settling
_GAUGES = {
    "waiting": "vllm:num_requests_waiting",
    "running": "vllm:num_requests_running",
    "kv": "vllm:kv_cache_usage_perc",
}


def _truth(samples: Samples) -> dict[str, float]:
    return {
        key: sum(v for (n, _), v in samples.items() if n == name) for key, name in _GAUGES.items()
    }


def _daemon_view(samples: Samples) -> dict[str, float]:
    depth = "llmprober_queue_depth"
    return {
        "waiting": value(samples, depth, source="server", state="waiting"),
        "running": value(samples, depth, source="server", state="running"),
        "kv": value(samples, "llmprober_server_kv_cache_usage_ratio"),
    }


async def test_server_figures_equal_vllms_gauges(vllm: str) -> None:
    target = {
        "name": "vllm", "url": f"{vllm}/v1", "model": MODEL_NAME, "interval_seconds": 3600,
        "metrics_url": f"{vllm}/metrics", "metrics_interval_seconds": SCRAPE_SECONDS,
    }  # fmt: skip
    pairs: list[tuple[dict[str, float], dict[str, float]]] = []
    async with daemon({"targets": [target]}) as (url, _), aiohttp.ClientSession() as session:
        level = Level("closed2x", "closed", workers=2 * SLOTS)
        lag = LoopLag()
        load = foreign_load(vllm, level, "--max-tokens", "16", seconds=5 + LOAD_SECONDS)
        async with load as load_report, lag:
            await asyncio.sleep(5)
            end = time.monotonic() + LOAD_SECONDS
            async with snapshot_at(LOAD_SECONDS / 2) as machine:
                while time.monotonic() < end:
                    truth = _truth(await engine_samples(session, vllm))
                    pairs.append((truth, _daemon_view(await scrape(url))))
                    await asyncio.sleep(SCRAPE_SECONDS)
        await drain(vllm, timeout=120)
        await asyncio.sleep(3 * SCRAPE_SECONDS)
        idle_truth = _truth(await engine_samples(session, vllm))
        idle_ours = _daemon_view(await scrape(url))
        engine = await scrape(url)
    means = {
        key: (
            sum(t[key] for t, _ in pairs) / len(pairs),
            sum(o[key] for _, o in pairs) / len(pairs),
        )
        for key in _GAUGES
    }
    report = (
        f"means (vLLM, daemon): {means}; idle {idle_truth} / {idle_ours}; {len(pairs)} samples\n"
        f"the load: {load_report}; {lag}\n{''.join(machine)}\n{log_tail(5)}"
    )
    print("\n" + report, flush=True)
    assert means["waiting"][0] > 1, report  # a queue formed
    assert abs(means["waiting"][0] - means["waiting"][1]) <= 0.5, report
    assert abs(means["running"][0] - means["running"][1]) <= 0.5, report
    assert abs(means["kv"][0] - means["kv"][1]) <= 0.002, report
    assert idle_ours == idle_truth, report
    assert value(engine, "llmprober_server_scrape_errors_total") == 0, report
