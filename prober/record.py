"""One path per finished request: metrics, the queue estimate and the log line.

Every result, whichever path produced it, goes through `Recorder.record(target, result, mode)`:

- `Mode.PROBE`, a scheduled probe: the request metrics (mode `probe`), the probe gauges
  (success, time of the last probe), the target's capacity as a probe (the probes-alone
  estimate learns from it) and one log line. `record_pair` records a probe and its companion:
  both as probes, and the capacity reads the two together.
- `Mode.LOAD`, background load: the request metrics (mode `load`) and the capacity; not
  logged (a line per request at load rates would drown the probes').
- `Mode.ON_DEMAND`, `/probe`: recorded as a probe on the recorder's metrics (`/probe` builds
  one on a fresh registry per request) and logged with `via="/probe"`; never fed to the
  estimate, which counts the probes in flight and did not count this one.

A request cut short (shutdown, a stopped load) is recorded too, as `cancelled` builds it.
Probes (scheduled ones and their companions) also go to the target's ring of recent probes
(`prober.recent`), which the status page shows: the same probes `/metrics` counts.

`record_cache_probe` records the cache probe's pair (`cache_probe:`): the TTFT of its miss and
its hit apart, whether the engine confirmed the prefix cached, and one log line; its results
reach the engine state, never the queue estimate or the request metrics.

This module writes every per-target series: the recorder what a result yields (the queue wait
the capacity returns included) and what the scheduler and load driver report, and
`ScrapeRecorder` the engine scrapes that failed, which no result carries.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from enum import StrEnum
from typing import Any

from prober import timings
from prober.capacity.target import TargetCapacity
from prober.logs import get_logger, safe_line
from prober.metrics import Metrics
from prober.recent import RecentProbes, summary
from prober.result import Outcome, RequestResult
from prober.targets import Target

log = get_logger("prober.record")
ANSWER_LOG_CHARS = 200  # of a probe's answer, logged when a check failed
DROP_REASONS = ("in_flight", "silent")  # why a load's arrival was not sent (LOAD_DROPPED)


class Mode(StrEnum):
    """Which path produced a result."""

    PROBE = "probe"
    LOAD = "load"
    ON_DEMAND = "on_demand"


# The request metrics' `mode` label: a `/probe` is a probe there.
_METRIC_MODE = {Mode.PROBE: "probe", Mode.LOAD: "load", Mode.ON_DEMAND: "probe"}
_CANCELLED = {
    Mode.PROBE: "cancelled at shutdown",
    Mode.LOAD: "load stopped",
    Mode.ON_DEMAND: "cancelled at shutdown",
}


def cancelled(t_sched_ns: int, mode: Mode, why: str | None = None) -> RequestResult:
    """The result of a request scheduled at `t_sched_ns` and cancelled before it ended, `why`
    (else the mode's usual reason: shutdown, the load stopping)."""
    now = time.perf_counter_ns()
    return RequestResult(Outcome.CANCELLED, t_sched_ns, now, now, error=why or _CANCELLED[mode])


def log_probe(bound: Any, r: RequestResult) -> None:
    """The one line of a finished probe, at info (warning when it failed, and when an answer
    check failed: `probe_check_failed`, with the answer's first `ANSWER_LOG_CHARS`
    characters, redacted). Its request id is the one its exemplars carry; never the prompt
    (`log_prompts` logs that apart)."""
    fields: dict[str, Any] = {
        "request_id": r.request_id,
        "outcome": r.outcome.value,
        "ttft_seconds": timings.ttft(r),
        "ttfo_seconds": timings.ttfo(r),
        "output_tokens": r.output_tokens,
        "reasoning_tokens": r.reasoning_tokens,
        "token_source": r.token_source.value,
        "finish_reason": r.finish_reason.value,
        "connection": None if r.reused is None else ("reused" if r.reused else "fresh"),
    }
    if r.checks:  # each check's verdict: "pass", or why it failed
        fields["checks"] = {c.check.value: c.detail or "pass" for c in r.checks}
    if r.ok and not r.checks_passed:  # with the answer's start, a server's text as errors are
        answer = safe_line(r.text, ANSWER_LOG_CHARS)
        bound.warning("probe_check_failed", answered=r.answered, answer=answer, **fields)
    elif r.ok:
        bound.info("probe_ok", answered=r.answered, **fields)
    else:
        bound.warning("probe_failed", error=r.error, http_status=r.http_status, **fields)


# `llmprober_cache_probe_total{confirmed}`: the engine said at least half the prefix was
# cached, said less, or says nothing of its cache.
CONFIRMED = ("true", "false", "unknown")


def confirmed(result: RequestResult, prefix_tokens: int) -> str:
    """Whether the engine confirmed the cache probe's prefix cached: half of it at least.
    Not "more than none": llama-server keeps the chat template's first tokens of the last
    request in its slot, so even a miss reports a few cached."""
    if result.cached_tokens is None:
        return "unknown"
    return "true" if 2 * result.cached_tokens >= prefix_tokens else "false"


class ScrapeRecorder:
    """Counts a target's failed engine scrapes, and the quantities its scrapes dropped a
    sample of as out of range, for its `TargetCapacity.watch`: a writer apart from
    `Recorder`, since each capacity is built with it before the recorder that holds them."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def scrape_failed(self, target: Target) -> None:
        labels = target.labels
        self.metrics.child(self.metrics.server_scrape_errors, (labels.target, labels.model)).inc()

    def samples_rejected(self, target: Target, quantities: tuple[str, ...]) -> None:
        labels, rejected = target.labels, self.metrics.server_samples_rejected
        for quantity in quantities:
            self.metrics.child(rejected, (labels.target, labels.model, quantity)).inc()


class Recorder:
    """Records finished requests on `metrics` and feeds each target's `capacity`, recording
    the queue waits it returns.

    `wall_clock` stamps the last probe's time (a gauge in Unix seconds, never a latency).
    `recent` keeps each target's last probes for the status page (`prober.status`).
    """

    def __init__(
        self,
        metrics: Metrics,
        capacity: Mapping[str, TargetCapacity] | None = None,
        *,
        wall_clock: Callable[[], float] = time.time,
        recent: RecentProbes | None = None,
    ) -> None:
        self.metrics = metrics
        self.recent = RecentProbes() if recent is None else recent
        # Kept as given, even empty: the daemon's is its fleet's, filled as targets start.
        self.capacity: Mapping[str, TargetCapacity] = {} if capacity is None else capacity
        self._wall_clock = wall_clock

    def describe(self, target: Target) -> None:
        """A target's configuration (SLOs, interval) and its probe outcomes at 0, at start."""
        self.metrics.describe_target(target.labels, target.slo, target.config.interval_seconds)
        series = target.config.series
        self.metrics.drop_families(target.name, itl=series.itl, phases=series.phases)
        self.metrics.expect_checks(target.labels, target.spec.checks.names)
        if target.config.cache_probe is not None:
            labels = target.labels
            for result in ("miss", "hit"):
                for confirmed in CONFIRMED:
                    values = (labels.target, labels.model, result, confirmed)
                    self.metrics.child(self.metrics.cache_probe, values)

    def skipped(self, target: Target) -> None:
        """A probe run not started (its cap still in flight, or missed)."""
        labels = target.labels
        self.metrics.child(self.metrics.probe_skipped, (labels.target, labels.model)).inc()

    def load_started(self, target: Target, rate: float) -> None:
        """A target's background load began at `rate` arrivals/s; its outcomes from 0."""
        labels = target.labels
        self.metrics.child(self.metrics.load_target_rate, (labels.target, labels.model)).set(rate)
        self.metrics.expect(labels, "load")
        for reason in DROP_REASONS:
            self.metrics.child(self.metrics.load_dropped, (labels.target, labels.model, reason))

    def load_in_flight(self, target: Target, delta: int) -> None:
        labels = target.labels
        self.metrics.child(self.metrics.load_in_flight, (labels.target, labels.model)).inc(delta)

    def load_dropped(self, target: Target, reason: str) -> None:
        """An arrival not sent, for `reason` (`LOAD_DROPPED`'s)."""
        labels = target.labels
        child = (labels.target, labels.model, reason)
        self.metrics.child(self.metrics.load_dropped, child).inc()

    def record(self, target: Target, result: RequestResult, mode: Mode) -> None:
        """One finished request: metrics, the target's capacity, and its log line."""
        self._count(target, result, mode)
        cap = self._capacity_of(target)
        if cap is not None and mode is not Mode.ON_DEMAND:
            self._queue_waits(target, cap.observe(result, probe=mode is Mode.PROBE))

    def record_pair(self, target: Target, primary: RequestResult, companion: RequestResult) -> None:
        """A probe and the companion sent while it decoded: two probes, read together."""
        self._count(target, primary, Mode.PROBE)
        self._count(target, companion, Mode.PROBE, companion=True)
        cap = self._capacity_of(target)
        if cap is not None:
            self._queue_waits(target, *cap.observe_pair(primary, companion))

    def record_cache_probe(
        self, target: Target, miss: RequestResult, hit: RequestResult | None
    ) -> None:
        """The cache probe's miss and its hit (None: not sent, the miss failed)."""
        labels, cache = target.labels, target.config.cache_probe
        prefix = cache.prefix_tokens if cache is not None else 1
        cap = self._capacity_of(target)
        fields: dict[str, Any] = {}
        for name, r in (("miss", miss), ("hit", hit)):
            if r is None:
                continue
            if cap is not None:
                cap.state.finished(r)
            fields[f"{name}_outcome"] = r.outcome.value
            fields[f"{name}_cached_tokens"] = r.cached_tokens
            ttft = timings.ttft(r) if r.ok else None
            fields[f"{name}_ttft_seconds"] = ttft
            if not r.ok:
                continue
            key = (labels.target, labels.model, name)
            if ttft is not None and 0.0 <= ttft < math.inf:
                self.metrics.child(self.metrics.cache_probe_ttft, key).observe(ttft)
            self.metrics.child(self.metrics.cache_probe, (*key, confirmed(r, prefix))).inc()
        bound = log.bind(target=target.name, model=target.config.model)
        ok = hit is not None and hit.ok
        (bound.info if ok else bound.warning)("cache_probe", **fields)

    def load_stopped(self, target: Target) -> None:
        """A target's background load ended for good (a reload took its `load:` away)."""
        labels = target.labels
        self.metrics.child(self.metrics.load_target_rate, (labels.target, labels.model)).set(0)

    def load_ended(self, target: Target, reason: str) -> None:
        """A target's arrivals ended on their own (`reason`): counted, and its rate is 0."""
        labels = target.labels
        self.metrics.child(self.metrics.load_ended, (labels.target, labels.model, reason)).inc()
        self.load_stopped(target)

    def _capacity_of(self, target: Target) -> TargetCapacity | None:
        """The capacity that learns from `target`'s requests: the one built for this very
        `Target`. A request sent before a reload replaced the target's endpoint finishes into
        its metrics, never into the estimate of the engine that replaced it."""
        cap = self.capacity.get(target.name)
        return cap if cap is not None and cap.target is target else None

    def _queue_waits(self, target: Target, *waits: float | None) -> None:
        labels = target.labels
        for wait in waits:
            if wait is not None:
                self.metrics.child(self.metrics.queue_wait, (labels.target, labels.model)).observe(
                    wait
                )

    def _count(
        self, target: Target, result: RequestResult, mode: Mode, *, companion: bool = False
    ) -> None:
        labels = target.labels
        series = target.config.series
        good = self.metrics.record(
            result, labels, _METRIC_MODE[mode], target.slo, itl=series.itl, phases=series.phases
        )
        if mode is Mode.LOAD:
            return
        wall_end = self._wall_clock()
        self.metrics.record_probe(result, labels, wall_end)
        record = summary(result, wall_end=wall_end, good=good, companion=companion)
        self.recent.add(target.name, record)
        bound = log.bind(target=target.name, model=target.config.model)
        if mode is Mode.ON_DEMAND:
            bound = bound.bind(via="/probe")
        if companion:  # sent while another probe decoded: its figures are not a lone probe's
            bound = bound.bind(companion=True)
        log_probe(bound, result)
