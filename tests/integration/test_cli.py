"""The `llm-prober` command as a user runs it: real processes, real ports, real signals."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web

from tests.support.net import free_port, wait_http
from tests.support.process import CLI, process
from tests.support.servers import serve_app
from tests.support.sse import chunk, sse, streaming

MINIMAL = """\
server:
  listen: "127.0.0.1:{port}"
targets:
  - name: local
    url: http://127.0.0.1:{sim}/v1
    model: any
"""


@pytest.fixture(scope="module")
def sim_port() -> Iterator[int]:
    port = free_port()
    with process("sim", "--port", str(port), "--decode-step", "0.01") as proc:
        wait_http(f"http://127.0.0.1:{port}/health")
        yield port
        assert proc.poll() is None


def test_probe_prints_one_json_object(sim_port: int) -> None:
    out = subprocess.run(
        [*CLI, "probe", "--url", f"http://127.0.0.1:{sim_port}/v1", "--model", "sim",
         "--max-tokens", "8", "--prompt-tokens", "32", "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    doc = json.loads(out.stdout)
    for key in ("outcome", "ttft_seconds", "ttfo_seconds", "tpot_seconds", "e2e_seconds",
                "itl_seconds", "prompt_tokens", "output_tokens", "reasoning_tokens",
                "token_source"):  # fmt: skip
        assert key in doc
    assert doc["outcome"] == "ok"
    assert doc["output_tokens"] == 8
    assert doc["token_source"] == "usage"
    assert len(doc["itl_seconds"]) == 7


async def test_probe_sends_an_azure_shaped_request() -> None:
    """The hosted-API flags end to end: the query kept, the key alone in `api-key`, an extra
    header, and the key nowhere in the output."""
    seen: list[tuple[str, dict[str, str]]] = []
    answer = streaming([chunk({"content": "hi"}), chunk({}, "stop"), sse("[DONE]")])

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append((request.path_qs, dict(request.headers)))
        return await answer(request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    key = "sk-azure-shaped-0123456789"
    async with serve_app(app) as root:
        proc = await asyncio.create_subprocess_exec(
            *CLI, "probe", "--url", f"{root}/openai/deployments/g?api-version=2024-06-01",
            "--model", "g", "--api-key-env", "LLMPROBER_TEST_AZURE_KEY",
            "--api-key-header", "api-key", "--header", "X-Team: search", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "LLMPROBER_TEST_AZURE_KEY": key},
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["outcome"] == "ok"
    [(path, headers)] = seen
    assert path == "/openai/deployments/g/chat/completions?api-version=2024-06-01"
    assert (headers["api-key"], headers["X-Team"]) == (key, "search")
    assert "Authorization" not in headers
    assert key not in (out + err).decode()


def test_probe_failure_exits_1_with_outcome() -> None:
    port = free_port()
    out = subprocess.run(
        [*CLI, "probe", "--url", f"http://127.0.0.1:{port}/v1", "--model", "m", "--json"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 1
    assert json.loads(out.stdout)["outcome"] == "connect_error"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["probe", "--url", "http://x/v1", "--model", "m", "--max-tokens", "0"],
         "argument --max-tokens: must be at least 1, got 0"),
        (["probe", "--url", "http://x/v1", "--model", "m", "--api", "grpc"],
         "argument --api: invalid choice: 'grpc'"),
        (["probe", "--model", "m"], "the following arguments are required: --url"),
    ],
)  # fmt: skip
def test_bad_flags_exit_2_with_one_clear_line(argv: list[str], message: str) -> None:
    out = subprocess.run([*CLI, *argv], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2
    assert message in out.stderr


def test_check_config(tmp_path: Path) -> None:
    good = tmp_path / "good.yml"
    good.write_text(MINIMAL.format(port=9470, sim=8080))
    out = subprocess.run([*CLI, "check-config", str(good)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    bad = tmp_path / "bad.yml"
    bad.write_text("targets:\n  - name: x\n    url: ftp://h\n")
    out = subprocess.run([*CLI, "check-config", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        "targets[0].url: must be an http:// or https:// URL, got 'ftp://h'",
        "targets[0].model: required",
    ]
    # The daemon refuses to start on the same errors.
    out = subprocess.run([*CLI, "run", "--config", str(bad)], capture_output=True, text=True)
    assert out.returncode == 2
    assert "targets[0].model: required" in out.stderr


def test_check_config_probe_tries_each_target(tmp_path: Path, sim_port: int) -> None:
    path = tmp_path / "config.yml"
    path.write_text(
        MINIMAL.format(port=9470, sim=sim_port)
        + f"  - name: no-v1\n    url: http://127.0.0.1:{sim_port}\n    model: any\n"
    )
    out = subprocess.run([*CLI, "check-config", str(path), "--probe"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 1, out.stderr
    assert out.stdout.splitlines() == [
        f"{path}: ok (2 targets)",
        f"targets[0] (local): ok (http://127.0.0.1:{sim_port}/v1)",
        f"targets[1] (no-v1): http_4xx: HTTP 404 from http://127.0.0.1:{sim_port}/chat/completions:"
        " is the base URL the one that ends in /v1?",
    ]


def test_daemon_serves_and_exits_0_on_sigterm_within_grace(tmp_path: Path, sim_port: int) -> None:
    port = free_port()
    config = tmp_path / "config.yml"
    config.write_text(
        MINIMAL.format(port=port, sim=sim_port)
        + "    headers: {X-Sim-Fault: 'stall_after:2'}\n    warmup: 0\n"
    )
    with process(
        "run", "--config", str(config), env={"LLMPROBER_SERVER__GRACE_SECONDS": "1"}
    ) as proc:
        landing = wait_http(f"http://127.0.0.1:{port}/")
        assert "local" in landing
        assert wait_http(f"http://127.0.0.1:{port}/-/healthy") == "OK\n"
        metrics = wait_http(f"http://127.0.0.1:{port}/metrics")
        assert "llmprober_slo_ttft_seconds" in metrics
        time.sleep(0.5)  # the stalled probe is now in flight
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        elapsed = time.monotonic() - started
        output = proc.stdout.read() if proc.stdout else ""
    assert code == 0, output
    assert elapsed < 1 + 5, f"shutdown took {elapsed:.1f}s with a 1 s grace"
    logs = [json.loads(line) for line in output.splitlines() if line.startswith("{")]
    events = [log["event"] for log in logs]
    assert "starting" in events
    assert "stopped" in events
    # The `fast` extra is installed for the tests: the daemon must have picked uvloop up.
    loop = next(log["event_loop"] for log in logs if log["event"] == "starting")
    assert loop.startswith("uvloop" if importlib.util.find_spec("uvloop") else "asyncio")


def test_check_config_of_groups_alone_says_what_it_checked(tmp_path: Path) -> None:
    """Groups' targets are found at run time: the line counts the groups, not 0 targets."""
    path = tmp_path / "config.yml"
    group = "{group: %s, model: m, dns: {name: llm.test, type: A, port: 8000}}"
    path.write_text(f"target_groups: [{group % 'a'}, {group % 'b'}]\n")
    out = subprocess.run([*CLI, "check-config", str(path)], capture_output=True, text=True,
                         timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"{path}: ok (0 static targets, 2 target groups)"]
