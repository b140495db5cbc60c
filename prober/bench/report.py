"""The bench report: the JSON document (its keys are a public contract) and its writer.

`build_report` turns a `SweepRun` into `{"config", "environment", "intervals", "levels",
"knee", "capacity", "warnings"}`; each level carries its identity (`{"concurrency": C}` or
`{"rate": R}`, with the achieved `arrival_rate` beside the nominal one in an open loop), the
statistics of `stats.summarize` with their intervals, the `client` block (`watch.verdict`:
was the client itself the bottleneck?), and one record per measured request; the knee, the
capacity and the warnings are `verdicts.py`'s. `text.py` renders it for the terminal.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from prober import __version__, timings
from prober.bench import intervals, stats, verdicts
from prober.bench.config import BenchConfig, Mode
from prober.bench.runner import LevelRun, SweepRun
from prober.bench.watch import verdict
from prober.capacity.own import PrefillBaseline
from prober.result import RequestResult
from prober.summary import result_summary
from prober.timings import NS_PER_S, Slo


def build_report(cfg: BenchConfig, sweep: SweepRun) -> dict[str, Any]:
    # One prefill envelope for the whole sweep: its least-loaded requests show the prefill.
    every = [sweep.preflight, *(r for run in sweep.levels for r in run.results)]
    baseline = stats.prefill_baseline(every)
    levels = [level_report(run, cfg.slo, baseline, sweep.event_loop) for run in sweep.levels]
    return {
        "config": cfg.as_json(),
        "environment": environment(sweep),
        "intervals": {
            "confidence": intervals.CONFIDENCE,
            "replicates": intervals.REPLICATES,
            "min_requests": intervals.MIN_REQUESTS,
            "method": "percentile bootstrap over the level's requests, seeded (docs/bench.md)",
        },
        "levels": levels,
        "knee": verdicts.knee(levels),
        "capacity": verdicts.capacity(levels, cfg.capacity_goodput, cfg.target_rate),
        "warnings": verdicts.warnings(levels),
    }


def level_report(
    run: LevelRun, slo: Slo, baseline: PrefillBaseline | None = None, event_loop: str = ""
) -> dict[str, Any]:
    key = run.level.key()
    closed = run.level.mode is Mode.CONCURRENCY
    concurrency = int(run.level.value) if closed else None
    summary = stats.summarize(run.results, slo, baseline=baseline, concurrency=concurrency)
    origin = min((r.t_sched_ns for r in run.results), default=0)
    if not closed:
        summary["arrival_rate"] = stats.arrival_rate(run.results, run.level.value, run.dropped)
    client = None
    if run.client is not None:
        client = verdict(run.client, event_loop, _latency_scale(summary))
    return {
        **key,
        "level": key,
        **summary,
        "client": client,
        "warmup_requests": run.warmup,
        "connections_warmed": run.connections_warmed,
        "dropped": run.dropped,
        "requests": [request_record(r, origin, slo) for r in run.results],
    }


def _latency_scale(summary: dict[str, Any]) -> float | None:
    """The finest latency the level measured: the smaller of its TTFT p50 and ITL p50."""
    figures = [summary.get(k, {}).get("p50") for k in ("ttft_seconds", "itl_seconds")]
    present = [f for f in figures if f]
    return min(present) if present else None


def request_record(r: RequestResult, origin_ns: int, slo: Slo) -> dict[str, Any]:
    """The probe's per-request JSON shape, plus stamps relative to the level's start."""

    def offset(ns: int | None) -> float | None:
        return None if ns is None else (ns - origin_ns) / NS_PER_S

    return {
        **result_summary(r),
        "good": timings.is_good(r, slo),
        "t_sched_offset_seconds": offset(r.t_sched_ns),
        "t_send_offset_seconds": offset(r.t_send_ns),
        "t_first_token_offset_seconds": offset(r.t_first_token_ns),
        "t_end_offset_seconds": offset(r.t_end_ns),
    }


def environment(sweep: SweepRun) -> dict[str, Any]:
    pre = sweep.preflight
    return {
        "llm_prober_version": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "event_loop": sweep.event_loop or None,
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "preflight": {
            "ttft_seconds": timings.ttft(pre),
            "prompt_tokens": pre.prompt_tokens,
            "token_source": pre.token_source.value,
        },
        "prompt_tokens_per_word": sweep.tokens_per_word,
    }


def write_json(doc: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
