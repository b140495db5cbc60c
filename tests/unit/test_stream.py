"""prober.request.stream: OpenAI SSE chunks and Ollama NDJSON lines → counts, stamps and
outcome."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from prober.request.sse import LineSplitter, SSEParser
from prober.request.stream import InStreamError, StreamState
from prober.result import Outcome, RequestResult, TokenSource
from tests.support.sse import sse

OLLAMA = Path(__file__).resolve().parents[1] / "fixtures" / "ollama"
T_SCHED, T_SEND, T_END = 0, 10, 1_000_000


def concluded(state: StreamState) -> RequestResult:
    """The result `request` builds from the state's verdict on a body that ended."""
    verdict = state.conclude()
    return state.result(
        verdict.outcome, error=verdict.error,
        t_sched_ns=T_SCHED, t_send_ns=T_SEND, t_end_ns=T_END, wall_start=0.0,
    )  # fmt: skip


def run_sse(*events: Any, done: bool = True) -> tuple[StreamState, RequestResult]:
    """Feed each event as one read stamped 100, 200, ...; `[DONE]` last unless `done=False`."""
    state = StreamState("req-1", ndjson=False, keep_text=True)
    parser = SSEParser()
    items = [*events, "[DONE]"] if done else list(events)
    for i, item in enumerate(items, start=1):
        state.feed(parser, sse(item), 100 * i)
    state.close(parser, 100 * (len(items) + 1))
    return state, concluded(state)


# Shapes as vLLM / OpenAI send them (`stream_options.include_usage` on), as objects: `sse`
# frames them (tests/support/sse's `chunk` gives a leaner chunk's bytes).
def chunk_object(delta: dict[str, Any] | None = None, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta or {}, "logprobs": None, "finish_reason": finish}
    return {
        "id": "chatcmpl-abc",
        "object": "chat.completion.chunk",
        "created": 1726667007,
        "model": "m",
        "choices": [choice],
    }


ROLE = chunk_object({"role": "assistant", "content": None})
ROLE_EMPTY = chunk_object({"role": "assistant", "content": ""})


def content(text: str) -> dict[str, Any]:
    return chunk_object({"content": text})


