"""PNG charts of a bench report (matplotlib, Agg backend: no display needed).

`write_plots(doc, directory)` draws, against the load (concurrency or rate): TTFT p50/p99,
throughput (requests/s, goodput requests/s and output tokens/s), and TPOT p50/p99. The knee,
when found, is marked on every chart. Returns the paths written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: never try to open a window

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure


def _load(level: dict[str, Any]) -> float:
    return float(level.get("concurrency", level.get("rate", 0)))


def _series(levels: list[dict[str, Any]], *path: str) -> list[float]:
    out: list[float] = []
    for level in levels:
        node: Any = level
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        out.append(float("nan") if node is None else float(node))
    return out


def _axis_label(doc: dict[str, Any]) -> str:
    if doc["config"]["mode"] == "concurrency":
        return "concurrency (closed loop)"
    return "offered rate, requests/s (open loop)"


def _mark_knee(ax: Axes, doc: dict[str, Any]) -> None:
    knee = doc.get("knee", {}).get("level")
    if knee:
        ax.axvline(_load(knee), color="grey", linestyle="--", linewidth=1, label="knee")


def _finish(
    fig: Figure,
    ax: Axes,
    doc: dict[str, Any],
    title: str,
    ylabel: str,
    path: Path,
    twin: Axes | None = None,
) -> Path:
    _mark_knee(ax, doc)
    ax.set_title(title)
    ax.set_xlabel(_axis_label(doc))
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if twin is not None:  # one legend for both axes, so neither hides the other
        more_handles, more_labels = twin.get_legend_handles_labels()
        handles, labels = handles + more_handles, labels + more_labels
    ax.legend(handles, labels, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_plots(doc: dict[str, Any], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    levels = [lvl for lvl in doc["levels"] if lvl.get("requests_ok")]
    x = [_load(lvl) for lvl in levels]
    paths = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for q in ("p50", "p99"):
        ax.plot(x, _series(levels, "ttft_seconds", q), marker="o", label=f"TTFT {q}")
    paths.append(_finish(fig, ax, doc, "Time to first token", "seconds", directory / "ttft.png"))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(x, _series(levels, "request_throughput"), marker="o", label="requests/s")
    ax.plot(x, _series(levels, "goodput", "requests_per_second"), marker="s", label="goodput/s")
    twin = ax.twinx()
    twin.plot(
        x,
        _series(levels, "output_token_throughput"),
        marker="^",
        color="tab:green",
        label="output tokens/s",
    )
    twin.set_ylabel("output tokens/s")
    path = directory / "throughput.png"
    paths.append(_finish(fig, ax, doc, "Throughput", "requests/s", path, twin))

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for q in ("p50", "p99"):
        ax.plot(x, _series(levels, "tpot_seconds", q), marker="o", label=f"TPOT {q}")
    paths.append(_finish(fig, ax, doc, "Time per output token", "seconds", directory / "tpot.png"))
    return paths
