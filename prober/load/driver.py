"""Open-loop background load for one target, on an absolute schedule.

Arrivals come from `requests()`: the configured rate, rate schedule or trace as a seeded
stream of `workload.Request`s (offset from the start, lengths, shared prefix), drawn in
arrival order, so the same seed gives the same requests whatever the server does and
whatever the cap drops. Each request runs as its own task and the generator never waits for
it. Latency counts from the scheduled instant (`t_sched`), so the client's own lateness
shows up as dispatch lag and inside TTFT instead of hiding. An arrival that would exceed
`max_in_flight` is not sent and is counted as dropped: memory stays bounded however far the
server falls behind. A target that has gone silent (`EngineWatch.silent`: no token on any of
its streams for `silent_seconds` while a request waited or failed) gets no new request either:
its arrivals are dropped and counted (reason `silent`) until a token comes, one line logged
when the load pauses and one when it resumes, and when it pauses the load lets go of all it
holds there but its oldest request (the rest cancelled, outcome `cancelled`). During an
outage a daemon that loads many targets then holds, per target, the arrivals of one
`silent_seconds` window until the pause and one request after it (the pause ends when its
evidence lapses too: a moment's arrivals between probes that fail slower than the window),
not `max_in_flight`; the probes go on and see the target come back.

Nothing here blocks or spins on the event loop: a trace's arrivals are drawn in a worker
thread (`_take`: the file is opened and read there, a batch bounded in count, in how far
ahead of the schedule it reads and in time), a rate's or a schedule's on the loop (each draw
is arithmetic, and a burst falling due at once yields every `_YIELD_EVERY`); a sleep lasts at
most `_MAX_SLEEP_SECONDS` a turn, so an arrival however far away is only waited for. When the
arrivals end (a source that does not loop ran out, a trace that turned bad, an error) the
load logs one line and counts `llmprober_load_stopped_total{reason}`.

Each finished request, a cancelled one too, goes to the `Recorder` (metrics and the target's
capacity) and then to `on_result` (the bench's own collection). `own_load` is the live count of
requests in flight that the queue estimate reads: pass the one the target's capacity holds.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator
from contextlib import aclosing

import aiohttp

from prober.capacity.own import OwnLoad
from prober.capacity.state import EngineWatch
from prober.load.arrivals import RateClock, arrival_offsets, scheduled_offsets
from prober.load.config import LoadConfig
from prober.load.workload import Request, TraceError, replay
from prober.logs import get_logger
from prober.prompts import PromptBuilder
from prober.record import Mode, Recorder, cancelled
from prober.result import RequestResult
from prober.runtime import start_now
from prober.settings import TargetConfig
from prober.targets import Target

log = get_logger("prober.load")
LoadHook = Callable[[RequestResult], None]
Shard = tuple[int, int]  # (index, count) of this replica
# Overdue arrivals dispatched back to back before the loop gets a turn (a trace's burst of
# simultaneous lines, or a loop that stalled): other targets' reads and stamps go on.
_YIELD_EVERY = 256
_MAX_SLEEP_SECONDS = 3600.0  # one sleep's longest: a timer far away is set again, never overflows
_MAX_OFFSET_SECONDS = 1e9  # ~32 years: an arrival later than this ends the load, said once
# A trace's batch, read in a worker thread: at most this many arrivals, none past the first
# that falls this far ahead of the schedule, and no more once this long was spent reading.
_BATCH = 512
_READ_AHEAD_SECONDS = 2.0
_BATCH_SECONDS = 0.05
SHED = "the target went silent: the load keeps only its oldest request"
Batch = tuple[list[Request], TraceError | None, bool]  # arrivals, the fault that ended them, done


def requests(
    cfg: LoadConfig, target: TargetConfig, *, rate: float | None = None, shard: Shard = (0, 1)
) -> Iterator[Request]:
    """The load's arrivals for this replica, in order, without end unless a schedule or trace
    ends. `rate` replaces the configured source with arrivals at that mean rate (the
    configured law and lengths); a replica of `count` sends 1/count of the load (a trace: every
    count-th line)."""
    count = shard[1]
    if cfg.trace is not None and rate is None:
        yield from replay(cfg.trace.replay(rate=cfg.rate, seed=cfg.seed, shard=shard))
        return
    k = cfg.burstiness or 1.0
    if rate is None and cfg.schedule is not None:
        steps = [(seconds, r / count) for seconds, r in cfg.schedule.pairs()]
        offsets = scheduled_offsets(
            cfg.arrival, steps, loop=cfg.schedule.loop, seed=cfg.seed, burstiness=k
        )
    else:
        offsets = arrival_offsets(
            cfg.arrival, rate or (cfg.rate or 0) / count, cfg.seed, burstiness=k
        )
    prompt = cfg.prompt_lengths(target.prompt_tokens).sampler()
    answer = cfg.answer_lengths(target.max_tokens).sampler()
    # Not the arrivals' generator: lengths drawn from the same stream as the gaps would be
    # correlated with them.
    rng = random.Random(None if cfg.seed is None else f"lengths:{cfg.seed}")
    for offset in offsets:
        yield Request(offset, prompt.draw(rng), answer.draw(rng))


def mean_rate(cfg: LoadConfig, shard: Shard = (0, 1)) -> float:
    """Arrivals per second this replica's load sends on average."""
    if cfg.trace is not None:
        return cfg.trace.replay(rate=cfg.rate, seed=cfg.seed, shard=shard).mean_rate
    if cfg.schedule is not None:
        return RateClock(cfg.schedule.pairs(), loop=True).mean_rate / shard[1]
    return (cfg.rate or 0.0) / shard[1]


