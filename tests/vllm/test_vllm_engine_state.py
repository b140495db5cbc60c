"""The engine state and the cache probe against a real vLLM (issue 36 items 1 and 3).

A wedged engine whose API server still answers (vllm-project/vllm #39863: `/health` 200 from
an engine that makes no progress): the test SIGSTOPs vLLM's engine-core process
(`VLLM::EngineCore`), never telling the daemon. Its API server keeps accepting requests and
answering `/health`, and no token comes. The daemon must say `stalled` within `stall_seconds`
+ one probe interval (plus slack for the poll and two loaded cores), and `ok` again after
SIGCONT. `metrics_url` is set, so the engine's generation-token counter is read too: it stays
still while the core is stopped. A full engine, never stopped (floods of 3x and 10x its
sequences and an open-loop flood at twice its capacity), is `busy` and never `stalled`.

The prefix cache (on by default; `--enable-prompt-tokens-details` puts the cached tokens in
each answer's usage): the cache probe's hit has a lower TTFT than its miss for a 256-token
prefix and the engine confirms the hits; and where every probe asks the same unsalted question,
the cached prompt tokens the daemon counts (`llmprober_tokens_total{kind="prompt_cached"}`)
are those vLLM's own `vllm:prefix_cache_hits` counted over the same requests.
"""

from __future__ import annotations

import contextlib
import os
import signal
from typing import Any

import aiohttp
import pytest

from tests.support.daemon import daemon, scrape, value, wait_for
from tests.support.engine_floods import busy_never_stalled
from tests.support.stall import cache_probe_figures, until_state, vllm_engine_core_pid
from tests.support.vllm import MODEL_NAME, SLOTS, engine_samples, total

pytestmark = pytest.mark.vllm
STALL = 4.0
INTERVAL = 1.0
SLACK = 3.0  # the 0.1 s poll, and vLLM's engine beside the daemon on two cores


async def _health(base: str) -> int:
    timeout = aiohttp.ClientTimeout(total=10)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(f"{base}/health") as resp,
    ):
        return resp.status


def _target(base: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "vllm", "url": f"{base}/v1", "model": MODEL_NAME, "interval_seconds": INTERVAL,
        "jitter_seconds": 0, "prompt_tokens": 32, "max_tokens": 8, "stall_seconds": STALL,
        "metrics_url": f"{base}/metrics", "metrics_interval_seconds": 1.0,
        "timeouts": {"connect_seconds": 2, "first_token_seconds": 60}, **extra,
    }  # fmt: skip


async def test_a_stopped_engine_core_is_stalled_while_health_says_200(vllm: str) -> None:
    core = vllm_engine_core_pid(vllm)
    async with daemon({"targets": [_target(vllm)]}) as (url, _):
        await until_state(url, "vllm", "ok", timeout=120)
        os.kill(core, signal.SIGSTOP)
        try:
            took = await until_state(url, "vllm", "stalled", timeout=STALL + INTERVAL + 30)
            bound = STALL + INTERVAL + SLACK
            print(f"stalled {took:.1f} s after the engine core's SIGSTOP (bound {bound})")
            assert took <= bound
            # The #39863 case: the API server still calls the engine healthy.
            assert await _health(vllm) == 200
            samples = await scrape(url)
            assert value(samples, "llmprober_engine_state", state="stalled") == 1
        finally:
            os.kill(core, signal.SIGCONT)
        took = await until_state(url, "vllm", "ok", timeout=90)
        print(f"ok {took:.1f} s after SIGCONT")


async def test_floods_of_3x_and_10x_the_slots_and_2x_capacity_are_busy_never_stalled(
    vllm: str,
) -> None:
    """A full vLLM is busy, never stalled: closed loops of 3x and 10x its sequences and Poisson
    arrivals at twice its capacity, 20 s each, from another process; the default stall window
    (first-token timeout + 2 intervals) and `metrics_url` set. `bench/engine_state.py --engine
    vllm` runs the same floods for 10 minutes each."""
    await busy_never_stalled(vllm, _target(vllm), SLOTS, ready_seconds=120)


async def test_cached_prompt_tokens_are_those_vllm_counts(vllm: str) -> None:
    """The same question every second, unsalted: after the warm-up every probe's prompt is
    served from the prefix cache, and the cached tokens the daemon counts from the answers'
    usage equal vLLM's own `vllm:prefix_cache_hits` over the same requests. vLLM caches whole
    blocks, 128 tokens on its CPU build: a question of about 300 tokens has two."""
    question = " ".join(["Name the colour of a clear sky at noon, in one word."] * 20)
    config = _target(vllm, stall_seconds=None, cache_bust=False, question=question)
    cached: list[tuple[float, float]] = []  # (the daemon's count, vLLM's), each read
    async with aiohttp.ClientSession() as session:
        before = await engine_samples(session, vllm)
        async with daemon({"targets": [config]}) as (url, _):

            async def probed() -> bool:
                samples = await scrape(url)
                return value(samples, "llmprober_requests_total", mode="probe") >= 5

            async def agreed() -> bool:  # a probe between the two reads: read again
                counted = value(await scrape(url), "llmprober_tokens_total", kind="prompt_cached")
                after = await engine_samples(session, vllm)
                cached.append((counted, total(after, before, "vllm:prefix_cache_hits_total")))
                return cached[-1][0] == cached[-1][1]

            await wait_for(probed, timeout=120)
            with contextlib.suppress(AssertionError):
                await wait_for(agreed, timeout=15)
    counted, truth = cached[-1]
    print(f"cached prompt tokens: the daemon {counted}, vLLM's prefix_cache_hits {truth}")
    assert counted == truth, f"the daemon counted {counted}, vLLM {truth}"
    assert truth >= 4 * 128  # four probes or more, a block of the prompt at least each


async def test_cache_probe_hit_is_faster_than_its_miss_and_confirmed(vllm: str) -> None:
    # Probes every 30 s: between them only the cache probe's pairs reach the engine.
    cache = {"prefix_tokens": 256, "interval_seconds": 3}
    config = _target(vllm, interval_seconds=30, stall_seconds=None, cache_probe=cache)
    async with daemon({"targets": [config]}) as (url, _):

        async def pairs() -> bool:
            samples = await scrape(url)
            hits = value(samples, "llmprober_cache_probe_ttft_seconds_count", result="hit")
            return hits >= 3

        await wait_for(pairs, timeout=240)
        samples = await scrape(url)
    mean, confirmed = cache_probe_figures(samples)
    print(f"vLLM cache probe mean TTFT {mean}, counts {confirmed}")
    assert mean["hit"] < mean["miss"]
    assert confirmed[("hit", "true")] >= 3
    assert confirmed[("miss", "true")] == 0
