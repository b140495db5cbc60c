"""Capacity signals of each target: the queue estimate and the server's own truth.

`TargetCapacity` feeds finished requests to the `QueueEstimator` (returning each queue wait to
the recorder that writes it), scrapes the engine's `/metrics` on its own schedule (a failed
scrape is handed to its `ScrapeRecord` and never stops probing), and `CapacityCollector`
exports both at scrape time, the estimate always and the server truth beside it
(`source="server"`) where the engine reports one.

Each target's engine state (`state.EngineWatch`: ok, busy, stalled, down) is fed here too: the
finished requests with their queue waits, and the engine's progress counter at each scrape;
it is judged at scrape time, with the saturation this module computes.

It also says what shape the engine's other requests have (`TargetCapacity.traffic`), which the
probes-alone estimate needs for a waiting depth: the operator's `traffic:`, else the mean the
engine's request and token counters give, else nobody's, and then the depth is withheld and
one line at start says what to set.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple, Protocol

import aiohttp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from prober import metric_specs as specs
from prober.capacity.inflight import ProbesInFlight
from prober.capacity.own import Estimate, OwnLoad, QueueEstimator
from prober.capacity.probes import ProbesAloneEstimator, Shape, Traffic
from prober.capacity.server import Engine, ServerMetricsError, ServerSnapshot, TokenTotals, scrape
from prober.capacity.state import EngineState, EngineWatch, StateVerdict
from prober.kinds import Basis, Drain
from prober.logs import get_logger
from prober.metric_specs import gauge_family
from prober.result import RequestResult
from prober.settings import TrafficConfig
from prober.targets import Target

log = get_logger("prober.capacity")
_RATE_WINDOW_SECONDS = 30.0
# The traffic's shape from the engine's counters: the mean prompt and answer of the requests
# that finished in the last minute, the prober's own taken out, once at least 16 of them are
# other clients'. The mean of 16 lengths whose spread equals their mean (an exponential's)
# has a standard error of a quarter of it (1/√16), the bound the estimate is held to.
# Between readings the last one holds: a quiet minute says nothing new about the shape.
_SHAPE_WINDOW_SECONDS = 60.0
_MIN_SHAPE_REQUESTS = 16
_MAX_MEAN_TOKENS = 1_000_000.0  # as `traffic:` allows: beyond it a counter is not a count
_OWN_KEPT = 4096  # own finished requests remembered for the shape: a minute at 68/s
_NOTE_SECONDS = 60.0  # `decode_slowdown_*` lines: at most one a minute per target
# What to set where the waiting depth is withheld: the log line's `fix`, and the status page's.
WITHHELD_FIX = (
    "set traffic: {prompt_tokens: N, output_tokens: N} (the mean lengths of the engine's "
    "other requests), traffic: probes (they look like the probes), or metrics_url of an "
    "engine that reports its queue"
)


@dataclass(frozen=True, slots=True)
class ScrapeState:
    """The last scrape of the engine's /metrics: when it ended (Unix time, shown, never a
    latency) and why it failed ("" when it did not)."""

    at: float
    error: str = ""


class ScrapeRecord(Protocol):
    """Where a failed engine scrape is counted (`record.ScrapeRecorder`): recording is a layer
    above capacity, so the capacity names only this."""

    def scrape_failed(self, target: Target) -> None: ...

    def samples_rejected(self, target: Target, quantities: tuple[str, ...]) -> None: ...


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
        self._stated = stated_traffic(cfg.traffic, probe)
        self.probes = ProbesInFlight(clock)
        alone = ProbesAloneEstimator(probe, self.traffic, cfg.slots, self.probes, clock)
        self.estimator = QueueEstimator(
            clock=clock,
            slots_hint=cfg.slots,
            probes_alone=alone,
            own_load=own_load,
            server_drain_rate=self.server_drain_rate,
        )
        self.snapshot: ServerSnapshot | None = None
        self.last_scrape: ScrapeState | None = None
        self._server_full = 0
        self._completed: deque[tuple[float, float]] = deque()
        self._totals: deque[tuple[float, TokenTotals]] = deque()  # (at, the engine's totals)
        # (at, prompt, output tokens) of the prober's own finished requests: the engine
        # counts them too
        self._own: deque[tuple[float, int, int]] = deque(maxlen=_OWN_KEPT)
        self._engine_shape: Shape | None = None
        self._shape_noted = False
        self.state = EngineWatch(target.activity)
        self._estimate_failed = False
        self._readable: tuple[bool | None, float] = (None, -math.inf)  # (said, when)

    def observe(self, result: RequestResult, *, probe: bool = False) -> float | None:
        """A finished load request or probe (a probe's result also feeds the probes-alone
        path); returns its queue wait, None where it had no token."""
        self._count_own(result)
        wait = self.estimator.observe(result, probe=probe)
        self.state.finished(result, wait)
        return wait

    def observe_pair(
        self, primary: RequestResult, companion: RequestResult
    ) -> tuple[float | None, float | None]:
        """A probe and its companion (see `QueueEstimator.observe_pair`); both queue waits."""
        self._count_own(primary)
        self._count_own(companion)
        waits = self.estimator.observe_pair(primary, companion)
        self.state.finished(primary, waits[0])
        self.state.finished(companion, waits[1])
        self._note_slowdown()
        return waits

    def _note_slowdown(self) -> None:
        """One line when the pairs first say whether the batch can be read from the probes'
        gaps (why a running figure below saturation is made, or not), and again where that
        changes, at most once a minute (`_NOTE_SECONDS`), with what they read."""
        alone = self.estimator.probes_alone
        readable = None if alone is None else alone.decode.readable()
        said, when = self._readable
        now = self._clock()
        if alone is None or readable is None or readable == said or now - when < _NOTE_SECONDS:
            return
        self._readable = (readable, now)
        event = "decode_slowdown_readable" if readable else "decode_slowdown_unreadable"
        log.info(event, target=self.target.name, **alone.decode.reading())

    def traffic(self) -> Traffic:
        """The shape of the engine's other requests: the operator's word first (a statement
        made on purpose), then the engine's counters, else nobody's (`Drain.PROBE_SHAPE`)."""
        if self._stated is not None:
            return self._stated
        if self._engine_shape is not None:
            return Traffic(self._engine_shape, Drain.ENGINE_SHAPE)
        return Traffic(None, Drain.PROBE_SHAPE)

    def _count_own(self, result: RequestResult) -> None:
        """Remember a finished request of the prober's whose tokens the engine reported
        (usage): the engine's counters include it. One that failed without usage is not
        known to the prober and stays in the engine's figures (bias: `docs/design.md`)."""
        if result.prompt_tokens is not None and result.ok:
            self._own.append((self._clock(), result.prompt_tokens, result.output_tokens))

    def companion_delay(self, fraction: float, draw: float) -> float | None:
        """When to send a companion after a probe's first token (`fraction` of its expected
        decode), or None for no companion: pairs go with every probe until the decode
        slowdown (and, without a hint, the slots) can be read from them, then with the
        target's `pair_share` (`draw` is uniform 0..1)."""
        alone = self.estimator.probes_alone
        decode = None if alone is None else alone.typical_decode()
        if alone is None or decode is None:
            return None
        wanted = alone.learning or draw < self.target.config.pair_share
        return fraction * decode if wanted else None

    def server_drain_rate(self) -> float | None:
        """Requests/s the server completed over the last half minute, from its counter."""
        if len(self._completed) < 2:
            return None
        (t0, c0), (t1, c1) = self._completed[0], self._completed[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 and c1 >= c0 else None

    async def watch(self, session: aiohttp.ClientSession) -> None:
        """Scrape the engine's /metrics every `metrics_interval_seconds` until cancelled.

        First, where the probes-alone estimate would have no traffic shape, one line says the
        waiting depth is withheld and what to set: at once without `metrics_url`, else at the
        first scrape that shows the engine gives no request and token counters."""
        cfg = self.target.config
        bound = log.bind(target=cfg.name)
        # What an earlier watch read belongs to the engine it watched (a reload may change
        # `metrics_url`): the server's figures start again from this one.
        self.snapshot = None
        self.last_scrape = None
        self._completed.clear()
        self._totals.clear()
        if self._stated is None and self.own_load is None and cfg.metrics_url is None:
            bound.warning("queue_depth_withheld", why="no traffic: given", fix=WITHHELD_FIX)
        if cfg.metrics_url is None:
            return
        engine = Engine(cfg.engine) if cfg.engine else None
        while True:
            started = self._clock()
            try:
                snap = await scrape(session, cfg.metrics_url, engine, cfg.timeouts.connect_seconds)
            except ServerMetricsError as exc:
                self.snapshot = None
                self.state.counter(None)
                self._scrapes.scrape_failed(self.target)
                self.last_scrape = ScrapeState(time.time(), str(exc))
                bound.warning("server_scrape_failed", error=str(exc))
            else:
                self.last_scrape = ScrapeState(time.time())
                self._keep(snap, started)
            await asyncio.sleep(max(0.0, cfg.metrics_interval_seconds - (self._clock() - started)))

    def server_slots(self) -> int | None:
        """Slots as the server shows them: the most requests it ran while others waited."""
        return self._server_full or None

    def estimate(self) -> Estimate:
        """The estimate now; a fault in it costs this target its figures for this scrape,
        never the whole of /metrics (logged once)."""
        try:
            return self.estimator.estimate()
        except Exception:
            if not self._estimate_failed:
                self._estimate_failed = True
                log.exception("queue_estimate_failed", target=self.target.name)
            return Estimate(None, None, None)

    def engine_state(self, est: Estimate | None = None) -> StateVerdict:
        """The engine's state now (`state.EngineWatch.judge`), with the saturation of the
        engine's figures where scraped, else of the estimate `est` (made here when None)."""
        if est is None:
            est = self.estimate()
        cfg = self.target.config
        sat = self.server_saturation(est)
        if sat is None:
            sat = _estimated_saturation(est)
        return self.state.judge(cfg.stall_window_seconds, self.target.slo.ttft_seconds, sat)

    def server_saturation(self, est: Estimate) -> float | None:
        """(running + waiting) / slots from the engine's own figures, where it reports them.
        The slots: the hint first, since the estimate's exist only once it has a basis."""
        snap = self.snapshot
        if snap is None:
            return None
        slots = self.target.config.slots or est.slots or self.server_slots()
        return saturation(snap.waiting, snap.running, slots)

    def _keep(self, snap: ServerSnapshot, at: float) -> None:
        self.snapshot = snap
        self.state.counter(snap.progress_total)
        if snap.rejected:
            self._scrapes.samples_rejected(self.target, snap.rejected)
        if snap.waiting and snap.running:
            self._server_full = max(self._server_full, round(snap.running))
        if snap.completed_total is not None:
            self._completed.append((at, snap.completed_total))
            while self._completed and self._completed[0][0] < at - _RATE_WINDOW_SECONDS:
                self._completed.popleft()
        if snap.lengths is not None:
            self._keep_totals(snap.lengths, at)
        elif not self._shape_noted and self._stated is None and self.own_load is None:
            self._shape_noted = True
            log.warning(
                "queue_depth_withheld",
                target=self.target.name,
                why=f"no traffic: given, and {snap.engine}'s /metrics counts no requests' tokens"
                " (its own waiting count is exported as source=server)",
                fix=WITHHELD_FIX,
            )

    def _keep_totals(self, totals: TokenTotals, at: float) -> None:
        """The engine's token totals at `at`; the shape of the last minute's requests from
        them. A total that fell is a restarted engine (or a data-parallel rank gone): the
        counts start again from it, as Prometheus' `rate` does."""
        kept = self._totals
        if kept and _fell(kept[-1][1], totals):
            kept.clear()
        kept.append((at, totals))
        while len(kept) > 2 and kept[1][0] <= at - _SHAPE_WINDOW_SECONDS:
            kept.popleft()
        if (shape := self._shape_since(*kept[0], at, totals)) is not None:
            self._engine_shape = shape

    def _shape_since(
        self, since: float, then: TokenTotals, now: float, totals: TokenTotals
    ) -> Shape | None:
        """The mean prompt and output tokens of the other clients' requests that finished
        between two readings: the engine's, less the prober's own finished in between (both
        timed by this clock: one at a window's edge may fall on either side). None with too
        few, or a mean no request can have."""
        own = [(p, o) for t, p, o in self._own if since < t <= now]
        requests = totals.requests - then.requests - len(own)
        if requests < _MIN_SHAPE_REQUESTS:
            return None
        prompt = totals.prompt_tokens - then.prompt_tokens - sum(p for p, _ in own)
        output = totals.output_tokens - then.output_tokens - sum(o for _, o in own)
        shape = Shape(prompt / requests, output / requests)
        means = (shape.prompt_tokens, shape.output_tokens)
        return shape if all(1.0 <= m <= _MAX_MEAN_TOKENS for m in means) else None


def stated_traffic(given: TrafficConfig | Literal["probes"] | None, probe: Shape) -> Traffic | None:
    """The shape the operator gave in `traffic:`, None where they gave none."""
    if given is None:
        return None
    if given == "probes":
        return Traffic(probe, Drain.TRAFFIC_PROBES)
    return Traffic(Shape(given.prompt_tokens, given.output_tokens), Drain.TRAFFIC)


def _fell(before: TokenTotals, after: TokenTotals) -> bool:
    """Whether any of the totals is lower `after` than `before` (counters only grow)."""
    return (
        after.requests < before.requests
        or after.prompt_tokens < before.prompt_tokens
        or after.output_tokens < before.output_tokens
    )


def saturation(waiting: float | None, running: float | None, slots: int | None) -> float | None:
    """Busy slots ÷ slots below the knee, 1 + waiting ÷ slots above it: continuous at 1.

    One formula for both sides, (busy + waiting) ÷ slots, so a request that waits a moment
    for the next engine step below the knee adds its share instead of a jump past 1."""
    if slots is None or slots < 1 or running is None:
        return None
    return (min(running, slots) + (waiting or 0.0)) / slots


def _estimated_saturation(est: Estimate) -> float | None:
    """Saturation of the estimate: below the knee it needs no waiting depth (none waits), so
    it is made where the depth is withheld while no queue exists; above it, not."""
    if est.waiting is None and est.queue is not False:
        return None
    return saturation(est.waiting, est.running, est.slots)


class Reading(NamedTuple):
    """One target's figures at a scrape, read on the loop (`CapacityCollector.read_on_loop`)."""

    key: list[str]  # target, model
    est: Estimate
    state: EngineState
    hinted: bool  # the slots come from the `slots` hint
    saturation: float | None  # of the estimate
    snapshot: ServerSnapshot | None  # the engine's own figures, where scraped
    server_saturation: float | None


class CapacityCollector(Collector):
    """Exports queue depth (estimate and server), the estimate's basis, slots, saturation and
    KV usage at scrape time.

    Two steps: `read_on_loop` takes each target's figures from the loop's state, and
    `families_from` makes the gauge families from them (pure: `exposition.py` runs it in its
    worker thread; ~15 samples a target, most of the collector's time)."""

    def __init__(self, capacities: Collection[TargetCapacity]) -> None:
        # Kept as given, read at each scrape: the daemon's is a live view of its fleet.
        self._capacities = capacities

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self.families_from(self.read_on_loop())

    def read_on_loop(self) -> list[Reading]:
        readings = []
        for cap in self._capacities:
            est = cap.estimate()
            snap = cap.snapshot
            readings.append(Reading(
                [cap.target.labels.target, cap.target.labels.model], est,
                cap.engine_state(est).state, cap.target.config.slots is not None,
                _estimated_saturation(est), snap,
                None if snap is None else cap.server_saturation(est),
            ))  # fmt: skip
        return readings

    @staticmethod
    def families_from(readings: Iterable[Reading]) -> list[GaugeMetricFamily]:
        depth = gauge_family(specs.QUEUE_DEPTH)
        basis = gauge_family(specs.QUEUE_ESTIMATE_BASIS)
        drain = gauge_family(specs.QUEUE_DRAIN_RATE)
        drain_basis = gauge_family(specs.QUEUE_DRAIN_BASIS)
        slots = gauge_family(specs.ENGINE_SLOTS)
        sat = gauge_family(specs.SATURATION)
        kv = gauge_family(specs.SERVER_KV_CACHE_USAGE)
        engine = gauge_family(specs.ENGINE_STATE)
        for key, est, now, hinted, saturation_, snap, server_saturation in readings:
            for s in EngineState:
                engine.add_metric([*key, s.value], 1.0 if s is now else 0.0)
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
                slots.add_metric([*key, "hint" if hinted else "learned"], est.slots)
            if saturation_ is not None:
                sat.add_metric([*key, "estimate"], saturation_)
            if snap is None:
                continue
            for state, value in (("waiting", snap.waiting), ("running", snap.running)):
                if value is not None:
                    depth.add_metric([*key, "server", state], value)
            if server_saturation is not None:
                sat.add_metric([*key, "server"], server_saturation)
            if snap.kv_usage_ratio is not None:
                kv.add_metric(key, snap.kv_usage_ratio)
        return [depth, basis, drain, drain_basis, slots, sat, kv, engine]
