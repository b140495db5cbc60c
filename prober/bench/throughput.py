"""A level's throughputs and their intervals: what each request counts, and the share τ of the
level's time it stands for. Every rate is Σ counted / Σ τ over the level's requests (counted:
1 for a success, its output tokens, 1 for a good request), and its interval resamples the
requests with their τ (`intervals.throughput_intervals`).

- **Open loop**: τ is the interval from the completion before (the first request's from the
  level's first scheduled arrival), so Σ τ is the level window, first `t_sched` to last
  `t_end`, and each rate is counted / window. Arrivals are independent, so completions follow
  them below capacity and the service above it, and their intervals can be resampled.
- **Closed loop**: τ is the request's service time (E2E from send less its queue wait, as
  `stats.service_time`; a request without a first token: its time in system) over B, the mean
  number of requests in service while the client was still sending (first to last `t_send`).
  The rate is then B / mean service time: Little's law on the slots, over the part of the
  level where the client held its concurrency. B is what the experiment fixes (C below
  saturation, the engine's slots above it); the service times are what varies.

Why the closed loop is not counted / window: when workers have sent their share they stop,
and the slots idle while the last requests finish; over the whole window a level reads low
by about C / (2 N) of a request's time and by more the noisier the service, and more at
C = slots than above it, where the queue keeps the slots busy to the end: a saturated level
would look like a rise over the one before. Nor completion intervals: C requests sent together
end together, so its intervals come in waves that an independent resample miscounts. Nor time
in system: past saturation it adds a queue wait each request owes to the others' service, so
its spread counts the same noise several times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from prober import timings
from prober.bench.intervals import Share, throughput_intervals
from prober.capacity.own import PrefillBaseline
from prober.result import RequestResult
from prober.timings import NS_PER_S, Slo

RATES = ("request_throughput", "output_token_throughput", "goodput_requests_per_second")


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


def _held(r: RequestResult, baseline: PrefillBaseline) -> float:
    held = service_time(r, baseline)
    return held if held is not None else (r.t_end_ns - r.t_send_ns) / NS_PER_S


def completion_shares(results: Sequence[RequestResult]) -> list[float]:
    """Open loop: each request's interval from the completion before (seconds)."""
    before = min(r.t_sched_ns for r in results)
    taus = [0.0] * len(results)
    for i in sorted(range(len(results)), key=lambda i: results[i].t_end_ns):
        taus[i] = max(0, results[i].t_end_ns - before) / NS_PER_S
        before = max(before, results[i].t_end_ns)
    return taus


def in_service(results: Sequence[RequestResult], held: Sequence[float]) -> float | None:
    """B: the mean number of `results` in service (the last `held` seconds before each one's
    end) from the first to the last send; None when every request was sent at once."""
    start = min(r.t_send_ns for r in results) / NS_PER_S
    end = max(r.t_send_ns for r in results) / NS_PER_S
    if end <= start:
        return None
    busy = 0.0
    for r, h in zip(results, held, strict=True):
        stop = r.t_end_ns / NS_PER_S
        busy += max(0.0, min(stop, end) - max(stop - h, start))
    return busy / (end - start)


def service_shares(results: Sequence[RequestResult], baseline: PrefillBaseline) -> list[float]:
    """Closed loop: each request's service time over B (or, when every request was sent at
    once, scaled so the shares add up to the level window: counted / window)."""
    held = [_held(r, baseline) for r in results]
    total = math.fsum(held)
    busy = in_service(results, held)
    if busy is None or busy <= 0:
        span = (max(r.t_end_ns for r in results) - min(r.t_sched_ns for r in results)) / NS_PER_S
        busy = total / span if span > 0 else 0.0
    return [h / busy if busy > 0 else 0.0 for h in held]


def rates(
    results: Sequence[RequestResult], slo: Slo, baseline: PrefillBaseline, *, closed: bool
) -> dict[str, Any]:
    """The level's three rates (None without time to divide by) and their intervals."""
    taus = service_shares(results, baseline) if closed else completion_shares(results)
    shares = [
        Share(tau, int(r.ok), r.output_tokens if r.ok else 0, int(timings.is_good(r, slo)))
        for tau, r in zip(taus, results, strict=True)
    ]
    span = math.fsum(taus)
    counted = {
        "request_throughput": sum(s.ok for s in shares),
        "output_token_throughput": sum(s.tokens for s in shares),
        "goodput_requests_per_second": sum(s.good for s in shares),
    }
    method = "service_times" if closed else "completion_intervals"
    return {
        **{key: count / span if span > 0 else None for key, count in counted.items()},
        "throughput_ci": {"method": method, **throughput_intervals(shares, method)},
    }
