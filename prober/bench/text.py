"""The bench report for the terminal: the summary table and the lines under it.

`print_summary(doc)` renders the levels as a rich table (each figure with its interval on a
dim second line where it has one; an open loop's achieved arrival rate beside the nominal),
then one line per client-bound level, per warning, the knee (or why none was called) and the
capacity in served requests/s.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from prober.bench.verdicts import KNEE_THROUGHPUT_GAIN


def _ms(value: Any) -> str:
    return "-" if value is None else f"{value * 1000:.0f}"


def _num(value: Any, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def level_name(level: dict[str, Any]) -> str:
    if "concurrency" in level:
        return f"c={level['concurrency']}"
    return f"{level['rate']:g}/s"


def _with_ci(value: Any, ci: Any, render: Any) -> str:
    """The figure, and its interval on a dim second line when there is one."""
    if value is None:
        return "-"
    if not ci:
        return str(render(value))
    return f"{render(value)}\n[dim]{render(ci[0])}-{render(ci[1])}[/dim]"


def _dist(lvl: dict[str, Any], name: str, q: str) -> str:
    node = lvl.get(name) or {}
    return _with_ci(node.get(q), (node.get("ci") or {}).get(q), _ms)


def _client_cell(lvl: dict[str, Any]) -> str:
    client = lvl.get("client")
    if not client:
        return "-"
    mark = "BOUND " if client.get("client_bound") else ""
    return f"{mark}{_num(client.get('cpu_share'))}"


def _columns(open_loop: bool) -> list[str]:
    load = ["level", "arrived/s"] if open_loop else ["level"]
    return [*load, "ok/all", "req/s", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50", "ITL p99",
            "E2E p50", "goodput", "L", "λW", "L/λW", "λW/C", "client CPU"]  # fmt: skip


def _row(lvl: dict[str, Any], open_loop: bool) -> list[str]:
    little = lvl.get("littles_law", {})
    ci = lvl.get("throughput_ci") or {}
    load = [level_name(lvl["level"])]
    if open_loop:
        load.append(_num((lvl.get("arrival_rate") or {}).get("achieved")))
    return [
        *load,
        f"{lvl.get('requests_ok', 0)}/{lvl['requests_total']}",
        _with_ci(lvl.get("request_throughput"), ci.get("request_throughput"), _num),
        _with_ci(
            lvl.get("output_token_throughput"),
            ci.get("output_token_throughput"),
            lambda v: _num(v, ".1f"),
        ),
        _dist(lvl, "ttft_seconds", "p50"),
        _dist(lvl, "ttft_seconds", "p99"),
        _dist(lvl, "tpot_seconds", "p50"),
        _ms(lvl.get("itl_seconds", {}).get("p99")),
        _dist(lvl, "e2e_seconds", "p50"),
        f"{lvl['goodput']['ratio']:.0%}" if "goodput" in lvl else "-",
        _num(little.get("mean_in_flight")),
        _num(little.get("lambda_times_w")),
        _num(little.get("ratio"), ".3f"),
        _num(little.get("lambda_w_over_concurrency"), ".3f"),
        _client_cell(lvl),
    ]


def summary_table(doc: dict[str, Any]) -> Table:
    loop = doc.get("environment", {}).get("event_loop")
    on = f" (client on {loop})" if loop else ""
    table = Table(title=f"llm-prober bench: {doc['config']['model']} at {doc['config']['url']}{on}")
    open_loop = doc["config"].get("mode") == "rate"
    for name in _columns(open_loop):
        table.add_column(name, justify="right")
    for lvl in doc["levels"]:
        table.add_row(*_row(lvl, open_loop))
    confidence = doc.get("intervals", {}).get("confidence", 0.95)
    table.caption = (
        f"latencies in ms; under a figure its {confidence:.0%} interval (bootstrap over the "
        "level's requests); "
        + ("arrived/s = achieved arrival rate, the level names the nominal; " if open_loop else "")
        + "L = mean in flight, λW = completion rate × mean E2E, C = configured concurrency; "
        "client CPU in cores, BOUND = the client was the bottleneck"
    )
    return table


def client_lines(doc: dict[str, Any]) -> list[str]:
    """One warning per level whose client was the bottleneck: its latencies are suspect."""
    lines = []
    for lvl in doc["levels"]:
        client = lvl.get("client") or {}
        if client.get("client_bound"):
            lines.append(
                f"{level_name(lvl['level'])}: the client was the bottleneck "
                f"({'; '.join(client['reasons'])}): its latencies include the client's own "
                "queueing and are not trustworthy"
            )
    return lines


def _ci_text(ci: Any, fmt: str = ".2f") -> str:
    return f" ({ci[0]:{fmt}}-{ci[1]:{fmt}})" if ci else ""


def warning_lines(doc: dict[str, Any]) -> list[str]:
    lines = []
    for w in doc.get("warnings", []):
        name = level_name(w["level"])
        if w["kind"] == "too_few_requests":
            lines.append(
                f"warning: {name}: {w['requests_ok']} successful requests, fewer than "
                f"{w['min_requests']}: too few to tell signal from noise; it has no intervals "
                "and no verdict rests on it (raise --num-requests)"
            )
        elif w["kind"] == "dip":
            below = " and ".join(level_name(b) for b in w["below"])
            lines.append(
                f"warning: {name}: throughput fell below {below} and rose again at "
                f"{level_name(w['rose_at'])}, beyond the intervals: the server or the machine "
                "ran slower during this level (an interval covers which requests were "
                "measured, not a change of pace between levels)"
            )
    return lines


def knee_lines(knee: dict[str, Any]) -> list[str]:
    if knee["level"] is not None:
        return [_knee_line(knee)]
    return [f"knee: none found ({knee['rule']})", *map(_undecided_line, knee.get("undecided", []))]


def _knee_line(knee: dict[str, Any]) -> str:
    r = knee["ttft_p50_ratio_ci"]
    latency = (
        f"knee: {level_name(knee['level'])}: TTFT p50 {knee['ttft_p50_seconds']:.3f}s vs "
        f"{knee['last_ttft_p50_seconds']:.3f}s (x{knee['ttft_p50_ratio']:.2f}, interval "
        f"x{r[0]:.2f}-x{r[1]:.2f})"
    )
    last = level_name(knee["last_scaling_level"])
    if knee.get("stopped") == "behind":
        return (
            f"{latency} while it served {knee['request_throughput']:.2f} req/s"
            f"{_ci_text(knee.get('request_throughput_ci'))} of {knee['arrival_rate']:.2f}/s "
            f"arrived, a queue building; last level before it {last}"
        )
    g = knee["throughput_gain_ci"]
    return (
        f"{latency} while throughput grew {knee['throughput_gain']:+.0%} ({g[0]:+.0%} to "
        f"{g[1]:+.0%}, under {KNEE_THROUGHPUT_GAIN:+.0%}); last scaling level {last}"
    )


def _undecided_line(u: dict[str, Any]) -> str:
    name = level_name(u["level"])
    if u["reason"] == "throughput_unclear":
        g = u["throughput_gain_ci"]
        return (
            f"  {name}: TTFT rose, but the throughput's gain ({g[0]:+.0%} to {g[1]:+.0%}) "
            f"does not rule out {KNEE_THROUGHPUT_GAIN:+.0%} or more: too few requests to tell"
        )
    if u["reason"] == "throughput_fell":
        g = u["throughput_gain_ci"]
        return (
            f"  {name}: TTFT rose, but throughput fell ({g[0]:+.0%} to {g[1]:+.0%}): "
            "saturation holds it flat, so the server or the machine slowed down; not a knee"
        )
    return (
        f"  {name}: TTFT rose with flat throughput, but throughput rose again at "
        f"{level_name(u['rose_at'])}: a dip, not a knee"
    )


def capacity_lines(cap: dict[str, Any]) -> list[str]:
    if cap["level"] is None:
        return [f"capacity: no level meets the SLO ({cap['rule']})"]
    where = level_name(cap["level"])
    arrival = cap.get("arrival_rate")
    if arrival and arrival.get("achieved") is not None:
        where += f" nominal, {arrival['achieved']:.2f}/s arrived"
    at_least = "at least " if cap.get("lower_bound") else ""
    line = (
        f"capacity: {at_least}{cap['request_throughput']:.2f} req/s served"
        f"{_ci_text(cap.get('request_throughput_ci'))} at {where} (goodput "
        f"{cap['goodput_ratio']:.0%}, mean E2E {cap['mean_e2e_from_send_seconds']:.3f}s); "
        + _bound_text(cap)
    )
    lines = [line]
    if "slots_needed" in cap:
        lines.append(_slots_line(cap))
    return lines


def _bound_text(cap: dict[str, Any]) -> str:
    if cap.get("bounded_by") == "slo":
        bound = (
            f"bounded by the SLO ({level_name(cap['next_level'])} has goodput "
            f"{cap['next_goodput_ratio']:.0%})"
        )
    else:
        bound = "the highest level measured"
    trend = cap.get("trend")
    if trend == "flat":
        start = cap.get("plateau_from")
        since = f" from {level_name(start)} on" if start else ""
        return f"{bound}; throughput flat{since}: a ceiling"
    if trend == "behind":
        return f"{bound}; it served less than arrived, a queue building: past the ceiling"
    if trend == "rising":
        more = ": extend the sweep" if cap.get("lower_bound") else ""
        return f"{bound}; throughput still rising into it{more}"
    if trend == "unclear":
        return f"{bound}; the intervals cannot tell whether throughput still rose into it"
    return bound


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


def verdict_lines(doc: dict[str, Any]) -> list[str]:
    return [*knee_lines(doc["knee"]), *capacity_lines(doc["capacity"])]


def print_summary(doc: dict[str, Any], console: Console | None = None) -> None:
    out = console or Console()
    if console is None and not out.is_terminal:
        out.width = 160  # a pipe or a file: do not squeeze the table into 80 columns
    out.print(summary_table(doc))
    for line in [*client_lines(doc), *warning_lines(doc), *verdict_lines(doc)]:
        out.print(line, highlight=False, markup=False)
