"""The daemon's metric objects on an injected registry; `record()` a result.

Each is built from its entry in `prober.metric_specs` (name, help, labels, buckets: declared
there once). Labels come from configuration only (`target`, `model`, `mode`) or from closed
sets (`outcome`, `kind`, `source`, `state`, `reason`, `phase`, `connection`), so cardinality
is bounded.
Latency observations carry the request id as an exemplar, so a slow bucket leads to one
concrete request in the logs (each finished probe is logged with it).

Every labelled child is made through `Metrics.child`, which remembers it under its target
(every per-target metric's first label), so `forget(target)` removes each series of a target
that left the fleet with prometheus-client's public `remove`, and nothing stale stays.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeGuard, TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from prober import metric_specs as specs
from prober import timings
from prober.metric_specs import counter, gauge, histogram
from prober.result import MAX_COUNT, Check, FinishReason, Outcome, RequestResult, TokenSource
from prober.timings import Slo

# `llmprober_token_source_total{source}`: counted events that may each hold several tokens.
LOWER_BOUND_SOURCE = "chunks_lower_bound"

_M = TypeVar("_M", Counter, Gauge, Histogram)
_Metric = Counter | Gauge | Histogram


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

        self.ttft = histogram(specs.TTFT, registry)
        self.ttfo = histogram(specs.TTFO, registry)
        self.tpot = histogram(specs.TPOT, registry)
        self.itl = histogram(specs.ITL, registry)
        self.e2e = histogram(specs.E2E, registry)
        self.dispatch_lag = histogram(specs.DISPATCH_LAG, registry)
        self.phase = histogram(specs.PROBE_PHASE, registry)
        self.connections = counter(specs.CONNECTIONS, registry)
        self.server_prefill = histogram(specs.SERVER_PREFILL, registry)
        self.server_decode = histogram(specs.SERVER_DECODE, registry)
        self.requests = counter(specs.REQUESTS, registry)
        self.good = counter(specs.REQUESTS_GOOD, registry)
        self.without_answer = counter(specs.WITHOUT_ANSWER, registry)
        self.without_answer_reasoning = counter(specs.REASONING_WITHOUT_ANSWER, registry)
        self.finish_reasons = counter(specs.FINISH_REASONS, registry)
        self.token_source = counter(specs.TOKEN_SOURCE, registry)
        self.tokens = counter(specs.TOKENS, registry)
        self.answer_checks = counter(specs.ANSWER_CHECKS, registry)
        self.probe_success = gauge(specs.PROBE_SUCCESS, registry)
        self.last_probe = gauge(specs.LAST_PROBE, registry)
        self.probe_interval = gauge(specs.PROBE_INTERVAL, registry)
        self.slo_ttft = gauge(specs.SLO_TTFT, registry)
        self.slo_tpot = gauge(specs.SLO_TPOT, registry)
        self.slo_e2e = gauge(specs.SLO_E2E, registry)
        self.slo_ttfo = gauge(specs.SLO_TTFO, registry)
        self.probe_skipped = counter(specs.PROBE_SKIPPED, registry)
        self.load_in_flight = gauge(specs.LOAD_IN_FLIGHT, registry)
        self.load_target_rate = gauge(specs.LOAD_TARGET_RATE, registry)
        self.load_dropped = counter(specs.LOAD_DROPPED, registry)
        self.load_ended = counter(specs.LOAD_STOPPED, registry)
        self.server_scrape_errors = counter(specs.SERVER_SCRAPE_ERRORS, registry)
        self.server_samples_rejected = counter(specs.SERVER_SAMPLES_REJECTED, registry)
        self.queue_wait = histogram(specs.QUEUE_WAIT, registry)
        self.cache_probe_ttft = histogram(specs.CACHE_PROBE_TTFT, registry)
        self.cache_probe = counter(specs.CACHE_PROBE, registry)
        # Every label child made, by (metric, label values), and their keys by target; see
        # `child` and `forget`.
        self._children: dict[tuple[_Metric, tuple[str, ...]], _Metric] = {}
        self._by_target: dict[str, set[tuple[_Metric, tuple[str, ...]]]] = {}

    def describe_target(self, labels: Labels, slo: Slo, interval_seconds: float) -> None:
        """Publish a target's configuration so dashboards can draw SLO lines."""
        key = (labels.target, labels.model)
        self.child(self.slo_ttft, key).set(slo.ttft_seconds)
        self.child(self.slo_tpot, key).set(slo.tpot_seconds)
        for line, seconds in ((self.slo_e2e, slo.e2e_seconds), (self.slo_ttfo, slo.ttfo_seconds)):
            if seconds is not None:
                self.child(line, key).set(seconds)
            else:  # unset (again, after a reload): no line drawn
                self._drop(line, key)
        self.child(self.probe_interval, key).set(interval_seconds)
        self.expect(labels, "probe")

    def expect(self, labels: Labels, mode: str) -> None:
        """Every outcome and finish reason of `mode` at 0 from now: a first failure is then
        an increase from 0, which `increase()` and `rate()` see (no `_created` series)."""
        key = labels.with_mode(mode)
        for outcome in Outcome:
            self.child(self.requests, (*key, outcome.value))
        for reason in FinishReason:
            self.child(self.finish_reasons, (*key, reason.value))
        self.child(self.without_answer, key)

    def expect_checks(self, labels: Labels, checks: Iterable[Check]) -> None:
        """A target's answer checks at 0 for its probes, passed and failed, from now."""
        for check in checks:
            for result in ("pass", "fail"):
                self.child(self.answer_checks, (*labels.with_mode("probe"), check.value, result))

    def record(
        self,
        result: RequestResult,
        labels: Labels,
        mode: str,
        slo: Slo,
        *,
        itl: bool = True,
        phases: bool = True,
    ) -> bool:
        """Observe one result; return whether it was good (within SLO). `itl` and `phases`:
        whether the target has those histograms (its `series:`).

        It never raises: a count outside [0, 2**53) or a duration that is negative or not
        finite (whatever a server sent, however the result was built) is left out, so one
        hostile answer can neither crash the caller nor poison a histogram's sum.
        """
        key = labels.with_mode(mode)
        child = self.child
        exemplar = {"request_id": result.request_id[:64]} if result.request_id else None
        child(self.requests, (*key, result.outcome.value)).inc()
        if _duration(lag := timings.dispatch_lag(result)):
            child(self.dispatch_lag, key).observe(lag)
        for kind, count in (
            ("prompt", result.prompt_tokens),
            ("prompt_cached", result.cached_tokens),
            ("output", result.output_tokens),
            ("reasoning", result.reasoning_tokens),
        ):
            if count and _count(count):
                child(self.tokens, (*key, kind)).inc(count)
        for check in result.checks:
            verdict = "pass" if check.passed else "fail"
            child(self.answer_checks, (*key, check.check.value, verdict)).inc()
        self._observe_latencies(result, key, exemplar, itl)
        self._observe_stream(result, key)
        if mode == "probe" and phases:
            self._observe_phases(result, labels)
        good = timings.is_good(result, slo)
        if good:
            child(self.good, key).inc()
        else:
            child(self.good, key)  # the series exists at 0, so ratios are defined
        return good

    def child(self, metric: _M, values: tuple[str, ...]) -> _M:
        """`metric.labels(*values)`, remembered: `labels()` validates and locks on every call,
        a fifth of what `record` cost. A series is still created on its first use only, and
        remembered under its target (`values[0]`) until `forget` removes it."""
        children = self._children
        found = children.get((metric, values))
        if found is None:
            found = children[(metric, values)] = metric.labels(*values)
            self._by_target.setdefault(values[0], set()).add((metric, values))
        return cast(_M, found)

    def _drop(self, metric: _Metric, values: tuple[str, ...]) -> None:
        if self._children.pop((metric, values), None) is not None:
            metric.remove(*values)
            self._by_target.get(values[0], set()).discard((metric, values))

    def forget(self, target: str, model: str | None = None) -> int:
        """Remove every series of `target` (of its `model` only, when given) from the
        registry; returns how many. The next record of it starts them again from zero."""
        keys = self._by_target.get(target, set())
        gone = [key for key in keys if model is None or key[1][1:2] == (model,)]
        for metric, values in gone:
            self._drop(metric, values)
        if not keys:
            self._by_target.pop(target, None)
        return len(gone)

    def drop_families(self, target: str, *, itl: bool, phases: bool) -> int:
        """Remove `target`'s ITL (`itl` False) and phase (`phases` False) series, a family its
        `series:` turned off; returns how many."""
        off = {m for m, on in ((self.itl, itl), (self.phase, phases)) if not on}
        gone = [key for key in self._by_target.get(target, set()) if key[0] in off]
        for metric, values in gone:
            self._drop(metric, values)
        return len(gone)

    def targets(self) -> set[str]:
        """The targets that have series now."""
        return set(self._by_target)

    def _observe_latencies(
        self,
        r: RequestResult,
        key: tuple[str, str, str],
        exemplar: dict[str, str] | None,
        itl: bool,
    ) -> None:
        child = self.child
        if _duration(first := timings.ttft(r)):
            child(self.ttft, key).observe(first, exemplar)
        if _duration(first_content := timings.ttfo(r)):
            child(self.ttfo, key).observe(first_content, exemplar)
        if _duration(per_token := timings.tpot(r)):
            child(self.tpot, key).observe(per_token, exemplar)
        if itl:
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
        child = self.child
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
                self.child(self.phase, values).observe(seconds)

    def record_probe(self, result: RequestResult, labels: Labels, wall_end: float) -> None:
        key = (labels.target, labels.model)
        self.child(self.probe_success, key).set(1 if result.ok else 0)
        if math.isfinite(wall_end):
            self.child(self.last_probe, key).set(wall_end)


def _duration(seconds: float | None) -> TypeGuard[float]:
    """A duration worth observing: finite and not negative (None, NaN, ±inf are not)."""
    return seconds is not None and 0.0 <= seconds < math.inf


def _count(n: int) -> bool:
    """A count worth adding: an integer in [0, 2**53)."""
    return isinstance(n, int) and 0 <= n < MAX_COUNT
