"""The engine tests' evidence helpers: the foreign load's failure pause and reasons, the loop
lag and the machine snapshot (tests/support/machine.py, tests/support/foreign_load.py), and
the probes-alone harness's engine reading and word on the slowdown
(tests/support/probes_alone_accuracy.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.support.machine import LoopLag, snapshot
from tests.support.net import closed_port
from tests.support.probes_alone_accuracy import _WordHandler, engine_reading, engine_truth

ROOT = Path(__file__).resolve().parents[2]


async def test_loop_lag_sees_a_blocked_loop() -> None:
    lag = LoopLag()
    async with lag:
        await asyncio.sleep(0.25)
        time.sleep(1.3)  # the loop blocked: the next tick is over a second late
        await asyncio.sleep(0.15)
    assert lag.worst >= 1.0
    assert lag.late_ticks == 1
    assert "worst lateness" in str(lag)


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists(), reason="reads /proc")
async def test_loop_lag_says_how_long_the_loop_waited_for_a_cpu() -> None:
    # A loop that is blocked, not starved: it waited for no CPU, and the text says so in
    # figures (a starved loop reads a large share here; a blocked one a small share).
    lag = LoopLag()
    async with lag:
        time.sleep(0.5)
    assert lag.waited.endswith(" %")
    assert int(lag.waited.split()[0]) < 50
    assert f"waiting for a CPU {lag.waited} of the time" in str(lag)


@pytest.mark.skipif(not Path("/proc/loadavg").exists(), reason="reads /proc")
def test_snapshot_names_a_busy_process() -> None:
    spin = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.3)
        text = snapshot(window=0.5)
    finally:
        spin.kill()
        spin.wait()
    assert text.startswith("machine: load ")
    line = next(line for line in text.splitlines() if f" {spin.pid} " in line)
    # Its niceness (inherited from this process) and its session: what orders it against others.
    assert f" ni {os.getpriority(os.PRIO_PROCESS, 0):>3} sid {os.getsid(0):>6} " in line
    assert "(asked 0.5):" in text  # the window is timed, and says what was asked


def test_a_refused_load_pauses_between_failures_and_says_why() -> None:
    # Eight closed-loop clients against a port nothing listens on, for 2 s: each failure is
    # followed by the pause, so a few dozen attempts, never thousands, and the reason given.
    url = f"http://127.0.0.1:{closed_port()}/v1"
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.foreign_load", "--url", url,
         "--mode", "closed", "--workers", "8", "--seconds", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["ok"] == 0
    assert 8 <= report["failed"] <= 8 * (2 / 0.5 + 1)
    assert report["reasons"] == {"ClientConnectorError": report["failed"]}


VLLM_METRICS = """\
# HELP vllm:num_requests_waiting Number of requests waiting.
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:num_requests_running{engine="1",model_name="m"} 4.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 10.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 5.0
vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9
"""


async def test_the_engine_reading_sums_every_series_and_counts_departures() -> None:
    bodies = [VLLM_METRICS, "llamacpp:requests_deferred 1\nllamacpp:requests_processing 4\n"]

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=bodies[0])

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    async with TestServer(app, host="127.0.0.1") as server, aiohttp.ClientSession() as session:
        base = str(server.make_url("")).rstrip("/")
        assert await engine_reading(session, base) == (5.0, 8.0, 15.0)
        assert await engine_truth(session, base) == (5.0, 8.0)
        bodies.pop(0)  # llama-server counts no finished requests
        assert await engine_reading(session, base) == (1.0, 4.0, None)


def test_the_word_on_the_slowdown_is_noted_when_logged() -> None:
    words: list[float] = []
    handler = _WordHandler(words)
    record = logging.LogRecord("prober.capacity", logging.INFO, __file__, 1, {}, None, None)
    for event in ("probe_ok", "decode_slowdown_readable", "decode_slowdown_unreadable"):
        record.msg = {"event": event, "pairs": 8}
        handler.emit(record)
    record.msg = "decode_slowdown_readable, but as text"  # not structlog's: not the word
    handler.emit(record)
    assert len(words) == 2
