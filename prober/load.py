"""Open-loop background load for one target, on an absolute schedule.

Arrivals come from `arrivals.arrival_offsets`; each request runs as its own task and the
generator never waits for it. Latency counts from the scheduled instant (`t_sched`), so the
client's own lateness shows up as dispatch lag and inside TTFT instead of hiding. An arrival
that would exceed `max_in_flight` is not sent and is counted as dropped: memory stays bounded
however far the server falls behind.

Each finished request, a cancelled one too, goes to the `Recorder` (metrics and the target's
capacity) and then to `on_result` (the bench's own collection). `own_load` is the live count of
requests in flight that the queue estimate reads: pass the one the target's capacity holds.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import aiohttp

from prober.arrivals import arrival_offsets
from prober.estimate import OwnLoad
from prober.logs import get_logger
from prober.prompts import PromptBuilder
from prober.record import Mode, Recorder, cancelled
from prober.result import RequestResult
from prober.runtime import start_now
from prober.settings import LoadConfig
from prober.targets import Target, spread

log = get_logger("prober.load")
LoadHook = Callable[[RequestResult], None]


class LoadDriver:
    """Runs one target's background load until `stop()`."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        target: Target,
        cfg: LoadConfig,
        recorder: Recorder | None,
        *,
        rate: float | None = None,
        on_result: LoadHook | None = None,
        prompts: PromptBuilder | None = None,
        own_load: OwnLoad | None = None,
    ) -> None:
        self._session = session
        self._target = target
        self._cfg = cfg
        self._recorder = recorder
        self._metrics = None if recorder is None else recorder.metrics
        self.rate = cfg.rate if rate is None else rate
        self._on_result = on_result
        self._rng = random.Random(cfg.seed)
        # The seed fixes the arrival schedule and lengths, never the cache-busting prefixes: a
        # restarted run must not resend prompts that the engine's prefix cache still holds.
        self._prompts = prompts or PromptBuilder(cache_bust=target.config.cache_bust)
        self._tasks: set[asyncio.Task[None]] = set()
        self._runner: asyncio.Task[None] | None = None
        self.own_load = OwnLoad() if own_load is None else own_load
        self.sent = 0
        self.dropped = 0

    def start(self) -> None:
        if self._metrics is not None:
            labels = self._target.labels
            self._metrics.load_target_rate.labels(labels.target, labels.model).set(self.rate)
        if self.rate > 0:
            self._runner = asyncio.create_task(self._run(), name=f"load:{self._target.name}")

    async def set_rate(self, rate: float) -> None:
        """Continue at `rate` arrivals/s on a fresh schedule (0 pauses); in-flight requests go on.

        One driver can step through load levels (bench, experiments) while the estimator keeps
        what it has learned about the engine.
        """
        if rate < 0:
            raise ValueError(f"rate must not be negative, got {rate}")
        await self._halt_arrivals()
        self.rate = rate
        self.start()

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
        start_ns = time.perf_counter_ns()
        cap = self._cfg.max_in_flight
        for offset in arrival_offsets(self._cfg.arrival, self.rate, self._cfg.seed):
            t_sched_ns = start_ns + int(offset * 1e9)
            delay = (t_sched_ns - time.perf_counter_ns()) / 1e9
            if delay > 0:
                await asyncio.sleep(delay)
            # Count tasks, not `own_load`: a task only counts itself there once it runs, and
            # arrivals that fall due together (a stalled loop) are all dispatched before any runs.
            if len(self._tasks) >= cap:
                self._drop()
                continue
            task = start_now(self._one(t_sched_ns))  # dispatch lag counts until it runs
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _drop(self) -> None:
        self.dropped += 1
        if self._metrics is not None:
            labels = self._target.labels
            self._metrics.load_dropped.labels(labels.target, labels.model).inc()

    async def _one(self, t_sched_ns: int) -> None:
        cfg, target = self._cfg, self._target
        prompt_tokens = spread(
            self._rng, cfg.prompt_tokens or target.config.prompt_tokens, cfg.prompt_tokens_spread
        )
        max_tokens = spread(
            self._rng, cfg.max_tokens or target.config.max_tokens, cfg.max_tokens_spread
        )
        own = self.own_load
        own.sent()
        self.sent += 1
        self._gauge(1)
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
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
                prompts=self._prompts,
                on_first_token=first_token,
            )
        except asyncio.CancelledError:
            result = cancelled(t_sched_ns, Mode.LOAD)
            raise
        finally:
            own.finished(had_first_token=first_token_seen)
            self._gauge(-1)
            if result is not None:
                self._record(result)

    def _gauge(self, delta: int) -> None:
        if self._metrics is not None:
            labels = self._target.labels
            self._metrics.load_in_flight.labels(labels.target, labels.model).inc(delta)

    def _record(self, result: RequestResult) -> None:
        if self._recorder is not None:
            self._recorder.record(self._target, result, Mode.LOAD)
        if self._on_result is not None:
            self._on_result(result)