class LoadDriver:
    """Runs one target's background load until `stop()`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: Target,
        cfg: LoadConfig,
        recorder: Recorder,
        *,
        rate: float | None = None,
        on_result: LoadHook | None = None,
        prompts: PromptBuilder | None = None,
        own_load: OwnLoad | None = None,
        engine: EngineWatch | None = None,
        shard: Shard = (0, 1),
        clock: Callable[[], int] = time.perf_counter_ns,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`rate`: arrivals at this mean rate instead of the configured rate, schedule or
        trace (as `set_rate`); `engine`: the target's evidence, for `silent_seconds` (None:
        never paused); `shard`: this replica's (index, count); `clock` (monotonic ns) and
        `sleep` are the loop's unless a test injects its own."""
        self._session = session
        self._target = target
        self._cfg = cfg
        self._recorder = recorder
        self._fixed_rate = rate
        self._shard = shard
        self.rate = mean_rate(cfg, shard) if rate is None else rate
        self._on_result = on_result
        self._clock, self._sleep = clock, sleep
        # The seed fixes the arrival schedule and lengths, never the cache-busting prefixes: a
        # restarted run must not resend prompts that the engine's prefix cache still holds.
        self._prompts = prompts or PromptBuilder(cache_bust=target.config.cache_bust)
        self._tasks: dict[asyncio.Task[None], None] = {}  # in flight, oldest first
        self._shed: set[asyncio.Task[None]] = set()  # cancelled because the target went silent
        self._runner: asyncio.Task[None] | None = None
        self.own_load = OwnLoad() if own_load is None else own_load
        self._engine = engine
        self.paused = False  # the target was silent at the last arrival
        self.sent = 0
        self.dropped = 0

    def start(self) -> None:
        self._recorder.load_started(self._target, self.rate)
        # A configured source always has arrivals (a lone-instant trace has a mean rate of 0).
        if self._fixed_rate is None or self._fixed_rate > 0:
            self._runner = asyncio.create_task(self._run(), name=f"load:{self._target.name}")
            self._runner.add_done_callback(self._ended)

    def _ended(self, runner: asyncio.Task[None]) -> None:
        """A runner that raised ends its load loudly (one line, counted), never silently."""
        if runner.cancelled() or (error := runner.exception()) is None:
            return
        log.error("load_failed", target=self._target.name, error=f"{type(error).__name__}: {error}")
        self._recorder.load_ended(self._target, "error")

    async def set_rate(self, rate: float) -> None:
        """Continue at `rate` arrivals/s on a fresh schedule (0 pauses); in-flight requests go on.

        One driver can step through load levels (bench, experiments) while the estimator keeps
        what it has learned about the engine.
        """
        if rate < 0:
            raise ValueError(f"rate must not be negative, got {rate}")
        await self._halt_arrivals()
        self.rate = self._fixed_rate = rate
        self.start()

    async def arrivals_done(self) -> None:
        """Wait until the arrivals end: a schedule or trace that does not loop ran out."""
        if self._runner is not None:
            await asyncio.wait({self._runner})  # returns, never raises, if it is cancelled

    async def _halt_arrivals(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            await asyncio.gather(self._runner, return_exceptions=True)
            self._runner = None

    async def stop(self, grace_seconds: float) -> None:
        """Stop arrivals; give in-flight requests `grace_seconds`, then cancel them."""
        await self._halt_arrivals()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=grace_seconds)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _run(self) -> None:
        start_ns = self._clock()
        cap = self._cfg.max_in_flight
        unslept = 0
        try:
            async with aclosing(self._arrivals(start_ns)) as arrivals:
                async for request in arrivals:
                    if not request.offset <= _MAX_OFFSET_SECONDS:  # 1e-300/s: 1e300 s away
                        log.error("load_arrival_too_far", target=self._target.name,
                                  offset_seconds=request.offset)  # fmt: skip
                        self._recorder.load_ended(self._target, "too_far")
                        return
                    t_sched_ns = start_ns + int(request.offset * 1e9)
                    if await self._wait_until(t_sched_ns):
                        unslept = 0
                    elif (unslept := unslept + 1) % _YIELD_EVERY == 0:
                        await asyncio.sleep(0)  # a burst falling due at once never starves the loop
                    # Count tasks, not `own_load`: a task only counts itself there once it
                    # runs, and arrivals that fall due together (a stalled loop) are all
                    # dispatched before any runs.
                    if len(self._tasks) >= cap:
                        self._drop("in_flight")
                        continue
                    if self._silent():
                        self._drop("silent")
                        continue
                    # Dispatch lag counts until the task runs.
                    task = start_now(self._one(t_sched_ns, request))
                    self._tasks[task] = None
                    task.add_done_callback(self._forget)
        except TraceError as exc:  # the file changed since it was checked: the load ends here
            log.error(
                "load_trace_failed", target=self._target.name, reason=exc.reason, error=str(exc)
            )
            self._recorder.load_ended(self._target, f"trace_{exc.reason}")
            return
        log.info("load_arrivals_ended", target=self._target.name, sent=self.sent)
        self._recorder.load_ended(self._target, "finished")

    async def _wait_until(self, t_ns: int) -> bool:
        """Sleep until `t_ns` (the injected clock's), a bounded sleep at a time; whether it
        slept."""
        delay = (t_ns - self._clock()) / 1e9
        if delay <= 0:
            return False
        while delay > _MAX_SLEEP_SECONDS:  # each turn sleeps an hour: bounded in count per hour
            await self._sleep(_MAX_SLEEP_SECONDS)
            delay = (t_ns - self._clock()) / 1e9
        if delay > 0:
            await self._sleep(delay)
        return True

    async def _arrivals(self, start_ns: int) -> AsyncGenerator[Request, None]:
        """The arrivals in order; a trace's read in a worker thread, batch by batch."""
        source = requests(self._cfg, self._target.config, rate=self._fixed_rate, shard=self._shard)
        if self._cfg.trace is None or self._fixed_rate is not None:
            for request in source:  # rate or schedule: arithmetic, no I/O
                yield request
            return
        while True:
            horizon = (self._clock() - start_ns) / 1e9 + _READ_AHEAD_SECONDS
            batch, fault, done = await asyncio.to_thread(_take, source, horizon)
            for request in batch:
                yield request
            if fault is not None:
                raise fault
            if done:
                return

    def _forget(self, task: asyncio.Task[None]) -> None:
        self._tasks.pop(task, None)
        self._shed.discard(task)

    def _let_go(self) -> int:
        """Cancel the load's requests in flight but the oldest (outcome `cancelled`, `SHED`):
        a silent target holds one, not a stream or a pending connect per arrival of the
        window until each times out. How many were cancelled."""
        surplus = list(self._tasks)[1:]
        for task in surplus:
            self._shed.add(task)
            task.cancel()
        return len(surplus)

    def _drop(self, reason: str) -> None:
        self.dropped += 1
        self._recorder.load_dropped(self._target, reason)

    def _silent(self) -> bool:
        """Whether the target is silent now; a change is logged once."""
        window = self._cfg.silent_seconds
        if self._engine is None or window is None:
            return False
        silent = self._engine.silent(window)
        if silent != self.paused:
            self.paused = silent
            if silent:
                log.warning(
                    "load_paused", target=self._target.name, cancelled=self._let_go(),
                    why=f"no token on any stream for {window:g} s while a request waited or"
                    " failed; the load's requests in flight but the oldest are cancelled, and"
                    " arrivals dropped (llmprober_load_dropped_total, reason silent) until"
                    " one comes",
                )  # fmt: skip
            else:
                log.info("load_resumed", target=self._target.name, dropped=self.dropped)
        return silent

    async def _one(self, t_sched_ns: int, request: Request) -> None:
        target = self._target
        own = self.own_load
        own.sent()
        self.sent += 1
        self._recorder.load_in_flight(target, 1)
        first_token_seen = False

        def first_token() -> None:
            nonlocal first_token_seen
            first_token_seen = True
            own.first_token()

        result: RequestResult | None = None
        try:
            result = await target.send(
                self._session,
                t_sched_ns,
                prompt_tokens=request.prompt_tokens,
                max_tokens=request.max_tokens,
                prefix=request.prefix,
                prompts=self._prompts,
                probe=False,  # its own lengths, no question, no answer checks
                on_first_token=first_token,
            )
        except asyncio.CancelledError:
            if asyncio.current_task() not in self._shed:
                result = cancelled(t_sched_ns, Mode.LOAD)
                raise
            # Let go by the driver itself: the task ends here, so it keeps no CancelledError
            # whose traceback would hold this request's frames until a full collection.
            result = cancelled(t_sched_ns, Mode.LOAD, SHED)
        finally:
            own.finished(had_first_token=first_token_seen)
            self._recorder.load_in_flight(target, -1)
            if result is not None:
                self._record(result)

    def _record(self, result: RequestResult) -> None:
        self._recorder.record(self._target, result, Mode.LOAD)
        if self._on_result is not None:
            self._on_result(result)


def _take(source: Iterator[Request], horizon: float) -> Batch:
    """The next arrivals of `source` (blocking: file I/O), up to `_BATCH`, the first past
    `horizon` seconds, or `_BATCH_SECONDS` spent; the fault that ended them and whether they
    ended."""
    batch: list[Request] = []
    until = time.monotonic() + _BATCH_SECONDS
    try:
        for request in source:
            batch.append(request)
            if len(batch) >= _BATCH or request.offset > horizon or time.monotonic() > until:
                return batch, None, False
    except TraceError as exc:
        return batch, exc, True
    return batch, None, True
