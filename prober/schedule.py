"""Periodic probes with apscheduler: one interval job per target, first run at start, the
next ones on a grid of the interval at the target's own phase (`cadence`).

At most `probes_in_flight` probes per target are in flight (coalesced); a run due beyond that,
or missed by more than the grace time, is counted in `llmprober_probe_skipped_total` (and
logged once per target), so a slow endpoint never silently thins its probes. A probe's
`t_sched` is the job's scheduled fire time (with jitter), taken from apscheduler's submission
event, so scheduler lateness shows as dispatch lag instead of hiding. Warm-up probes run
before a target's first recorded probe and are never recorded.

A share `pair_share` of probes are pairs: a companion probe is sent 40 % of a decode
into the first, so the first probe's token gaps before and after tell the queue estimate how
much one more sequence slows decoding (`capacity/decode.py`). Both are recorded as probes.
Every probe in flight is tracked by the target's `TargetCapacity.probes`, so the estimate counts the
prober's own requests exactly. `drain()` stops scheduling and lets in-flight probes finish
within a grace period; the rest are cancelled, counted as `cancelled`, and end quietly (a
job cancelled at shutdown is no error). Every probe, a pair's two and a cancelled one, goes
through the `Recorder` (metrics, the target's capacity, one log line).

A target with `cache_probe:` has a second job, `NAME#cache` (no target name holds '#'): every
`cache_probe.interval_seconds` one prompt of a prefix drawn fresh for the run is sent twice,
a miss that warms the engine's prefix cache and then a hit; both go to
`Recorder.record_cache_probe`, never to the queue estimate (a cached prefill is no prefill).

Given a live mapping of targets (the daemon's fleet), the set changes while it runs: `add` a
target (its warm-up first), `reschedule` one whose interval, jitter or cap changed, `remove`
one (its probes in flight get the grace, as at shutdown, then are cancelled and counted).
A probe looks its target and session up by name when it starts, so a reload that replaced
them is followed by the next run.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

import aiohttp
from apscheduler.events import (
    EVENT_JOB_MAX_INSTANCES,
    EVENT_JOB_MISSED,
    EVENT_JOB_SUBMITTED,
    JobEvent,
    JobSubmissionEvent,
)
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from prober.cadence import phased
from prober.logs import get_logger
from prober.prompts import PromptBuilder, SharedPrefix
from prober.record import Mode, Recorder, cancelled
from prober.result import RequestResult
from prober.targets import Target

log = get_logger("prober.schedule")

_COMPANION_AT = 0.4  # of the first probe's expected decode: gaps on both sides of the join
CACHE_JOB = "#cache"  # a target's cache-probe job is its name and this
# Words in the cache probe's one block: the most a prompt of its prefix can hold (a prompt
# never has more than four words per requested token, `prompts.MIN_TOKENS_PER_WORD`).
_CACHE_BLOCK_WORDS_PER_TOKEN = 4


class _SkipNotices(logging.Filter):
    """apscheduler warns on every skipped or missed run; the counter and one log line per
    target say it instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return "maximum number of running instances" not in text and "was missed by" not in text


def _scheduler_logger() -> logging.Logger:
    logger = logging.getLogger("apscheduler.scheduler.probes")
    if not any(isinstance(f, _SkipNotices) for f in logger.filters):
        logger.addFilter(_SkipNotices())
    return logger


