"""Pure statistics of a bench sweep: per-level summaries, Little's law, knee and capacity.

No clock, no I/O: every function works on `RequestResult`s or on level summaries, so the
tests drive them with plain integers.

Definitions (docs/bench.md states them for users):

- latency distributions (TTFT, TTFO, TPOT, ITL, E2E) are over successful requests; every
  failure is counted in `outcomes` and fails goodput. TTFT/TTFO/E2E count from `t_sched`
  (docs/design.md §2), so open-loop figures include any client lateness.
- the level window runs from the first `t_sched` to the last `t_end`; throughputs divide
  by it.
- Little's law, over the window: L = ∫ in-flight(t) dt / T with a request in flight from
  `t_send` to `t_end` (any outcome); λ = successful completions / T; W = mean E2E of
  successful requests measured from `t_send`. The window starts and ends empty, so when
  every request succeeds L = λW is a sample-path identity: the check validates the
  bookkeeping, and `ratio` > 1 means failed requests held the server without completing.
  `arrival_window` adds what the identity cannot show: the mean in-flight while requests
  still arrive (the concurrency really held) and its growth from the first half of that
  window to the second (about 1 at a steady state, well above 1 when a queue builds). In a
  closed loop λW is also divided by the configured concurrency C: a check against a number
  that did not come from the records (below 1 by the ramp-down at the level's end, where
  workers that have sent their share leave fewer than C in flight, and by any client gap).
- queue wait of a successful request: `W_q = (t_first_token − t_send) − prefill`, prefill
  being the server's own figure where it reports one, else the sweep's lower envelope of
  time-to-first-token against prompt length (`capacity.own.PrefillBaseline`, as the daemon
  learns it); service time = E2E from send − W_q: what a slot is held for.
- knee: the first level, in increasing load, whose TTFT p99 exceeds KNEE_TTFT_FACTOR × the
  lowest level's while output-token throughput grew less than KNEE_THROUGHPUT_GAIN over the
  level before: more load bought mostly latency.
- capacity: the highest level of the unbroken run of levels, from the lowest up, whose
  goodput ratio is at least the threshold; slots for a target rate R by Little's law, twice:
  R × mean service time at that level (slots busy serving: what to provision) and R × W,
  the mean time in system (queue wait included: requests held, waiting or running).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from prober import timings
from prober.capacity.own import PrefillBaseline
from prober.result import Outcome, RequestResult
from prober.timings import NS_PER_S, Slo

QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p95", 0.95), ("p99", 0.99))
KNEE_TTFT_FACTOR = 2.0
KNEE_THROUGHPUT_GAIN = 0.10

Summary = dict[str, Any]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (NumPy's default method); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def distribution(values: Sequence[float]) -> dict[str, float | int | None]:
    """p50/p90/p95/p99, mean, min, max and count of `values` (None where there are none)."""
    out: dict[str, float | int | None] = {n: percentile(values, q) for n, q in QUANTILES}
    out["mean"] = statistics.fmean(values) if values else None
    out["min"] = min(values) if values else None
    out["max"] = max(values) if values else None
    out["count"] = len(values)
    return out


def _present(values: Iterable[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def window(results: Sequence[RequestResult]) -> tuple[int, int]:
    """The level window in ns: first scheduled instant to last end."""
    return min(r.t_sched_ns for r in results), max(r.t_end_ns for r in results)


def in_flight_area(results: Iterable[RequestResult], start_ns: int, end_ns: int) -> float:
    """∫ in-flight(t) dt over [start, end] in request-seconds; in flight from send to end."""
    area = 0
    for r in results:
        area += max(0, min(r.t_end_ns, end_ns) - max(r.t_send_ns, start_ns))
    return area / NS_PER_S


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def littles_law(results: Sequence[RequestResult], concurrency: int | None = None) -> dict[str, Any]:
    """L (time-weighted in-flight) versus λ·W over the level; in-flight over its arrivals;
    with a closed loop's configured `concurrency`, λ·W over it."""
    if not results:
        return {"mean_in_flight": None, "lambda_times_w": None, "ratio": None}
    start_ns, end_ns = min(r.t_send_ns for r in results), max(r.t_end_ns for r in results)
    span = (end_ns - start_ns) / NS_PER_S
    done = [r for r in results if r.ok]
    mean_in_flight = in_flight_area(results, start_ns, end_ns) / span if span > 0 else None
    lam = len(done) / span if span > 0 else None
    w = statistics.fmean((r.t_end_ns - r.t_send_ns) / NS_PER_S for r in done) if done else None
    lam_w = lam * w if lam is not None and w is not None else None
    return {
        "window_seconds": span,
        "mean_in_flight": mean_in_flight,
        "throughput": lam,
        "mean_e2e_from_send_seconds": w,
        "lambda_times_w": lam_w,
        "ratio": _ratio(mean_in_flight, lam_w) if mean_in_flight and lam_w else None,
        "arrival_window": arrival_window(results),
    } | _against_configured(lam_w, concurrency)


