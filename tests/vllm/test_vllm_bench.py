"""`llm-prober bench` against a real vLLM (`--max-num-seqs 4`): the queue forms past the slots.

A closed loop at c = 1, 2, 4, 8 with 16-token answers (`--ignore-eos`). Up to c = 4 every
request gets a sequence at once; at c = 8 half of them wait for one, so the queue wait and
TTFT jump there. What batching buys on this CPU build is printed, not assumed (here: 1.87,
3.24, 5.68 and 5.62 req/s at c = 1, 2, 4, 8). Little's law holds at every level, and the
client holds the configured concurrency while it sends.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.bench_report import bench, clean, fig, row
from tests.support.vllm import MODEL_NAME

pytestmark = pytest.mark.vllm
SWEEP = ("--concurrency", "1,2,4,8", "--num-requests", "16", "--input-len", "32",
         "--output-len", "16", "--warmup", "2")  # fmt: skip


def test_closed_loop_queue_forms_past_the_sequences(vllm: str, tmp_path: Path) -> None:
    doc = clean(lambda: [bench(vllm, tmp_path, "--model", MODEL_NAME, *SWEEP)])[0]
    levels = {level["concurrency"]: level for level in doc["levels"]}
    print("\nvLLM --max-num-seqs 4, closed loop:")
    for level in doc["levels"]:
        wait = fig(level, "queue_wait_seconds", "p50")
        print(f"  {row(level)}  queue wait p50 {wait:.3f}s")
    report = "\n".join(row(level) for level in doc["levels"])
    wait = {c: fig(levels[c], "queue_wait_seconds", "p50") for c in levels}
    ttft = {c: fig(levels[c], "ttft_seconds", "p50") for c in levels}
    # Within the sequences a request waits less than one decode step or so; past them, for
    # another request's whole answer (16 tokens): the jump is many times the c=4 wait.
    assert wait[8] > 0.25 * fig(levels[4], "e2e_seconds", "p50"), report
    assert wait[8] > 3 * max(wait[4], 0.02), report
    assert ttft[8] > 2 * ttft[4], report
    for c, level in levels.items():
        little = level["littles_law"]
        assert little["ratio"] == pytest.approx(1.0, rel=0.1), report
        held = little["arrival_window"]["mean_in_flight"]
        # While requests still arrive the client holds the configured concurrency. (λ·W over
        # the whole level also counts the last wave draining: 0.88 of c at c=8 here.)
        assert held == pytest.approx(c, rel=0.1), report
