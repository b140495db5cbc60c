"""Pure timing maths of one request (DESIGN section 1, binding).

    dispatch lag = t_send − t_sched
    TTFT         = t_first_token − t_sched        (any channel; includes dispatch lag)
    TTFO         = t_first_content − t_sched      (first answer token)
    TPOT         = (t_last_token − t_first_token) / (n_out − 1), only when n_out ≥ 2
    ITL          = each gap between consecutive token-bearing events
    E2E          = t_end − t_sched, for a successful stream
    good         = ok and TTFT ≤ slo.ttft and TPOT ≤ slo.tpot (and E2E ≤ slo.e2e when set)

Every function returns seconds (float) or None when the quantity does not exist for that
result. No clock, no I/O: tests drive them with plain integers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from prober.result import RequestResult

NS_PER_S = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-target service-level objective; `e2e_seconds` is optional."""

    ttft_seconds: float
    tpot_seconds: float
    e2e_seconds: float | None = None


def _seconds(ns: int) -> float:
    return ns / NS_PER_S


def dispatch_lag(r: RequestResult) -> float:
    return _seconds(r.t_send_ns - r.t_sched_ns)


def ttft(r: RequestResult) -> float | None:
    return None if r.t_first_token_ns is None else _seconds(r.t_first_token_ns - r.t_sched_ns)


def ttfo(r: RequestResult) -> float | None:
    if r.t_first_content_ns is None:
        return None
    return _seconds(r.t_first_content_ns - r.t_sched_ns)


def tpot(r: RequestResult) -> float | None:
    if r.output_tokens < 2 or r.t_first_token_ns is None or r.t_last_token_ns is None:
        return None
    return _seconds(r.t_last_token_ns - r.t_first_token_ns) / (r.output_tokens - 1)


def itl_gaps(r: RequestResult) -> list[float]:
    stamps = r.token_event_ns
    return [_seconds(b - a) for a, b in itertools.pairwise(stamps)]


def e2e(r: RequestResult) -> float | None:
    return _seconds(r.t_end_ns - r.t_sched_ns) if r.ok else None


def is_good(r: RequestResult, slo: Slo) -> bool:
    """Goodput membership. A one-token answer has no TPOT and is judged on TTFT (and E2E)."""
    if not r.ok:
        return False
    first = ttft(r)
    if first is None or first > slo.ttft_seconds:
        return False
    per_token = tpot(r)
    if per_token is not None and per_token > slo.tpot_seconds:
        return False
    if slo.e2e_seconds is not None:
        total = e2e(r)
        if total is None or total > slo.e2e_seconds:
            return False
    return True
