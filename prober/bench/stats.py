"""Pure statistics of one bench level: distributions with intervals, throughputs, Little's law.

No clock, no I/O: every function works on `RequestResult`s, so the tests drive them with
plain integers.

Definitions (docs/bench.md states them for users):

- latency distributions (TTFT, TTFO, TPOT, ITL, E2E) are over successful requests; every
  failure is counted in `outcomes` and fails goodput. TTFT/TTFO/E2E count from `t_sched`
  (docs/design.md §2), so open-loop figures include any client lateness.
- the level window runs from the first `t_sched` to the last `t_end`. Throughputs
  (`throughput.py`): open loop, counted / window; closed loop, the mean number of requests
  in service while the client still sent over their mean service time, free of the idle
  slots of the level's ramp-down.
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
  learns it); service time = E2E from send − W_q: what a slot is held for (both in
  `throughput.py`, where the closed loop's rates rest on them).
- intervals (`intervals.py`): every latency distribution of per-request values carries a
  `ci` block, the throughputs a `throughput_ci` block; the knee and the capacity, judged on
  them, are `verdicts.py`'s.
- achieved arrival rate (open loop): arrivals (measured and dropped) less one over the span
  of the measured ones' scheduled instants; a seeded schedule of N arrivals can fall in far
  less or more time than N / rate.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from prober import timings
from prober.bench import throughput
from prober.bench.intervals import QUANTILES, quantile_intervals
from prober.bench.intervals import percentile as percentile  # the bench's quantile, re-exported
from prober.bench.throughput import queue_wait, service_time
from prober.capacity.own import PrefillBaseline
from prober.result import Outcome, RequestResult
from prober.timings import NS_PER_S, Slo

Summary = dict[str, Any]


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
    closed loop's configured C, for the λ·W check (and the closed loop's throughput interval).
    """
    if not results:
        return {"requests_total": 0, "outcomes": {}}
    start_ns, end_ns = window(results)
    span = (end_ns - start_ns) / NS_PER_S
    ok = [r for r in results if r.ok]
    tpots = _present(timings.tpot(r) for r in ok)
    good = sum(timings.is_good(r, slo) for r in results)
    outcomes = Counter(r.outcome.value for r in results)
    baseline = baseline if baseline is not None else prefill_baseline(results)
    rates = throughput.rates(results, slo, baseline, closed=concurrency is not None)
    latencies = {
        "ttft_seconds": _present(timings.ttft(r) for r in ok),
        "ttfo_seconds": _present(timings.ttfo(r) for r in ok),
        "tpot_seconds": tpots,
        "e2e_seconds": _present(timings.e2e(r) for r in ok),
    }
    cis = quantile_intervals(latencies)
    return {
        "requests_total": len(results),
        "requests_ok": len(ok),
        "duration_seconds": span,
        **{name: {**distribution(v), "ci": cis[name]} for name, v in latencies.items()},
        "itl_seconds": distribution([g for r in ok for g in timings.itl_gaps(r)]),
        "queue_wait_seconds": distribution(_present(queue_wait(r, baseline) for r in ok)),
        "service_time_seconds": distribution(_present(service_time(r, baseline) for r in ok)),
        "dispatch_lag_seconds": distribution([timings.dispatch_lag(r) for r in results]),
        "request_throughput": rates["request_throughput"],
        "output_token_throughput": rates["output_token_throughput"],
        "throughput_ci": rates["throughput_ci"],
        "output_token_throughput_per_request": distribution([1 / t for t in tpots if t > 0]),
        "output_tokens_mean": statistics.fmean(r.output_tokens for r in ok) if ok else None,
        "prompt_tokens_mean": _mean_prompt(ok),
        "outcomes": {o.value: outcomes[o.value] for o in Outcome if outcomes[o.value]},
        "goodput": {
            "ratio": good / len(results),
            "requests_per_second": rates["goodput_requests_per_second"],
        },
        "littles_law": littles_law(results, concurrency),
    }


def arrival_rate(results: Sequence[RequestResult], nominal: float, dropped: int = 0) -> Summary:
    """The open loop's achieved arrival rate: (arrivals − 1) / span of the scheduled instants,
    dropped arrivals counted (they were offered); None with fewer than two."""
    scheds = [r.t_sched_ns for r in results]
    arrivals = len(scheds) + dropped
    span = (max(scheds) - min(scheds)) / NS_PER_S if scheds else 0.0
    achieved = (arrivals - 1) / span if arrivals >= 2 and span > 0 else None
    return {"nominal": nominal, "achieved": achieved, "arrivals": arrivals, "span_seconds": span}


def _mean_prompt(ok: Sequence[RequestResult]) -> float | None:
    counts = [r.prompt_tokens for r in ok if r.prompt_tokens]
    return statistics.fmean(counts) if counts else None