class ProbeScheduler:
    """Owns the apscheduler instance and the probes it starts; `recorder` records them, and
    its capacity (where a target has one) decides pairs and counts the probes in flight.
    Each target's probes go through its own session of `sessions` (by target name)."""

    def __init__(
        self,
        sessions: Mapping[str, aiohttp.ClientSession],
        targets: Mapping[str, Target] | Iterable[Target],
        recorder: Recorder,
        *,
        seed: int | None = None,
    ) -> None:
        self._sessions = sessions
        # A mapping is kept as given (the fleet's, live); a list is the fixed set of a test.
        self._targets = targets if isinstance(targets, Mapping) else {t.name: t for t in targets}
        self._recorder = recorder
        self._capacity = recorder.capacity
        self._rng = random.Random(seed)
        self._scheduler = AsyncIOScheduler(timezone=UTC, logger=_scheduler_logger())
        self._scheduler.add_listener(self._submitted, EVENT_JOB_SUBMITTED)
        self._scheduler.add_listener(self._skipped, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
        self._fire_ns: dict[str, int] = {}
        self._warmed: set[str] = set()
        self._skip_noted: set[str] = set()
        self._in_flight: set[asyncio.Task[Any]] = set()
        self._by_target: dict[str, set[asyncio.Task[Any]]] = {}
        self._stopping: set[asyncio.Task[Any]] = set()  # cancelled by `remove`: end quietly
        self._draining = False
        self.probed: set[str] = set()
        self._cache_prompts: dict[str, PromptBuilder] = {}  # calibrated on the cache probe

    @property
    def ready(self) -> bool:
        """True once every target has finished its first recorded probe."""
        return self.probed >= self._targets.keys()

    def start(self) -> None:
        for target in self._targets.values():
            self.add(target)
        self._scheduler.start()

    def add(self, target: Target) -> None:
        """Probe `target` from now: described, warmed up, then every interval."""
        cfg = target.config
        self._recorder.describe(target)
        now = datetime.now(UTC)
        self._scheduler.add_job(
            self._job,
            phased(target.name, cfg.interval_seconds, cfg.jitter_seconds, now),
            args=(target.name,),
            id=target.name,
            next_run_time=now,
            max_instances=cfg.probes_in_flight,
            coalesce=True,
            misfire_grace_time=max(1, int(cfg.interval_seconds)),
            replace_existing=True,
        )
        self._add_cache_job(target)

    def _add_cache_job(self, target: Target) -> None:
        """The cache probe's job, as `target.config.cache_probe` says (none: none)."""
        job = target.name + CACHE_JOB
        if self._scheduler.get_job(job) is not None:
            self._scheduler.remove_job(job)
        cache = target.config.cache_probe
        if cache is None:
            return
        self._scheduler.add_job(
            self._cache_job,
            phased(job, cache.interval_seconds, None, datetime.now(UTC)),
            args=(target.name,),
            id=job,
            max_instances=1,
            coalesce=True,
            misfire_grace_time=max(1, int(cache.interval_seconds)),
        )

    def reschedule(self, target: Target) -> None:
        """`target`'s interval, jitter and cap as its config now says; the next run on its
        grid at least one interval from now (`cadence`), its probes in flight untouched."""
        cfg = target.config
        self._recorder.describe(target)
        self._scheduler.modify_job(
            target.name,
            max_instances=cfg.probes_in_flight,
            misfire_grace_time=max(1, int(cfg.interval_seconds)),
        )
        self._scheduler.reschedule_job(
            target.name,
            trigger=phased(
                target.name, cfg.interval_seconds, cfg.jitter_seconds, datetime.now(UTC)
            ),
        )
        self._add_cache_job(target)

    def remove(self, name: str) -> set[asyncio.Task[Any]]:
        """Stop probing `name`: no new run from now, and added again it warms up again.
        Returns its probes in flight, for `finish`."""
        for job in (name, name + CACHE_JOB):
            if self._scheduler.get_job(job) is not None:
                self._scheduler.remove_job(job)
        self._cache_prompts.pop(name, None)
        for noted in (self._warmed, self.probed, self._skip_noted):
            noted.discard(name)
        self._fire_ns.pop(name, None)
        return {t for t in self._by_target.pop(name, set()) if not t.done()}

    async def finish(self, tasks: set[asyncio.Task[Any]], grace_seconds: float) -> None:
        """Give a removed target's probes `grace_seconds`, then cancel them (each is recorded
        `cancelled` and its job ends quietly, as at shutdown)."""
        if tasks:
            _, tasks = await asyncio.wait(tasks, timeout=grace_seconds)
        self._stopping |= tasks
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        self._stopping -= tasks

    async def drain(self, grace_seconds: float) -> None:
        """Stop scheduling; wait up to `grace_seconds` for in-flight probes, cancel the rest."""
        if not self._scheduler.running:
            return
        self._scheduler.pause()
        pending = {t for t in self._in_flight if not t.done()}
        if pending:
            log.info("draining_probes", in_flight=len(pending), grace_seconds=grace_seconds)
            _, pending = await asyncio.wait(pending, timeout=grace_seconds)
        # Cancel what is left ourselves, so each probe records `cancelled` and its job ends
        # without an exception (apscheduler logs one as an ERROR with a traceback).
        self._draining = True
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=1.0)
        self._scheduler.shutdown(wait=False)  # cancels anything that did not end
        await asyncio.sleep(0)

    def _submitted(self, event: JobSubmissionEvent) -> None:
        fire: datetime = event.scheduled_run_times[-1]
        late_ns = int((time.time() - fire.timestamp()) * 1e9)
        self._fire_ns[event.job_id] = time.perf_counter_ns() - max(0, late_ns)

    def _skipped(self, event: JobEvent) -> None:
        target = self._targets.get(event.job_id)
        if target is None:
            return
        self._recorder.skipped(target)
        if target.name not in self._skip_noted:
            self._skip_noted.add(target.name)
            why = "in_flight" if event.code == EVENT_JOB_MAX_INSTANCES else "missed"
            log.warning(
                "probe_skipped",
                target=target.name,
                reason=why,
                probes_in_flight=target.config.probes_in_flight,
                note="counted in llmprober_probe_skipped_total; logged once per target",
            )

    async def _job(self, name: str) -> None:
        """The scheduled job: one probe run; cancelled by our own drain, it ends quietly."""
        try:
            await self._probe(name)
        except asyncio.CancelledError:
            if self._draining or asyncio.current_task() in self._stopping:
                return  # our shutdown or removal: no error (apscheduler would log a traceback)
            raise

    def _track(self, name: str) -> None:
        """The running task is one of `name`'s: drained with it, and at shutdown."""
        task = asyncio.current_task()
        assert task is not None
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        mine = self._by_target.setdefault(name, set())
        mine.add(task)
        task.add_done_callback(mine.discard)

    async def _cache_job(self, name: str) -> None:
        """The cache probe's job: a miss, then a hit on the same prefix."""
        try:
            await self._cache_probe(name)
        except asyncio.CancelledError:
            if self._draining or asyncio.current_task() in self._stopping:
                return
            raise

    async def _cache_probe(self, name: str) -> None:
        target = self._targets.get(name)
        cache = None if target is None else target.config.cache_probe
        if target is None or cache is None:
            return
        self._track(name)
        t_sched_ns = self._fire_ns.pop(name + CACHE_JOB, time.perf_counter_ns())
        builder = self._cache_prompts.setdefault(name, PromptBuilder())
        # A prefix of its own each run, so the first request finds nothing cached.
        words = _CACHE_BLOCK_WORDS_PER_TOKEN * cache.prefix_tokens
        prefix = SharedPrefix((self._rng.getrandbits(63),), words)
        session = self._sessions[name]

        async def send(t_ns: int, prompts: PromptBuilder) -> RequestResult:
            return await target.send(
                session, t_ns, prompt_tokens=cache.prefix_tokens, max_tokens=1,
                prompts=prompts, prefix=prefix, probe=False,
            )  # fmt: skip

        # The hit is built by the calibration as it was for the miss, so its text is the
        # miss's to the word: an engine with sliding-window attention (llama-server on Gemma 3)
        # reuses a slot's cache only for a prompt that differs at its very end.
        as_before = copy.copy(builder)
        miss = await send(t_sched_ns, builder)
        hit = await send(time.perf_counter_ns(), as_before) if miss.ok else None
        self._recorder.record_cache_probe(target, miss, hit)

    async def _probe(self, name: str) -> None:
        target = self._targets.get(name)
        if target is None:
            return  # a run submitted just before its target was removed
        self._track(name)
        t_sched_ns = self._fire_ns.pop(name, time.perf_counter_ns())
        if name not in self._warmed:
            await self._warm_up(target)
            t_sched_ns = time.perf_counter_ns()
        cap = self._capacity.get(name)
        delay = None if cap is None else cap.companion_delay(_COMPANION_AT, self._rng.random())
        try:
            if delay is not None:
                results = await self._pair(target, t_sched_ns, delay)
            else:
                results = (await self._send(target, t_sched_ns),)
        except asyncio.CancelledError:
            self._recorder.record(target, cancelled(t_sched_ns, Mode.PROBE), Mode.PROBE)
            self.probed.add(name)
            raise
        if len(results) == 2:
            self._recorder.record_pair(target, results[0], results[1])
        else:
            self._recorder.record(target, results[0], Mode.PROBE)
        self.probed.add(name)

    async def _send(
        self, target: Target, t_sched_ns: int, on_first_token: Callable[[], None] | None = None
    ) -> RequestResult:
        """One probe, tracked as in flight for the queue estimate while it runs."""
        cap = self._capacity.get(target.name)
        if cap is None:
            return await target.send(
                self._sessions[target.name], t_sched_ns, on_first_token=on_first_token
            )
        probes = cap.probes
        key = probes.begin()

        def first_token() -> None:
            probes.first_token(key)
            if on_first_token is not None:
                on_first_token()

        try:
            return await target.send(
                self._sessions[target.name], t_sched_ns, on_first_token=first_token
            )
        finally:
            probes.end(key)

    async def _pair(
        self, target: Target, t_sched_ns: int, delay: float
    ) -> tuple[RequestResult, ...]:
        """A probe, and a companion sent `delay` seconds after its first token."""
        first = asyncio.Event()
        primary = asyncio.create_task(self._send(target, t_sched_ns, first.set))

        async def companion() -> RequestResult | None:
            await first.wait()
            await asyncio.sleep(delay)
            if primary.done():
                return None  # it ended before the companion could join it
            return await self._send(target, time.perf_counter_ns())

        second = asyncio.create_task(companion())
        try:
            result = await primary
            if not first.is_set():
                second.cancel()
            other = await asyncio.gather(second, return_exceptions=True)
        finally:
            for task in (primary, second):
                task.cancel()
        companion_result = other[0]
        if isinstance(companion_result, RequestResult):
            return result, companion_result
        return (result,)

    async def _warm_up(self, target: Target) -> None:
        bound = log.bind(target=target.name, model=target.config.model)
        for i in range(target.config.warmup):
            result = await target.send(self._sessions[target.name], time.perf_counter_ns())
            bound.info("warmup", n=i + 1, outcome=result.outcome.value)
        self._warmed.add(target.name)