def _against_configured(lam_w: float | None, concurrency: int | None) -> dict[str, Any]:
    if concurrency is None:
        return {}
    ratio = lam_w / concurrency if lam_w is not None else None
    return {"configured_concurrency": concurrency, "lambda_w_over_concurrency": ratio}


def prefill_baseline(results: Iterable[RequestResult]) -> PrefillBaseline:
    """The lower envelope of time to first token (from send) against prompt length."""
    baseline = PrefillBaseline()
    for r in results:
        if r.ok and r.t_first_token_ns is not None:
            to_first = (r.t_first_token_ns - r.t_send_ns) / NS_PER_S
            baseline.observe(r.prompt_tokens or 0, to_first)
    return baseline


def queue_wait(r: RequestResult, baseline: PrefillBaseline) -> float | None:
    """`(t_first_token − t_send) − prefill`, at least 0; None without a first token."""
    if r.t_first_token_ns is None:
        return None
    prefill = r.server_prefill_seconds
    if prefill is None:
        prefill = baseline(r.prompt_tokens or 0) or 0.0
    return max(0.0, (r.t_first_token_ns - r.t_send_ns) / NS_PER_S - prefill)


def service_time(r: RequestResult, baseline: PrefillBaseline) -> float | None:
    """E2E from send minus the queue wait: how long the request held a slot."""
    wait = queue_wait(r, baseline)
    return None if wait is None else (r.t_end_ns - r.t_send_ns) / NS_PER_S - wait


def arrival_window(results: Sequence[RequestResult]) -> dict[str, float | None]:
    """In flight while requests still arrive ([first send, last send]), and its growth.

    `mean_in_flight` is the concurrency the client really held (closed loop: C, less any
    gap between a request's end and the next send); `growth` is the second half's mean
    over the first half's: about 1 at a steady state, well above 1 when a queue builds.
    """
    start_ns, end_ns = min(r.t_send_ns for r in results), max(r.t_send_ns for r in results)
    span = (end_ns - start_ns) / NS_PER_S
    if span <= 0:
        return {"window_seconds": span, "mean_in_flight": None, "growth": None}
    mid_ns = (start_ns + end_ns) // 2
    first = in_flight_area(results, start_ns, mid_ns)
    second = in_flight_area(results, mid_ns, end_ns)
    return {
        "window_seconds": span,
        "mean_in_flight": (first + second) / span,
        "growth": _ratio(second, first),
    }


def summarize(
    results: Sequence[RequestResult],
    slo: Slo,
    *,
    baseline: PrefillBaseline | None = None,
    concurrency: int | None = None,
) -> Summary:
    """Everything the report says about one level, from its measured results.

    `baseline`: the sweep's prefill envelope (default: this level's own); `concurrency`: the
    closed loop's configured C, for the λ·W check.
    """
    if not results:
        return {"requests_total": 0, "outcomes": {}}
    start_ns, end_ns = window(results)
    span = (end_ns - start_ns) / NS_PER_S
    ok = [r for r in results if r.ok]
    tpots = _present(timings.tpot(r) for r in ok)
    good = sum(timings.is_good(r, slo) for r in results)
    out_tokens = sum(r.output_tokens for r in ok)
    outcomes = Counter(r.outcome.value for r in results)
    baseline = baseline if baseline is not None else prefill_baseline(results)
    return {
        "requests_total": len(results),
        "requests_ok": len(ok),
        "duration_seconds": span,
        "ttft_seconds": distribution(_present(timings.ttft(r) for r in ok)),
        "ttfo_seconds": distribution(_present(timings.ttfo(r) for r in ok)),
        "tpot_seconds": distribution(tpots),
        "itl_seconds": distribution([g for r in ok for g in timings.itl_gaps(r)]),
        "e2e_seconds": distribution(_present(timings.e2e(r) for r in ok)),
        "queue_wait_seconds": distribution(_present(queue_wait(r, baseline) for r in ok)),
        "service_time_seconds": distribution(_present(service_time(r, baseline) for r in ok)),
        "dispatch_lag_seconds": distribution([timings.dispatch_lag(r) for r in results]),
        "request_throughput": _ratio(len(ok), span),
        "output_token_throughput": _ratio(out_tokens, span),
        "output_token_throughput_per_request": distribution([1 / t for t in tpots if t > 0]),
        "output_tokens_mean": statistics.fmean(r.output_tokens for r in ok) if ok else None,
        "prompt_tokens_mean": _mean_prompt(ok),
        "outcomes": {o.value: outcomes[o.value] for o in Outcome if outcomes[o.value]},
        "goodput": {"ratio": good / len(results), "requests_per_second": _ratio(good, span)},
        "littles_law": littles_law(results, concurrency),
    }


