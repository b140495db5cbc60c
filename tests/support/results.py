"""`RequestResult`s with plain integer stamps, for tests of what is computed from one, and a
throwaway `Recorder` for code that needs one."""

from __future__ import annotations

from collections.abc import Sequence
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


def timed_result(
    send: float, first: float, end: float, *, prefill: float, prompt_tokens: int,
    gaps: Sequence[float] | None = None,
) -> RequestResult:  # fmt: skip
    """A request that succeeded, for the queue estimators: scheduled and sent at `send` s, its
    first token (an answer's) at `first`, ended at `end`, with the server's `prefill` seconds.
    Its token events: at `first`, then one each of `gaps` seconds after the one before (the
    last is the last token), or, without `gaps`, at `first` and at `end`."""
    stamps: tuple[int, ...]
    if gaps is None:
        stamps = (int(first * S), int(end * S))
    else:
        built = [int(first * S)]
        for g in gaps:
            built.append(built[-1] + int(g * S))
        stamps = tuple(built)
    return RequestResult(
        Outcome.OK, int(send * S), int(send * S), int(end * S),
        t_first_token_ns=int(first * S), t_first_content_ns=int(first * S),
        t_last_token_ns=stamps[-1], token_event_ns=stamps, prompt_tokens=prompt_tokens,
        output_tokens=len(stamps), server_prefill_seconds=prefill,
    )  # fmt: skip


def recorder() -> Recorder:
    """A recorder on a registry of its own: what bench gives its load driver."""
    return Recorder(Metrics(CollectorRegistry()))