def usage(prompt: int, completion: int, reasoning: int | None = None) -> dict[str, Any]:
    block: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if reasoning is not None:
        block["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return {**chunk_object(), "choices": [], "usage": block}


STOP = chunk_object({}, finish="stop")


# -- channels ------------------------------------------------------------------------------


def test_content_stream_with_usage() -> None:
    _, r = run_sse(ROLE_EMPTY, content("Hel"), content("lo"), content("!"), STOP, usage(17, 3))
    assert r.outcome is Outcome.OK
    assert r.error == ""
    # The role chunk was read at 100: no token, so the first token is the read at 200.
    assert r.t_first_token_ns == r.t_first_content_ns == 200
    assert r.t_last_token_ns == 400
    assert r.token_event_ns == (200, 300, 400)
    assert (r.prompt_tokens, r.output_tokens, r.reasoning_tokens) == (17, 3, 0)
    assert r.token_source is TokenSource.USAGE
    assert r.request_id == "req-1"  # the prober's own id, never the server's
    assert r.response_id == "chatcmpl-abc"
    assert r.text == "Hello!"
    assert (r.t_sched_ns, r.t_send_ns, r.t_end_ns) == (T_SCHED, T_SEND, T_END)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_channel_counts_for_ttft_not_ttfo(field: str) -> None:
    state, r = run_sse(
        ROLE,
        chunk_object({field: "Let me"}),
        chunk_object({field: " think"}),
        content("Yes"),
        STOP,
    )
    assert r.outcome is Outcome.OK
    assert r.t_first_token_ns == 200
    assert r.t_first_content_ns == 400
    assert r.token_event_ns == (200, 300, 400)
    assert r.reasoning_tokens == 2
    assert r.output_tokens == 3
    assert r.token_source is TokenSource.CHUNKS
    assert r.text == "Yes"  # reasoning is never part of the answer text
    assert state.finish_reason == "stop"


def test_reasoning_count_from_usage_details_wins() -> None:
    _, r = run_sse(
        chunk_object({"reasoning_content": "hm"}), content("ok"), STOP, usage(5, 40, reasoning=38)
    )
    assert (r.output_tokens, r.reasoning_tokens) == (40, 38)
    assert r.token_source is TokenSource.USAGE


def test_completions_text_channel() -> None:
    def text(t: str, finish: str | None = None) -> dict[str, Any]:
        return {
            "id": "cmpl-1",
            "object": "text_completion",
            "choices": [{"index": 0, "text": t, "logprobs": None, "finish_reason": finish}],
        }

    _, r = run_sse(text("Once"), text(" upon"), text("", finish="length"))
    assert r.outcome is Outcome.OK
    assert r.t_first_token_ns == r.t_first_content_ns == 100
    assert r.token_event_ns == (100, 200)
    assert r.output_tokens == 2
    assert (r.request_id, r.response_id) == ("req-1", "cmpl-1")


@pytest.mark.parametrize("role_chunk", [ROLE, ROLE_EMPTY], ids=["content-null", "content-empty"])
def test_role_only_chunk_is_not_a_token(role_chunk: dict[str, Any]) -> None:
    state, r = run_sse(role_chunk, STOP)
    assert state.t_first_token_ns is None
    assert r.outcome is Outcome.PROTOCOL_ERROR
    assert r.error == "stream carried no token"


def test_other_choice_indexes_are_ignored() -> None:
    other = chunk_object({"content": "ignored"})
    other["choices"][0]["index"] = 1
    _, r = run_sse(other, content("a"), STOP)
    assert r.token_event_ns == (200,)
    assert r.text == "a"


# -- counts --------------------------------------------------------------------------------


def test_usage_chunk_sets_counts_and_source() -> None:
    state, r = run_sse(content("a"), content("b"), STOP, usage(31, 2, reasoning=0))
    assert (state.usage_prompt, state.usage_completion, state.usage_reasoning) == (31, 2, 0)
    assert (r.prompt_tokens, r.output_tokens, r.reasoning_tokens) == (31, 2, 0)
    assert r.token_source is TokenSource.USAGE


def test_without_usage_events_are_counted() -> None:
    _, r = run_sse(content("a"), content("b"), content("c"), STOP)
    assert r.output_tokens == 3
    assert r.prompt_tokens is None
    assert r.token_source is TokenSource.CHUNKS


def test_multi_token_chunk_is_one_event_but_usage_wins() -> None:
    _, with_usage = run_sse(content("Hello there, world"), STOP, usage(4, 4))
    assert with_usage.token_event_ns == (100,)
    assert with_usage.output_tokens == 4
    _, without = run_sse(content("Hello there, world"), STOP)
    assert without.output_tokens == 1
    assert without.token_source is TokenSource.CHUNKS


def test_llamacpp_timings_give_server_prefill_and_decode() -> None:
    final = {
        **chunk_object({}, finish="stop"),
        "timings": {
            "prompt_n": 12,
            "prompt_ms": 45.5,
            "prompt_per_token_ms": 3.79,
            "predicted_n": 2,
            "predicted_ms": 25.0,
            "predicted_per_token_ms": 12.5,
        },
    }
    _, r = run_sse(content("a"), content("b"), final)
    assert r.server_prefill_seconds == pytest.approx(0.0455)
    assert r.server_decode_per_token_seconds == pytest.approx(0.0125)
    assert r.prompt_tokens == 12  # from timings.prompt_n when no usage came
    _, with_usage = run_sse(content("a"), final, usage(13, 1))
    assert with_usage.prompt_tokens == 13


# -- endings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "message"),
    [
        ({"message": "out of memory", "type": "server_error", "code": 500}, "out of memory"),
        ("model crashed", "model crashed"),
    ],
)
def test_in_stream_error_raises(error: Any, message: str) -> None:
    state = StreamState("r", ndjson=False)
    parser = SSEParser()
    state.feed(parser, sse(content("a")), 1)
    with pytest.raises(InStreamError, match=message):
        state.feed(parser, sse({"error": error}), 2)


