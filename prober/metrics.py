"""Every llm-prober metric, declared once on an injected registry; `record()` a result.

Names follow DESIGN section 4: prefix `llmprober_`, base units, counters end in `_total`.
Labels come from configuration only (`target`, `model`, `mode`) or from closed sets (`outcome`,
`kind`, `source`, `state`, `reason`, `phase`, `connection`), so cardinality is bounded.
Latency observations carry the request id as an exemplar, so a slow bucket leads to one
concrete request in the logs (each finished probe is logged with it).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeGuard, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from prober import timings
from prober.result import MAX_COUNT, FinishReason, Outcome, RequestResult, TokenSource
from prober.timings import Slo

# vLLM's TTFT buckets (so client and server series share queries), up to minutes.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
# vLLM's inter-token buckets, extended down to a millisecond for fast engines.
TPOT_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
# vLLM's end-to-end buckets, with a sub-second start for short probes.
E2E_BUCKETS = (
    0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
    50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
# The client's own lateness: microseconds to seconds.
LAG_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
)  # fmt: skip

# Connection set-up and request phases: from tens of microseconds (loopback) to the minutes a
# first token may take.
PHASE_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
# `llmprober_token_source_total{source}`: counted events that may each hold several tokens.
LOWER_BOUND_SOURCE = "chunks_lower_bound"

_M = TypeVar("_M", Counter, Histogram)

TARGET_LABELS = ("target", "model")
REQUEST_LABELS = ("target", "model", "mode")


@dataclass(frozen=True, slots=True)
class Labels:
    target: str
    model: str

    def with_mode(self, mode: str) -> tuple[str, str, str]:
        return (self.target, self.model, mode)


def observe_many(child: Histogram, amounts: Sequence[float]) -> None:
    """`child.observe(a)` for each amount (no exemplar), in one pass.

    A 64-token stream has 63 gaps; observing them one by one scans the buckets and takes two
    locks per gap, most of what `record` cost. Here each lands in the bucket `observe` picks
    (the first bound ≥ it), each bucket is incremented once, and the sum gains the amounts in
    the same order, so the exposition is bit-identical. It uses prometheus-client's Histogram
    internals and falls back to `observe` wherever they are not as expected.
    """
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for amount in amounts:
            child.observe(amount)
        return
    counts = [0] * len(bounds)
    value = total.get()
    for amount in amounts:
        value += amount
        if amount == amount:  # observe() counts NaN in the sum and in no bucket
            counts[bisect_left(bounds, amount)] += 1
    total.set(value)
    for bucket, count in zip(buckets, counts, strict=True):
        if count:
            bucket.inc(count)


class Metrics:
    """The metric families of one registry. Build one per registry (daemon, `/probe`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, REQUEST_LABELS, buckets=buckets, registry=registry)

        self.ttft = histogram(
            "llmprober_ttft_seconds", "Time to first token on any channel, from the scheduled send",
            TTFT_BUCKETS,
        )  # fmt: skip
        self.ttfo = histogram(
            "llmprober_ttfo_seconds", "Time to first answer (content) token, from scheduled send",
            TTFT_BUCKETS,
        )  # fmt: skip
        self.tpot = histogram(
            "llmprober_tpot_seconds", "Mean time per output token after the first.", TPOT_BUCKETS
        )
        self.itl = histogram(
            "llmprober_itl_seconds", "Every gap between consecutive token events.", TPOT_BUCKETS
        )
        self.e2e = histogram(
            "llmprober_e2e_seconds", "End-to-end latency of successful streams.", E2E_BUCKETS
        )
        self.dispatch_lag = histogram(
            "llmprober_dispatch_lag_seconds",
            "Begin of the request minus its scheduled time (the prober's own lateness).",
            LAG_BUCKETS,
        )  # fmt: skip
        self.phase = Histogram(
            "llmprober_probe_phase_seconds",
            "Time of each phase of a probe (resolve, connect, tls, request_written, first_byte, "
            "first_token), by whether its connection was fresh or reused.",
            (*TARGET_LABELS, "phase", "connection"), buckets=PHASE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.connections = Counter(
            "llmprober_connections", "Requests by whether they opened a connection or reused one.",
            (*REQUEST_LABELS, "connection"), registry=registry,
        )  # fmt: skip
        self.server_prefill = histogram(
            "llmprober_server_prefill_seconds", "Prefill time reported by the server.", TTFT_BUCKETS
        )
        self.server_decode = histogram(
            "llmprober_server_decode_per_token_seconds",
            "Decode time per token reported by the server.", TPOT_BUCKETS,
        )  # fmt: skip
        self.requests = Counter(
            "llmprober_requests", "Requests by outcome.", (*REQUEST_LABELS, "outcome"),
            registry=registry,
        )  # fmt: skip
        self.good = Counter(
            "llmprober_requests_good", "Requests that succeeded within the target's SLO (goodput).",
            REQUEST_LABELS, registry=registry,
        )  # fmt: skip
        self.without_answer = Counter(
            "llmprober_requests_without_answer",
            "Requests that got reasoning tokens but no answer (content) token; never good.",
            REQUEST_LABELS, registry=registry,
        )  # fmt: skip
        self.without_answer_reasoning = Counter(
            "llmprober_reasoning_tokens_without_answer",
            "Reasoning tokens spent by requests that ended without an answer.",
            REQUEST_LABELS, registry=registry,
        )  # fmt: skip
        self.finish_reasons = Counter(
            "llmprober_finish_reasons", "Requests by finish reason (none: the server sent none).",
            (*REQUEST_LABELS, "reason"), registry=registry,
        )  # fmt: skip
        self.token_source = Counter(
            "llmprober_token_source",
            "Requests with tokens by where their output count came from: usage, chunks (counted "
            "events), chunks_lower_bound (events carried several tokens: the count is a lower "
            "bound, TPOT an upper bound).",
            (*REQUEST_LABELS, "source"), registry=registry,
        )  # fmt: skip
        self.tokens = Counter(
            "llmprober_tokens", "Tokens by kind (output includes reasoning).",
            (*REQUEST_LABELS, "kind"), registry=registry,
        )  # fmt: skip
        self.probe_success = Gauge(
            "llmprober_probe_success", "Whether the last probe succeeded (1) or not (0).",
            TARGET_LABELS, registry=registry,
        )  # fmt: skip
        self.last_probe = Gauge(
            "llmprober_last_probe_timestamp_seconds", "Unix time the last probe finished.",
            TARGET_LABELS, registry=registry,
        )  # fmt: skip
        self.probe_interval = Gauge(
            "llmprober_probe_interval_seconds", "Configured probe interval.", TARGET_LABELS,
            registry=registry,
        )  # fmt: skip
        self.slo_ttft = Gauge(
            "llmprober_slo_ttft_seconds", "Configured TTFT SLO.", TARGET_LABELS, registry=registry
        )
        self.slo_tpot = Gauge(
            "llmprober_slo_tpot_seconds", "Configured TPOT SLO.", TARGET_LABELS, registry=registry
        )
        self.slo_e2e = Gauge(
            "llmprober_slo_e2e_seconds", "Configured end-to-end SLO (when set).", TARGET_LABELS,
            registry=registry,
        )  # fmt: skip
        self.slo_ttfo = Gauge(
            "llmprober_slo_ttfo_seconds", "Configured time-to-first-answer SLO (when set).",
            TARGET_LABELS, registry=registry,
        )  # fmt: skip

        self.probe_skipped = Counter(
            "llmprober_probe_skipped", "Probe runs not started because the target's probes in "
            "flight were at `probes_in_flight` (a slow endpoint thins the probes).",
            TARGET_LABELS, registry=registry,
        )  # fmt: skip

        self.load_in_flight = Gauge(
            "llmprober_load_in_flight", "Background-load requests in flight.", TARGET_LABELS,
            registry=registry,
        )  # fmt: skip
        self.load_target_rate = Gauge(
            "llmprober_load_target_rate", "Configured background-load arrival rate (requests/s).",
            TARGET_LABELS, registry=registry,
        )  # fmt: skip
        self.load_dropped = Counter(
            "llmprober_load_dropped", "Arrivals not sent because the in-flight cap was reached.",
            TARGET_LABELS, registry=registry,
        )  # fmt: skip
        self.server_scrape_errors = Counter(
            "llmprober_server_scrape_errors", "Failed scrapes of the engine's own /metrics.",
            TARGET_LABELS, registry=registry,
        )  # fmt: skip
        self.queue_wait = Histogram(
            "llmprober_queue_wait_seconds", "Estimated queue wait per request (TTFT − prefill).",
            TARGET_LABELS, buckets=TTFT_BUCKETS, registry=registry,
        )  # fmt: skip
        # Label children `record` has used, by (metric, label values); see `_child`.
        self._children: dict[tuple[Counter | Histogram, tuple[str, ...]], Counter | Histogram] = {}

    def describe_target(self, labels: Labels, slo: Slo, interval_seconds: float) -> None:
        """Publish a target's configuration so dashboards can draw SLO lines."""
        key = (labels.target, labels.model)
        self.slo_ttft.labels(*key).set(slo.ttft_seconds)
        self.slo_tpot.labels(*key).set(slo.tpot_seconds)
        if slo.e2e_seconds is not None:
            self.slo_e2e.labels(*key).set(slo.e2e_seconds)
        if slo.ttfo_seconds is not None:
            self.slo_ttfo.labels(*key).set(slo.ttfo_seconds)
        self.probe_interval.labels(*key).set(interval_seconds)
        probe = labels.with_mode("probe")
        for outcome in Outcome:
            self.requests.labels(*probe, outcome.value)
        for reason in FinishReason:
            self.finish_reasons.labels(*probe, reason.value)
        self.without_answer.labels(*probe)

    def record(self, result: RequestResult, labels: Labels, mode: str, slo: Slo) -> bool:
        """Observe one result; return whether it was good (within SLO).

        It never raises: a count outside [0, 2**53) or a duration that is negative or not
        finite (whatever a server sent, however the result was built) is left out, so one
        hostile answer can neither crash the caller nor poison a histogram's sum.
        """
        key = labels.with_mode(mode)
        child = self._child
        exemplar = {"request_id": result.request_id[:64]} if result.request_id else None
        child(self.requests, (*key, result.outcome.value)).inc()
        if _duration(lag := timings.dispatch_lag(result)):
            child(self.dispatch_lag, key).observe(lag)
        for kind, count in (
            ("prompt", result.prompt_tokens),
            ("output", result.output_tokens),
            ("reasoning", result.reasoning_tokens),
        ):
            if count and _count(count):
                child(self.tokens, (*key, kind)).inc(count)
        self._observe_latencies(result, key, exemplar)
        self._observe_stream(result, key)
        if mode == "probe":
            self._observe_phases(result, labels)
        good = timings.is_good(result, slo)
        if good:
            child(self.good, key).inc()
        else:
            child(self.good, key)  # the series exists at 0, so ratios are defined
        return good

    def _child(self, metric: _M, values: tuple[str, ...]) -> _M:
        """`metric.labels(*values)`, remembered: `labels()` validates and locks on every call,
        a fifth of what `record` cost. A series is still created on its first use only; no
        code removes a series, so a remembered child never goes stale."""
        children = self._children
        found = children.get((metric, values))
        if found is None:
            found = children[(metric, values)] = metric.labels(*values)
        return cast(_M, found)

    def _observe_latencies(
        self, r: RequestResult, key: tuple[str, str, str], exemplar: dict[str, str] | None
    ) -> None:
        child = self._child
        if _duration(first := timings.ttft(r)):
            child(self.ttft, key).observe(first, exemplar)
        if _duration(first_content := timings.ttfo(r)):
            child(self.ttfo, key).observe(first_content, exemplar)
        if _duration(per_token := timings.tpot(r)):
            child(self.tpot, key).observe(per_token, exemplar)
        gaps = timings.itl_gaps(r)
        if gaps and not 0.0 <= min(gaps) <= max(gaps) < math.inf:  # stamps out of order
            gaps = [gap for gap in gaps if 0.0 <= gap < math.inf]
        observe_many(child(self.itl, key), gaps)
        if _duration(total := timings.e2e(r)):
            child(self.e2e, key).observe(total, exemplar)
        if _duration(prefill := r.server_prefill_seconds):
            child(self.server_prefill, key).observe(prefill)
        if _duration(decode := r.server_decode_per_token_seconds):
            child(self.server_decode, key).observe(decode)

    def _observe_stream(self, r: RequestResult, key: tuple[str, str, str]) -> None:
        """What the stream said: finish reason, token source, an answer or none, connection."""
        child = self._child
        child(self.finish_reasons, (*key, r.finish_reason.value)).inc()
        if r.token_event_ns:
            source = r.token_source.value
            if r.token_source is TokenSource.CHUNKS and r.tokens_lower_bound:
                source = LOWER_BOUND_SOURCE
            child(self.token_source, (*key, source)).inc()
        # Both exist at 0 until one comes, so ratios are defined.
        unanswered = child(self.without_answer, key)
        spent = child(self.without_answer_reasoning, key)
        if r.without_answer:
            unanswered.inc()
            if r.reasoning_tokens and _count(r.reasoning_tokens):
                spent.inc(r.reasoning_tokens)
        if r.reused is not None:
            child(self.connections, (*key, "reused" if r.reused else "fresh")).inc()

    def _observe_phases(self, r: RequestResult, labels: Labels) -> None:
        connection = "reused" if r.reused else "fresh"
        for phase, seconds in timings.phases(r):
            if _duration(seconds):
                values = (labels.target, labels.model, phase, connection)
                self._child(self.phase, values).observe(seconds)

    def record_probe(self, result: RequestResult, labels: Labels, wall_end: float) -> None:
        key = (labels.target, labels.model)
        self.probe_success.labels(*key).set(1 if result.ok else 0)
        if math.isfinite(wall_end):
            self.last_probe.labels(*key).set(wall_end)


def _duration(seconds: float | None) -> TypeGuard[float]:
    """A duration worth observing: finite and not negative (None, NaN, ±inf are not)."""
    return seconds is not None and 0.0 <= seconds < math.inf


def _count(n: int) -> bool:
    """A count worth adding: an integer in [0, 2**53)."""
    return isinstance(n, int) and 0 <= n < MAX_COUNT
