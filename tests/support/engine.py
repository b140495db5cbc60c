"""A real llama-server for tests: start it on a free port, wait until healthy, stop it.

    with llama_server(slots=4) as base:          # base = "http://127.0.0.1:PORT" (no /v1)
        ...                                       # OpenAI API at base + "/v1", metrics at
                                                  # base + "/metrics"
    four_slots = llama_server_fixture(4)          # a module-scoped pytest fixture yielding base

The binary and model come from `LLAMA_SERVER` / `LLAMA_MODEL`, else from the cache that
`scripts/setup-engine.sh` fills (`${LLMPROBER_CACHE:-~/.cache/llm-prober}`). When either is
missing the test is skipped with the reason, unless the environment sets `CI`, where a missing
engine is a failure. The server runs with `-t 2` (the engine figures in the docs assume it),
`--poll 0` (see `llama_server`) and `--metrics`; its log goes to a temporary file whose tail
is shown if it fails to start.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import pytest

from tests.support.net import free_port

Scope = Literal["session", "package", "module", "class", "function"]
START_TIMEOUT_SECONDS = 120.0
STOP_TIMEOUT_SECONDS = 10.0
_MODEL_FILE = "gemma-3-270m-q4_k_m.gguf"


def engine_paths() -> tuple[Path, Path]:
    """(llama-server binary, GGUF model); skips (or fails under CI) when either is missing."""
    cache = Path(os.environ.get("LLMPROBER_CACHE", Path.home() / ".cache" / "llm-prober"))
    binary = Path(os.environ.get("LLAMA_SERVER", cache / "llama-server"))
    model = Path(os.environ.get("LLAMA_MODEL", cache / _MODEL_FILE))
    missing = [str(p) for p in (binary, model) if not p.is_file()]
    if missing:
        reason = (
            f"llama-server or model missing ({', '.join(missing)}): run scripts/setup-engine.sh"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return binary, model


def _healthy(base: str) -> bool:
    try:
        with urllib.request.urlopen(base + "/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False  # 503 while the model loads, refused before the socket is bound


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


@contextmanager
def llama_server(
    slots: int,
    ctx: int = 4096,
    *,
    threads: int = 2,
    poll: int = 0,
    extra_args: Sequence[str] = (),
) -> Iterator[str]:
    """A llama-server with `slots` parallel slots (`-np`) and `ctx` context tokens in all
    (each slot gets ctx / slots); yields its base URL without /v1.

    `poll=0`: worker threads sleep instead of spinning while they wait for each other. On a
    machine shared with other work the default spin (50) turns every lost core into a stall:
    measured here, a 2-thread decode went from 12 ms to 380 ms per token under load, while
    with `--poll 0` it stayed at 12 ms.
    """
    binary, model = engine_paths()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [
        str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(slots), "-t", str(threads), "-c", str(ctx), "--poll", str(poll), "--metrics",
        *extra_args,
    ]  # fmt: skip
    with tempfile.NamedTemporaryFile("w+b", prefix="llama-server-", suffix=".log") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + START_TIMEOUT_SECONDS
            while not _healthy(base):
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"llama-server exited with {proc.returncode}:\n{_tail(Path(log.name))}"
                    )
                if time.monotonic() > deadline:
                    raise RuntimeError(f"llama-server not healthy in {START_TIMEOUT_SECONDS}s")
                time.sleep(0.2)
            yield base
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[Any]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(STOP_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def llama_server_fixture(
    slots: int, ctx: int = 4096, *, scope: Scope = "module", **kwargs: Any
) -> Callable[[], Iterator[str]]:
    """A pytest fixture (assign it to a module-level name) yielding a running server's base."""

    @pytest.fixture(scope=scope)
    def _server() -> Iterator[str]:
        with llama_server(slots, ctx, **kwargs) as base:
            yield base

    return _server
