"""One shutdown deadline (issue 12 item 11): on SIGTERM, scheduled probes, background load and a
`/probe` in flight drain at once within `grace_seconds`, a job cancelled at shutdown logs no
ERROR traceback, and SIGHUP is ignored (the daemon keeps serving). Real processes on loopback."""

from __future__ import annotations

import json
import signal
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.net import free_port, wait_http
from tests.support.process import process

pytestmark = pytest.mark.timeout(120)
GRACE = 2.0
CONFIG = """\
server: {{listen: "127.0.0.1:{port}", grace_seconds: {grace}}}
logging: {{format: json}}
targets:
  - name: slow
    url: http://127.0.0.1:{sim}/v1
    model: sim
    warmup: 0
    interval_seconds: 1
    jitter_seconds: 0
    load: {{rate: 4, seed: 1}}
"""


def in_flight(port: int) -> float:
    text = wait_http(f"http://127.0.0.1:{port}/metrics")
    lines = [x for x in text.splitlines() if x.startswith("llmprober_load_in_flight{")]
    return sum(float(x.rsplit(" ", 1)[1]) for x in lines)


def test_sigterm_drains_everything_within_one_grace_and_sighup_is_ignored(
    tmp_path: Path,
) -> None:
    sim_port, port = free_port(), free_port()
    config = tmp_path / "config.yml"
    config.write_text(CONFIG.format(port=port, sim=sim_port, grace=GRACE))
    # 16 tokens at 0.5 s a step: every stream outlives the grace period.
    with (
        process("sim", "--port", str(sim_port), "--decode-step", "0.5"),
        process("run", "--config", str(config)) as proc,
    ):
        wait_http(f"http://127.0.0.1:{sim_port}/health")
        wait_http(f"http://127.0.0.1:{port}/-/healthy")
        for _ in range(100):  # until background load is in flight (bounded)
            if in_flight(port) >= 2:
                break
            time.sleep(0.1)
        assert in_flight(port) >= 2

        answers: list[object] = []

        def probe_now() -> None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/probe?target=slow",
                                            timeout=30) as resp:  # fmt: skip
                    answers.append(resp.status)
            except (urllib.error.URLError, OSError) as exc:
                answers.append(exc)

        thread = threading.Thread(target=probe_now)
        thread.start()
        time.sleep(0.5)  # the /probe request is in flight upstream by now

        proc.send_signal(signal.SIGHUP)
        time.sleep(0.3)
        assert proc.poll() is None, "SIGHUP must not kill the daemon"
        assert wait_http(f"http://127.0.0.1:{port}/-/healthy") == "OK\n"

        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        elapsed = time.monotonic() - started
        thread.join(timeout=30)
        output = proc.stdout.read() if proc.stdout else ""
    assert code == 0, output
    # Drained one after another (probes, then load, then /probe) this took over 3 graces.
    assert elapsed < 2 * GRACE, f"shutdown took {elapsed:.1f}s with a {GRACE} s grace"
    assert "Traceback" not in output
    logs = [json.loads(x) for x in output.splitlines() if x.startswith("{")]
    assert not [x for x in logs if x["level"] in ("error", "critical")], output
    events = [x["event"] for x in logs]
    assert "sighup_ignored" in events
    cancelled = [x for x in logs if x["event"] == "probe_failed" and x["outcome"] == "cancelled"]
    assert cancelled, "the probes cut at the deadline are logged as cancelled"
    assert answers, "the /probe request got an answer or a closed connection"
