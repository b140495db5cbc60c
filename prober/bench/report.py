"""The bench report: the JSON document (keys are a public contract) and the summary table.

`build_report` turns a `SweepRun` into `{"config", "environment", "levels", "knee",
"capacity"}`; each level carries its identity (`{"concurrency": C}` or `{"rate": R}`), the
statistics of `stats.summarize`, and one record per measured request. `print_summary` renders
the levels as a rich table, with the knee and capacity underneath.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from prober import __version__, timings
from prober.bench import stats
from prober.bench.config import BenchConfig
from prober.bench.runner import LevelRun, SweepRun
from prober.result import RequestResult
from prober.timings import NS_PER_S, Slo


def build_report(cfg: BenchConfig, sweep: SweepRun) -> dict[str, Any]:
    levels = [level_report(run, cfg.slo) for run in sweep.levels]
    return {
        "config": cfg.as_json(),
        "environment": environment(sweep),
        "levels": levels,
        "knee": stats.knee(levels),
        "capacity": stats.capacity(levels, cfg.capacity_goodput, cfg.target_rate),
    }


def level_report(run: LevelRun, slo: Slo) -> dict[str, Any]:
    key = run.level.key()
    summary = stats.summarize(run.results, slo)
    origin = min((r.t_sched_ns for r in run.results), default=0)
    return {
        **key,
        "level": key,
        **summary,
        "warmup_requests": run.warmup,
        "dropped": run.dropped,
        "requests": [request_record(r, origin, slo) for r in run.results],
    }


def request_record(r: RequestResult, origin_ns: int, slo: Slo) -> dict[str, Any]:
    """The probe's per-request JSON shape, plus stamps relative to the level's start."""
    # Imported here: prober.cli imports bench to wire the subcommand.
    from prober.cli import result_summary

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


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _num(value: Any, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _level_name(level: dict[str, Any]) -> str:
    if "concurrency" in level:
        return f"c={level['concurrency']}"
    return f"{level['rate']:g}/s"


def summary_table(doc: dict[str, Any]) -> Table:
    table = Table(title=f"llm-prober bench: {doc['config']['model']} at {doc['config']['url']}")
    for name in ("level", "ok/all", "req/s", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
                 "ITL p99", "E2E p50", "goodput", "L", "λW", "L/λW"):  # fmt: skip
        table.add_column(name, justify="right")
    for lvl in doc["levels"]:
        little = lvl.get("littles_law", {})
        table.add_row(
            _level_name(lvl["level"]),
            f"{lvl.get('requests_ok', 0)}/{lvl['requests_total']}",
            _num(lvl.get("request_throughput")),
            _num(lvl.get("output_token_throughput"), ".1f"),
            _ms(lvl.get("ttft_seconds", {}).get("p50")),
            _ms(lvl.get("ttft_seconds", {}).get("p99")),
            _ms(lvl.get("tpot_seconds", {}).get("p50")),
            _ms(lvl.get("itl_seconds", {}).get("p99")),
            _ms(lvl.get("e2e_seconds", {}).get("p50")),
            f"{lvl['goodput']['ratio']:.0%}" if "goodput" in lvl else "-",
            _num(little.get("mean_in_flight")),
            _num(little.get("lambda_times_w")),
            _num(little.get("ratio"), ".3f"),
        )
    table.caption = "latencies in ms; L = mean in flight, λW = completion rate × mean E2E"
    return table


def verdict_lines(doc: dict[str, Any]) -> list[str]:
    knee, cap = doc["knee"], doc["capacity"]
    lines = []
    if knee["level"] is None:
        lines.append(f"knee: none found ({knee['rule']})")
    else:
        lines.append(
            f"knee: {_level_name(knee['level'])} (TTFT p99 {knee['ttft_p99_seconds']:.3f}s vs "
            f"{knee['baseline_ttft_p99_seconds']:.3f}s at the lowest level, throughput "
            f"{knee['throughput_gain']:+.0%}); last scaling level "
            f"{_level_name(knee['last_scaling_level'])}"
        )
    if cap["level"] is None:
        lines.append(f"capacity: no level meets the SLO ({cap['rule']})")
    else:
        lines.append(
            f"capacity: {_level_name(cap['level'])} (goodput {cap['goodput_ratio']:.0%}, "
            f"{cap['request_throughput']:.2f} req/s, "
            f"mean E2E {cap['mean_e2e_from_send_seconds']:.3f}s)"
        )
        if "slots_needed" in cap:
            lines.append(
                f"slots for {cap['target_rate']:g} req/s by Little's law: "
                f"{cap['concurrency_needed']:.2f} -> {cap['slots_needed']}"
            )
    return lines


def print_summary(doc: dict[str, Any], console: Console | None = None) -> None:
    out = console or Console()
    if console is None and not out.is_terminal:
        out.width = 160  # a pipe or a file: do not squeeze the table into 80 columns
    out.print(summary_table(doc))
    for line in verdict_lines(doc):
        out.print(line, highlight=False)
