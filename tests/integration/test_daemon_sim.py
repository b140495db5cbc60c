"""The daemon against the simulator: metrics populated, timings accurate, every outcome counted."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import time

import aiohttp
import pytest

from prober.metric_specs import REQUEST_LATENCY
from prober.request import Api, RequestSpec, stream_request
from prober.result import Outcome
from prober.timings import tpot, ttft
from prober.web import FLEET, METRICS, client_session
from tests.support.daemon import daemon, scrape, simulator, value, wait_for

HISTOGRAMS = tuple(spec.name for spec in REQUEST_LATENCY)


async def test_scrape_has_every_histogram_with_labels() -> None:
    async with simulator(reasoning_tokens=2) as sim:
        target = {
            "name": "sim",
            "url": f"{sim}/v1",
            "model": "sim",
            "interval_seconds": 0.5,
            "jitter_seconds": 0,
            "warmup": 1,
            "metrics_url": f"{sim}/metrics",
            "load": {"rate": 5.0, "max_in_flight": 8, "seed": 1},
        }
        async with daemon({"targets": [target]}) as (url, _app):

            async def populated() -> bool:
                s = await scrape(url)
                return value(s, "llmprober_requests_total", mode="probe", outcome="ok") >= 2

            await wait_for(populated, timeout=20)
            samples = await scrape(url)
    for mode in ("probe", "load"):
        for name in HISTOGRAMS:
            count = value(samples, f"{name}_count", target="sim", model="sim", mode=mode)
            assert count > 0, f"{name} has no {mode} observation"
        assert value(samples, "llmprober_tokens_total", mode=mode, kind="reasoning") > 0
        assert value(samples, "llmprober_requests_good_total", mode=mode) > 0
    assert value(samples, "llmprober_probe_success", target="sim") == 1
    assert value(samples, "llmprober_slo_ttft_seconds", target="sim") == 2.0
    assert value(samples, "llmprober_queue_depth", source="server", state="running") >= 0
    assert any(k[0] == "llmprober_queue_depth" and ("source", "estimate") in k[1] for k in samples)
    assert value(samples, "llmprober_load_target_rate", target="sim") == 5.0


async def test_ttft_and_tpot_match_fixed_simulator_delays() -> None:
    """Prefill 50 ms + 2000 tok/s, decode step 20 ms, no slowdown: the client must see it.

    Tolerance: TTFT median within [prefill, prefill + one decode step + 15 ms] (a request can
    arrive mid-step and wait for the step boundary); TPOT median within 15 % of the step.
    """
    prefill_base, step = 0.05, 0.02
    async with (
        simulator(
            slots=4, prefill_base_seconds=prefill_base, decode_step_seconds=step, decode_slowdown=0
        ) as sim,
        client_session() as session,
    ):
        firsts, per_token = [], []
        for _ in range(8):
            spec = RequestSpec(f"{sim}/v1", Api.CHAT, "sim", "hello there " * 10, 16)
            result = await stream_request(session, spec, time.perf_counter_ns())
            assert result.outcome is Outcome.OK, result.error
            firsts.append(ttft(result))
            per_token.append(tpot(result))
    expected_prefill = prefill_base + (result.prompt_tokens or 0) / 2000.0
    median_ttft = statistics.median(firsts)
    print(f"TTFT median {median_ttft * 1e3:.1f} ms (prefill {expected_prefill * 1e3:.1f} ms)")
    assert expected_prefill - 0.002 <= median_ttft <= expected_prefill + step + 0.015
    assert statistics.median(per_token) == pytest.approx(step, rel=0.15)


def _blackhole() -> tuple[socket.socket, list[socket.socket], int]:
    """A listener whose accept backlog is full, so a new connect never completes."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            s.connect(("127.0.0.1", port))
        fillers.append(s)
    return listener, fillers, port


FAULTS: dict[str, tuple[str, dict[str, float]]] = {
    "ok": ("", {}),
    "timeout_first_token": ("no_first_byte", {"first_token_seconds": 0.5}),
    "stalled": ("stall_after:3", {"idle_seconds": 0.5}),
    "timeout_total": ("endless", {"total_seconds": 1.0}),
    "http_429": ("status:429", {}),
    "http_4xx": ("status:404", {}),
    "http_5xx": ("status:503", {}),
    "protocol_error": ("bad_json", {}),
}


async def test_every_outcome_class_is_counted() -> None:
    listener, fillers, hole_port = _blackhole()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()
    try:
        async with simulator() as sim:
            targets = []
            for outcome, (fault, timeouts) in FAULTS.items():
                targets.append(
                    {
                        "name": outcome,
                        "url": f"{sim}/v1",
                        "model": "sim",
                        "interval_seconds": 60,
                        "warmup": 0,
                        "headers": {"X-Sim-Fault": fault} if fault else {},
                        "timeouts": timeouts,
                    }
                )
            targets.append(
                {"name": "connect_error", "url": f"http://127.0.0.1:{closed_port}/v1",
                 "model": "m", "warmup": 0}
            )  # fmt: skip
            targets.append(
                {"name": "timeout_connect", "url": f"http://127.0.0.1:{hole_port}/v1",
                 "model": "m", "warmup": 0, "timeouts": {"connect_seconds": 0.5}}
            )  # fmt: skip
            async with daemon({"targets": targets}) as (url, _app):

                async def all_probed() -> bool:
                    async with aiohttp.ClientSession() as s, s.get(f"{url}/-/ready") as r:
                        return r.status == 200

                await wait_for(all_probed, timeout=20)
                samples = await scrape(url)
                # /metrics keeps answering while every target fails.
                assert value(samples, "llmprober_probe_success", target="ok") == 1
    finally:
        listener.close()
        for s in fillers:
            s.close()
    for t in targets:
        name = t["name"]
        got = {
            dict(k[1])["outcome"]: v
            for k, v in samples.items()
            if k[0] == "llmprober_requests_total" and ("target", name) in k[1] and v
        }
        assert got == {name: 1.0}, f"target {name}: {got}"


