"""PNG charts of a bench report (matplotlib, Agg backend: no display needed).

`write_plots(doc, directory)` draws, against the load: TTFT p50/p99 (`ttft.png`), throughput
(`throughput.png`: requests/s and goodput/s above, output tokens/s below) and TPOT p50/p99
(`tpot.png`). Each figure's interval is a band around it; the SLO is a horizontal line on the
latency charts; the knee and the capacity are vertical lines on every chart. The load axis is
the concurrency (log 2 scale) or, in an open loop, the achieved arrival rate with the nominal
rate under each tick, and the served = arrived diagonal on the throughput chart. Latencies are
on a log scale so the SLO and the levels below the knee stay readable together. The legend
sits below the axes, never on the data. Returns the paths written.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: never try to open a window

import matplotlib.pyplot as plt
from matplotlib import ticker
from matplotlib.axes import Axes
from matplotlib.figure import Figure

NAN = float("nan")
SIZE = (7.5, 5.0)


def _nominal(level: dict[str, Any]) -> float:
    return float(level.get("concurrency", level.get("rate", 0)))


def _get(node: Any, *path: str) -> Any:
    for key in path:
        node = node.get(key) if isinstance(node, dict) else None
    return node


def _series(levels: list[dict[str, Any]], *path: str) -> list[float]:
    return [NAN if (v := _get(lvl, *path)) is None else float(v) for lvl in levels]


def _band(levels: list[dict[str, Any]], *path: str) -> tuple[list[float], list[float]]:
    cis = [_get(lvl, *path) for lvl in levels]
    return [c[0] if c else NAN for c in cis], [c[1] if c else NAN for c in cis]


class Chart:
    """The load axis of one report: where each level sits, and how its ticks read."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.levels = [lvl for lvl in doc["levels"] if lvl.get("requests_ok")]
        self.open = doc["config"]["mode"] != "concurrency"
        self.x = [self.load(lvl) for lvl in self.levels]

    def load(self, level: dict[str, Any]) -> float:
        achieved = _get(level, "arrival_rate", "achieved")
        return float(achieved) if self.open and achieved else _nominal(level)

    def at(self, key: dict[str, Any] | None) -> float | None:
        """The x of the level whose identity is `key`."""
        for lvl in self.levels:
            if key is not None and lvl["level"] == key:
                return self.load(lvl)
        return None

    def line(self, ax: Axes, path: tuple[str, ...], label: str, **style: Any) -> None:
        """A series with its interval (at `path[:-1] + ("ci", path[-1])`, or `ci=`) as a band."""
        ci_path = style.pop("ci", (*path[:-1], "ci", path[-1]))
        (drawn,) = ax.plot(self.x, _series(self.levels, *path), label=label, **style)
        low, high = _band(self.levels, *ci_path)
        if any(not math.isnan(v) for v in low):
            ax.fill_between(self.x, low, high, color=drawn.get_color(), alpha=0.15, linewidth=0)

    def marks(self, ax: Axes, *, served: bool = False) -> None:
        """The capacity as a wide pale stripe and the knee as a dashed line over it (so both
        show where they fall on the same level), each named in the legend; with `served`,
        the capacity's throughput as a horizontal line too."""
        knee, cap = self.doc.get("knee", {}), self.doc.get("capacity", {})
        x = self.at(cap.get("level"))
        if x is not None:
            rate = cap.get("request_throughput")
            text = f"capacity ({rate:.2f} req/s served)" if rate is not None else "capacity"
            ax.axvline(x, color="tab:green", linewidth=8, alpha=0.25, label=text, zorder=0)
            if served and rate is not None:
                ax.axhline(rate, color="tab:green", linewidth=1, linestyle=":", zorder=0)
        x = self.at(knee.get("level"))
        if x is not None:
            ax.axvline(x, color="tab:red", linestyle="--", linewidth=1.2, label="knee")

    def slo(self, ax: Axes, key: str, name: str) -> None:
        value = self.doc["config"].get(key)
        if value:
            ax.axhline(value, color="black", linestyle="-.", linewidth=1, label=f"SLO {name}")

    def axis(self, ax: Axes) -> None:
        if self.open:
            ax.set_xlabel("achieved arrival rate, requests/s (nominal below)")
            names = [f"{x:.2f}\n({_nominal(lvl):g})" for x, lvl in zip(self.x, self.levels,
                                                                       strict=True)]  # fmt: skip
        else:
            ax.set_xlabel("concurrency (closed loop)")
            if self.x and min(self.x) > 0 and max(self.x) >= 4 * min(self.x):
                ax.set_xscale("log", base=2)
            names = [f"{x:g}" for x in self.x]
        ax.set_xticks(self.x, names)
        ax.margins(x=0.06)  # the last level's marks clear of the frame
        ax.minorticks_off()
        ax.grid(True, alpha=0.3)


def _save(fig: Figure, axes: list[Axes], path: Path) -> Path:
    handles, labels = [], []
    for ax in axes:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="outside lower center", ncols=min(4, len(labels) or 1),
               fontsize="small", frameon=False)  # fmt: skip
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _latency(chart: Chart, name: str, key: str, slo: str, title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=SIZE, layout="constrained")
    chart.line(ax, (key, "p50"), f"{name} p50", marker="o")
    chart.line(ax, (key, "p99"), f"{name} p99", marker="^", linestyle="--")
    chart.slo(ax, slo, name)
    chart.marks(ax)
    chart.axis(ax)
    ax.set_yscale("log")
    # Ticks at 1, 2 and 5 of each decade, written as plain numbers (0.2, not 2 x 10^-1).
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_ylabel("seconds (log scale)")
    ax.set_title(title)
    return _save(fig, [ax], path)


def _throughput(chart: Chart, path: Path) -> Path:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(SIZE[0], SIZE[1] * 1.4), sharex=True,
                                      layout="constrained", height_ratios=(3, 2))  # fmt: skip
    if chart.open:
        top.plot(chart.x, chart.x, color="grey", linewidth=1, label="served = arrived")
    ci = ("throughput_ci", "request_throughput")
    chart.line(top, ("request_throughput",), "requests/s", marker="o", linewidth=3, ci=ci)
    chart.line(top, ("goodput", "requests_per_second"), "goodput requests/s", marker="s",
               markerfacecolor="none", linestyle="--", linewidth=1.5, zorder=3,
               ci=("throughput_ci", "goodput_requests_per_second"))  # fmt: skip
    chart.marks(top, served=True)
    top.set_ylabel("requests/s")
    top.set_ylim(bottom=0)
    top.set_title("Throughput")
    top.grid(True, alpha=0.3)
    chart.line(bottom, ("output_token_throughput",), "output tokens/s", marker="^",
               color="tab:purple", ci=("throughput_ci", "output_token_throughput"))  # fmt: skip
    chart.marks(bottom)
    bottom.set_ylabel("output tokens/s")
    bottom.set_ylim(bottom=0)
    chart.axis(bottom)
    return _save(fig, [top, bottom], path)


def write_plots(doc: dict[str, Any], directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    chart = Chart(doc)
    return [
        _latency(
            chart,
            "TTFT",
            "ttft_seconds",
            "slo_ttft_seconds",
            "Time to first token",
            directory / "ttft.png",
        ),
        _throughput(chart, directory / "throughput.png"),
        _latency(
            chart,
            "TPOT",
            "tpot_seconds",
            "slo_tpot_seconds",
            "Time per output token",
            directory / "tpot.png",
        ),
    ]
