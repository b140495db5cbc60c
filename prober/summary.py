"""One request's summary: the JSON shape `llm-prober probe` prints and bench records.

Beside `result.py` so that every command that reports a result (the CLI, bench's report)
takes it from below both of them.
"""

from __future__ import annotations

from typing import Any

from prober import timings
from prober.logs import redact
from prober.result import RequestResult


def result_summary(r: RequestResult) -> dict[str, Any]:
    """The probe's JSON shape (keys are a public contract)."""
    return {
        "outcome": r.outcome.value,
        "error": redact(r.error),  # a server may echo the API key in its error body
        "http_status": r.http_status,
        "request_id": r.request_id,
        "ttft_seconds": timings.ttft(r),
        "ttfo_seconds": timings.ttfo(r),
        "tpot_seconds": timings.tpot(r),
        "e2e_seconds": timings.e2e(r),
        "dispatch_lag_seconds": timings.dispatch_lag(r),
        "itl_seconds": timings.itl_gaps(r),
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        "reasoning_tokens": r.reasoning_tokens,
        "token_source": r.token_source.value,
        "tokens_lower_bound": r.tokens_lower_bound,
        "finish_reason": r.finish_reason.value,
        "answered": r.answered,
        "connection": None if r.reused is None else ("reused" if r.reused else "fresh"),
        "phases_seconds": dict(timings.phases(r)),
        "server_prefill_seconds": r.server_prefill_seconds,
        "server_decode_per_token_seconds": r.server_decode_per_token_seconds,
    }
