"""The engine tests' evidence helpers: the foreign load's failure pause and reasons, the loop
lag and the machine snapshot (tests/support/machine.py, tests/support/foreign_load.py)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.machine import LoopLag, snapshot
from tests.support.net import closed_port

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
