"""The fault matrix: the daemon, probes and background load together, against every fault.

One daemon carries one target per fault, each with its periodic probe and a small open-loop
load, against the simulator's injected faults (`X-Sim-Fault`), a TLS copy of the simulator with
a self-signed certificate, a closed port, a name that does not resolve, and every behaviour of
the hostile server (`tests/support/hostile.py`: compressed bodies, redirects, nonsense
numbers, endless streams, junk or a held connection after the end, hang-ups, an id echoing
the key, each in its variants) and every protocol-level flood (`tests/support/floods.py`:
1xx runs, endless status lines and headers, chunk extensions, 1-byte chunks, trailers). Each
target must count only its expected outcome, in both modes; `/metrics` must keep answering
while every target fails; and once the daemon and servers are gone, no asyncio task and no
socket may be left over. The outcome column mirrors the classification table of
docs/design.md §3.

Name resolution is replaced by a resolver that answers `localhost` and refuses every other
name, so the unresolvable host is refused here instead of by a DNS server off this machine:
every byte of this test goes to 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path
from typing import Any

import aiohttp
import aiohttp.connector
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult

from prober.request import Api, RequestSpec, Timeouts, stream_request
from prober.sim.faults import FAULT_HEADER
from tests.support.daemon import daemon, scrape, simulator, wait_for
from tests.support.floods import FLOODS, Flooded, flood_server
from tests.support.hostile import BEHAVIOURS, OLLAMA_BEHAVIOURS, Hostile, api_of, hostile_server
from tests.support.net import closed_port
from tests.support.servers import SIM, bad_http_server, tls_simulator
from tests.support.tls import self_signed_cert

OVERSIZED_BYTES = 3 * 1024 * 1024  # one SSE line three times the 1 MiB limit

# name: (X-Sim-Fault, timeouts, expected outcome); every target also gets background load.
SIM_FAULTS: dict[str, tuple[str, dict[str, float], str]] = {
    "healthy": ("", {}, "ok"),
    "status_401": ("status:401", {}, "http_4xx"),
    "status_403": ("status:403", {}, "http_4xx"),
    "status_404": ("status:404", {}, "http_4xx"),
    "status_429": ("status:429", {}, "http_429"),
    "status_500": ("status:500", {}, "http_5xx"),
    "status_503": ("status:503", {}, "http_5xx"),
    "no_first_byte": ("no_first_byte", {"first_token_seconds": 0.5}, "timeout_first_token"),
    "keepalives_only": ("no_first_token", {"first_token_seconds": 0.5}, "timeout_first_token"),
    "stall_after_3": ("stall_after:3", {"idle_seconds": 0.5}, "stalled"),
    "truncate_after_3": ("truncate_after:3", {}, "protocol_error"),
    "malformed_sse": ("malformed", {}, "protocol_error"),
    "bad_json": ("bad_json", {}, "protocol_error"),
    "oversized_event": (f"oversized:{OVERSIZED_BYTES}", {}, "protocol_error"),
    "no_tokens": ("no_tokens", {}, "protocol_error"),
    "endless": ("endless", {"total_seconds": 1.0}, "timeout_total"),
    "close_mid_body": ("close_mid_body", {}, "protocol_error"),
}
HOSTILE_TIMEOUTS = {"first_token_seconds": 3, "idle_seconds": 1.0, "total_seconds": 4}
LOAD = {"rate": 1.5, "arrival": "constant", "max_in_flight": 2, "max_tokens": 4, "seed": 1}
MIN_LOAD_RESULTS = 2


class LocalOnlyResolver(AbstractResolver):
    """`localhost` is 127.0.0.1; any other name fails as an unknown name would."""

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        if host == "localhost":
            return [{"hostname": host, "host": "127.0.0.1", "port": port, "family": socket.AF_INET,
                     "proto": 0, "flags": socket.AI_NUMERICHOST}]  # fmt: skip
        raise OSError(None, f"Name or service not known: {host} (test resolver)")

    async def close(self) -> None:
        pass


@pytest.fixture
def no_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aiohttp.connector, "DefaultResolver", LocalOnlyResolver)


def open_sockets() -> int:
    """Sockets this process holds open, from /proc/self/fd."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            continue  # closed while we looked
    return count


def fault_targets(
    sim: str, tls_sim: str, bad_http: str, cert: Path, hostile: Hostile, floods: Flooded
) -> dict[str, tuple[dict[str, Any], str]]:
    common = {"model": "sim", "interval_seconds": 60, "jitter_seconds": 0, "warmup": 0,
              "max_tokens": 4, "load": LOAD}  # fmt: skip
    targets: dict[str, tuple[dict[str, Any], str]] = {}
    for name, (fault, timeouts, outcome) in SIM_FAULTS.items():
        headers = {FAULT_HEADER: fault} if fault else {}
        cfg = {**common, "name": name, "url": f"{sim}/v1", "headers": headers,
               "timeouts": timeouts}  # fmt: skip
        targets[name] = (cfg, outcome)
    others = {
        "refused": ({"url": f"http://127.0.0.1:{closed_port()}/v1"}, "connect_error"),
        "unresolvable": ({"url": "http://no-such-host.invalid:8000/v1"}, "connect_error"),
        "tls_untrusted": ({"url": f"{tls_sim}/v1"}, "connect_error"),
        "tls_to_plain_http": ({"url": f"{sim.replace('http:', 'https:')}/v1"}, "connect_error"),
        "tls_ca_file": ({"url": f"{tls_sim}/v1", "tls": {"ca_file": str(cert)}}, "ok"),
        "bad_http_response": ({"url": f"{bad_http}/v1"}, "protocol_error"),
    }
    for name, (extra, outcome) in others.items():
        targets[name] = ({**common, "name": name, **extra}, outcome)
    # Every hostile behaviour, each class in its variants (tests/support/hostile.py).
    for name, (_, outcome) in {**BEHAVIOURS, **OLLAMA_BEHAVIOURS}.items():
        extra = {"url": hostile.url(name), "api": api_of(name), "timeouts": HOSTILE_TIMEOUTS}
        targets[f"hostile_{name}"] = ({**common, "name": f"hostile_{name}", **extra}, outcome)
    # Every protocol-level flood (tests/support/floods.py): cut at its bound.
    for name in FLOODS:
        extra = {"url": floods.url(name), "timeouts": HOSTILE_TIMEOUTS}
        targets[name] = ({**common, "name": name, **extra}, "protocol_error")
    return targets


