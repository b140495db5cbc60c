"""What a response stream says, event by event: tokens per channel, usage, server timings.

`StreamState` turns decoded events (OpenAI SSE chunks, or Ollama's newline-delimited JSON) into
the counts and stamps of a `RequestResult`. It knows nothing of HTTP or timeouts: `send`
feeds it reads, asks it for its `Verdict` on a body that ended (`conclude`), and has it build
the result once, from the outcome the exchange settled on and the connection's stamps.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from prober.logs import redact, safe_line
from prober.request.activity import StreamActivity
from prober.request.jsonparse import loads
from prober.request.sse import LineSplitter, SSEParser, StreamError
from prober.result import (
    MAX_COUNT,
    NO_CONNECTION,
    ConnectionFacts,
    FinishReason,
    Outcome,
    RequestResult,
    TokenSource,
)


class InStreamError(ValueError):
    """The server reported an error inside a 200 stream."""


# A duration the server reports is believed only when finite, >= 0 and under a day.
MAX_SERVER_SECONDS = 86_400.0
# Events per stream: this many per requested token, plus slack for role, usage and empty
# chunks. A server that ignores `max_tokens` ends as `protocol_error` instead of growing the
# stream's stamps without bound.
EVENTS_PER_TOKEN = 4
EVENT_SLACK = 256
LINES_PER_EVENT = 8  # of the event bound: `max_lines`
# Finish reasons as servers spell them (OpenAI, vLLM, TGI, llama.cpp, Ollama's done_reason),
# folded onto the bounded label; anything else is `other`.
_FINISH = {
    "stop": FinishReason.STOP,
    "eos": FinishReason.STOP,
    "eos_token": FinishReason.STOP,
    "stop_sequence": FinishReason.STOP,
    "end_turn": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "max_tokens": FinishReason.LENGTH,
    "content_filter": FinishReason.CONTENT_FILTER,
    "safety": FinishReason.CONTENT_FILTER,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "tool_use": FinishReason.TOOL_CALLS,
}
MAX_TEXT_CHARS = 1 << 20  # completion text kept for `log_prompts`
# Answer text kept for an answer check: this many characters per requested token. A token of
# the usual vocabularies is a few characters (the longest, runs of spaces or dashes, a few
# dozen); past the bound the answer is cut, and the result says so (`text_cut`).
ANSWER_CHARS_PER_TOKEN = 64
_MODEL_CHARS = 128  # of a response's `model`, kept for `expect.model`
# A server's response id is kept (for correlating with its logs, never exported) only when it
# looks like one: a short token of safe characters.
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}")


def max_events(max_tokens: int) -> int:
    """The most events a stream asked for `max_tokens` tokens may carry."""
    return EVENTS_PER_TOKEN * max(1, max_tokens) + EVENT_SLACK


def answer_chars(max_tokens: int) -> int:
    """The most answer characters kept for a check of a request asked for `max_tokens`."""
    return min(MAX_TEXT_CHARS, ANSWER_CHARS_PER_TOKEN * max(1, max_tokens))


def max_lines(max_tokens: int) -> int:
    """The most SSE lines (comments and blank lines included) such a stream may carry: an
    event is two, an `event:` or `id:` line adds one, a keep-alive comment comes every few
    seconds; a JSON object split over lines has dozens."""
    return LINES_PER_EVENT * max_events(max_tokens)


def finish_reason(value: Any) -> FinishReason | None:
    """A server's finish reason on the closed set; None when it sent none."""
    if value is None or value == "":
        return None
    return _FINISH.get(str(value)[:32].strip().lower(), FinishReason.OTHER)


def _int(value: Any) -> int | None:
    """A token count, or None when it is not an integer in [0, 2**53)."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT:
        return value
    return None


def _number(value: Any, scale: float = 1.0) -> float | None:
    """`value × scale` as seconds, or None unless finite and within [0, a day]."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            seconds = float(value) * scale
        except OverflowError:  # an integer too large for a float
            return None
        if 0.0 <= seconds <= MAX_SERVER_SECONDS:  # False for NaN too
            return seconds
    return None


