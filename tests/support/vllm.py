"""A real vLLM (the CPU build) for tests: one per test run, on a free loopback port.

    with vllm_server() as base:       # base = "http://127.0.0.1:PORT" (no /v1)
        ...                           # OpenAI API at base + "/v1", metrics at base + "/metrics"

`tests/conftest.py` wraps it in the session fixture `vllm`, so the ~100 s start is paid once.
The interpreter and the model folder come from `VLLM_PYTHON` / `VLLM_MODEL`, else from the
cache that `scripts/setup-vllm.sh` fills (`${LLMPROBER_CACHE:-~/.cache/llm-prober}`). Where
that script found vLLM cannot run here it exported `VLLM_UNAVAILABLE` (the reason): the tests
are then skipped with it. Otherwise a missing install skips them, or fails them under `CI`.

The engine: `--max-num-seqs 4` (the slots the tests name), a 512-token context,
`--enforce-eager` (torch.compile would add three minutes to the start), the engine core and
worker at niceness 10 (`_yield_to_clients`: they busy the machine's cores), bf16 where the CPU
computes it natively and fp32 elsewhere (`dtype()`), a 1 GiB KV cache, the model served as `m`
(the name the tests send; vLLM refuses any other), `--enable-prompt-tokens-details` (the
cached prompt tokens in each answer's usage; prefix caching is on by default). Its log goes to
a temporary file whose tail `log_tail()` gives a failing test's message.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.engine import _healthy
from tests.support.machine import process_stats
from tests.support.net import free_port

SLOTS = 4
MODEL_NAME = "m"
START_TIMEOUT_SECONDS = 400.0
STOP_TIMEOUT_SECONDS = 20.0
_LOG: IO[bytes] | None = None


def vllm_paths() -> tuple[Path, Path]:
    """(the vLLM venv's python, the model folder); skips, or fails under CI, when missing."""
    if reason := os.environ.get("VLLM_UNAVAILABLE"):
        pytest.skip(f"vLLM cannot run on this machine: {reason}")
    cache = Path(os.environ.get("LLMPROBER_CACHE", Path.home() / ".cache" / "llm-prober"))
    python = Path(os.environ.get("VLLM_PYTHON", cache / "vllm-venv" / "bin" / "python"))
    model = Path(os.environ.get("VLLM_MODEL", cache / "gemma-3-270m-hf"))
    missing = [str(p) for p in (python, model / "config.json") if not p.is_file()]
    if missing:
        reason = f"vLLM or its model missing ({', '.join(missing)}): run scripts/setup-vllm.sh"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return python, model


def log_tail(lines: int = 30) -> str:
    """The last lines of the running vLLM's log (for a failing test's message)."""
    if _LOG is None:
        return "(no vLLM log)"
    text = Path(_LOG.name).read_text(errors="replace")
    return "\n".join(text.splitlines()[-lines:])


def _command(python: Path, model: Path, port: int) -> list[str]:
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
        "--served-model-name", MODEL_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--max-model-len", "512", "--max-num-seqs", str(SLOTS), "--dtype", dtype(),
        "--enforce-eager", "--chat-template", str(model / "chat-template.jinja"),
        "--enable-prompt-tokens-details",
    ]  # fmt: skip


def dtype(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """bf16 where the CPU computes it natively (AVX512-BF16 or AMX), else fp32.

    On an AVX2-only CPU vLLM's bf16 path gained nothing from batching (0.29 req/s for one
    stream, 0.31 for four; fp32: 0.35 and 0.93). `VLLM_DTYPE` overrides the choice."""
    if chosen := os.environ.get("VLLM_DTYPE"):
        return chosen
    try:
        flags = set(cpuinfo.read_text().split())
    except OSError:
        return "float32"
    return "bfloat16" if flags & {"avx512_bf16", "amx_bf16"} else "float32"


def _environment(model: Path) -> dict[str, str]:
    cache = model.parent / "vllm-cache"
    return {
        **os.environ,
        "VLLM_CACHE_ROOT": str(cache),  # it writes under the home folder otherwise
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }


@contextmanager
def vllm_server() -> Iterator[str]:
    """Start vLLM, wait until `/health` answers, yield its base URL; stop it after."""
    global _LOG
    python, model = vllm_paths()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.NamedTemporaryFile("w+b", prefix="vllm-", suffix=".log") as log:
        _LOG = log
        proc = subprocess.Popen(
            _command(python, model, port), stdout=log, stderr=subprocess.STDOUT,
            env=_environment(model), process_group=0,  # see _yield_to_clients
        )  # fmt: skip
        try:
            _wait_healthy(proc, base)
            _yield_to_clients(proc.pid)
            yield base
        finally:
            _stop(proc)
            _LOG = None


def _wait_healthy(proc: subprocess.Popen[Any], base: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while not _healthy(base):
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited with {proc.returncode}:\n{log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM not healthy in {START_TIMEOUT_SECONDS}s:\n{log_tail()}")
        time.sleep(0.5)


# The niceness of vLLM's engine core and worker: they yield the CPU to everything else.
ENGINE_NICENESS = 10


def _yield_to_clients(group: int) -> None:
    """Lowers every thread of vLLM's engine core and worker (process group `group`) to
    `ENGINE_NICENESS`; the API server, the daemon, the test and its load keep their own.

    Under load the worker computes on one core and the engine core polls the worker's queue
    on the other (87 % and 99 % of the two cores here): whatever else the machine runs gets
    what is left. On a shared CI machine that left vLLM's own API server and the test's
    loop starved (requests held in the API server while vLLM's gauges read 0.67 running of
    4; the daemon's /metrics unanswered for 30 s in a loop that shares nothing with vLLM). In
    production the engine has its machine and its clients theirs; niceness gives the clients
    that here without slowing the engine when they are idle.

    vLLM runs in a process group of its own (`_stop` signals the group) but in the test's
    session: with autogroup scheduling, on these machines, each session is one scheduling
    entity and niceness orders only the threads inside it. Started in a session of its own
    (as it once was), vLLM was a peer of the whole test run and its niceness void: the likeliest
    reading of a CI run whose test process got 4 % of the CPU beside the worker's 99 % and the
    engine core's 95 %, its loop up to 16 s late."""
    for pid, comm, fields in process_stats():
        if fields[2:3] != [str(group)] or not comm.startswith("VLLM::"):  # the third: pgrp
            continue
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                os.setpriority(os.PRIO_PROCESS, int(task.name), ENGINE_NICENESS)
        except OSError:
            continue  # gone, or not ours to change


def _stop(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM to the whole process group (the API server, its engine core and worker)."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, 15)
    try:
        proc.wait(STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()


Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def engine_samples(session: aiohttp.ClientSession, base: str) -> Samples:
    """vLLM's `/metrics` now, as {(sample name, sorted labels): value}."""
    async with session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def total(after: Samples, before: Samples, name: str, **labels: str) -> float:
    """How much the samples named `name` whose labels include `labels` grew, summed."""

    def summed(samples: Samples) -> float:
        return sum(
            v
            for (n, ls), v in samples.items()
            if n == name and all((k, w) in ls for k, w in labels.items())
        )

    return summed(after) - summed(before)
