"""The simulated inference engine: slots, a FIFO queue, KV budget, and one loop that steps.

One task (`Engine.run`) drives every request, the way a real engine's scheduler does, so the
simulator can hold hundreds of streams on one core without a timer per stream. Each step:

1. drop requests whose client has gone (queued ones too, so the waiting count stays true);
2. admit queued requests, in FIFO order, into free slots while their KV reservation
   (prompt + max tokens) fits; the head of the queue blocks the rest, as in FCFS schedulers;
3. the step lasts the prefill of the newly admitted requests plus, when sequences are already
   decoding, one decode step `decode_step * (1 + slowdown * (batch - 1))`; prefill in a step
   delays everyone's next token, which is what real engines do;
4. at the end of the step every newly admitted request gets its first token (prefill yields
   it) and every decoding request its next token.

Tokens are delivered to each request's `asyncio.Queue` as `Emission`s; the engine only puts,
the request's handler writes. With `tokens_per_chunk = k` the engine still decodes one token
per step but flushes every k tokens (vLLM's stream interval), at the end of the reasoning
channel, and at the end of the request. Steps follow an absolute schedule, so timer
lateness does not accumulate into the token rate.

GPU utilisation (`utilization()`) is what `nvidia-smi` and DCGM's `DCGM_FI_DEV_GPU_UTIL`
report: the share of a recent window during which the engine was stepping (a kernel was
running), whatever the batch. One stream keeps the engine stepping, so it reads near 100 %
while the slots could take many more: the point of exporting it is to show that it is the
wrong scaling signal.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prober.sim.config import SimConfig

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

# Past this lateness the loop restarts its schedule from now instead of bursting to catch up.
_MAX_LAG_SECONDS = 0.05
# The window of the utilisation gauge: nvidia-smi samples over 1/6 s to 1 s.
UTILIZATION_WINDOW_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Emission:
    """Tokens handed to one request; `last` ends it, `dropped` means its client had gone."""

    tokens: int
    at: float
    last: bool = False
    dropped: bool = False


@dataclass(eq=False)
class EngineRequest:
    """One sequence inside the engine. Times are engine-clock seconds."""

    prompt_tokens: int
    max_tokens: int | None  # None: endless
    reasoning_tokens: int
    reserve_tokens: int
    prefill_seconds: float
    is_gone: Callable[[], bool]
    out: asyncio.Queue[Emission] = field(default_factory=asyncio.Queue)
    generated: int = 0
    pending: int = 0
    prefilled: bool = False
    finished: bool = False
    t_first: float = 0.0
    t_last: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineStats:
    """The engine's true state at one instant, as `/metrics` exports it."""

    waiting: int
    running: int
    kv_used_tokens: int
    kv_capacity_tokens: int
    prompt_tokens_total: int
    generation_tokens_total: int
    request_success_total: int

    @property
    def kv_usage(self) -> float:
        """Reserved share of the KV budget, 0..1; 0 when the budget is unlimited."""
        if self.kv_capacity_tokens == 0:
            return 0.0
        return self.kv_used_tokens / self.kv_capacity_tokens


def _never_gone() -> bool:
    return False


