"""Figures of closed-loop runs: goodput, cost, recovery after a phase, series and plots.

Definitions (docs/autoscaling.md states them):

- a request is good when it was answered and its TTFT (from its scheduled instant) is within
  the SLO; a request with no endpoint, dropped or failed is not good; goodput of a phase is
  good / all requests *scheduled* in it;
- cost is replica-seconds: every replica from its creation (weights loading included) to its
  stop, clipped to the trace, multiplied by the time factor to read in real seconds;
- recovery after a phase starts (the trace's `recovery_phase`: the standard trace's step,
  the diurnal trace's first midday): the phase is cut into bins of `bin_real` real seconds;
  the time from its start to the end of the last bin whose TTFT p95 is over the SLO (0 when
  none is; None when its last bin still is: not met again);
- series for the plots: per bin, the users' TTFT p95 and the controller's samples.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prober.bench.stats import percentile

from .trace import Trace

Record = dict[str, Any]


def is_good(r: Record, slo: float) -> bool:
    return r.get("outcome") == "ok" and r.get("ttft") is not None and r["ttft"] <= slo


def goodput(records: Sequence[Record], slo: float, start: float, end: float) -> float | None:
    inside = [r for r in records if start <= r["sched"] < end]
    return sum(is_good(r, slo) for r in inside) / len(inside) if inside else None


def replica_seconds(lifetimes: Sequence[tuple[float, float]], start: float, end: float) -> float:
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in lifetimes)


def ttft_p95_bins(
    records: Sequence[Record], start: float, end: float, width: float
) -> list[tuple[float, float | None]]:
    """(bin start, TTFT p95) over [start, end); unanswered requests count as infinitely late."""
    count = max(1, math.ceil((end - start) / width - 1e-9))
    bins: list[list[float]] = [[] for _ in range(count)]
    for r in records:
        i = math.floor((r["sched"] - start) / width)
        if 0 <= i < count:
            ok = r.get("outcome") == "ok" and r.get("ttft") is not None
            bins[i].append(r["ttft"] if ok else _NEVER)
    return [(start + i * width, _late(percentile(b, 0.95))) for i, b in enumerate(bins)]


# Unanswered requests rank as this late; infinities would interpolate to NaN.
_NEVER = 1e9


def _late(p95: float | None) -> float | None:
    return math.inf if p95 is not None and p95 >= _NEVER else p95


def recovery(
    records: Sequence[Record], trace: Trace, slo: float, width: float, phase: str | None = None
) -> float | None:
    """Seconds (compressed) from the phase's start (the trace's `recovery_phase` unless named)
    until its TTFT p95 stays within the SLO."""
    start, end = trace.phase(phase or trace.recovery_phase)
    bins = ttft_p95_bins(records, start, end, width)
    over = [i for i, (_, p95) in enumerate(bins) if p95 is not None and p95 > slo]
    if not over:
        return 0.0
    if over[-1] == len(bins) - 1:
        return None
    return min(end, bins[over[-1]][0] + width) - start


def summarize(
    run: dict[str, Any], trace: Trace, slo: float, factor: float, bin_real: float = 30.0
) -> dict[str, Any]:
    """One policy's row: goodput overall and per phase, cost, recovery, peak replicas."""
    records, end = run["requests"], trace.seconds
    # A phase is every run of segments of its name (the diurnal trace's bursts are four).
    phases = {s.name: trace.spans(s.name) for s in trace.segments}
    cost = replica_seconds(run["replicas"], 0.0, end) * factor
    rec = recovery(records, trace, slo, bin_real / factor)
    samples = run["samples"]

    def inside(t: float, spans: list[tuple[float, float]]) -> bool:
        return any(a <= t < b for a, b in spans)

    def good(spans: list[tuple[float, float]]) -> float | None:
        chosen = [r for r in records if inside(r["sched"], spans)]
        return goodput(chosen, slo, 0.0, end)

    return {
        "policy": run["policy"],
        "requests": len(records),
        "goodput": goodput(records, slo, 0.0, end),
        "goodput_by_phase": {n: good(spans) for n, spans in phases.items()},
        "mean_replicas_by_phase": {
            n: sum(replica_seconds(run["replicas"], a, b) for a, b in spans)
            / sum(b - a for a, b in spans)
            for n, spans in phases.items()
        },
        "peak_replicas_by_phase": {
            n: max((s["spec"] for s in samples if inside(s["t"], spans)), default=0)
            for n, spans in phases.items()
        },
        "replica_seconds": cost,
        "mean_replicas": cost / (end * factor),
        "peak_replicas": max((s["spec"] for s in samples), default=0),
        "recovery_phase": trace.recovery_phase,
        "recovery_seconds": None if rec is None else rec * factor,
        "no_endpoint": sum(r.get("outcome") == "no_endpoint" for r in records),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def table(rows: Sequence[dict[str, Any]], trace: Trace | None = None) -> str:
    """A Markdown table of summaries (real-time units): goodput overall and in the trace's
    `columns` phases (the standard trace's ramp, step and spike by default)."""
    columns = trace.columns if trace is not None else Trace(()).columns
    after = trace.recovery_phase if trace is not None else Trace(()).recovery_phase
    head = (
        f"| policy | goodput | {' | '.join(columns)} | replica-s | mean replicas | peak | "
        f"{after} recovery |\n|{'---|' * (len(columns) + 6)}\n"
    )
    lines = []
    for r in rows:
        ph = r["goodput_by_phase"]
        rec = r["recovery_seconds"]
        lines.append(
            f"| {r['policy']} | {_pct(r['goodput'])} | "
            + "".join(f"{_pct(ph.get(c))} | " for c in columns)
            + f"{r['replica_seconds']:.0f} | {r['mean_replicas']:.2f} | {r['peak_replicas']} | "
            f"{'not met' if rec is None else f'{rec:.0f} s'} |"
        )
    return head + "\n".join(lines) + "\n"


def plot(
    runs: Sequence[dict[str, Any]], trace: Trace, slo: float, factor: float, out: Path
) -> Path | None:
    """replicas, TTFT p95 and queue over time, one column per policy; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, axes = plt.subplots(3, len(runs), figsize=(4 * len(runs), 8), sharex=True, squeeze=False)
    width = 15.0 / factor
    for col, run in enumerate(runs):
        t = [s["t"] * factor / 60 for s in run["samples"]]
        ax = axes[0][col]
        ax.step(t, [s["spec"] for s in run["samples"]], where="post", label="desired")
        ax.step(t, [s["ready"] for s in run["samples"]], where="post", label="ready")
        load = [trace.rate_at(s["t"]) for s in run["samples"]]
        ax.plot(t, load, ":", color="grey", label="load (replica capacities)")
        ax.set_title(run["policy"])
        ax.legend(fontsize=7)
        bins = ttft_p95_bins(run["requests"], 0.0, trace.seconds, width)
        ax = axes[1][col]
        p95 = [min(p, 5 * slo) * factor if p is not None else math.nan for _, p in bins]
        ax.plot([b * factor / 60 for b, _ in bins], p95)
        ax.axhline(slo * factor, color="red", linestyle="--", linewidth=0.8)
        ax.set_ylabel("users' TTFT p95 (real s)")
        ax = axes[2][col]
        ax.plot(t, [s["waiting"] or 0 for s in run["samples"]])
        ax.set_ylabel("waiting (fleet)")
        ax.set_xlabel("real minutes")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out
