"""Drives a bench sweep against one server: pre-flight, warm-up, then each level's load.

Every request goes through `Target.send` (calibrated, cache-busted prompts; `stream_request`
underneath), so bench measures exactly what the daemon measures. Closed loop: C workers,
each sending its next request the moment its last one ends (`t_sched = t_send`). Open loop:
the daemon's `LoadDriver` (absolute Poisson or constant schedule), so latency counts from the
scheduled instant and a slow server cannot slow the arrivals down.

Per level: `warmup` unrecorded requests (closed loop, at most the level's concurrency, one
at a time for rate levels), then the measured requests. One `PromptBuilder` serves the whole
sweep, so the length calibration learned in the pre-flight and warm-ups carries over.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import islice

import aiohttp

from prober.arrivals import arrival_offsets
from prober.bench.config import BenchConfig, Level, Mode
from prober.load import LoadDriver
from prober.prompts import PromptBuilder
from prober.result import RequestResult
from prober.settings import LoadConfig
from prober.targets import Target
from prober.web import client_session

OnResult = Callable[[RequestResult], None]
# A level's lifecycle as the progress display sees it: (level, phase, expected requests).
OnPhase = Callable[[Level, str, int | None], None]


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


class PreflightError(Exception):
    """The server did not answer one plain request: nothing useful can be measured."""


@dataclass(frozen=True, slots=True)
class LevelRun:
    level: Level
    results: list[RequestResult]
    warmup: int
    dropped: int = 0


@dataclass(frozen=True, slots=True)
class SweepRun:
    preflight: RequestResult
    levels: list[LevelRun]
    tokens_per_word: float


class BenchRunner:
    """One sweep: `await run()`; `on_result` and `on_phase` feed a progress display."""

    def __init__(
        self,
        cfg: BenchConfig,
        *,
        on_result: OnResult | None = None,
        on_phase: OnPhase | None = None,
    ) -> None:
        self.cfg = cfg
        self.target = Target.from_config(cfg.target_config())
        # Never seeded: a rerun with the same --seed must not send the prefixes the last run
        # left in the server's prompt cache (llama-server keeps past prompts in RAM).
        self.prompts = PromptBuilder(cache_bust=True) if cfg.cache_bust else RepeatedPrompt()
        self._on_result = on_result or (lambda _: None)
        self._on_phase = on_phase or (lambda *_: None)

    async def run(self) -> SweepRun:
        async with client_session() as session:
            first = await self.preflight(session)
            runs = [await self.level(session, level) for level in self.cfg.sweep]
        return SweepRun(first, runs, self.prompts.tokens_per_word)

    async def preflight(self, session: aiohttp.ClientSession) -> RequestResult:
        """One short request; a server that cannot answer it fails the sweep at once.

        For a repeated prompt, up to `_CALIBRATION_REQUESTS` until its length is within
        `_CALIBRATION_TOLERANCE` of the request, then the text is frozen.
        """
        cfg = self.cfg
        for _ in range(1 if cfg.cache_bust else _CALIBRATION_REQUESTS):
            result = await self.target.send(
                session,
                time.perf_counter_ns(),
                prompt_tokens=cfg.input_len,
                max_tokens=1,
                prompts=self.prompts,
            )
            if not result.ok:
                raise PreflightError(
                    f"pre-flight request to {cfg.url} failed ({result.outcome.value}): "
                    f"{result.error or 'no detail'}"
                )
            error = abs((result.prompt_tokens or 0) / cfg.input_len - 1)
            if error <= _CALIBRATION_TOLERANCE:
                break
        if isinstance(self.prompts, RepeatedPrompt):
            self.prompts.freeze()
        return result

    async def level(self, session: aiohttp.ClientSession, level: Level) -> LevelRun:
        cfg = self.cfg
        if cfg.warmup:
            self._on_phase(level, "warmup", cfg.warmup)
            width = int(level.value) if level.mode is Mode.CONCURRENCY else 1
            await self._closed(session, min(width, cfg.warmup), cfg.warmup, None)
        self._on_phase(level, "measure", cfg.num_requests)
        if level.mode is Mode.CONCURRENCY:
            results = await self._closed(
                session, int(level.value), cfg.num_requests, cfg.duration_seconds
            )
            run = LevelRun(level, results, cfg.warmup)
        else:
            run = await self._open(session, level)
        self._on_phase(level, "done", len(run.results))
        return run

    async def _closed(
        self,
        session: aiohttp.ClientSession,
        concurrency: int,
        count: int | None,
        duration: float | None,
    ) -> list[RequestResult]:
        """C workers; each sends its next request when its last one ends."""
        results: list[RequestResult] = []
        remaining = count
        deadline_ns = time.perf_counter_ns() + int((duration or 0) * 1e9)

        async def worker() -> None:
            nonlocal remaining
            while True:
                if remaining is not None:
                    if remaining <= 0:
                        return
                    remaining -= 1
                elif time.perf_counter_ns() >= deadline_ns:
                    return
                result = await self._send(session, time.perf_counter_ns())
                results.append(result)
                self._on_result(result)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return results

    async def _send(self, session: aiohttp.ClientSession, t_sched_ns: int) -> RequestResult:
        cfg = self.cfg
        return await self.target.send(
            session,
            t_sched_ns,
            prompt_tokens=cfg.input_len,
            max_tokens=cfg.output_len,
            prompts=self.prompts,
        )

    async def _open(self, session: aiohttp.ClientSession, level: Level) -> LevelRun:
        """Arrivals at `level.value` req/s through the daemon's `LoadDriver`."""
        cfg = self.cfg
        results: list[RequestResult] = []

        def record(result: RequestResult) -> None:
            results.append(result)
            self._on_result(result)

        load = LoadConfig(
            rate=level.value,
            arrival=cfg.arrival,
            max_in_flight=cfg.max_in_flight,
            prompt_tokens=cfg.input_len,
            max_tokens=cfg.output_len,
            seed=cfg.seed,
        )
        # The sweep's calibrated builder: the first open-loop prompts are already the right size.
        driver = LoadDriver(
            session, self.target, load, None, on_result=record, prompts=self.prompts
        )
        started_ns = time.perf_counter_ns()
        driver.start()
        await self._arrivals_done(driver, level, started_ns)
        await driver.stop(cfg.timeout_seconds + 5)
        if cfg.num_requests is not None:
            # Under heavy client lag one arrival past the count may slip out: it was sent
            # (the server saw it) but is not measured, like a warm-up request.
            results.sort(key=lambda r: r.t_sched_ns)
            del results[cfg.num_requests :]
        return LevelRun(level, results, cfg.warmup, driver.dropped)

    async def _arrivals_done(self, driver: LoadDriver, level: Level, started_ns: int) -> None:
        cfg = self.cfg
        if cfg.duration_seconds is not None:
            await asyncio.sleep(cfg.duration_seconds)
            return
        assert cfg.num_requests is not None
        # The schedule is seeded, so the N-th and (N+1)-th arrival instants are known: stop
        # halfway between them, then make sure the N-th has really gone out.
        offsets = list(islice(arrival_offsets(cfg.arrival, level.value, cfg.seed),
                              cfg.num_requests + 1))  # fmt: skip
        stop_at = started_ns + int((offsets[-2] + offsets[-1]) / 2 * 1e9)
        await asyncio.sleep(max(0.0, (stop_at - time.perf_counter_ns()) / 1e9))
        # LoadDriver has no send hook to wait on; this only spins when the loop ran late.
        while driver.sent + driver.dropped < cfg.num_requests:  # noqa: ASYNC110
            await asyncio.sleep(0.001)
