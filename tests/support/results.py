"""A `RequestResult` with plain integer stamps, for tests of what is computed from one, and a
throwaway `Recorder` for code that needs one."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from prober.metrics import Metrics
from prober.record import Recorder
from prober.result import Outcome, RequestResult

S = 1_000_000_000  # ns per second


def result(outcome: Outcome = Outcome.OK, **kw: Any) -> RequestResult:
    """A reasoning-first stream: sched 0, send 0.1 s, first reasoning token 0.5 s, first
    answer token 1.5 s, last token 2.5 s, 11 token events, end 3 s."""
    stamps = tuple(int(0.5 * S) + i * (S // 5) for i in range(11))
    base: dict[str, Any] = {
        "t_sched_ns": 0,
        "t_send_ns": S // 10,
        "t_end_ns": 3 * S,
        "t_first_byte_ns": int(0.4 * S),
        "t_first_token_ns": stamps[0],
        "t_first_content_ns": int(1.5 * S),
        "t_last_token_ns": stamps[-1],
        "token_event_ns": stamps,
        "output_tokens": len(stamps),
    }
    base.update(kw)
    return RequestResult(outcome=outcome, **base)


def recorder() -> Recorder:
    """A recorder on a registry of its own: what bench gives its load driver."""
    return Recorder(Metrics(CollectorRegistry()))
