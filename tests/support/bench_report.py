"""`llm-prober bench` in tests: run it in-process, read its JSON report (one figure by its key
path, one row a level), and measure again while a report shows the machine stalled it."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prober.bench import add_bench_parser, run_bench


def fig(level: dict[str, Any], *path: str) -> float:
    node: Any = level
    for key in path:
        node = node[key]
    return float(node)


def bench(base: str, tmp_path: Path, *argv: str) -> dict[str, Any]:
    """Run `llm-prober bench` against `base`; return its JSON report."""
    parser = argparse.ArgumentParser(prog="llm-prober")
    add_bench_parser(parser.add_subparsers(dest="command"))
    out = tmp_path / f"bench-{time.perf_counter_ns()}.json"
    argv = ("--url", base + "/v1", "--model", "gemma", "--seed", "7", "--ignore-eos",
            "--no-progress", "--out", str(out), *argv)  # fmt: skip
    args = parser.parse_args(["bench", *argv])
    assert run_bench(args) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    for level in doc["levels"]:
        assert level["outcomes"] == {"ok": level["requests_total"]}, level["outcomes"]
    return doc


ATTEMPTS = 3
STALL_GAP_SECONDS = 0.5  # a decode step here takes 10-40 ms
STALL_PREFILL_TOKENS_PER_SECOND = 100.0  # the engine prefills at ~300 tok/s


def stalls(doc: dict[str, Any]) -> list[str]:
    """Signs in a report that something else on the machine starved the engine or client."""
    found = []
    for level in doc["levels"]:
        name = f"c={level['concurrency']}" if "concurrency" in level else f"{level['rate']:g}/s"
        for r in level["requests"]:
            gap = max(r["itl_seconds"], default=0.0)
            prefill = r["server_prefill_seconds"] or 0.0
            if gap > STALL_GAP_SECONDS:
                found.append(f"{name}: {gap:.2f}s between two tokens")
            if prefill > 0.5 + r["prompt_tokens"] / STALL_PREFILL_TOKENS_PER_SECOND:
                found.append(f"{name}: {prefill:.2f}s to prefill {r['prompt_tokens']} tokens")
            if level.get("concurrency") == 1 and r["ttft_seconds"] - prefill > 0.5:
                found.append(f"{name}: {r['ttft_seconds'] - prefill:.2f}s lost outside prefill")
        held = level["littles_law"]["arrival_window"]["mean_in_flight"]
        if "concurrency" in level and held is not None and held < 0.9 * level["concurrency"]:
            found.append(f"{name}: client held only {held:.2f} in flight")
    return found


Docs = list[dict[str, Any]]


def clean(run: Callable[[], Docs], premise: Callable[[Docs], list[str]] | None = None) -> Docs:
    """`run()` again while its reports show a stall, or `premise` finds that the run did not
    set up what it measures, at most ATTEMPTS times in all."""
    for attempt in range(1, ATTEMPTS + 1):
        docs = run()
        found = [s for doc in docs for s in stalls(doc)] + (premise(docs) if premise else [])
        if not found:
            return docs
        print(f"\nattempt {attempt}: measured again ({'; '.join(found[:3])})")
    return docs


def row(level: dict[str, Any]) -> str:
    name = f"c={level['concurrency']}" if "concurrency" in level else f"{level['rate']:g}/s"
    little = level["littles_law"]
    return (
        f"{name:>8} TTFT p50 {fig(level, 'ttft_seconds', 'p50'):.3f} "
        f"p99 {fig(level, 'ttft_seconds', 'p99'):.3f}  TPOT p50 "
        f"{fig(level, 'tpot_seconds', 'p50') * 1000:.1f} ms  {fig(level, 'request_throughput'):.2f}"
        f" req/s  L {little['mean_in_flight']:.2f}  λW {little['lambda_times_w']:.2f}  "
        f"held {little['arrival_window']['mean_in_flight']:.2f}  "
        f"growth {little['arrival_window']['growth']:.2f}"
    )