async def test_shutdown_counts_in_flight_probe_as_cancelled() -> None:
    async with simulator() as sim:
        target = {
            "name": "stuck", "url": f"{sim}/v1", "model": "sim", "warmup": 0,
            "headers": {"X-Sim-Fault": "stall_after:1"}, "interval_seconds": 60,
        }  # fmt: skip
        config = {"server": {"listen": "127.0.0.1:0", "grace_seconds": 0.3}, "targets": [target]}
        async with daemon(config) as (_url, app):
            await asyncio.sleep(1.0)
            registry = app[METRICS].registry
            started = time.monotonic()
        shutdown_seconds = time.monotonic() - started
    assert shutdown_seconds < 0.3 + 2.0, "shutdown must end within the grace period"
    cancelled = registry.get_sample_value(
        "llmprober_requests_total",
        {"target": "stuck", "model": "sim", "mode": "probe", "outcome": "cancelled"},
    )
    assert cancelled == 1.0


async def test_probe_endpoint_runs_one_probe_in_a_fresh_registry() -> None:
    async with simulator() as sim:
        target = {"name": "sim", "url": f"{sim}/v1", "model": "sim", "interval_seconds": 3600}
        async with daemon({"targets": [target]}) as (url, _app), aiohttp.ClientSession() as s:
            async with s.get(f"{url}/probe", params={"target": "sim"}) as resp:
                assert resp.status == 200
                text = await resp.text()
            for bad in ("http://169.254.169.254/latest", "nope", ""):
                async with s.get(f"{url}/probe", params={"target": bad}) as resp:
                    assert resp.status == 404
                    assert "the configured targets are sim" in await resp.text()
    assert (
        'llmprober_requests_total{mode="probe",model="sim",outcome="ok",target="sim"} 1.0' in text
    )
    assert "llmprober_ttft_seconds_count" in text
    assert 'mode="load"' not in text


async def test_overload_keeps_in_flight_at_the_cap_and_counts_drops() -> None:
    """A target far slower than its load: in-flight stays at the cap, probes keep coming."""
    async with simulator(slots=1, decode_step_seconds=0.2) as sim:
        target = {
            "name": "slow", "url": f"{sim}/v1", "model": "sim", "interval_seconds": 1,
            "jitter_seconds": 0, "warmup": 0, "max_tokens": 4,
            "load": {"rate": 30.0, "max_in_flight": 5, "max_tokens": 8, "seed": 3},
            "timeouts": {"first_token_seconds": 30, "total_seconds": 60},
        }  # fmt: skip
        async with daemon({"targets": [target]}) as (url, _app):
            peaks = []
            for _ in range(12):
                await asyncio.sleep(0.25)
                peaks.append(value(await scrape(url), "llmprober_load_in_flight", target="slow"))
            samples = await scrape(url)
    assert max(peaks) == 5
    assert value(samples, "llmprober_load_dropped_total", target="slow", reason="in_flight") > 20
    # The periodic probe is still scheduled and recorded (it queues behind the load).
    assert value(samples, "llmprober_last_probe_timestamp_seconds", target="slow") > 0


async def test_ollama_native_api_against_the_simulator() -> None:
    async with simulator(reasoning_tokens=3) as sim, client_session() as session:
        spec = RequestSpec(sim, Api.OLLAMA, "sim", "hello " * 20, 10)
        result = await stream_request(session, spec, time.perf_counter_ns())
    assert result.outcome is Outcome.OK, result.error
    assert result.output_tokens == 10
    assert result.reasoning_tokens == 3
    assert result.t_first_token_ns is not None
    assert result.t_first_content_ns is not None
    assert result.t_first_content_ns > result.t_first_token_ns
    assert result.server_prefill_seconds is not None
    assert result.server_decode_per_token_seconds is not None


async def test_shards_split_probes_and_load_without_coordination() -> None:
    """Two replicas: each target probed by exactly one; every replica carries half the load."""
    names = [f"t{i}" for i in range(6)]
    targets = [
        {"name": n, "url": "http://127.0.0.1:9/v1", "model": "m", "interval_seconds": 3600,
         "load": {"rate": 4.0}}
        for n in names
    ]  # fmt: skip
    probed: list[set[str]] = []
    for index in (0, 1):
        config = {"targets": targets, "shard": {"index": index, "count": 2}}
        async with daemon(config) as (_url, app):
            fleet = app[FLEET]
            probed.append(set(fleet.probed))
            assert set(fleet.capacity) == set(names)  # load (and its estimate) on every replica
    assert probed[0].isdisjoint(probed[1])
    assert probed[0] | probed[1] == set(names)
    assert probed[0]
    assert probed[1]
