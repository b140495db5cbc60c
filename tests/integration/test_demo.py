"""`llm-prober demo` (issue 13 item 6): a busy port is one line naming it and the flag (exit 2);
once running it prints what to try next, the simulator on a free port by default."""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import time

import pytest

from tests.support.net import wait_http
from tests.support.process import CLI, process

pytestmark = pytest.mark.timeout(120)


def busy_port() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock


@pytest.mark.parametrize("flag", ["--port", "--sim-port"])
def test_a_busy_port_is_one_line_naming_it_and_the_flag(flag: str) -> None:
    with busy_port() as sock:
        port = sock.getsockname()[1]
        out = subprocess.run([*CLI, "demo", flag, str(port)], capture_output=True, text=True,
                             timeout=60, check=False)  # fmt: skip
    assert out.returncode == 2
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    assert lines[0].startswith(f"demo: port {port} is not free (")
    assert lines[0].endswith(f"choose another with {flag}")
    assert "Traceback" not in out.stdout + out.stderr


def test_demo_prints_what_to_try_next_and_serves_it() -> None:
    with busy_port() as sock:
        port = sock.getsockname()[1]  # free again once closed
    with process("demo", "--port", str(port), "--load-rate", "0") as proc:
        assert proc.stdout is not None
        text = ""
        deadline = time.monotonic() + 30
        while "Ctrl-C" not in text and time.monotonic() < deadline:  # bounded
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:  # raw reads: the text wrapper's buffer would hide lines from select
                text += os.read(proc.stdout.fileno(), 65536).decode()
        lines = text.splitlines()
        assert f"http://127.0.0.1:{port}/metrics" in text
        assert f"curl -s 'http://127.0.0.1:{port}/probe?target=sim'" in text
        assert "dashboards:" in text
        sim = next(x for x in lines if x.startswith("simulator:")).split()[1]
        assert not sim.endswith(":8000/v1")  # a free port, not vLLM's default
        assert '"ok"' in wait_http(f"{sim.removesuffix('/v1')}/health")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
