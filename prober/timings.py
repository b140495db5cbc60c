"""Pure timing maths of one request (docs/design.md §2 and §4, binding).

    dispatch lag = t_begin − t_sched              (the prober's own lateness only)
    TTFT         = t_first_token − t_sched        (any channel; includes dispatch lag)
    TTFO         = t_first_content − t_sched      (first answer token)
    TPOT         = (t_last_token − t_first_token) / (n_out − 1), only when n_out ≥ 2
    ITL          = each gap between consecutive token-bearing events
    E2E          = t_end − t_sched, for a successful stream
    answered     = a content token arrived (reasoning alone is no answer)
    good         = ok and answered and TTFT ≤ slo.ttft and TPOT ≤ slo.tpot
                   (and TTFO ≤ slo.ttfo, E2E ≤ slo.e2e when set)
                   and every answer check run on it passed (`prober.checks`)

Phases, from the moment the prober began the request, each ending where the next starts
(absent phases are skipped, so those present add up to TTFT − dispatch lag):

    resolve          t_resolved − t_begin              (a name was looked up)
    connect          t_tcp or t_connected − (t_resolved or t_begin)   (fresh connection)
    tls              t_connected − t_tcp               (fresh TLS connection)
    request_written  t_send − (t_connected or t_begin)
    first_byte       t_first_byte − t_send
    first_token      t_first_token − t_first_byte

Every function returns seconds (float) or None when the quantity does not exist for that
result. No clock, no I/O: tests drive them with plain integers.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from prober.result import RequestResult

NS_PER_S = 1_000_000_000


PHASES = ("resolve", "connect", "tls", "request_written", "first_byte", "first_token")


@dataclass(frozen=True, slots=True)
class Slo:
    """Per-target service-level objective; `e2e_seconds` and `ttfo_seconds` are optional."""

    ttft_seconds: float
    tpot_seconds: float
    e2e_seconds: float | None = None
    ttfo_seconds: float | None = None


def _seconds(ns: int) -> float:
    return ns / NS_PER_S


def t_begin(r: RequestResult) -> int:
    """When the prober began the request; a result without the stamp began at its send."""
    return r.t_send_ns if r.t_begin_ns is None else r.t_begin_ns


def dispatch_lag(r: RequestResult) -> float:
    return _seconds(t_begin(r) - r.t_sched_ns)


def phases(r: RequestResult) -> list[tuple[str, float]]:
    """(phase, seconds) for each phase this request went through, in order; none for a
    result that never obtained a connection."""
    if r.t_begin_ns is None or r.reused is None:
        return []
    ends: list[tuple[str, int | None]] = []
    if not r.reused:
        tcp = r.t_tcp_ns
        ends += [
            ("resolve", r.t_resolved_ns),
            ("connect", r.t_connected_ns if tcp is None else tcp),
            ("tls", None if tcp is None else r.t_connected_ns),
        ]
    ends += [
        ("request_written", r.t_send_ns),
        ("first_byte", r.t_first_byte_ns),
        ("first_token", r.t_first_token_ns),
    ]
    out: list[tuple[str, float]] = []
    at = r.t_begin_ns
    for name, end in ends:
        if end is not None:
            out.append((name, _seconds(end - at)))
            at = end
    return out


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
    """Goodput membership. A one-token answer has no TPOT and is judged on TTFT (and E2E).

    A stream without an answer (reasoning tokens only) is never good, however fast; nor is
    one whose answer failed a check, its outcome `ok` all the same.
    """
    if not r.ok or not r.answered or not r.checks_passed:
        return False
    if slo.ttfo_seconds is not None:
        first_answer = ttfo(r)
        if first_answer is None or first_answer > slo.ttfo_seconds:
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