def test_finish_reason_without_done_concludes_ok() -> None:
    _, r = run_sse(content("a"), content("b"), chunk_object({}, finish="length"), done=False)
    assert r.outcome is Outcome.OK


def test_neither_done_nor_finish_reason_is_protocol_error() -> None:
    _, r = run_sse(content("a"), content("b"), done=False)
    assert r.outcome is Outcome.PROTOCOL_ERROR
    assert r.error == "stream ended without [DONE]"
    assert r.output_tokens == 2  # what did arrive is still counted


def test_done_without_tokens_is_protocol_error() -> None:
    _, r = run_sse(ROLE, usage(5, 0))
    assert r.outcome is Outcome.PROTOCOL_ERROR
    assert r.error == "stream carried no token"


def test_events_after_done_are_ignored() -> None:
    state = StreamState("r", ndjson=False)
    parser = SSEParser()
    state.feed(parser, sse(content("a")) + sse("[DONE]") + sse(content("late")), 1)
    assert state.token_event_ns == [1]


def test_done_pending_at_close_still_counts() -> None:
    state = StreamState("r", ndjson=False)
    parser = SSEParser()
    state.feed(parser, sse(content("a")) + b"data: [DONE]", 1)
    assert not state.done
    state.close(parser, 2)
    assert state.done
    assert state.t_done_ns == 2


def test_done_without_blank_line_ends_the_stream_at_once() -> None:
    state = StreamState("r", ndjson=False)
    parser = SSEParser()
    state.feed(parser, sse(content("a")) + b"data: [DONE]\n", 1)
    assert state.done
    assert state.t_done_ns == 1


@pytest.mark.parametrize("data", ["{not json", "[1, 2]", '"text"'])
def test_malformed_json_raises_value_error(data: str) -> None:
    state = StreamState("r", ndjson=False)
    with pytest.raises(ValueError):  # JSONDecodeError, or a non-object
        state.feed(SSEParser(), sse(data), 1)


def test_feed_returns_completed_event_count() -> None:
    state = StreamState("r", ndjson=False)
    parser = SSEParser()
    assert state.feed(parser, b": keep-alive\n\n", 1) == 0
    assert state.feed(parser, sse(content("a"))[:8], 2) == 0
    assert state.feed(parser, sse(content("a"))[8:] + sse(content("b")), 3) == 2
    assert state.token_event_ns == [3, 3]


# -- Ollama NDJSON -------------------------------------------------------------------------


def run_ollama(data: bytes, cuts: list[int] | None = None) -> tuple[StreamState, RequestResult]:
    """Feed one read per line (stamped 100, 200, ...), or reads split at `cuts`."""
    state = StreamState("req-o", ndjson=True)
    splitter = LineSplitter()
    if cuts is None:
        reads = data.splitlines(keepends=True)
    else:
        bounds = [0, *cuts, len(data)]
        reads = [data[a:b] for a, b in itertools.pairwise(bounds)]
    for i, read in enumerate(reads, start=1):
        state.feed(splitter, read, 100 * i)
    state.close(splitter, 100 * (len(reads) + 1))
    return state, concluded(state)


def ollama_fixture(name: str) -> bytes:
    return (OLLAMA / f"{name}.ndjson").read_bytes()


def test_ollama_plain_fixture() -> None:
    _, r = run_ollama(ollama_fixture("chat_plain"))
    assert r.outcome is Outcome.OK
    assert len(r.token_event_ns) == 35
    assert r.t_first_token_ns == r.t_first_content_ns == 100
    assert r.t_last_token_ns == 3500
    assert (r.prompt_tokens, r.output_tokens, r.reasoning_tokens) == (31, 35, 0)
    assert r.token_source is TokenSource.USAGE
    assert r.server_prefill_seconds == pytest.approx(0.158227)
    assert r.server_decode_per_token_seconds == pytest.approx(0.341685 / 35)