async def fetch_status(url: str) -> int:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        return resp.status


def outcomes(samples: dict[Any, float]) -> dict[tuple[str, str], dict[str, float]]:
    """`llmprober_requests_total` as {(target, mode): {outcome: count}}, nonzero counts only,
    in one pass over the samples."""
    seen: dict[tuple[str, str], dict[str, float]] = {}
    for (name, labels), v in samples.items():
        if name == "llmprober_requests_total" and v:
            label = dict(labels)
            seen.setdefault((label["target"], label["mode"]), {})[label["outcome"]] = v
    return seen


async def settle(baseline: tuple[int, int], timeout: float = 8.0) -> tuple[int, int]:
    """(tasks, sockets) once both are back to the baseline, or what they are at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        now = (len(asyncio.all_tasks()), open_sockets())
        if (now[0] <= baseline[0] and now[1] <= baseline[1]) or time.monotonic() > deadline:
            return now
        await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
async def test_fault_matrix_probes_and_load(no_dns: None, tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    baseline = (len(asyncio.all_tasks()), open_sockets())
    async with (
        simulator(**SIM) as sim,
        tls_simulator(cert, key) as tls_sim,
        bad_http_server() as bad_http,
        hostile_server() as hostile,
        flood_server() as floods,
    ):
        targets = fault_targets(sim, tls_sim, bad_http, cert, hostile, floods)
        config = {"targets": [cfg for cfg, _ in targets.values()]}
        async with daemon(config) as (url, _app):

            async def counted() -> bool:
                s = await scrape(url)  # also proves /metrics answers while targets fail
                seen = outcomes(s)
                return all(
                    sum(seen.get((name, "probe"), {}).values()) >= 1
                    and sum(seen.get((name, "load"), {}).values()) >= MIN_LOAD_RESULTS
                    for name in targets
                )

            await wait_for(counted, timeout=90, interval=0.5)
            samples = await scrape(url)
            ready = await fetch_status(f"{url}/-/ready")  # recording raised for none of them
            running_sockets = open_sockets()
            async with aiohttp.ClientSession() as s, s.get(f"{url}/-/healthy") as resp:
                assert resp.status == 200
    wrong = {}
    seen = outcomes(samples)
    for name, (_, expected) in targets.items():
        probe, load = seen.get((name, "probe"), {}), seen.get((name, "load"), {})
        if sum(probe.values()) != 1 or not set(probe) | set(load) <= {expected}:
            wrong[name] = {"expected": expected, "probe": probe, "load": load}
    assert not wrong, f"misclassified: {wrong}"
    assert ready == 200
    assert hostile.sink_hits == 0  # no redirect was followed, by a probe or by the load
    # Connections stay bounded while it runs: at most the in-flight cap per target, each
    # counted twice (client and server end in this one process), plus the listeners.
    assert running_sockets - baseline[1] <= len(targets) * (LOAD["max_in_flight"] + 1) * 2 + 8
    tasks, sockets = await settle(baseline)
    assert tasks <= baseline[0], f"{tasks - baseline[0]} asyncio tasks left over"
    assert sockets <= baseline[1], f"{sockets - baseline[1]} sockets left open"


async def test_429_retry_after_is_parsed() -> None:
    async with simulator(**SIM) as sim, aiohttp.ClientSession() as session:
        spec = RequestSpec(f"{sim}/v1", Api.CHAT, "sim", "hi", 4, Timeouts(2, 2, 2, 3),
                           headers={FAULT_HEADER: "status:429"})  # fmt: skip
        result = await stream_request(session, spec, time.perf_counter_ns())
    assert result.outcome.value == "http_429"
    assert result.retry_after_seconds == 1.0


async def one_request(base_url: str, **kw: Any) -> Any:
    spec = RequestSpec(f"{base_url}/v1", Api.CHAT, "m", "hi", 4, Timeouts(2, 2, 2, 3), **kw)
    async with aiohttp.ClientSession() as session:
        return await stream_request(session, spec, time.perf_counter_ns())


async def test_untrusted_certificate_is_connect_error(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    async with tls_simulator(cert, key) as tls_sim:
        result = await one_request(tls_sim)
    assert result.outcome.value == "connect_error", result.error


async def test_unparsable_http_response_is_protocol_error() -> None:
    async with bad_http_server() as url:
        result = await one_request(url)
    assert result.outcome.value == "protocol_error", result.error
