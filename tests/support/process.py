"""The `llm-prober` command as a child process."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

CLI = [sys.executable, "-m", "prober.cli"]


@contextmanager
def process(*args: str, env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[str]]:
    """`llm-prober ARGS` with stdout and stderr merged as text; killed on exit if still alive."""
    proc = subprocess.Popen(
        [*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
