"""The record of one streamed request: the outcome classes and the frozen `RequestResult`.

Stamps are `time.perf_counter_ns()` values (monotonic). `wall_start` is wall-clock time for
logs and exemplars only, never for a latency.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

# A count is believed only in [0, 2**53): beyond it a float is no longer exact, and
# prometheus-client refuses a negative increment (which would crash recording).
MAX_COUNT = 1 << 53


class Outcome(StrEnum):
    """Exactly one per request (docs/design.md §3)."""

    OK = "ok"
    TIMEOUT_CONNECT = "timeout_connect"
    TIMEOUT_FIRST_TOKEN = "timeout_first_token"
    TIMEOUT_TOTAL = "timeout_total"
    STALLED = "stalled"
    CONNECT_ERROR = "connect_error"
    HTTP_429 = "http_429"
    HTTP_4XX = "http_4xx"
    HTTP_5XX = "http_5xx"
    PROTOCOL_ERROR = "protocol_error"
    CANCELLED = "cancelled"


class TokenSource(StrEnum):
    """Where `output_tokens` came from: the server's usage block, or counted events."""

    USAGE = "usage"
    CHUNKS = "chunks"


class FinishReason(StrEnum):
    """Why generation stopped, folded onto a closed set (a bounded metric label)."""

    STOP = "stop"
    LENGTH = "length"
    CONTENT_FILTER = "content_filter"
    TOOL_CALLS = "tool_calls"
    OTHER = "other"
    NONE = "none"  # the stream never said


class Check(StrEnum):
    """An answer check a target may ask for (`expect:`): a bounded metric label."""

    REGEX = "regex"
    JSON = "json"
    JSON_SCHEMA = "json_schema"
    MIN_ANSWER_TOKENS = "min_answer_tokens"
    MODEL = "model"


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check of one answer: whether it held, and why not (one printable line)."""

    check: Check
    passed: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ConnectionFacts:
    """What the attempt's connection adds to a result (`RequestResult`'s fields of the same
    names): the request path (`request/send.py`) builds it, the stream's `result` takes it."""

    t_begin_ns: int | None = None
    t_resolved_ns: int | None = None
    t_tcp_ns: int | None = None
    t_connected_ns: int | None = None
    reused: bool | None = None
    retry_after_seconds: float | None = None
    response_bytes: int | None = None


NO_CONNECTION = ConnectionFacts()  # a stream decoded without a connection (tests, bench)


@dataclass(frozen=True, slots=True)
class RequestResult:
    """Everything one request yielded; the timing maths in `timings` work on this alone."""

    outcome: Outcome
    t_sched_ns: int
    t_send_ns: int  # the request's first bytes written to the connection
    t_end_ns: int
    # The prober's own id, sent as X-Request-Id: what logs and exemplars show.
    request_id: str = ""
    # The server's id for the response when it looks like one (`request.stream.safe_id`), for
    # correlating with the server's own records; never exported or logged.
    response_id: str = ""
    error: str = ""
    http_status: int | None = None
    t_first_byte_ns: int | None = None
    t_first_token_ns: int | None = None
    t_first_content_ns: int | None = None
    t_last_token_ns: int | None = None
    # Arrival stamp of every token-bearing event, in order: the ITL gaps come from these.
    token_event_ns: tuple[int, ...] = ()
    prompt_tokens: int | None = None
    # Prompt tokens the engine's prefix cache served (`usage.prompt_tokens_details.
    # cached_tokens`, llama-server's `timings.cache_n`); None where it did not say.
    cached_tokens: int | None = None
    output_tokens: int = 0
    reasoning_tokens: int = 0
    token_source: TokenSource = TokenSource.CHUNKS
    # Server-reported per-request timings (llama-server `timings`, Ollama durations).
    server_prefill_seconds: float | None = None
    server_decode_per_token_seconds: float | None = None
    retry_after_seconds: float | None = None
    wall_start: float = 0.0
    finish_reason: FinishReason = FinishReason.NONE
    # Counted events were the source and some event carried more than one word: each may
    # hold several tokens, so `output_tokens` is a lower bound (and TPOT an upper bound).
    tokens_lower_bound: bool = False
    # Why `usage` was not the source (empty when it was, or when no token came).
    token_fallback: str = ""
    # Connection set-up (docs/design.md §2, phases). `t_begin`: the prober began the attempt; None
    # for a result that never started one (dispatch lag then falls back to `t_send`).
    t_begin_ns: int | None = None
    t_resolved_ns: int | None = None  # name resolution done (None: no lookup was made)
    t_tcp_ns: int | None = None  # TCP connected, before the TLS handshake (TLS only)
    t_connected_ns: int | None = None  # connection ready: fresh after set-up, reused at once
    reused: bool | None = None  # pooled connection reused; None when none was obtained
    # Bytes the server sent for the exchange (head, chunk framing, body), as the connection
    # counted them against its bounds (prober/request/exchange.py); None where none was counted.
    response_bytes: int | None = None
    # The `model` the response named (its first event's), one printable line of at most 128
    # characters, redacted; "" when it named none. What `expect.model` compares.
    response_model: str = ""
    # The answer checks run on it (`prober.checks`, for a probe of a target with `expect:`);
    # a failed one makes the request not good.
    checks: tuple[CheckResult, ...] = ()
    # Completion (answer) text, kept only when `log_prompts` is on or an answer check needs
    # it, up to the request's bound; `text_cut` when more came than the bound kept.
    text: str = field(default="", repr=False)
    text_cut: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def answered(self) -> bool:
        """At least one content token arrived (reasoning alone is no answer)."""
        return self.t_first_content_ns is not None

    @property
    def checks_passed(self) -> bool:
        """Every answer check run on it held (true when none ran)."""
        return all(check.passed for check in self.checks)

    @property
    def without_answer(self) -> bool:
        """Tokens came, all of them reasoning: the budget went on thinking, not answering."""
        return self.t_first_token_ns is not None and self.t_first_content_ns is None
