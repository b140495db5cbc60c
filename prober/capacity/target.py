"""Capacity signals of each target: the queue estimate and the server's own truth.

`TargetCapacity` feeds finished requests to the `QueueEstimator` (returning each queue wait to
the recorder that writes it), scrapes the engine's `/metrics` on its own schedule (a failed
scrape is handed to its `ScrapeRecord` and never stops probing), and `CapacityCollector`
exports both at scrape time, the estimate always and the server truth beside it
(`source="server"`) where the engine reports one.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import aiohttp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from prober import metric_specs as specs
from prober.capacity.own import Estimate, OwnLoad, QueueEstimator
from prober.capacity.probes import ForeignEstimator, ProbesInFlight, Shape
from prober.capacity.server import Engine, ServerMetricsError, ServerSnapshot, scrape
from prober.kinds import Basis, Drain
from prober.logs import get_logger
from prober.metric_specs import gauge_family
from prober.result import RequestResult
from prober.targets import Target

log = get_logger("prober.capacity")
_RATE_WINDOW_SECONDS = 30.0


class ScrapeRecord(Protocol):
    """Where a failed engine scrape is counted (`record.ScrapeRecorder`): recording is a layer
    above capacity, so the capacity names only this."""

    def scrape_failed(self, target: Target) -> None: ...


class TargetCapacity:
    """One target's queue estimate, fed by its probes and load, and its engine's own figures.

    It writes no series: the queue waits go back to the recorder that fed it the result, and
    `scrapes` counts the failures of `watch`, which has no caller to return them to.
    `own_load` is the load driver's live count of its requests, when the target has load: the
    same object goes to the target's `LoadDriver`. `clock` (monotonic seconds) times the
    probes in flight, the estimate's window and the server's completion rate.
    """

    def __init__(
        self,
        target: Target,
        scrapes: ScrapeRecord,
        own_load: OwnLoad | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self._scrapes = scrapes
        self.own_load = own_load
        self._clock = clock
        cfg = target.config
        probe = Shape(cfg.prompt_tokens, cfg.max_tokens)
        given = cfg.traffic.prompt_tokens is not None or cfg.traffic.output_tokens is not None
        traffic = None
        if given:
            traffic = Shape(
                cfg.traffic.prompt_tokens or cfg.prompt_tokens,
                cfg.traffic.output_tokens or cfg.max_tokens,
            )
        self.probes = ProbesInFlight(clock)
        foreign = ForeignEstimator(probe, traffic, cfg.slots, self.probes, clock)
        self.estimator = QueueEstimator(
            clock=clock,
            slots_hint=cfg.slots,
            foreign=foreign,
            own_load=own_load,
            server_drain_rate=self.server_drain_rate,
        )
        self.snapshot: ServerSnapshot | None = None
        self._server_full = 0
        self._completed: deque[tuple[float, float]] = deque()

    def observe(self, result: RequestResult, *, probe: bool = False) -> float | None:
        """A finished load request or probe (a probe's result also feeds the probes-alone
        path); returns its queue wait, None where it had no token."""
        return self.estimator.observe(result, probe=probe)

    def observe_pair(
        self, primary: RequestResult, companion: RequestResult
    ) -> tuple[float | None, float | None]:
        """A probe and its companion (see `QueueEstimator.observe_pair`); both queue waits."""
        return self.estimator.observe_pair(primary, companion)

    def companion_delay(self, fraction: float, draw: float) -> float | None:
        """When to send a companion after a probe's first token (`fraction` of its expected
        decode), or None for no companion: pairs go with every probe until the decode
        slowdown (and, without a hint, the slots) can be read from them, then with the
        target's `pair_share` (`draw` is uniform 0..1)."""
        foreign = self.estimator.foreign
        decode = None if foreign is None else foreign.typical_decode()
        if foreign is None or decode is None:
            return None
        wanted = foreign.learning or draw < self.target.config.pair_share
        return fraction * decode if wanted else None

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
            started = self._clock()
            try:
                snap = await scrape(session, cfg.metrics_url, engine, cfg.timeouts.connect_seconds)
            except ServerMetricsError as exc:
                self.snapshot = None
                self._scrapes.scrape_failed(self.target)
                bound.warning("server_scrape_failed", error=str(exc))
            else:
                self._keep(snap, started)
            await asyncio.sleep(max(0.0, cfg.metrics_interval_seconds - (self._clock() - started)))

    def server_slots(self) -> int | None:
        """Slots as the server shows them: the most requests it ran while others waited."""
        return self._server_full or None

    def _keep(self, snap: ServerSnapshot, at: float) -> None:
        self.snapshot = snap
        if snap.waiting and snap.running:
            self._server_full = max(self._server_full, round(snap.running))
        if snap.completed_total is not None:
            self._completed.append((at, snap.completed_total))
            while self._completed and self._completed[0][0] < at - _RATE_WINDOW_SECONDS:
                self._completed.popleft()