def test_ollama_thinking_fixture() -> None:
    state, r = run_ollama(ollama_fixture("chat_thinking"))
    assert r.outcome is Outcome.OK
    assert r.t_first_token_ns == 100  # first `thinking`
    assert r.t_first_content_ns == 2900  # first `content`, after 28 thinking lines
    assert len(r.token_event_ns) == 35
    assert (r.prompt_tokens, r.output_tokens, r.reasoning_tokens) == (18, 38, 28)
    assert r.server_prefill_seconds == pytest.approx(0.201664)
    assert r.server_decode_per_token_seconds == pytest.approx(0.498380 / 38)
    assert state.finish_reason == "stop"


def test_ollama_split_anywhere_gives_the_same_counts() -> None:
    data = ollama_fixture("chat_thinking")
    _, whole = run_ollama(data)
    for cut in range(0, len(data), 97):
        _, split = run_ollama(data, [cut])
        assert (split.outcome, split.output_tokens, split.reasoning_tokens) == (
            whole.outcome,
            whole.output_tokens,
            whole.reasoning_tokens,
        )
        assert len(split.token_event_ns) == len(whole.token_event_ns)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("chat_error", 'model "llama3.3:70b" not found'),
        ("chat_error_midstream", "unexpected EOF"),
    ],
)
def test_ollama_error_line_raises(name: str, message: str) -> None:
    with pytest.raises(InStreamError, match=message):
        run_ollama(ollama_fixture(name))


def test_ollama_stream_cut_before_done_is_protocol_error() -> None:
    lines = ollama_fixture("chat_plain").splitlines(keepends=True)
    _, r = run_ollama(b"".join(lines[:-1]))
    assert r.outcome is Outcome.PROTOCOL_ERROR
    assert r.error == "stream ended without final done:true line"
    assert r.output_tokens == 35
    assert r.token_source is TokenSource.CHUNKS


def test_ollama_final_line_without_newline_is_flushed_at_close() -> None:
    _, r = run_ollama(ollama_fixture("chat_plain").rstrip(b"\n"))
    assert r.outcome is Outcome.OK
    assert r.output_tokens == 35


def test_ollama_blank_lines_are_skipped() -> None:
    line = b'{"message":{"role":"assistant","content":"hi"},"done":false}\n'
    final = b'{"message":{"role":"assistant","content":""},"done":true,"eval_count":1}\n'
    _, r = run_ollama(b"\n" + line + b"\r\n\n" + final)
    assert r.outcome is Outcome.OK
    assert r.output_tokens == 1


# -- huge numbers (issue 25, item 8) ---------------------------------------------------------

HUGE = "9" * 100_000  # past Python's 4,300-digit limit for int(): json.loads once raised


def test_a_huge_integer_in_an_ignored_field_is_ignored() -> None:
    chunk = '{"choices": [{"index": 0, "delta": {"content": "hi"}}], "x_pad": ' + HUGE + "}"
    state = StreamState("r", ndjson=False)
    state.feed(SSEParser(), f"data: {chunk}\n\ndata: [DONE]\n\n".encode(), 1)
    assert state.conclude().outcome is Outcome.OK
    assert len(state.token_event_ns) == 1


@pytest.mark.parametrize("where", ["completion_tokens", "prompt_tokens"])
def test_a_huge_integer_in_a_count_is_nonsense_not_a_failed_stream(where: str) -> None:
    usage = {"prompt_tokens": 5, "completion_tokens": 2}
    text = json.dumps({"choices": [], "usage": usage}).replace(
        f'"{where}": ', f'"{where}": {HUGE}0'
    )
    token = '{"choices": [{"index": 0, "delta": {"content": "hi"}}]}'
    state = StreamState("r", ndjson=False)
    state.feed(SSEParser(), f"data: {token}\n\ndata: {text}\n\ndata: [DONE]\n\n".encode(), 1)
    result = state.result(Outcome.OK, t_sched_ns=0, t_send_ns=0, t_end_ns=2, wall_start=0.0)
    assert state.conclude().outcome is Outcome.OK
    assert (result.prompt_tokens if where == "prompt_tokens" else None) is None
    if where == "completion_tokens":
        assert result.output_tokens == 1  # the counted event, not the nonsense
        assert "completion_tokens missing or not a count" in result.token_fallback
