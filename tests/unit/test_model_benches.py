"""The benchmarks that are models of the estimator (no server, no engine) still run against
the estimator as it is: `bench/slowdown_decision.py` went on calling `slots_learning.model_jumps`
with arguments it no longer took (since 9c5115a), and nothing ran it until it was needed. A
few learners each; the figures are the benchmarks' to print, not this test's to judge."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.parametrize(
    ("script", "rows"),
    [("slowdown_decision.py", "vLLM CPU"), ("slots_learning.py", "0.17/0.16/0.09/0.13")],
)
def test_the_model_benchmark_runs(script: str, rows: str) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--trials", "5"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert rows in done.stdout, done.stdout
