"""The bench report: the JSON document (keys are a public contract) and the summary table.

`build_report` turns a `SweepRun` into `{"config", "environment", "levels", "knee",
"capacity"}`; each level carries its identity (`{"concurrency": C}` or `{"rate": R}`), the
statistics of `stats.summarize`, the `client` block (`watch.verdict`: was the client itself
the bottleneck?), and one record per measured request. `print_summary` renders the levels as
a rich table, with the client warnings, the knee and the capacity underneath.
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
        "levels": levels,
        "knee": stats.knee(levels),
        "capacity": stats.capacity(levels, cfg.capacity_goodput, cfg.target_rate),
    }


def level_report(
    run: LevelRun, slo: Slo, baseline: PrefillBaseline | None = None, event_loop: str = ""
) -> dict[str, Any]:
    key = run.level.key()
    closed = run.level.mode is Mode.CONCURRENCY
    concurrency = int(run.level.value) if closed else None
    summary = stats.summarize(run.results, slo, baseline=baseline, concurrency=concurrency)
    origin = min((r.t_sched_ns for r in run.results), default=0)
    return {
        **key,
        "level": key,
        **summary,
        "client": verdict(run.client, event_loop) if run.client is not None else None,
        "warmup_requests": run.warmup,
        "connections_warmed": run.connections_warmed,
        "dropped": run.dropped,
        "requests": [request_record(r, origin, slo) for r in run.results],
    }


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


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _num(value: Any, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _level_name(level: dict[str, Any]) -> str:
    if "concurrency" in level:
        return f"c={level['concurrency']}"
    return f"{level['rate']:g}/s"


def _client_cell(lvl: dict[str, Any]) -> str:
    client = lvl.get("client")
    if not client:
        return "-"
    share = client.get("cpu_share")
    mark = "BOUND " if client.get("client_bound") else ""
    return f"{mark}{_num(share)}"


def summary_table(doc: dict[str, Any]) -> Table:
    loop = doc.get("environment", {}).get("event_loop")
    on = f" (client on {loop})" if loop else ""
    table = Table(title=f"llm-prober bench: {doc['config']['model']} at {doc['config']['url']}{on}")
    for name in (
        "level",
        "ok/all",
        "req/s",
        "tok/s",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "ITL p99",
        "E2E p50",
        "goodput",
        "L",
        "λW",
        "L/λW",
        "λW/C",
        "client CPU",
    ):
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
            _num(little.get("lambda_w_over_concurrency"), ".3f"),
            _client_cell(lvl),
        )
    table.caption = (
        "latencies in ms; L = mean in flight, λW = completion rate × mean E2E, C = configured "
        "concurrency; client CPU in cores, BOUND = the client was the bottleneck"
    )
    return table


def client_lines(doc: dict[str, Any]) -> list[str]:
    """One warning per level whose client was the bottleneck: its latencies are suspect."""
    lines = []
    for lvl in doc["levels"]:
        client = lvl.get("client") or {}
        if client.get("client_bound"):
            lines.append(
                f"{_level_name(lvl['level'])}: the client was the bottleneck "
                f"({'; '.join(client['reasons'])}): its latencies include the client's own "
                "queueing and are not trustworthy"
            )
    return lines


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
            lines.append(_slots_line(cap))
    return lines


def _slots_line(cap: dict[str, Any]) -> str:
    rate, w = cap["target_rate"], cap["mean_e2e_from_send_seconds"]
    in_system = f"{cap['slots_needed']} in system ({rate:g} x {w:.3f}s E2E)"
    if "slots_needed_service" not in cap:
        return f"slots for {rate:g} req/s by Little's law: {in_system}"
    wait = cap.get("mean_queue_wait_seconds") or 0.0
    return (
        f"slots for {rate:g} req/s by Little's law: {cap['slots_needed_service']} from "
        f"service time ({rate:g} x {cap['mean_service_seconds']:.3f}s = E2E minus "
        f"{wait:.3f}s queue wait), {in_system}"
    )


def print_summary(doc: dict[str, Any], console: Console | None = None) -> None:
    out = console or Console()
    if console is None and not out.is_terminal:
        out.width = 160  # a pipe or a file: do not squeeze the table into 80 columns
    out.print(summary_table(doc))
    for line in [*client_lines(doc), *verdict_lines(doc)]:
        out.print(line, highlight=False)
