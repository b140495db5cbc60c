"""Capacity signals of each target: the queue estimate and the server's own truth.

`TargetCapacity` feeds finished requests to the `QueueEstimator`, scrapes the engine's
`/metrics` on its own schedule (a failed scrape is counted and never stops probing), and
`CapacityCollector` exports both at scrape time, the estimate always and the server truth
beside it (`source="server"`) where the engine reports one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterable, Iterator

import aiohttp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from prober.estimate import QueueEstimator
from prober.logs import get_logger
from prober.metrics import Metrics
from prober.result import RequestResult
from prober.servers import Engine, ServerMetricsError, ServerSnapshot, scrape
from prober.targets import Target

log = get_logger("prober.capacity")
_RATE_WINDOW_SECONDS = 30.0


class TargetCapacity:
    def __init__(self, target: Target, metrics: Metrics) -> None:
        self.target = target
        self._metrics = metrics
        self.estimator = QueueEstimator()
        self.estimator.server_drain_rate = self.server_drain_rate
        self.snapshot: ServerSnapshot | None = None
        self._completed: deque[tuple[float, float]] = deque()

    def observe(self, result: RequestResult) -> None:
        wait = self.estimator.observe(result)
        if wait is not None:
            labels = self.target.labels
            self._metrics.queue_wait.labels(labels.target, labels.model).observe(wait)

    def server_drain_rate(self) -> float | None:
        """Requests/s the server completed over the last half minute, from its counter."""
        if len(self._completed) < 2:
            return None
        (t0, c0), (t1, c1) = self._completed[0], self._completed[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 and c1 >= c0 else None

    async def watch(self, session: aiohttp.ClientSession) -> None:
        """Scrape the engine's /metrics every `metrics_interval_seconds` until cancelled."""
        cfg = self.target.config
        if cfg.metrics_url is None:
            return
        engine = Engine(cfg.engine) if cfg.engine else None
        bound = log.bind(target=cfg.name)
        while True:
            started = time.monotonic()
            try:
                snap = await scrape(session, cfg.metrics_url, engine, cfg.timeouts.connect_seconds)
            except ServerMetricsError as exc:
                self.snapshot = None
                labels = self.target.labels
                self._metrics.server_scrape_errors.labels(labels.target, labels.model).inc()
                bound.warning("server_scrape_failed", error=str(exc))
            else:
                self._keep(snap, started)
            await asyncio.sleep(
                max(0.0, cfg.metrics_interval_seconds - (time.monotonic() - started))
            )

    def _keep(self, snap: ServerSnapshot, at: float) -> None:
        self.snapshot = snap
        if snap.completed_total is not None:
            self._completed.append((at, snap.completed_total))
            while self._completed and self._completed[0][0] < at - _RATE_WINDOW_SECONDS:
                self._completed.popleft()


class CapacityCollector(Collector):
    """Exports queue depth (estimate and server) and KV usage at scrape time."""

    def __init__(self, capacities: Iterable[TargetCapacity]) -> None:
        self._capacities = list(capacities)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "llmprober_queue_depth",
            "Requests waiting for / holding an engine slot, estimated by the client or reported "
            "by the server.",
            labels=("target", "model", "source", "state"),
        )
        kv = GaugeMetricFamily(
            "llmprober_server_kv_cache_usage_ratio",
            "KV-cache usage reported by the server (0..1).",
            labels=("target", "model"),
        )
        for cap in self._capacities:
            labels = cap.target.labels
            est = cap.estimator.estimate()
            for state, value in (("waiting", est.waiting), ("running", est.running)):
                if value is not None:
                    depth.add_metric([labels.target, labels.model, "estimate", state], value)
            snap = cap.snapshot
            if snap is None:
                continue
            for state, value in (("waiting", snap.waiting), ("running", snap.running)):
                if value is not None:
                    depth.add_metric([labels.target, labels.model, "server", state], value)
            if snap.kv_usage_ratio is not None:
                kv.add_metric([labels.target, labels.model], snap.kv_usage_ratio)
        yield depth
        yield kv
