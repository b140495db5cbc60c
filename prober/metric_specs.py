"""The one table of every metric the daemon exports: name, kind, help, labels, buckets.

`Metrics` builds its prometheus-client objects from these entries, `CapacityCollector` its
scrape-time families; the deployment tests (rules, dashboards), the integration tests and the
README check read the names from here instead of listing them again. A new metric is one entry
here, added to `SPECS`, and one call of `counter`/`gauge`/`histogram`/`gauge_family` where
it is recorded.

Names follow docs/design.md §5: prefix `llmprober_`, base units, counters end in `_total`.
`name` is the name the README and queries use (`llmprober_requests_total`); prometheus-client
strips a counter's `_total` into its family name itself, so the exposition is the same.
Labels come from configuration only (`target`, `model`, `mode`) or from closed sets, so
cardinality is bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

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

TARGET_LABELS = ("target", "model")
REQUEST_LABELS = ("target", "model", "mode")


class Kind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One exported metric. `buckets` is set for histograms and only for them."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.startswith("llmprober_"):
            raise ValueError(f"{self.name}: every metric is prefixed llmprober_")
        if (self.kind is Kind.COUNTER) != self.name.endswith("_total"):
            raise ValueError(f"{self.name}: counters, and only counters, end in _total")
        if (self.kind is Kind.HISTOGRAM) != bool(self.buckets):
            raise ValueError(f"{self.name}: histograms, and only histograms, have buckets")

    @property
    def family(self) -> str:
        """The family name prometheus-client gives it (a counter's without `_total`)."""
        return self.name.removesuffix("_total") if self.kind is Kind.COUNTER else self.name

    @property
    def series(self) -> tuple[str, ...]:
        """The sample names a scrape carries (besides prometheus-client's `_created`)."""
        if self.kind is Kind.HISTOGRAM:
            return tuple(f"{self.name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
        return (self.name,)


def _check(spec: MetricSpec, kind: Kind) -> None:
    if spec.kind is not kind:
        raise ValueError(f"{spec.name} is a {spec.kind}, not a {kind}")


def counter(spec: MetricSpec, registry: CollectorRegistry) -> Counter:
    _check(spec, Kind.COUNTER)
    return Counter(spec.name, spec.help, spec.labels, registry=registry)


def gauge(spec: MetricSpec, registry: CollectorRegistry) -> Gauge:
    _check(spec, Kind.GAUGE)
    return Gauge(spec.name, spec.help, spec.labels, registry=registry)


def histogram(spec: MetricSpec, registry: CollectorRegistry) -> Histogram:
    _check(spec, Kind.HISTOGRAM)
    return Histogram(spec.name, spec.help, spec.labels, buckets=spec.buckets, registry=registry)


def gauge_family(spec: MetricSpec) -> GaugeMetricFamily:
    """An empty scrape-time family of a gauge (a custom collector's)."""
    _check(spec, Kind.GAUGE)
    return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)


def counter_family(spec: MetricSpec) -> CounterMetricFamily:
    """An empty scrape-time family of a counter (a custom collector's)."""
    _check(spec, Kind.COUNTER)
    return CounterMetricFamily(spec.family, spec.help, labels=spec.labels)


def _request_histogram(name: str, help: str, buckets: tuple[float, ...]) -> MetricSpec:
    return MetricSpec(name, Kind.HISTOGRAM, help, REQUEST_LABELS, buckets)


def _request_counter(name: str, help: str, *labels: str) -> MetricSpec:
    return MetricSpec(name, Kind.COUNTER, help, (*REQUEST_LABELS, *labels))


def _target(name: str, kind: Kind, help: str) -> MetricSpec:
    return MetricSpec(name, kind, help, TARGET_LABELS)


# --- per request (`Metrics.record`); latency observations carry the request id as exemplar --
TTFT = _request_histogram(
    "llmprober_ttft_seconds", "Time to first token on any channel, from the scheduled send",
    TTFT_BUCKETS,
)  # fmt: skip
TTFO = _request_histogram(
    "llmprober_ttfo_seconds", "Time to first answer (content) token, from scheduled send",
    TTFT_BUCKETS,
)  # fmt: skip
TPOT = _request_histogram(
    "llmprober_tpot_seconds", "Mean time per output token after the first.", TPOT_BUCKETS
)
ITL = _request_histogram(
    "llmprober_itl_seconds", "Every gap between consecutive token events.", TPOT_BUCKETS
)
E2E = _request_histogram(
    "llmprober_e2e_seconds", "End-to-end latency of successful streams.", E2E_BUCKETS
)
DISPATCH_LAG = _request_histogram(
    "llmprober_dispatch_lag_seconds",
    "Begin of the request minus its scheduled time (the prober's own lateness).",
    LAG_BUCKETS,
)  # fmt: skip
PROBE_PHASE = MetricSpec(
    "llmprober_probe_phase_seconds", Kind.HISTOGRAM,
    "Time of each phase of a probe (resolve, connect, tls, request_written, first_byte, "
    "first_token), by whether its connection was fresh or reused.",
    (*TARGET_LABELS, "phase", "connection"), PHASE_BUCKETS,
)  # fmt: skip
CONNECTIONS = _request_counter(
    "llmprober_connections_total", "Requests by whether they opened a connection or reused one.",
    "connection",
)  # fmt: skip
SERVER_PREFILL = _request_histogram(
    "llmprober_server_prefill_seconds", "Prefill time reported by the server.", TTFT_BUCKETS
)
SERVER_DECODE = _request_histogram(
    "llmprober_server_decode_per_token_seconds",
    "Decode time per token reported by the server.", TPOT_BUCKETS,
)  # fmt: skip
REQUESTS = _request_counter("llmprober_requests_total", "Requests by outcome.", "outcome")
REQUESTS_GOOD = _request_counter(
    "llmprober_requests_good_total", "Requests that succeeded within the target's SLO (goodput)."
)
WITHOUT_ANSWER = _request_counter(
    "llmprober_requests_without_answer_total",
    "Requests that got reasoning tokens but no answer (content) token; never good.",
)
REASONING_WITHOUT_ANSWER = _request_counter(
    "llmprober_reasoning_tokens_without_answer_total",
    "Reasoning tokens spent by requests that ended without an answer.",
)
FINISH_REASONS = _request_counter(
    "llmprober_finish_reasons_total",
    "Requests by finish reason (none: the server sent none).", "reason",
)  # fmt: skip
TOKEN_SOURCE = _request_counter(
    "llmprober_token_source_total",
    "Requests with tokens by where their output count came from: usage, chunks (counted "
    "events), chunks_lower_bound (events carried several tokens: the count is a lower "
    "bound, TPOT an upper bound).",
    "source",
)  # fmt: skip
ANSWER_CHECKS = _request_counter(
    "llmprober_answer_checks_total",
    "Answer checks of ok probes (expect:) by check (regex, json, json_schema,"
    " min_answer_tokens, model) and result (pass, fail); a failed one makes the probe not good.",
    "check", "result",
)  # fmt: skip
TOKENS = _request_counter(
    "llmprober_tokens_total",
    "Tokens by kind (output includes reasoning; prompt_cached: prompt tokens the engine's"
    " prefix cache served, where it says).",
    "kind",
)  # fmt: skip

# --- per target: the last probe and the configuration ---------------------------------------
PROBE_SUCCESS = _target(
    "llmprober_probe_success", Kind.GAUGE, "Whether the last probe succeeded (1) or not (0)."
)
LAST_PROBE = _target(
    "llmprober_last_probe_timestamp_seconds", Kind.GAUGE, "Unix time the last probe finished."
)
PROBE_INTERVAL = _target(
    "llmprober_probe_interval_seconds", Kind.GAUGE, "Configured probe interval."
)
SLO_TTFT = _target("llmprober_slo_ttft_seconds", Kind.GAUGE, "Configured TTFT SLO.")
SLO_TPOT = _target("llmprober_slo_tpot_seconds", Kind.GAUGE, "Configured TPOT SLO.")
SLO_E2E = _target("llmprober_slo_e2e_seconds", Kind.GAUGE, "Configured end-to-end SLO (when set).")
SLO_TTFO = _target(
    "llmprober_slo_ttfo_seconds", Kind.GAUGE, "Configured time-to-first-answer SLO (when set)."
)
PROBE_SKIPPED = _target(
    "llmprober_probe_skipped_total", Kind.COUNTER,
    "Probe runs not started because the target's probes in flight were at "
    "`probes_in_flight` (a slow endpoint thins the probes).",
)  # fmt: skip

# --- background load ------------------------------------------------------------------------
LOAD_IN_FLIGHT = _target(
    "llmprober_load_in_flight", Kind.GAUGE, "Background-load requests in flight."
)
LOAD_TARGET_RATE = _target(
    "llmprober_load_target_rate", Kind.GAUGE,
    "Configured background-load arrival rate (requests/s).",
)  # fmt: skip
LOAD_DROPPED = MetricSpec(
    "llmprober_load_dropped_total", Kind.COUNTER,
    "Background-load arrivals not sent, by why: in_flight (the load's max_in_flight were all in"
    " flight), silent (no token on any of the target's streams for load.silent_seconds while a"
    " request waited or failed: a hung or unreachable target gets no more requests).",
    (*TARGET_LABELS, "reason"),
)  # fmt: skip
LOAD_STOPPED = MetricSpec(
    "llmprober_load_stopped_total", Kind.COUNTER,
    "Background loads whose arrivals ended before the daemon stopped, by why: finished (a"
    " schedule or trace that does not loop ran out), trace_* (the replayed file turned"
    " unreadable, empty, changed or over the pace bound), error.",
    (*TARGET_LABELS, "reason"),
)  # fmt: skip

# --- capacity (`record` writes these two; the gauges are `CapacityCollector`'s, at scrape time) --
SERVER_SCRAPE_ERRORS = _target(
    "llmprober_server_scrape_errors_total", Kind.COUNTER,
    "Failed scrapes of the engine's own /metrics.",
)  # fmt: skip
SERVER_SAMPLES_REJECTED = MetricSpec(
    "llmprober_server_samples_rejected_total", Kind.COUNTER,
    "Scrapes of the engine's own /metrics in which a quantity (waiting, running, kv_usage, "
    "completed, lengths) had a sample out of its range: dropped, never exported.",
    (*TARGET_LABELS, "quantity"),
)  # fmt: skip
QUEUE_WAIT = MetricSpec(
    "llmprober_queue_wait_seconds", Kind.HISTOGRAM,
    "Estimated queue wait per request (TTFT − prefill).", TARGET_LABELS, TTFT_BUCKETS,
)  # fmt: skip
QUEUE_DEPTH = MetricSpec(
    "llmprober_queue_depth", Kind.GAUGE,
    "Requests waiting for / holding an engine slot, estimated by the client or reported "
    "by the server.",
    (*TARGET_LABELS, "source", "state"),
)  # fmt: skip
QUEUE_ESTIMATE_BASIS = MetricSpec(
    "llmprober_queue_estimate_basis", Kind.GAUGE,
    "What the queue estimate rests on: 1 for the basis in use, 0 for the others.",
    (*TARGET_LABELS, "basis"),
)  # fmt: skip
QUEUE_DRAIN_RATE = _target(
    "llmprober_queue_drain_rate", Kind.GAUGE,
    "Requests per second a queue drains at (the engine's departures while every slot is"
    " busy), as the queue estimate uses it.",
)  # fmt: skip
QUEUE_DRAIN_BASIS = MetricSpec(
    "llmprober_queue_drain_basis", Kind.GAUGE,
    "What the queue estimate's drain rate rests on: 1 for the basis in use, 0 for the others.",
    (*TARGET_LABELS, "basis"),
)  # fmt: skip
ENGINE_SLOTS = MetricSpec(
    "llmprober_engine_slots", Kind.GAUGE,
    "The engine's parallel slots: the operator's hint, or learned by the estimator.",
    (*TARGET_LABELS, "source"),
)  # fmt: skip
SATURATION = MetricSpec(
    "llmprober_saturation", Kind.GAUGE,
    "Busy slots / slots below saturation, 1 + waiting / slots above it.",
    (*TARGET_LABELS, "source"),
)  # fmt: skip
ENGINE_STATE = MetricSpec(
    "llmprober_engine_state", Kind.GAUGE,
    "The engine's state over the target's stall_seconds, one-hot: ok, busy (tokens flow,"
    " over the SLO or saturated), stalled (requests wait, no token comes), down (no"
    " connection, or only connect errors and 5xx).",
    (*TARGET_LABELS, "state"),
)  # fmt: skip
SERVER_KV_CACHE_USAGE = _target(
    "llmprober_server_kv_cache_usage_ratio", Kind.GAUGE,
    "KV-cache usage reported by the server (0..1).",
)  # fmt: skip

# --- the cache probe (`cache_probe:`): one prefix sent twice, a miss then a hit -------------
CACHE_PROBE_TTFT = MetricSpec(
    "llmprober_cache_probe_ttft_seconds", Kind.HISTOGRAM,
    "TTFT of the cache probe's two requests: miss (a fresh prefix, which warms the cache)"
    " and hit (the same prefix again).",
    (*TARGET_LABELS, "result"), TTFT_BUCKETS,
)  # fmt: skip
CACHE_PROBE = MetricSpec(
    "llmprober_cache_probe_total", Kind.COUNTER,
    "Cache probe requests that succeeded, by result (miss, hit) and whether the engine"
    " confirmed at least half the prefix cached (true, false; unknown: it reports no cached"
    " tokens).",
    (*TARGET_LABELS, "result", "confirmed"),
)  # fmt: skip

# --- the daemon's own paths: which one is live (request/wire.py, exposition.py) -----------
STAMPING_INFO = MetricSpec(
    "llmprober_stamping_info", Kind.GAUGE,
    "How token arrivals are stamped: protocol (when the loop received the bytes) or"
    " fallback (when the reading task ran: late under batching; another aiohttp).",
    ("method",),
)  # fmt: skip
EXPOSITION_FALLBACK = MetricSpec(
    "llmprober_exposition_fallback_total", Kind.COUNTER,
    "Scrapes of /metrics the fast renderer failed on (prometheus-client internals it does"
    " not know), served by prometheus-client's own handler instead.",
    (),
)  # fmt: skip

# --- the configuration (fleet/reload.py), as Prometheus and blackbox_exporter name them -----
RELOAD_SUCCESSFUL = MetricSpec(
    "llmprober_config_last_reload_successful", Kind.GAUGE,
    "1 when the last configuration reload (SIGHUP, POST /-/reload, the file's checksum) was"
    " applied, 0 when it was refused and the running configuration kept.",
    (),
)  # fmt: skip
RELOAD_SUCCESS_TIME = MetricSpec(
    "llmprober_config_last_reload_success_timestamp_seconds", Kind.GAUGE,
    "When the configuration in use was loaded, start-up or the last good reload (Unix time).",
    (),
)  # fmt: skip

# --- discovery (`discovery.Discovery`, at scrape time) ----------------------------------------
TARGET_INFO = MetricSpec(
    "llmprober_target_info", Kind.GAUGE,
    "1 for each target this replica probes: its group (empty for a static target), its"
    " address, and the discovery labels its group declares (labels:); join it on target in"
    " PromQL.",
    ("target", "group", "address"),
)  # fmt: skip
DISCOVERY_TARGETS = MetricSpec(
    "llmprober_discovery_targets", Kind.GAUGE,
    "Targets a group holds now on this replica's shard (removed ones gone, name clashes left"
    " out).", ("group",),
)  # fmt: skip
DISCOVERY_ERRORS = MetricSpec(
    "llmprober_discovery_errors_total", Kind.COUNTER,
    "Discovery faults by group and reason (unreadable, too_large, malformed, invalid_target,"
    " too_many, http_status, connect, timeout, dns); a failed refresh keeps the last good list.",
    ("group", "reason"),
)  # fmt: skip
DISCOVERY_LAST_REFRESH = MetricSpec(
    "llmprober_discovery_last_refresh_timestamp_seconds", Kind.GAUGE,
    "When the group's source last answered well (Unix time).", ("group",),
)  # fmt: skip

# The client's own latency histograms: observed for every request, probe and load alike.
REQUEST_LATENCY = (TTFT, TTFO, TPOT, ITL, E2E, DISPATCH_LAG)
# Every metric, in the order a scrape shows them.
SPECS: tuple[MetricSpec, ...] = (
    *REQUEST_LATENCY, PROBE_PHASE, CONNECTIONS, SERVER_PREFILL, SERVER_DECODE,
    REQUESTS, REQUESTS_GOOD, WITHOUT_ANSWER, REASONING_WITHOUT_ANSWER, FINISH_REASONS,
    TOKEN_SOURCE, ANSWER_CHECKS, TOKENS,
    PROBE_SUCCESS, LAST_PROBE, PROBE_INTERVAL, SLO_TTFT, SLO_TPOT, SLO_E2E, SLO_TTFO,
    PROBE_SKIPPED, LOAD_IN_FLIGHT, LOAD_TARGET_RATE, LOAD_DROPPED, LOAD_STOPPED,
    SERVER_SCRAPE_ERRORS, SERVER_SAMPLES_REJECTED,
    QUEUE_WAIT, QUEUE_DEPTH, QUEUE_ESTIMATE_BASIS, QUEUE_DRAIN_RATE, QUEUE_DRAIN_BASIS,
    ENGINE_SLOTS, SATURATION, ENGINE_STATE,
    SERVER_KV_CACHE_USAGE, CACHE_PROBE_TTFT, CACHE_PROBE, STAMPING_INFO, EXPOSITION_FALLBACK,
    RELOAD_SUCCESSFUL, RELOAD_SUCCESS_TIME,
    TARGET_INFO, DISCOVERY_TARGETS, DISCOVERY_ERRORS, DISCOVERY_LAST_REFRESH,
)  # fmt: skip
BY_NAME = {spec.name: spec for spec in SPECS}
if len(BY_NAME) != len(SPECS):
    raise ValueError("a metric name appears twice in SPECS")


def names(kind: Kind) -> frozenset[str]:
    """The names of every metric of one kind."""
    return frozenset(spec.name for spec in SPECS if spec.kind is kind)
