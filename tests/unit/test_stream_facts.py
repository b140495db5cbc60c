"""What one stream says beyond its latency (issue 13): an answer or none, the finish reason, the
token source and its cause, the phases and dispatch lag, and how `record` exports each.

Plain integers and fed events: no server, no clock.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from prober import timings
from prober.metrics import Labels, Metrics
from prober.request.sse import LineSplitter, SSEParser
from prober.request.stream import StreamState, finish_reason
from prober.result import FinishReason, Outcome, RequestResult, TokenSource
from prober.timings import Slo
from tests.support.sse import chunk, sse

MS = 1_000_000
SLO = Slo(ttft_seconds=2.0, tpot_seconds=0.2)


def run(events: list[bytes], *, ndjson: bool = False) -> RequestResult:
    """Feed each event as one read 10 ms apart; conclude as `request` does."""
    state = StreamState("rid", ndjson=ndjson)
    reader = LineSplitter(1 << 20) if ndjson else SSEParser(1 << 20)
    t = 100 * MS
    for event in events:
        state.feed(reader, event, t)
        t += 10 * MS
    state.close(reader, t)

    verdict = state.conclude()
    return state.result(
        verdict.outcome, error=verdict.error, t_sched_ns=0, t_send_ns=50 * MS, t_end_ns=t,
        wall_start=0.0,
    )  # fmt: skip


def ollama(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj).encode() + b"\n"


# -- answered, or reasoning only ---------------------------------------------------------------


def test_reasoning_only_stream_is_ok_without_answer_and_never_good() -> None:
    r = run([chunk({"reasoning_content": " hmm"}), chunk({"reasoning_content": " so"}, "length"),
             sse("[DONE]")])  # fmt: skip
    assert r.outcome is Outcome.OK
    assert not r.answered
    assert r.without_answer
    assert r.reasoning_tokens == 2
    assert timings.ttft(r) is not None
    assert timings.ttfo(r) is None
    assert not timings.is_good(r, Slo(ttft_seconds=1e9, tpot_seconds=1e9))


def test_answered_stream_is_good_within_slo() -> None:
    r = run([chunk({"reasoning_content": " hmm"}), chunk({"content": " yes"}, "stop"),
             sse("[DONE]")])  # fmt: skip
    assert r.answered
    assert not r.without_answer
    assert timings.is_good(r, SLO)


def test_ttfo_slo_joins_goodput_when_set() -> None:
    # First answer token at 110 ms after a schedule at 0.
    r = run([chunk({"reasoning_content": " hmm"}), chunk({"content": " yes"}, "stop"),
             sse("[DONE]")])  # fmt: skip
    assert timings.ttfo(r) == pytest.approx(0.11)
    assert timings.is_good(r, replace(SLO, ttfo_seconds=0.2))
    assert not timings.is_good(r, replace(SLO, ttfo_seconds=0.1))


# -- finish reasons ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sent", "expected"),
    [
        ("stop", FinishReason.STOP), ("length", FinishReason.LENGTH),
        ("content_filter", FinishReason.CONTENT_FILTER), ("tool_calls", FinishReason.TOOL_CALLS),
        ("function_call", FinishReason.TOOL_CALLS), ("eos_token", FinishReason.STOP),
        ("LENGTH", FinishReason.LENGTH), ("max_tokens", FinishReason.LENGTH),
        ("something_new", FinishReason.OTHER), ("x" * 10_000, FinishReason.OTHER),
        (17, FinishReason.OTHER), (None, None), ("", None),
    ],
)  # fmt: skip
def test_finish_reason_folds_onto_the_closed_set(sent: Any, expected: FinishReason) -> None:
    assert finish_reason(sent) is expected


def test_finish_reason_of_openai_stream_and_none_when_never_sent() -> None:
    r = run([chunk({"content": " a"}), chunk({}, "length"), sse("[DONE]")])
    assert r.finish_reason is FinishReason.LENGTH
    r = run([chunk({"content": " a"}), sse("[DONE]")])
    assert r.finish_reason is FinishReason.NONE


@pytest.mark.parametrize(
    ("done_reason", "expected"),
    [("stop", FinishReason.STOP), ("length", FinishReason.LENGTH), ("load", FinishReason.OTHER),
     (None, FinishReason.NONE)],
)  # fmt: skip
def test_ollama_done_reason_is_mapped(done_reason: str | None, expected: FinishReason) -> None:
    final: dict[str, Any] = {"message": {"content": ""}, "done": True, "eval_count": 1}
    if done_reason is not None:
        final["done_reason"] = done_reason
    r = run([ollama({"message": {"content": "hi"}, "done": False}), ollama(final)], ndjson=True)
    assert r.outcome is Outcome.OK  # done:true ends the stream, with or without a reason
    assert r.finish_reason is expected


# -- token source ------------------------------------------------------------------------------


def test_usage_is_the_source_when_sent() -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 8}}
    r = run([chunk({"content": " the cat sat"}), sse(usage), sse("[DONE]")])
    assert (r.token_source, r.output_tokens) == (TokenSource.USAGE, 8)
    assert not r.tokens_lower_bound
    assert r.token_fallback == ""


def test_no_usage_counts_events_and_says_why() -> None:
    r = run([chunk({"content": " a"}), chunk({"content": " b"}), sse("[DONE]")])
    assert (r.token_source, r.output_tokens) == (TokenSource.CHUNKS, 2)
    assert not r.tokens_lower_bound  # one word per event: as good as a count gets
    assert "no usage block" in r.token_fallback


def test_several_words_per_event_without_usage_is_a_lower_bound() -> None:
    r = run([chunk({"content": " the cat"}), chunk({"content": " sat down"}), sse("[DONE]")])
    assert r.output_tokens == 2
    assert r.tokens_lower_bound


def test_usage_without_a_valid_count_is_a_fallback_with_its_cause() -> None:
    usage = {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": -3}}
    r = run([chunk({"content": " a"}), sse(usage), sse("[DONE]")])
    assert r.token_source is TokenSource.CHUNKS
    assert "usage.completion_tokens" in r.token_fallback


def test_ollama_without_eval_count_is_a_fallback() -> None:
    lines = [ollama({"message": {"content": "hi"}, "done": False}),
             ollama({"message": {"content": ""}, "done": True, "done_reason": "stop"})]  # fmt: skip
    r = run(lines, ndjson=True)
    assert r.token_source is TokenSource.CHUNKS
    assert "eval_count" in r.token_fallback


# -- dispatch lag and phases -------------------------------------------------------------------


def stamped(**kw: Any) -> RequestResult:
    base: dict[str, Any] = {
        "outcome": Outcome.OK, "t_sched_ns": 0, "t_begin_ns": 3 * MS, "t_send_ns": 20 * MS,
        "t_end_ns": 200 * MS, "t_first_byte_ns": 40 * MS, "t_first_token_ns": 60 * MS,
        "t_first_content_ns": 60 * MS, "t_last_token_ns": 60 * MS, "token_event_ns": (60 * MS,),
        "output_tokens": 1,
    }  # fmt: skip
    return RequestResult(**(base | kw))


def test_dispatch_lag_ends_where_the_prober_began_not_at_the_send() -> None:
    r = stamped(t_resolved_ns=5 * MS, t_connected_ns=15 * MS, reused=False)
    assert timings.dispatch_lag(r) == pytest.approx(0.003)
    # A result that never began an attempt (cancelled before) falls back to its send.
    assert timings.dispatch_lag(replace(r, t_begin_ns=None)) == pytest.approx(0.020)


def test_fresh_tls_phases_add_up_to_ttft_minus_dispatch_lag() -> None:
    r = stamped(t_resolved_ns=5 * MS, t_tcp_ns=9 * MS, t_connected_ns=15 * MS, reused=False)
    phases = timings.phases(r)
    assert [name for name, _ in phases] == list(timings.PHASES)
    assert dict(phases) == pytest.approx({
        "resolve": 0.002, "connect": 0.004, "tls": 0.006, "request_written": 0.005,
        "first_byte": 0.020, "first_token": 0.020,
    })  # fmt: skip
    ttft = timings.ttft(r)
    assert ttft is not None
    assert sum(s for _, s in phases) == pytest.approx(ttft - timings.dispatch_lag(r))


def test_plain_fresh_connection_without_lookup_has_no_resolve_or_tls() -> None:
    r = stamped(t_connected_ns=15 * MS, reused=False)
    assert [n for n, _ in timings.phases(r)] == [
        "connect", "request_written", "first_byte", "first_token"
    ]  # fmt: skip
    assert dict(timings.phases(r))["connect"] == pytest.approx(0.012)


def test_reused_connection_has_only_the_request_phases() -> None:
    r = stamped(t_connected_ns=3 * MS, reused=True)
    assert dict(timings.phases(r)) == pytest.approx(
        {"request_written": 0.017, "first_byte": 0.020, "first_token": 0.020}
    )


def test_no_connection_no_phases() -> None:
    assert timings.phases(stamped(outcome=Outcome.CONNECT_ERROR)) == []


# -- recording ---------------------------------------------------------------------------------


def test_record_exports_what_the_stream_said() -> None:
    metrics = Metrics(CollectorRegistry())
    labels = Labels("t", "m")
    metrics.describe_target(labels, SLO, 15.0)
    get = metrics.registry.get_sample_value
    key = {"target": "t", "model": "m", "mode": "probe"}
    assert get("llmprober_requests_without_answer_total", key) == 0.0  # exists before any
    thinking = replace(
        stamped(t_connected_ns=15 * MS, reused=False),
        t_first_content_ns=None, reasoning_tokens=16, finish_reason=FinishReason.LENGTH,
    )  # fmt: skip
    assert not metrics.record(thinking, labels, "probe", SLO)  # never good
    lower = replace(stamped(t_connected_ns=3 * MS, reused=True), tokens_lower_bound=True)
    assert metrics.record(lower, labels, "probe", SLO)
    metrics.record(replace(lower, token_source=TokenSource.USAGE), labels, "load", SLO)
    assert get("llmprober_requests_without_answer_total", key) == 1.0
    assert get("llmprober_reasoning_tokens_without_answer_total", key) == 16.0
    assert get("llmprober_finish_reasons_total", key | {"reason": "length"}) == 1.0
    assert get("llmprober_finish_reasons_total", key | {"reason": "none"}) == 1.0
    assert get("llmprober_token_source_total", key | {"source": "chunks"}) == 1.0
    assert get("llmprober_token_source_total", key | {"source": "chunks_lower_bound"}) == 1.0
    assert get("llmprober_token_source_total", key | {"mode": "load", "source": "usage"}) == 1.0
    assert get("llmprober_connections_total", key | {"connection": "fresh"}) == 1.0
    assert get("llmprober_connections_total", key | {"connection": "reused"}) == 1.0
    phase = {"target": "t", "model": "m", "phase": "connect", "connection": "fresh"}
    assert get("llmprober_probe_phase_seconds_count", phase) == 1.0
    assert get("llmprober_probe_phase_seconds_count", phase | {"connection": "reused"}) is None
    # Phases are per probe: the load request added none.
    written = {"target": "t", "model": "m", "phase": "request_written", "connection": "reused"}
    assert get("llmprober_probe_phase_seconds_count", written) == 1.0


def test_ttfo_slo_is_published_when_set() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.describe_target(Labels("t", "m"), replace(SLO, ttfo_seconds=3.0), 15.0)
    got = metrics.registry.get_sample_value(
        "llmprober_slo_ttfo_seconds", {"target": "t", "model": "m"}
    )
    assert got == 3.0
