"""Drives a bench sweep against one server: pre-flight, warm-up, then each level's load.

Every request goes through `Target.send` (calibrated, cache-busted prompts; `stream_request`
underneath), so bench measures exactly what the daemon measures. Closed loop: C workers,
each sending its next request the moment its last one ends (`t_sched = t_send`), its lengths
drawn from the sweep's seeded length distributions. Open loop: the daemon's `LoadDriver`
(absolute Poisson, constant or gamma schedule, a rate schedule or a trace, see
`BenchConfig.load_config`), so latency counts from the scheduled instant and a slow server
cannot slow the arrivals down.

Per level: `warmup` unrecorded requests (closed loop, at most the level's concurrency, one
at a time for rate levels); then, still before the level's clock, a wave of unrecorded
one-token requests as wide as the level will hold in flight, so every connection it uses is
opened and has carried a request (a fresh connection's set-up would otherwise land in the
first wave's dispatch lag and TTFT: 39 ms p50 at c=200); then the measured requests, with a
`ClientWatch` on the client's CPU and loop lag. One `PromptBuilder` serves the whole sweep,
so the length calibration learned in the pre-flight and warm-ups carries over; a closed-loop
worker builds its next prompt while its current request streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

import aiohttp
from prometheus_client import CollectorRegistry

from prober.bench.config import MAX_CONCURRENCY, BenchConfig, Level, Mode
from prober.bench.watch import ClientLoad, ClientWatch
from prober.config.flags import FLAG_NAMES
from prober.load.config import LoadConfig
from prober.load.driver import LoadDriver, requests
from prober.metrics import Metrics
from prober.preflight import diagnosis
from prober.prompts import PromptBuilder
from prober.record import Recorder
from prober.request.wire import client_session
from prober.result import RequestResult
from prober.targets import Target

OnResult = Callable[[RequestResult], None]
# A level's lifecycle as the progress display sees it: (level, phase, expected requests).
OnPhase = Callable[[Level, str, int | None], None]


# From this concurrency on, closed-loop workers start staggered (`_closed`): C requests set up
# in one loop iteration cost the last one ~C x 150 µs of client time, 5 ms at 32.
RAMP_FROM_CONCURRENCY = 32
# Pre-flight requests that may go to calibrating a repeated prompt, and how close is enough.
_CALIBRATION_REQUESTS = 3
_CALIBRATION_TOLERANCE = 0.02


class RepeatedPrompt(PromptBuilder):
    """`--no-cache-bust`: once `freeze()` is called, every request gets the very same text.

    Calibration changes the word count from one request to the next; a prefix cache that
    cannot truncate (sliding-window models such as Gemma 3 in llama.cpp) then reuses
    nothing, so the text is fixed once the length has been learned.
    """

    def __init__(self) -> None:
        super().__init__(cache_bust=False)
        self._fixed: dict[int, tuple[str, int]] | None = None

    def freeze(self) -> None:
        self._fixed = {}

    def build(self, tokens: int) -> tuple[str, int]:
        if self._fixed is None:
            return super().build(tokens)
        if tokens not in self._fixed:
            self._fixed[tokens] = super().build(tokens)
        return self._fixed[tokens]


class PrefetchingPrompts(PromptBuilder):
    """The sweep's cache-busting builder, with prompts built ahead of their request.

    A closed-loop worker calls `prefetch()` with its next request's length once its current
    request streams, so the instant that request ends the next one's text is ready (~10 µs
    off the path from `t_sched` to the write). A prefetched text uses the calibration of the
    moment it was built, one request behind, which matters only before calibration settles.
    Texts wait by length, at most `MAX_CONCURRENCY` in all: one per worker.
    """

    def __init__(self) -> None:
        super().__init__(cache_bust=True)
        self._ready: dict[int, deque[tuple[str, int]]] = {}
        self._waiting = 0

    def prefetch(self, tokens: int) -> None:
        if self._waiting < MAX_CONCURRENCY:
            self._ready.setdefault(tokens, deque()).append(super().build(tokens))
            self._waiting += 1

    def build(self, tokens: int) -> tuple[str, int]:
        ready = self._ready.get(tokens)
        if not ready:
            return super().build(tokens)
        self._waiting -= 1
        text = ready.popleft()
        if not ready:
            del self._ready[tokens]
        return text


def _mean_e2e(results: list[RequestResult]) -> float:
    ends = [(r.t_end_ns - r.t_send_ns) / 1e9 for r in results if r.ok]
    return statistics.fmean(ends) if ends else 0.0


class PreflightError(Exception):
    """The server did not answer one plain request: nothing useful can be measured."""


@dataclass(frozen=True, slots=True)
class LevelRun:
    level: Level
    results: list[RequestResult]
    warmup: int
    dropped: int = 0
    client: ClientLoad | None = None
    connections_warmed: int = 0


@dataclass(frozen=True, slots=True)
class SweepRun:
    preflight: RequestResult
    levels: list[LevelRun]
    tokens_per_word: float
    event_loop: str = ""


class BenchRunner:
    """One sweep: `await run()`; `on_result` and `on_phase` feed a progress display."""

    def __init__(
        self,
        cfg: BenchConfig,
        *,
        on_result: OnResult | None = None,
        on_phase: OnPhase | None = None,
        event_loop: str = "",
        freeze_heap: bool = False,
    ) -> None:
        """`event_loop`: the loop's name for the report; `freeze_heap`: before each level's
        clock, collect and freeze what is alive (the daemon's GC tuning, applied again so
        a level's collections never walk the results of the levels before it)."""
        self.cfg = cfg
        self.event_loop = event_loop
        self._freeze_heap = freeze_heap
        self.target = Target.from_config(cfg.target_config())
        # The open loop's writer of the load series, on a registry nothing exposes (a sweep
        # reports from its results): the daemon's driver, with no branch for "no metrics".
        self._recorder = Recorder(Metrics(CollectorRegistry()))
        # Never seeded: a rerun with the same --seed must not send the prefixes the last run
        # left in the server's prompt cache (llama-server keeps past prompts in RAM).
        self.prompts: PromptBuilder = PrefetchingPrompts() if cfg.cache_bust else RepeatedPrompt()
        self._on_result = on_result or (lambda _: None)
        self._on_phase = on_phase or (lambda *_: None)
        # The closed loop's lengths: one seeded stream for the sweep, drawn in send order (the
        # open loop's, prober/load/driver.py, is seeded alike).
        self._rng = random.Random(f"lengths:{cfg.seed}")
        self._prompt_lengths = cfg.input_len.sampler()
        self._answer_lengths = cfg.output_len.sampler()

    def _lengths(self) -> tuple[int, int]:
        return self._prompt_lengths.draw(self._rng), self._answer_lengths.draw(self._rng)

    async def run(self) -> SweepRun:
        async with client_session() as session:
            first = await self.preflight(session)
            runs = [await self.level(session, level) for level in self.cfg.sweep]
        return SweepRun(first, runs, self.prompts.tokens_per_word, self.event_loop)

    async def preflight(self, session: aiohttp.ClientSession) -> RequestResult:
        """One short request; a server that cannot answer it fails the sweep at once.

        For a repeated prompt, up to `_CALIBRATION_REQUESTS` until its length is within
        `_CALIBRATION_TOLERANCE` of the request, then the text is frozen.
        """
        cfg = self.cfg
        tokens = cfg.nominal_input
        for _ in range(1 if cfg.cache_bust else _CALIBRATION_REQUESTS):
            result = await self.target.send(
                session,
                time.perf_counter_ns(),
                prompt_tokens=tokens,
                max_tokens=1,
                prompts=self.prompts,
            )
            if not result.ok:
                problem = diagnosis(result, self.target.config, FLAG_NAMES)
                raise PreflightError(
                    f"pre-flight request to {cfg.url} failed ({result.outcome.value}): {problem}"
                )
            error = abs((result.prompt_tokens or 0) / tokens - 1)
            if error <= _CALIBRATION_TOLERANCE:
                break
        if isinstance(self.prompts, RepeatedPrompt):
            self.prompts.freeze()
        return result

    async def level(self, session: aiohttp.ClientSession, level: Level) -> LevelRun:
        cfg = self.cfg
        warmed = 0
        warm: list[RequestResult] = []
        if cfg.warmup:
            self._on_phase(level, "warmup", cfg.warmup)
            width = int(level.value) if level.mode is Mode.CONCURRENCY else 1
            warm = await self._closed(session, min(width, cfg.warmup), cfg.warmup, None)
            warmed = await self._open_connections(session, self._pool_width(level, warm))
        if self._freeze_heap:
            gc.collect()
            gc.freeze()
        self._on_phase(level, "measure", cfg.num_requests)
        watch = ClientWatch()
        watch.start()
        if level.mode is Mode.CONCURRENCY:
            ramp = _mean_e2e(warm) if level.value >= RAMP_FROM_CONCURRENCY else 0.0
            results = await self._closed(
                session, int(level.value), cfg.num_requests, cfg.duration_seconds, ramp
            )
            dropped = 0
        else:
            results, dropped = await self._open(session, level)
        client = watch.stop()
        self._on_phase(level, "done", len(results))
        return LevelRun(level, results, cfg.warmup, dropped, client, warmed)

    def _pool_width(self, level: Level, warm: list[RequestResult]) -> int:
        """Connections the level will hold at once: C, or a Poisson peak for a rate.

        Open loop: L = rate × E2E of the warm-up (nothing queued then) requests in flight on
        average; L + 3√L + 1 covers the peaks of a Poisson arrival stream. Past saturation
        in flight grows beyond it and new connections are opened inside the level, as any
        client would have to.
        """
        if level.mode is Mode.CONCURRENCY:
            return int(level.value)
        mean = level.value * _mean_e2e(warm)
        if mean <= 0:
            return 1
        return min(self.cfg.max_in_flight, math.ceil(mean + 3 * math.sqrt(mean) + 1))

    async def _open_connections(self, session: aiohttp.ClientSession, width: int) -> int:
        """`width` one-token requests at once, unrecorded: each opens (or reuses) a pooled
        connection and carries a request over it, so the level starts on warm connections."""
        tokens = self.cfg.nominal_input

        async def one() -> RequestResult:
            return await self.target.send(
                session,
                time.perf_counter_ns(),
                prompt_tokens=tokens,
                max_tokens=1,
                prompts=self.prompts,
            )

        results = await asyncio.gather(*(one() for _ in range(width)))
        return sum(r.ok for r in results)

    async def _closed(
        self,
        session: aiohttp.ClientSession,
        concurrency: int,
        count: int | None,
        duration: float | None,
        ramp: float = 0.0,
    ) -> list[RequestResult]:
        """C workers; each sends its next request when its last one ends.

        With `ramp` (seconds, about one request's E2E) worker i starts i/C of it late and
        its first request is not recorded: by the first recorded send all C are in flight,
        and the sends stay spread over the requests' duration. Started together, C workers
        against a steady server stay in lockstep and send C requests in one loop iteration,
        each waiting for the set-up of those before it (~30 ms for the last at C=200):
        the client's queueing, not the server's. The ramp's own requests end inside the
        first E2E of the level: L and throughput, counted from recorded requests, read low
        by about C / (2 × requests recorded) (6 % with 8 a worker), hence only from
        `RAMP_FROM_CONCURRENCY`, where the lockstep costs more than that.
        """
        results: list[RequestResult] = []
        remaining = count
        deadline_ns = time.perf_counter_ns() + int((ramp + (duration or 0)) * 1e9)
        loop = asyncio.get_running_loop()
        prompts = self.prompts

        def on_first_token(upcoming: tuple[int, int]) -> Callable[[], None]:
            def first_token() -> None:
                # Once the request streams, and from the loop's queue rather than inside the
                # read that carried the token: nothing is added before any write.
                if isinstance(prompts, PrefetchingPrompts):
                    loop.call_soon(prompts.prefetch, upcoming[0])

            return first_token

        async def worker(i: int) -> None:
            nonlocal remaining
            lengths = self._lengths()
            if ramp > 0:
                await asyncio.sleep(i * ramp / concurrency)
                upcoming = self._lengths()
                await self._send(session, time.perf_counter_ns(), lengths, on_first_token(upcoming))
                lengths = upcoming
            while True:
                if remaining is not None:
                    if remaining <= 0:
                        return
                    remaining -= 1
                elif time.perf_counter_ns() >= deadline_ns:
                    return
                upcoming = self._lengths()
                result = await self._send(
                    session, time.perf_counter_ns(), lengths, on_first_token(upcoming)
                )
                lengths = upcoming
                results.append(result)
                self._on_result(result)

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        return results

    async def _send(
        self,
        session: aiohttp.ClientSession,
        t_sched_ns: int,
        lengths: tuple[int, int],
        on_first_token: Callable[[], None],
    ) -> RequestResult:
        return await self.target.send(
            session,
            t_sched_ns,
            prompt_tokens=lengths[0],
            max_tokens=lengths[1],
            prompts=self.prompts,
            on_first_token=on_first_token,
        )

    async def _open(
        self, session: aiohttp.ClientSession, level: Level
    ) -> tuple[list[RequestResult], int]:
        """Arrivals at `level.value` req/s through the daemon's `LoadDriver`."""
        cfg = self.cfg
        results: list[RequestResult] = []

        def record(result: RequestResult) -> None:
            results.append(result)
            self._on_result(result)

        load = cfg.load_config(level.value)
        # The sweep's calibrated builder: the first open-loop prompts are already the right size.
        driver = LoadDriver(
            session, self.target, load, self._recorder, on_result=record, prompts=self.prompts
        )
        started_ns = time.perf_counter_ns()
        driver.start()
        await self._arrivals_done(driver, load, started_ns)
        await driver.stop(cfg.timeout_seconds + 5)
        if cfg.num_requests is not None:
            # Under heavy client lag one arrival past the count may slip out: it was sent
            # (the server saw it) but is not measured, like a warm-up request.
            results.sort(key=lambda r: r.t_sched_ns)
            del results[cfg.num_requests :]
        return results, driver.dropped

    async def _arrivals_done(self, driver: LoadDriver, load: LoadConfig, started_ns: int) -> None:
        cfg = self.cfg
        if cfg.duration_seconds is not None:
            with contextlib.suppress(TimeoutError):  # or a schedule or trace ran out first
                await asyncio.wait_for(driver.arrivals_done(), cfg.duration_seconds)
            return
        assert cfg.num_requests is not None
        # The schedule is seeded, so the N-th and (N+1)-th arrival instants are known: stop
        # halfway between them, then make sure the N-th has really gone out.
        arrivals = requests(load, self.target.config)
        offsets = [r.offset for r in islice(arrivals, cfg.num_requests + 1)]
        if len(offsets) <= cfg.num_requests:  # a schedule or trace that ends before N
            await driver.arrivals_done()
            return
        stop_at = started_ns + int((offsets[-2] + offsets[-1]) / 2 * 1e9)
        await asyncio.sleep(max(0.0, (stop_at - time.perf_counter_ns()) / 1e9))
        # LoadDriver has no send hook to wait on; this only spins when the loop ran late.
        while driver.sent + driver.dropped < cfg.num_requests:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
