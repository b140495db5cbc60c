"""Everything a server sends is bounded before it is used: counts, durations, events, prompts.

Properties over generated input, no server: whatever numbers a stream carries, the result's
counts lie in [0, 2**53) and its durations are finite and >= 0; recording any result (even one
built by hand with NaN and negative numbers) never raises and leaves every sample finite; a
stream past its event bound is a protocol error; calibration never grows a prompt past four
words per requested token, whatever counts the server reports.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from prober.metrics import Labels, Metrics
from prober.prompts import MAX_TOKENS_PER_WORD, MIN_TOKENS_PER_WORD, PromptBuilder
from prober.request.send import MAX_RETRY_AFTER_SECONDS, parse_retry_after
from prober.request.sse import LineSplitter, SSEParser, StreamError
from prober.request.stream import MAX_SERVER_SECONDS, StreamState, max_events
from prober.result import MAX_COUNT, Outcome, RequestResult, TokenSource
from prober.timings import Slo
from tests.support.sse import sse


# Numbers as a hostile server writes them: JSON text, so 1e400, NaN and 2**70 stay as sent.
def _json_number(f: float) -> str:
    if math.isnan(f):
        return "NaN"
    if math.isinf(f):
        return "Infinity" if f > 0 else "-Infinity"
    return repr(f)


NUMBER_TEXT = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(_json_number),
    st.sampled_from(["1e400", "-1e400", "true", "null", '"12"', "[]", "{}", "0", "-0"]),
)
FIELDS = ("prompt_tokens", "completion_tokens", "reasoning_tokens", "prompt_ms",
          "predicted_per_token_ms", "prompt_n")  # fmt: skip


def events(*objects: str) -> bytes:
    return b"".join(sse(o) for o in objects)


def feed_all(state: StreamState, reader: SSEParser | LineSplitter, data: bytes) -> RequestResult:
    state.feed(reader, data, 100)
    state.close(reader, 200)
    verdict = state.conclude()
    return state.result(
        verdict.outcome, error=verdict.error, t_sched_ns=0, t_send_ns=10, t_end_ns=300,
        wall_start=0.0,
    )  # fmt: skip


def assert_bounded(r: RequestResult) -> None:
    for count in (r.prompt_tokens, r.output_tokens, r.reasoning_tokens):
        assert count is None or (isinstance(count, int) and 0 <= count < MAX_COUNT), count
    for seconds in (r.server_prefill_seconds, r.server_decode_per_token_seconds):
        assert seconds is None or 0 <= seconds <= MAX_SERVER_SECONDS, seconds


def assert_records(r: RequestResult) -> None:
    metrics = Metrics(CollectorRegistry())
    labels = Labels("t", "m")
    assert isinstance(metrics.record(r, labels, "probe", Slo(2.0, 0.2)), bool)
    metrics.record_probe(r, labels, 1.0)
    for family in metrics.registry.collect():
        for sample in family.samples:
            assert math.isfinite(sample.value), sample
            assert sample.value >= 0, sample


@given(st.dictionaries(st.sampled_from(FIELDS), NUMBER_TEXT, min_size=1))
def test_property_openai_numbers_are_bounded_and_record(values: dict[str, str]) -> None:
    usage = {k: v for k, v in values.items() if k.endswith("tokens") and k != "reasoning_tokens"}
    details = values.get("reasoning_tokens", "0")
    timings = {k: v for k, v in values.items() if not k.endswith("tokens")}
    raw_usage = ", ".join(f'"{k}": {v}' for k, v in usage.items())
    raw_timings = ", ".join(f'"{k}": {v}' for k, v in timings.items())
    last = (
        f'{{"choices": [], "usage": {{{raw_usage}{", " if raw_usage else ""}'
        f'"completion_tokens_details": {{"reasoning_tokens": {details}}}}}, '
        f'"timings": {{{raw_timings}}}}}'
    )
    token = json.dumps({"choices": [{"index": 0, "delta": {"content": "x"}}]})
    r = feed_all(StreamState("r", ndjson=False), SSEParser(), events(token, token, last, "[DONE]"))
    assert r.outcome is Outcome.OK, r.error
    assert_bounded(r)
    assert_records(r)


@given(NUMBER_TEXT, NUMBER_TEXT)
def test_property_ollama_numbers_are_bounded_and_record(count: str, duration: str) -> None:
    line = (
        f'{{"message": {{"content": "x"}}, "done": true, "prompt_eval_count": {count}, '
        f'"eval_count": {count}, "prompt_eval_duration": {duration}, "eval_duration": {duration}}}'
    )
    r = feed_all(StreamState("r", ndjson=True), LineSplitter(), line.encode() + b"\n")
    assert r.outcome is Outcome.OK, r.error
    assert_bounded(r)
    assert_records(r)


WEIRD = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**80), 2**80))


@given(
    st.integers(-(2**80), 2**80), st.integers(-(2**80), 2**80), WEIRD, WEIRD, WEIRD,
    st.lists(st.integers(-(2**62), 2**62), max_size=20), st.sampled_from(list(Outcome)),
)  # fmt: skip
def test_property_recording_any_result_never_raises(
    tokens: int, reasoning: int, prefill: Any, decode: Any, wall: Any, stamps: list[int],
    outcome: Outcome,
) -> None:  # fmt: skip
    r = RequestResult(
        outcome=outcome, t_sched_ns=0, t_send_ns=stamps[0] if stamps else -5, t_end_ns=-1,
        request_id="r" * 200, prompt_tokens=tokens, output_tokens=tokens,
        reasoning_tokens=reasoning, token_source=TokenSource.USAGE,
        t_first_token_ns=stamps[0] if stamps else None,
        t_first_content_ns=stamps[-1] if stamps else None,
        t_last_token_ns=stamps[-1] if stamps else None, token_event_ns=tuple(stamps),
        server_prefill_seconds=prefill, server_decode_per_token_seconds=decode,
    )  # fmt: skip
    assert_records(r)
    metrics = Metrics(CollectorRegistry())
    metrics.record_probe(r, Labels("t", "m"), wall)  # a non-finite wall clock is not set


@pytest.mark.parametrize("max_tokens", [1, 16, 1000])
@pytest.mark.parametrize("ndjson", [False, True])
def test_a_stream_past_its_event_bound_is_a_stream_error(max_tokens: int, ndjson: bool) -> None:
    limit = max_events(max_tokens)
    state = StreamState("r", ndjson=ndjson, event_limit=limit)
    reader: SSEParser | LineSplitter = LineSplitter() if ndjson else SSEParser()
    one = b'{"message": {"content": "x"}}\n' if ndjson else events('{"choices": []}')
    state.feed(reader, one * limit, 1)  # exactly at the bound: fine
    with pytest.raises(StreamError, match=f"more than {limit} events"):
        state.feed(reader, one, 2)
    assert len(state.token_event_ns) <= limit


def test_the_event_bound_is_generous_for_honest_streams() -> None:
    # Role, one event per token, finish, usage, and a server that splits tokens in two.
    assert max_events(16) >= 2 * 16 + 3
    assert max_events(1) > 4


@given(st.integers(1, 10_000), st.lists(st.integers(1, 10**18), min_size=1, max_size=30))
def test_property_calibration_never_runs_away(tokens: int, reports: list[int]) -> None:
    builder = PromptBuilder(seed=1)
    for reported in reports:
        _, words = builder.build(tokens)
        assert words <= tokens / MIN_TOKENS_PER_WORD + 16
        builder.observe(words, reported)
        assert MIN_TOKENS_PER_WORD <= builder.tokens_per_word <= MAX_TOKENS_PER_WORD


def test_a_server_reporting_one_prompt_token_is_ignored_not_chased() -> None:
    builder = PromptBuilder(seed=1)
    sizes = []
    for _ in range(10):
        _, words = builder.build(64)
        sizes.append(words)
        builder.observe(words, 1)
    assert len(set(sizes)) == 1  # never chased
    assert builder.rejected == 10


def test_honest_reports_still_calibrate() -> None:
    builder = PromptBuilder(seed=1)
    for _ in range(8):
        _, words = builder.build(200)
        builder.observe(words, round(words * 1.6))
    _, words = builder.build(200)
    assert abs(words * 1.6 - 200) < 10


@pytest.mark.parametrize(
    ("header", "expected"),
    [("1e300", MAX_RETRY_AFTER_SECONDS), ("inf", None), ("nan", None), ("-5", 0.0), ("7", 7.0),
     ("Fri, 31 Dec 9999 23:59:59 GMT", MAX_RETRY_AFTER_SECONDS), ("99999999999999999999", None)],
)  # fmt: skip
def test_retry_after_is_bounded(header: str, expected: float | None) -> None:
    value = parse_retry_after(header)
    if header == "99999999999999999999":  # a float of about 1e20 seconds: capped
        assert value == MAX_RETRY_AFTER_SECONDS
    else:
        assert value == expected