class Engine:
    """Continuous-batching engine model; `run()` is its only loop."""

    def __init__(self, cfg: SimConfig, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep):
        self._cfg = cfg
        self._clock = clock
        self._sleep = sleep
        # dicts keep insertion order: FIFO for the queue, O(1) removal on disconnect.
        self._waiting: dict[EngineRequest, None] = {}
        self._running: dict[EngineRequest, None] = {}
        self._wake = asyncio.Event()
        self._t = 0.0
        self._kv_used = 0
        self._prompt_total = 0
        self._generation_total = 0
        self._success_total = 0
        # Busy intervals (engine clock) that end inside the utilisation window, and the
        # start of the step in progress: the gauge includes a step that has not ended.
        self._busy: deque[tuple[float, float]] = deque()
        self._step_started: float | None = None

    def submit(
        self,
        prompt_tokens: int,
        max_tokens: int,
        *,
        reasoning_tokens: int = 0,
        endless: bool = False,
        is_gone: Callable[[], bool] = _never_gone,
    ) -> EngineRequest:
        """Queue a request. Raises ValueError when it could never fit the KV budget."""
        reserve = self.check_fits(prompt_tokens, max_tokens)
        req = EngineRequest(
            prompt_tokens=prompt_tokens,
            max_tokens=None if endless else max_tokens,
            reasoning_tokens=reasoning_tokens,
            reserve_tokens=reserve,
            prefill_seconds=self._cfg.prefill_seconds(prompt_tokens),
            is_gone=is_gone,
        )
        self._waiting[req] = None
        self._wake.set()
        return req

    def check_fits(self, prompt_tokens: int, max_tokens: int) -> int:
        """The KV reservation of a request; ValueError when even an idle engine cannot hold it."""
        reserve = prompt_tokens + max_tokens
        cap = self._cfg.kv_capacity_tokens
        if cap and reserve > cap:
            raise ValueError(
                f"prompt ({prompt_tokens}) + max_tokens ({max_tokens}) = {reserve} tokens "
                f"exceeds the KV capacity of {cap} tokens"
            )
        return reserve

    def cancel(self, req: EngineRequest) -> None:
        """Take a request out of the engine (client gone or handler done); idempotent."""
        req.finished = True
        self._waiting.pop(req, None)
        if req in self._running:
            del self._running[req]
            self._kv_used -= req.reserve_tokens

    def stats(self) -> EngineStats:
        """Snapshot of the true state."""
        return EngineStats(
            waiting=len(self._waiting),
            running=len(self._running),
            kv_used_tokens=self._kv_used,
            kv_capacity_tokens=self._cfg.kv_capacity_tokens,
            prompt_tokens_total=self._prompt_total,
            generation_tokens_total=self._generation_total,
            request_success_total=self._success_total,
        )

    def utilization(self, window: float = UTILIZATION_WINDOW_SECONDS) -> float:
        """Share of the last `window` seconds the engine spent stepping, 0..1 (nvidia-smi)."""
        now = self._clock()
        self._prune(now - window)
        busy = sum(min(end, now) - max(start, now - window) for start, end in self._busy)
        if self._step_started is not None:
            busy += now - max(self._step_started, now - window)
        return min(1.0, max(0.0, busy / window))

    def _prune(self, cutoff: float) -> None:
        while self._busy and self._busy[0][1] <= cutoff:
            self._busy.popleft()

    async def run(self) -> None:
        """Step forever; cancel the task to stop."""
        while True:
            if not self._waiting and not self._running:
                self._wake.clear()
                await self._wake.wait()
                self._t = self._clock()
            self._drop_gone()
            admitted = self._admit()
            decoding = [r for r in self._running if r.prefilled]
            if not admitted and not decoding:
                continue
            step = sum(r.prefill_seconds for r in admitted)
            if decoding:
                step += self._cfg.decode_seconds(len(decoding))
            self._step_started = started = self._clock()
            try:
                await self._wait_until(self._t + step)
            finally:
                self._step_started = None
                self._busy.append((started, self._clock()))
                self._prune(started - UTILIZATION_WINDOW_SECONDS)
            for req in admitted:
                if not req.finished:
                    req.prefilled = True
                    self._prompt_total += req.prompt_tokens
            for req in (*admitted, *decoding):
                if not req.finished:
                    self._advance(req)

    async def _wait_until(self, target: float) -> None:
        delay = target - self._clock()
        # Always yield, so handlers run even when the loop is behind schedule.
        await self._sleep(max(delay, 0.0))
        self._t = target if delay > -_MAX_LAG_SECONDS else self._clock()

    def _drop_gone(self) -> None:
        for req in [*self._waiting, *self._running]:
            if req.is_gone():
                self.cancel(req)
                req.out.put_nowait(Emission(0, self._clock(), last=True, dropped=True))

    def _admit(self) -> list[EngineRequest]:
        admitted: list[EngineRequest] = []
        cap = self._cfg.kv_capacity_tokens
        while self._waiting and len(self._running) < self._cfg.slots:
            head = next(iter(self._waiting))
            if cap and self._kv_used + head.reserve_tokens > cap:
                break
            del self._waiting[head]
            self._running[head] = None
            self._kv_used += head.reserve_tokens
            admitted.append(head)
        return admitted

    def _advance(self, req: EngineRequest) -> None:
        now = self._clock()
        req.generated += 1
        req.pending += 1
        self._generation_total += 1
        if req.generated == 1:
            req.t_first = now
        req.t_last = now
        done = req.max_tokens is not None and req.generated >= req.max_tokens
        end_of_reasoning = req.generated == req.reasoning_tokens
        if done or end_of_reasoning or req.pending >= self._cfg.tokens_per_chunk:
            req.out.put_nowait(Emission(req.pending, now, last=done))
            req.pending = 0
        if done:
            self.cancel(req)
            self._success_total += 1