def saturation(waiting: float | None, running: float | None, slots: int | None) -> float | None:
    """Busy slots ÷ slots below the knee, 1 + waiting ÷ slots above it: continuous at 1.

    One formula for both sides, (busy + waiting) ÷ slots, so a request that waits a moment
    for the next engine step below the knee adds its share instead of a jump past 1."""
    if slots is None or slots < 1 or running is None:
        return None
    return (min(running, slots) + (waiting or 0.0)) / slots


class CapacityCollector(Collector):
    """Exports queue depth (estimate and server), the estimate's basis, slots, saturation and
    KV usage at scrape time."""

    def __init__(self, capacities: Iterable[TargetCapacity]) -> None:
        self._capacities = list(capacities)
        self._failed: set[str] = set()

    def _estimate(self, cap: TargetCapacity) -> Estimate:
        """The target's estimate; a fault in it costs that target its figures for this scrape,
        never the whole of /metrics (logged once per target)."""
        try:
            return cap.estimator.estimate()
        except Exception:
            if cap.target.name not in self._failed:
                self._failed.add(cap.target.name)
                log.exception("queue_estimate_failed", target=cap.target.name)
            return Estimate(None, None, None)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = gauge_family(specs.QUEUE_DEPTH)
        basis = gauge_family(specs.QUEUE_ESTIMATE_BASIS)
        drain = gauge_family(specs.QUEUE_DRAIN_RATE)
        drain_basis = gauge_family(specs.QUEUE_DRAIN_BASIS)
        slots = gauge_family(specs.ENGINE_SLOTS)
        sat = gauge_family(specs.SATURATION)
        kv = gauge_family(specs.SERVER_KV_CACHE_USAGE)
        for cap in self._capacities:
            key = [cap.target.labels.target, cap.target.labels.model]
            est = self._estimate(cap)
            for state, value in (("waiting", est.waiting), ("running", est.running)):
                if value is not None:
                    depth.add_metric([*key, "estimate", state], value)
            for b in Basis:
                basis.add_metric([*key, b.value], 1.0 if b is est.basis else 0.0)
            if est.drain is not None:
                drain.add_metric(key, est.drain)
            for d in Drain:
                drain_basis.add_metric([*key, d.value], 1.0 if d is est.drain_basis else 0.0)
            if est.slots is not None:
                hinted = cap.target.config.slots is not None
                slots.add_metric([*key, "hint" if hinted else "learned"], est.slots)
            if (value := saturation(est.waiting, est.running, est.slots)) is not None:
                sat.add_metric([*key, "estimate"], value)
            snap = cap.snapshot
            if snap is None:
                continue
            for state, value in (("waiting", snap.waiting), ("running", snap.running)):
                if value is not None:
                    depth.add_metric([*key, "server", state], value)
            # The hint first: the estimate's slots exist only once it has a basis of its own.
            server_slots = cap.target.config.slots or est.slots or cap.server_slots()
            if (value := saturation(snap.waiting, snap.running, server_slots)) is not None:
                sat.add_metric([*key, "server"], value)
            if snap.kv_usage_ratio is not None:
                kv.add_metric(key, snap.kv_usage_ratio)
        yield from (depth, basis, drain, drain_basis, slots, sat, kv)