def safe_id(value: Any) -> str:
    """`value` if it is a plausible response id holding no registered secret, else ""."""
    if isinstance(value, str) and _SAFE_ID.fullmatch(value) and redact(value) == value:
        return value
    return ""


@dataclass(frozen=True, slots=True)
class Verdict:
    """How a stream whose body ended without a transport fault went, as it alone can tell."""

    outcome: Outcome
    error: str = ""


class StreamState:
    """Accumulates one response stream; `done` turns true at its proper end."""

    def __init__(
        self,
        request_id: str,
        *,
        ndjson: bool,
        keep_text: bool = False,
        on_first_token: Callable[[], None] | None = None,
        event_limit: int | None = None,
        text_limit: int | None = None,
        activity: StreamActivity | None = None,
    ) -> None:
        self.request_id = request_id
        self.activity = activity  # the target's: each token event stamped there too
        self.event_limit = event_limit
        self.events = 0
        self.t_done_ns: int | None = None  # the read that carried [DONE] / done:true
        self.on_first_token = on_first_token
        self.ndjson = ndjson
        # Answer characters kept: `text_limit` (an answer check's bound), else all up to
        # MAX_TEXT_CHARS with `keep_text` (`log_prompts`), else none.
        limit = (MAX_TEXT_CHARS if keep_text else 0) if text_limit is None else text_limit
        self.text_limit = min(limit, MAX_TEXT_CHARS)
        self.text_cut = False  # answer text came past `text_limit`
        self.response_model = ""  # the first event's `model`, bounded and redacted
        self.done = False
        self.finish_reason: FinishReason | None = None
        self.usage_seen = False  # a usage block (or Ollama's final counts) was looked at
        self.multi_word = False  # some token event's text held more than one word
        self.t_first_byte_ns: int | None = None
        self.t_first_token_ns: int | None = None
        self.t_first_content_ns: int | None = None
        self.token_event_ns: list[int] = []
        self.reasoning_events = 0
        self.usage_prompt: int | None = None
        self.usage_completion: int | None = None
        self.usage_reasoning: int | None = None
        self.usage_cached: int | None = None  # prompt tokens the engine's prefix cache served
        self.server_prefill: float | None = None
        self.server_decode_per_token: float | None = None
        self.response_id: str | None = None  # None until the first event was looked at
        self._text: list[str] = []
        self._text_chars = 0

    # -- feeding ---------------------------------------------------------------------------

    def first_byte(self, t_ns: int) -> None:
        """A read of the body arrived at `t_ns`; the first one is the first byte."""
        if self.t_first_byte_ns is None:
            self.t_first_byte_ns = t_ns

    def feed(self, reader: SSEParser | LineSplitter, chunk: bytes, t_ns: int) -> int:
        """Parse one read stamped `t_ns`; return how many events it completed.

        Nothing after the end (`[DONE]`, Ollama's `done: true`) is looked at: a server that
        sends junk after it, or holds the connection open, has still answered.
        """
        if isinstance(reader, SSEParser):
            events = reader.feed(chunk)
            self.events += len(events)
            if self.event_limit is not None and self.events > self.event_limit:
                self._too_many()
            for event in events:
                self._on_sse(event.data, t_ns)
                if self.done:
                    break
            return len(events)
        lines = [line for line in reader.feed(chunk) if line.strip()]
        self.events += len(lines)
        if self.event_limit is not None and self.events > self.event_limit:
            self._too_many()
        for line in lines:
            self._on_ollama(loads(line), t_ns)
            if self.done:
                break
        return len(lines)

    def _too_many(self) -> NoReturn:
        raise StreamError(f"more than {self.event_limit} events in one stream")

    def close(self, reader: SSEParser | LineSplitter, t_ns: int) -> None:
        """End of body: flush what the reader still holds."""
        if self.done:
            return
        if isinstance(reader, SSEParser):
            for event in reader.close():
                self._on_sse(event.data, t_ns)
        else:
            for line in reader.close():
                if line.strip():
                    self._on_ollama(loads(line), t_ns)

    def _on_sse(self, data: str, t_ns: int) -> None:
        if self.done:
            return
        if data == "[DONE]":
            self.done = True
            self.t_done_ns = t_ns
            return
        obj = loads(data)
        if not isinstance(obj, dict):
            raise ValueError(f"event is not a JSON object: {data[:40]!r}")
        if "error" in obj:
            raise InStreamError(_error_text(obj["error"]))
        if self.response_id is None:
            self.response_id = safe_id(obj.get("id"))
            self.response_model = _model_name(obj.get("model"))
        if (usage := obj.get("usage")) is not None:
            self._usage(usage)
        if (timings := obj.get("timings")) is not None:
            self._llama_timings(timings)
        for choice in obj.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta is not None:
                content = delta.get("content")
                reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            else:
                content, reasoning = choice.get("text"), None
            self._token(content, reasoning, t_ns)
            if (reason := finish_reason(choice.get("finish_reason"))) is not None:
                self.finish_reason = reason

    def _on_ollama(self, obj: Any, t_ns: int) -> None:
        if not isinstance(obj, dict):
            raise ValueError("line is not a JSON object")
        if "error" in obj:
            raise InStreamError(_error_text(obj["error"]))
        if self.response_id is None:
            self.response_id = ""  # Ollama sends no id: its first line names the model
            self.response_model = _model_name(obj.get("model"))
        message = obj.get("message") or {}
        self._token(message.get("content"), message.get("thinking"), t_ns)
        if obj.get("done"):
            self.done = True
            self.t_done_ns = t_ns
            # An Ollama too old to send done_reason ended without saying why: `none`, which
            # still ends the stream (`done`).
            self.finish_reason = finish_reason(obj.get("done_reason"))
            self.usage_seen = True
            self.usage_prompt = _int(obj.get("prompt_eval_count"))
            self.usage_completion = _int(obj.get("eval_count"))
            self.server_prefill = _number(obj.get("prompt_eval_duration"), 1e-9)
            eval_seconds = _number(obj.get("eval_duration"), 1e-9)
            if eval_seconds is not None and self.usage_completion:
                self.server_decode_per_token = eval_seconds / self.usage_completion

    def _token(self, content: Any, reasoning: Any, t_ns: int) -> None:
        has_content = isinstance(content, str) and content != ""
        has_reasoning = isinstance(reasoning, str) and reasoning != ""
        if not (has_content or has_reasoning):
            return
        if self.t_first_token_ns is None:
            self.t_first_token_ns = t_ns
            if self.on_first_token is not None:
                self.on_first_token()
        if has_content and self.t_first_content_ns is None:
            self.t_first_content_ns = t_ns
        if has_reasoning:
            self.reasoning_events += 1
        if not self.multi_word:
            self.multi_word = _multi_word(content if has_content else reasoning)
        self.token_event_ns.append(t_ns)
        if self.activity is not None:
            self.activity.token(t_ns)
        if has_content and self.text_limit:
            room = self.text_limit - self._text_chars
            if len(content) > room:
                self.text_cut = True
            if room > 0:
                self._text.append(content[:room])
                self._text_chars += len(self._text[-1])

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        self.usage_seen = True
        self.usage_prompt = _int(usage.get("prompt_tokens"))
        self.usage_completion = _int(usage.get("completion_tokens"))
        details = usage.get("completion_tokens_details")
        if isinstance(details, dict):
            self.usage_reasoning = _int(details.get("reasoning_tokens"))
        prompt_details = usage.get("prompt_tokens_details")  # OpenAI's, vLLM's, llama-server's
        if isinstance(prompt_details, dict):
            self.usage_cached = _int(prompt_details.get("cached_tokens"))

    def _llama_timings(self, timings: Any) -> None:
        if not isinstance(timings, dict):
            return
        prefill = _number(timings.get("prompt_ms"), 1e-3)
        per_token = _number(timings.get("predicted_per_token_ms"), 1e-3)
        if prefill is not None:
            self.server_prefill = prefill
        if per_token is not None:
            self.server_decode_per_token = per_token
        if self.usage_prompt is None:
            self.usage_prompt = _int(timings.get("prompt_n"))
        if self.usage_cached is None:  # llama-server: the prompt tokens its slot's cache held
            self.usage_cached = _int(timings.get("cache_n"))

    # -- concluding ------------------------------------------------------------------------

    def conclude(self) -> Verdict:
        """The verdict on a stream whose body ended without a transport fault."""
        if not self.done and self.finish_reason is None:
            end = "final done:true line" if self.ndjson else "[DONE]"
            return Verdict(Outcome.PROTOCOL_ERROR, f"stream ended without {end}")
        if not self.token_event_ns:
            return Verdict(Outcome.PROTOCOL_ERROR, "stream carried no token")
        return Verdict(Outcome.OK)

    def result(
        self,
        outcome: Outcome,
        *,
        error: str = "",
        status: int | None = None,
        t_sched_ns: int,
        t_send_ns: int,
        t_end_ns: int,
        wall_start: float,
        connection: ConnectionFacts = NO_CONNECTION,
    ) -> RequestResult:
        """The result, with what the attempt's connection adds (none for a stream decoded
        without one)."""
        from_usage = self.usage_completion is not None
        output = self.usage_completion if from_usage else len(self.token_event_ns)
        counted = not from_usage and bool(self.token_event_ns)
        reasoning = (
            self.usage_reasoning if self.usage_reasoning is not None else self.reasoning_events
        )
        return RequestResult(
            outcome=outcome,
            t_sched_ns=t_sched_ns,
            t_send_ns=t_send_ns,
            t_end_ns=t_end_ns,
            # Always the prober's own X-Request-Id: a server's id is whatever it chose to send
            # (one that echoed the Authorization header published the key in exemplars).
            request_id=self.request_id,
            response_id=self.response_id or "",
            error=error,
            http_status=status if status is not None else (200 if self.t_first_byte_ns else None),
            t_first_byte_ns=self.t_first_byte_ns,
            t_first_token_ns=self.t_first_token_ns,
            t_first_content_ns=self.t_first_content_ns,
            t_last_token_ns=self.token_event_ns[-1] if self.token_event_ns else None,
            token_event_ns=tuple(self.token_event_ns),
            prompt_tokens=self.usage_prompt,
            cached_tokens=self._cached(),
            output_tokens=output or 0,
            reasoning_tokens=reasoning,
            token_source=TokenSource.USAGE if from_usage else TokenSource.CHUNKS,
            server_prefill_seconds=self.server_prefill,
            server_decode_per_token_seconds=self.server_decode_per_token,
            wall_start=wall_start,
            text="".join(self._text),
            text_cut=self.text_cut,
            response_model=self.response_model,
            finish_reason=self.finish_reason or FinishReason.NONE,
            tokens_lower_bound=counted and self.multi_word,
            token_fallback=self._fallback_cause() if counted else "",
            t_begin_ns=connection.t_begin_ns,
            t_resolved_ns=connection.t_resolved_ns,
            t_tcp_ns=connection.t_tcp_ns,
            t_connected_ns=connection.t_connected_ns,
            reused=connection.reused,
            retry_after_seconds=connection.retry_after_seconds,
            response_bytes=connection.response_bytes,
        )

    def _cached(self) -> int | None:
        """The cached prompt tokens, where no more than the prompt the server counted."""
        cached, prompt = self.usage_cached, self.usage_prompt
        return cached if cached is None or prompt is None or cached <= prompt else None

    def _fallback_cause(self) -> str:
        """Why the counted events stand in for the server's count."""
        if self.ndjson:
            if self.usage_seen:
                return "eval_count missing or not a count in [0, 2**53)"
            return "no final done:true line with eval_count"
        if self.usage_seen:
            return "usage.completion_tokens missing or not a count in [0, 2**53)"
        return "no usage block in the stream (stream_options.include_usage ignored?)"


def _multi_word(text: str) -> bool:
    """Whether a token event's text holds two words or more (one token rarely does)."""
    return len(text.split(None, 1)) > 1


def _model_name(value: Any) -> str:
    """A response's `model` as one bounded, printable, redacted line ("" if not a string)."""
    return safe_line(value[: 4 * _MODEL_CHARS], _MODEL_CHARS) if isinstance(value, str) else ""


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:200]
    return str(error)[:200]
