"""Periodic probes with apscheduler: one interval job per target, first run at start.

At most one probe per target is in flight (`max_instances=1`, coalesced). A probe's
`t_sched` is the job's scheduled fire time (with jitter), taken from apscheduler's submission
event, so scheduler lateness shows as dispatch lag instead of hiding. Warm-up probes run
before a target's first recorded probe and are never recorded. `drain()` stops scheduling and
lets in-flight probes finish within a grace period; the rest are cancelled and counted.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

import aiohttp
from apscheduler.events import EVENT_JOB_SUBMITTED, JobSubmissionEvent
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from prober import timings
from prober.logs import get_logger
from prober.metrics import Metrics
from prober.result import Outcome, RequestResult
from prober.targets import Target

log = get_logger("prober.schedule")

ResultHook = Callable[[Target, RequestResult], None]


def cancelled_result(t_sched_ns: int) -> RequestResult:
    now = time.perf_counter_ns()
    return RequestResult(Outcome.CANCELLED, t_sched_ns, now, now, error="cancelled at shutdown")


class ProbeScheduler:
    """Owns the apscheduler instance and the probes it starts."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        targets: Iterable[Target],
        metrics: Metrics,
        on_result: ResultHook | None = None,
    ) -> None:
        self._session = session
        self._targets = {t.name: t for t in targets}
        self._metrics = metrics
        self._on_result = on_result
        self._scheduler = AsyncIOScheduler(timezone=UTC)
        self._scheduler.add_listener(self._submitted, EVENT_JOB_SUBMITTED)
        self._fire_ns: dict[str, int] = {}
        self._warmed: set[str] = set()
        self._in_flight: set[asyncio.Task[Any]] = set()
        self.probed: set[str] = set()

    @property
    def ready(self) -> bool:
        """True once every target has finished its first recorded probe."""
        return self.probed >= self._targets.keys()

    def start(self) -> None:
        now = datetime.now(UTC)
        for target in self._targets.values():
            cfg = target.config
            self._metrics.describe_target(target.labels, target.slo, cfg.interval_seconds)
            self._scheduler.add_job(
                self._probe,
                "interval",
                args=(target.name,),
                id=target.name,
                seconds=cfg.interval_seconds,
                jitter=cfg.jitter_seconds or None,
                next_run_time=now,
                max_instances=1,
                coalesce=True,
                misfire_grace_time=max(1, int(cfg.interval_seconds)),
            )
        self._scheduler.start()

    async def drain(self, grace_seconds: float) -> None:
        """Stop scheduling; wait up to `grace_seconds` for in-flight probes, cancel the rest."""
        if not self._scheduler.running:
            return
        self._scheduler.pause()
        pending = {t for t in self._in_flight if not t.done()}
        if pending:
            log.info("draining_probes", in_flight=len(pending), grace_seconds=grace_seconds)
            await asyncio.wait(pending, timeout=grace_seconds)
        self._scheduler.shutdown(wait=False)  # cancels what is still running
        await asyncio.sleep(0)

    def _submitted(self, event: JobSubmissionEvent) -> None:
        fire: datetime = event.scheduled_run_times[-1]
        late_ns = int((time.time() - fire.timestamp()) * 1e9)
        self._fire_ns[event.job_id] = time.perf_counter_ns() - max(0, late_ns)

    async def _probe(self, name: str) -> None:
        target = self._targets[name]
        task = asyncio.current_task()
        assert task is not None
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        bound = log.bind(target=name, model=target.config.model)
        t_sched_ns = self._fire_ns.pop(name, time.perf_counter_ns())
        if name not in self._warmed:
            await self._warm_up(target, bound)
            t_sched_ns = time.perf_counter_ns()
        try:
            result = await target.send(self._session, t_sched_ns)
        except asyncio.CancelledError:
            self._record(target, cancelled_result(t_sched_ns))
            raise
        self._record(target, result)
        if result.ok:
            bound.debug("probe_ok", ttft_seconds=timings.ttft(result), tokens=result.output_tokens)
        else:
            bound.warning("probe_failed", outcome=result.outcome.value, error=result.error)

    async def _warm_up(self, target: Target, bound: Any) -> None:
        for i in range(target.config.warmup):
            result = await target.send(self._session, time.perf_counter_ns())
            bound.info("warmup", n=i + 1, outcome=result.outcome.value)
        self._warmed.add(target.name)

    def _record(self, target: Target, result: RequestResult) -> None:
        self._metrics.record(result, target.labels, "probe", target.slo)
        self._metrics.record_probe(result, target.labels, time.time())
        self.probed.add(target.name)
        if self._on_result is not None:
            self._on_result(target, result)
