"""The sweep's verdicts from its level summaries: the knee, the capacity, and warnings where
the data cannot tell.

Levels come in increasing load. Two levels are compared only through their intervals
(`intervals.py`): the ratio of a figure at level j over level i gets an interval from the two
levels' own (`ratio_interval`, independent samples), and

- throughput *flat* from i to j: the ratio's upper bound is below 1 + KNEE_THROUGHPUT_GAIN
  (more load bought less than that, beyond the noise);
- throughput *rose*: the lower bound is above 1 and the upper bound reaches 1 + the gain (a
  rise the intervals show, and not known to be small);
- throughput *fell*: the upper bound is below 1 and the ratio itself below
  1 − KNEE_THROUGHPUT_GAIN (a fall beyond the noise, and of more than that);
- TTFT *rose*: the TTFT p50 ratio's lower bound is above 1 and the ratio itself at least
  1 + KNEE_TTFT_RISE;
- an open-loop level fell *behind* its arrivals: its served throughput's upper bound is
  below (1 − KNEE_THROUGHPUT_GAIN) × the achieved arrival rate, and in flight grew while
  requests arrived (`arrival_window.growth` ≥ QUEUE_GROWTH). The growth guards against the
  drain: a level's window ends when its last requests do, so served reads below arrived by
  about in-flight / requests even when the server keeps up.

Knee: the first level k whose TTFT rose over level k − 1 while throughput stayed flat (or, in
an open loop, level k fell behind its arrivals), and after which no level's throughput rose
over k or k − 1 (a rise later means the flat step was the machine's noise, a dip, not
saturation); k − 1 is the last scaling level. A step where throughput fell is no knee either:
saturation holds throughput flat, a fall means the server or the machine slowed down (another
process on its cores; an engine that thrashes, preempting and recomputing). A level without
intervals (fewer than `MIN_REQUESTS` successful requests) takes no part.

Capacity: the highest level of the unbroken run, from the lowest up, whose goodput ratio is at
least the threshold (as before intervals), stated with its served throughput and interval,
what bounds it (the next level misses the SLO, or the sweep ended) and whether the throughput
into it was still rising (then, at the sweep's end, it is a lower bound), flat or behind its
arrivals (a ceiling) or unclear; slots for a target rate by Little's law, as service time and
as time in system.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from prober.bench.intervals import MIN_REQUESTS, ratio_interval

KNEE_THROUGHPUT_GAIN = 0.10
# A knee's latency rise is queueing: a request waits for a whole service time, many times a
# prefill. A rise under a quarter, with flat throughput, is within what batching does to TTFT
# (prefills sharing steps with decodes), and on a noisy flat series it is how a false knee
# starts (1 in 150 synthetic sweeps called one without it, none with it).
KNEE_TTFT_RISE = 0.25
# In-flight over the second half of the arrivals / over the first: about 1 at a steady state,
# 2.6-2.8 measured at 1.25-4x capacity (docs/bench.md, "Open loop versus closed loop").
QUEUE_GROWTH = 1.3

Summary = dict[str, Any]
Ratio = tuple[float, float, float]  # point, low, high


def _get(summary: Summary, *path: str) -> Any:
    node: Any = summary
    for key in path:
        if not isinstance(node, dict) or node.get(key) is None:
            return None
        node = node[key]
    return node


def _ratio(
    before: Summary, after: Summary, point: tuple[str, ...], ci: tuple[str, ...]
) -> Ratio | None:
    a, b = _get(before, *point), _get(after, *point)
    a_ci, b_ci = _get(before, *ci), _get(after, *ci)
    if a is None or b is None or a_ci is None or b_ci is None:
        return None
    return ratio_interval(float(a), a_ci, float(b), b_ci)


def throughput_ratio(before: Summary, after: Summary) -> Ratio | None:
    """Request throughput at `after` over `before`, with its interval."""
    return _ratio(before, after, ("request_throughput",), ("throughput_ci", "request_throughput"))


def ttft_ratio(before: Summary, after: Summary) -> Ratio | None:
    """TTFT p50 at `after` over `before`, with its interval."""
    return _ratio(before, after, ("ttft_seconds", "p50"), ("ttft_seconds", "ci", "p50"))


def flat(r: Ratio | None) -> bool:
    return r is not None and r[2] < 1 + KNEE_THROUGHPUT_GAIN


def rose(r: Ratio | None) -> bool:
    return r is not None and r[1] > 1 and r[2] >= 1 + KNEE_THROUGHPUT_GAIN


def latency_rose(r: Ratio | None) -> bool:
    return r is not None and r[1] > 1 and r[0] >= 1 + KNEE_TTFT_RISE


def behind(level: Summary) -> bool:
    """An open-loop level served less than it was offered, beyond the noise, with a queue."""
    arrived = _get(level, "arrival_rate", "achieved")
    served = _get(level, "throughput_ci", "request_throughput")
    growth = _get(level, "littles_law", "arrival_window", "growth")
    if arrived is None or served is None or growth is None:
        return False
    return bool(served[1] < (1 - KNEE_THROUGHPUT_GAIN) * arrived and growth >= QUEUE_GROWTH)


def fell(r: Ratio | None) -> bool:
    return r is not None and r[2] < 1 and r[0] < 1 - KNEE_THROUGHPUT_GAIN


def _gain(r: Ratio) -> dict[str, Any]:
    return {"throughput_gain": r[0] - 1, "throughput_gain_ci": [r[1] - 1, r[2] - 1]}


def _rule() -> str:
    return (
        f"first level whose TTFT p50 rose over the level before (by {KNEE_TTFT_RISE:.0%} or "
        f"more, its interval above 1) while request throughput grew < "
        f"{KNEE_THROUGHPUT_GAIN:.0%} (the gain's interval below it; a fall of more than "
        f"{KNEE_THROUGHPUT_GAIN:.0%} beyond the noise is none) or, in an open loop, fell behind "
        "its arrivals, and no later level's throughput rose over either"
    )


def knee(levels: Sequence[Summary]) -> dict[str, Any]:
    """The knee of the module docstring; `undecided` says where TTFT rose but the intervals
    could not tell whether the throughput had stopped, or showed that it had not."""
    out: dict[str, Any] = {"rule": _rule(), "level": None, "undecided": []}
    for k in range(1, len(levels)):
        found = _knee_at(levels[k - 1], levels[k], levels[k + 1 :])
        if found is not None and "reason" in found:
            out["undecided"].append(found)
        elif found is not None:
            return out | found
    return out


def _knee_at(last: Summary, cur: Summary, after: Sequence[Summary]) -> dict[str, Any] | None:
    """The knee at `cur` (its fields), why not (an `undecided` entry with its `reason`), or
    None where TTFT did not rise or throughput clearly did."""
    latency, gain = ttft_ratio(last, cur), throughput_ratio(last, cur)
    if gain is None or latency is None or not latency_rose(latency):
        return None
    if fell(gain):
        return {"level": cur["level"], "reason": "throughput_fell", **_gain(gain)}
    stopped = "flat" if flat(gain) else "behind" if behind(cur) else None
    if stopped is None:  # a clear rise, or the intervals cannot tell
        unclear = {"level": cur["level"], "reason": "throughput_unclear", **_gain(gain)}
        return unclear if gain[1] <= 1 else None
    for j in after:
        if rose(throughput_ratio(cur, j)) or rose(throughput_ratio(last, j)):
            return {"level": cur["level"], "reason": "rose_later", "rose_at": j["level"]}
    return {
        "level": cur["level"],
        "last_scaling_level": last["level"],
        "stopped": stopped,
        **_gain(gain),
        "request_throughput": _get(cur, "request_throughput"),
        "request_throughput_ci": _get(cur, "throughput_ci", "request_throughput"),
        "arrival_rate": _get(cur, "arrival_rate", "achieved"),
        "ttft_p50_seconds": _get(cur, "ttft_seconds", "p50"),
        "last_ttft_p50_seconds": _get(last, "ttft_seconds", "p50"),
        "ttft_p50_ratio": latency[0],
        "ttft_p50_ratio_ci": [latency[1], latency[2]],
    }


def capacity(
    levels: Sequence[Summary], min_goodput: float, target_rate: float | None
) -> dict[str, Any]:
    """The highest level, from the lowest up without a miss, with goodput ratio ≥ min_goodput,
    and what the intervals say about it."""
    out: dict[str, Any] = {
        "rule": f"highest level, scanning up from the lowest until the first miss, whose "
        f"goodput ratio >= {min_goodput:g}",
        "min_goodput_ratio": min_goodput,
        "level": None,
    }
    top = -1
    for i, summary in enumerate(levels):
        ratio = _get(summary, "goodput", "ratio")
        if ratio is None or ratio < min_goodput:
            break
        top = i
    if top < 0:
        return out
    best = levels[top]
    w = _get(best, "littles_law", "mean_e2e_from_send_seconds")
    service = _get(best, "service_time_seconds", "mean")
    out |= {
        "level": best["level"],
        "goodput_ratio": _get(best, "goodput", "ratio"),
        "request_throughput": _get(best, "request_throughput"),
        "request_throughput_ci": _get(best, "throughput_ci", "request_throughput"),
        "goodput_requests_per_second": _get(best, "goodput", "requests_per_second"),
        "mean_e2e_from_send_seconds": w,
        "mean_service_seconds": service,
        "mean_queue_wait_seconds": _get(best, "queue_wait_seconds", "mean"),
        **_bound(levels, top),
    }
    if "arrival_rate" in best:
        out["arrival_rate"] = best["arrival_rate"]
    return out | _sizing(target_rate, w, service)


def _sizing(rate: float | None, w: float | None, service: float | None) -> dict[str, Any]:
    """Slots for `rate` req/s by Little's law: from time in system `w` and service time."""
    if rate is None or w is None:
        return {}
    out = {"target_rate": rate, "concurrency_needed": rate * w, "slots_needed": _slots(rate * w)}
    if service is not None:
        out["concurrency_needed_service"] = rate * service
        out["slots_needed_service"] = _slots(rate * service)
    return out


