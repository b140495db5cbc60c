"""A fleet of failing targets beside a healthy one (issue 38 item 6), the suite's short version of
`bench/failing_fleet.py`: 40 targets failing the ways an outage makes them fail
(`tests/support/failing_server.py`: a blackholed address, a 200 that drips bytes, one that
sends only keep-alive comments, one that sends a token every 2 s), each probed every second
with background load at 2/s, beside a healthy simulator target. Real processes on loopback.

What must hold, counted (the latencies are printed, not asserted: the machine is shared; the
figures against the goals belong to the benchmark):
- the daemon answers every `/-/healthy` asked of it, every 50 ms throughout;
- a target that answers no token holds few streams: once it has been silent for
  `load.silent_seconds` its load pauses, the held-back arrivals counted (`reason="silent"`),
  and lets go of what it held but the oldest request (counted, outcome `cancelled`): one
  held at most where its streams stay open (drip, keep-alives), a moment's arrivals where its
  connects time out (a blackhole), while the target that still sends a token every 2 s is
  slow, not silent, and keeps its open loop;
- the healthy target's load is never held back, and its probes succeed;
- SIGTERM ends the daemon, exit 0, within the grace plus the stop margin.
"""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.daemon import parse_samples, value
from tests.support.failing_server import WAYS
from tests.support.net import HealthWatch, free_port, wait_http
from tests.support.process import process

pytestmark = pytest.mark.timeout(240)
ROOT = Path(__file__).resolve().parents[2]
GRACE = 2.0
STOP_MARGIN = 2.0  # seconds past the grace a stop may take (the bound)
PER_WAY = 10
RATE = 2.0  # each target's load, arrivals/s
SILENT = 3.0  # load.silent_seconds
SECONDS = 20.0
# A silent target's load in flight once paused: its oldest request, where an open loop would
# hold 40 by the end (2/s for 20 s; the cap is 64) and the pause alone the SILENT seconds'
# arrivals (Poisson, mean 6).
SILENT_HOLDS_AT_MOST = 1
# A blackholed target's probes end at their 5 s connect time-out, past the SILENT window:
# between two, neither has waited the window nor ended in it, the pause ends, and the load
# sends until its next failure pauses it again. It holds a moment's arrivals, not the window's.
BLACKHOLE_HOLDS_AT_MOST = 16


def target(name: str, url: str) -> dict[str, Any]:
    return {
        "name": name, "url": url, "model": "sim", "interval_seconds": 1, "jitter_seconds": 0.5,
        "warmup": 0, "max_tokens": 16,
        "load": {"rate": RATE, "max_tokens": 16, "seed": 1, "silent_seconds": SILENT},
    }  # fmt: skip


def test_a_fleet_of_failing_targets_holds_few_streams_and_the_daemon_answers(
    tmp_path: Path,
) -> None:
    failing_port, sim_port, port = free_port(), free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.support.failing_server", "--port", str(failing_port)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        hole_port = int(server.stdout.readline())
        targets = [target("healthy", f"http://127.0.0.1:{sim_port}/v1")]
        for way in WAYS:
            at = hole_port if way == "blackhole" else failing_port
            for i in range(PER_WAY):
                targets.append(target(f"{way}-{i}", f"http://127.0.0.1:{at}/{way}/v1"))
        names = [t["name"] for t in targets]
        config = tmp_path / "config.yml"
        config.write_text(json.dumps({
            "server": {"listen": f"127.0.0.1:{port}", "grace_seconds": GRACE},
            "logging": {"format": "json"}, "targets": targets,
        }))  # fmt: skip
        lines: list[str] = []
        with (
            process("sim", "--port", str(sim_port)),
            process("run", "--config", str(config)) as proc,
        ):
            assert proc.stdout is not None
            reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
            reader.start()  # the daemon's log is read as it comes: a full pipe would block it
            wait_http(f"http://127.0.0.1:{sim_port}/health")
            wait_http(f"http://127.0.0.1:{port}/-/healthy")
            with HealthWatch(port, every=0.05) as health:
                time.sleep(SECONDS)
            text = wait_http(f"http://127.0.0.1:{port}/metrics")
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
            stopped = time.monotonic() - started
            reader.join(timeout=10)
    finally:
        server.terminate()
        server.wait(10)
    ms = sorted(x * 1e3 for x in health.latencies)
    print(
        f"/-/healthy answered {len(ms)} times: p50 {statistics.median(ms):.1f} ms, "
        f"p99 {ms[int(0.99 * (len(ms) - 1))]:.1f} ms, max {ms[-1]:.1f} ms;"
        f" stopped in {stopped:.2f} s"
    )
    samples = parse_samples(text)
    in_flight = {n: value(samples, "llmprober_load_in_flight", target=n) for n in names}
    silent = {
        n: value(samples, "llmprober_load_dropped_total", target=n, reason="silent") for n in names
    }
    let_go = {
        n: value(samples, "llmprober_requests_total", target=n, mode="load", outcome="cancelled")
        for n in names
    }
    for way in WAYS:
        mine = [f"{way}-{i}" for i in range(PER_WAY)]
        print(f"{way}: load in flight {[in_flight[n] for n in mine]},"
              f" held back {[silent[n] for n in mine]},"
              f" let go {[let_go[n] for n in mine]}")  # fmt: skip
    assert health.failures == [], health.failures[:5]
    for way in ("blackhole", "drip", "keepalive"):  # no token, ever
        for i in range(PER_WAY):
            name = f"{way}-{i}"
            most = BLACKHOLE_HOLDS_AT_MOST if way == "blackhole" else SILENT_HOLDS_AT_MOST
            assert in_flight[name] <= most, (name, in_flight[name])
            assert silent[name] > 0, name
        assert sum(let_go[f"{way}-{i}"] for i in range(PER_WAY)) > 0, way
    for i in range(PER_WAY):  # a token every 2 s: slow, not silent
        assert silent[f"slow_lines-{i}"] == 0
        assert let_go[f"slow_lines-{i}"] == 0
    assert silent["healthy"] == 0
    assert let_go["healthy"] == 0
    ok = [line for line in lines if '"probe_ok"' in line and '"target": "healthy"' in line]
    assert ok, "the healthy target's probes succeed"
    assert code == 0, "".join(lines[-20:])
    assert stopped < GRACE + STOP_MARGIN, f"stopped in {stopped:.1f} s, grace {GRACE} s"
    assert not [line for line in lines if "Traceback" in line]