def _mean_prompt(ok: Sequence[RequestResult]) -> float | None:
    counts = [r.prompt_tokens for r in ok if r.prompt_tokens]
    return statistics.fmean(counts) if counts else None


def _get(summary: Summary, *path: str) -> float | None:
    node: Any = summary
    for key in path:
        if not isinstance(node, dict) or node.get(key) is None:
            return None
        node = node[key]
    return float(node)


def knee(levels: Sequence[Summary]) -> dict[str, Any]:
    """Where TTFT p99 stops scaling: see the module docstring. `levels` in increasing load."""
    rule = (
        f"first level whose TTFT p99 > {KNEE_TTFT_FACTOR:g} x the lowest level's while "
        f"output-token throughput grew < {KNEE_THROUGHPUT_GAIN:.0%} over the previous level"
    )
    base = _get(levels[0], "ttft_seconds", "p99") if levels else None
    out: dict[str, Any] = {"rule": rule, "level": None, "baseline_ttft_p99_seconds": base}
    if base is None:
        return out
    for prev, cur in itertools.pairwise(levels):
        p99 = _get(cur, "ttft_seconds", "p99")
        before = _get(prev, "output_token_throughput")
        after = _get(cur, "output_token_throughput")
        if p99 is None or before is None or after is None or before <= 0:
            continue
        gain = after / before - 1
        if p99 > KNEE_TTFT_FACTOR * base and gain < KNEE_THROUGHPUT_GAIN:
            return out | {
                "level": cur["level"],
                "last_scaling_level": prev["level"],
                "ttft_p99_seconds": p99,
                "throughput_gain": gain,
            }
    return out


def capacity(
    levels: Sequence[Summary], min_goodput: float, target_rate: float | None
) -> dict[str, Any]:
    """The highest level, from the lowest up without a miss, with goodput ratio ≥ min_goodput."""
    out: dict[str, Any] = {
        "rule": f"highest level, scanning up from the lowest until the first miss, whose "
        f"goodput ratio >= {min_goodput:g}",
        "min_goodput_ratio": min_goodput,
        "level": None,
    }
    best: Summary | None = None
    for summary in levels:
        ratio = _get(summary, "goodput", "ratio")
        if ratio is None or ratio < min_goodput:
            break
        best = summary
    if best is None:
        return out
    w = _get(best, "littles_law", "mean_e2e_from_send_seconds")
    service = _get(best, "service_time_seconds", "mean")
    out |= {
        "level": best["level"],
        "goodput_ratio": _get(best, "goodput", "ratio"),
        "request_throughput": _get(best, "request_throughput"),
        "goodput_requests_per_second": _get(best, "goodput", "requests_per_second"),
        "mean_e2e_from_send_seconds": w,
        "mean_service_seconds": service,
        "mean_queue_wait_seconds": _get(best, "queue_wait_seconds", "mean"),
    }
    if target_rate is not None and w is not None:
        out["target_rate"] = target_rate
        out["concurrency_needed"] = target_rate * w
        out["slots_needed"] = _slots(target_rate * w)
        if service is not None:
            out["concurrency_needed_service"] = target_rate * service
            out["slots_needed_service"] = _slots(target_rate * service)
    return out


def _slots(concurrency: float) -> int:
    return max(1, math.ceil(concurrency - 1e-9))