def _bound(levels: Sequence[Summary], top: int) -> dict[str, Any]:
    """What bounds the capacity level, the throughput's trend into it, and the lowest level
    of the SLO run already serving as much (flat from there to the capacity level)."""
    best = levels[top]
    out: dict[str, Any] = {"bounded_by": "sweep_end", "trend": None, "plateau_from": None}
    if top + 1 < len(levels):
        nxt = levels[top + 1]
        out |= {"bounded_by": "slo", "next_level": nxt["level"],
                "next_goodput_ratio": _get(nxt, "goodput", "ratio")}  # fmt: skip
    if behind(best):
        out["trend"] = "behind"
    elif top > 0:
        step = throughput_ratio(levels[top - 1], best)
        out["trend"] = "flat" if flat(step) else "rising" if rose(step) else "unclear"
    plateau = [lvl for lvl in levels[:top] if flat(throughput_ratio(lvl, best))]
    if plateau:
        out["plateau_from"] = plateau[0]["level"]
    out["lower_bound"] = out["bounded_by"] == "sweep_end" and out["trend"] not in (
        "flat",
        "behind",
    )
    return out


def warnings(levels: Sequence[Summary]) -> list[dict[str, Any]]:
    """Levels with too few requests for intervals, and throughput dips: a level significantly
    below an earlier one and a later one, i.e. the pace changed between levels (which no
    interval over one level's requests can show)."""
    out: list[dict[str, Any]] = []
    for i, lvl in enumerate(levels):
        ok = int(lvl.get("requests_ok", 0))
        if ok < MIN_REQUESTS:
            out.append({"level": lvl["level"], "kind": "too_few_requests", "requests_ok": ok,
                        "min_requests": MIN_REQUESTS})  # fmt: skip
            continue
        above_before = [e["level"] for e in levels[:i] if fell(throughput_ratio(e, lvl))]
        above_after = [e["level"] for e in levels[i + 1 :] if rose(throughput_ratio(lvl, e))]
        if above_before and above_after:
            out.append({"level": lvl["level"], "kind": "dip", "below": above_before,
                        "rose_at": above_after[0]})  # fmt: skip
    return out


def _slots(concurrency: float) -> int:
    return max(1, math.ceil(concurrency - 1e-9))
