"""Queue-depth estimate from what a client can see (DESIGN section 3).

Queue wait of one request: `W_q = (t_first_token − t_send) − prefill(n_prompt)`. The prefill
is the server's own figure where it reports one (llama-server `timings.prompt_ms`, Ollama
`prompt_eval_duration`); otherwise a baseline learned from the lower envelope of TTFT versus
prompt length (TTFT grows linearly with prompt length when nothing queues).

Waiting requests, in order of preference:
1. The prober's own background load is the traffic: of its requests in flight, those beyond
   the engine's parallel slots wait, and no request that already has its first token waits:
   `waiting = min(awaiting_first_token, max(0, in_flight − slots))`, with `slots` learned as
   the most of our requests ever seen decoding at once.
2. Otherwise Little's law on the queue: `L_q = λ · W_q`, with λ the drain rate at saturation
   (a queue only exists when every slot is busy, so it drains at capacity μ): the server's
   completion counter where scraped, else the completion rate the prober itself observes.
Running requests: own in-flight requests that hold a slot, else Little's law on the decode
stage, `μ · mean(decode time)`.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prober.result import RequestResult

_ENVELOPE_BINS = 24  # log2 bins of prompt length: 1 .. 16M tokens
_WINDOW_SECONDS = 30.0
# A request whose first token came within this much of its prefill did not queue.
_NO_WAIT_SECONDS = 0.02
_NO_WAIT_FRACTION = 0.25


@dataclass(frozen=True, slots=True)
class Estimate:
    waiting: float | None
    running: float | None
    wait_seconds: float | None


class OwnLoad:
    """Live counts the load driver keeps for its in-flight requests, and the slots they reveal.

    `slots` is a lower bound on the engine's parallel slots, raised by two observations: the
    number of our requests seen decoding at once, and the number in flight when a request was
    sent that then waited for no slot (it found one free, so at least that many exist). The
    second needs the server's own prefill time, to tell a queue wait from a slow prefill.
    """

    __slots__ = ("awaiting_first_token", "slots", "total")

    def __init__(self) -> None:
        self.total = 0
        self.awaiting_first_token = 0
        self.slots = 0

    def sent(self) -> int:
        """Count a request going out; return how many are in flight with it."""
        self.total += 1
        self.awaiting_first_token += 1
        return self.total

    def first_token(self) -> None:
        self.awaiting_first_token -= 1
        self.slots = max(self.slots, self.total - self.awaiting_first_token)

    def finished(
        self, result: RequestResult | None, in_flight_at_send: int, *, had_first_token: bool
    ) -> None:
        self.total -= 1
        if not had_first_token:
            self.awaiting_first_token -= 1
            return
        if result is None or result.t_first_token_ns is None:
            return
        prefill = result.server_prefill_seconds
        if prefill is None:
            return
        wait = (result.t_first_token_ns - result.t_send_ns) / 1e9 - prefill
        if wait < max(_NO_WAIT_SECONDS, _NO_WAIT_FRACTION * prefill):
            self.slots = max(self.slots, in_flight_at_send)


class PrefillBaseline:
    """Lower envelope of (prompt tokens → time to first token) over requests seen."""

    def __init__(self) -> None:
        self._floor: dict[int, tuple[int, float]] = {}

    def observe(self, prompt_tokens: int, seconds: float) -> None:
        b = min(max(prompt_tokens, 1).bit_length() - 1, _ENVELOPE_BINS - 1)
        best = self._floor.get(b)
        if best is None or seconds < best[1]:
            self._floor[b] = (prompt_tokens, seconds)

    def __call__(self, prompt_tokens: int) -> float | None:
        """Baseline prefill for a prompt of `prompt_tokens`: the envelope, linearly interpolated."""
        points = sorted(self._floor.values())
        if not points:
            return None
        if len(points) == 1 or prompt_tokens <= points[0][0]:
            n0, s0 = points[0]
            return s0 if prompt_tokens >= n0 or len(points) == 1 else s0 * prompt_tokens / n0
        for (n0, s0), (n1, s1) in itertools.pairwise(points):
            if prompt_tokens <= n1:
                return s0 + (s1 - s0) * (prompt_tokens - n0) / (n1 - n0)
        (n0, s0), (n1, s1) = points[-2], points[-1]
        return s1 + (s1 - s0) * (prompt_tokens - n1) / max(n1 - n0, 1)


class QueueEstimator:
    """One target's estimate; `observe()` each finished request, `estimate()` at scrape time."""

    def __init__(
        self,
        *,
        window_seconds: float = _WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._window = window_seconds
        self._clock = clock
        self._baseline = PrefillBaseline()
        # (finish time, queue wait, decode seconds) of recent successful requests.
        self._recent: deque[tuple[float, float, float]] = deque()
        self.own_load: OwnLoad | None = None
        self.server_drain_rate: Callable[[], float | None] = lambda: None

    def observe(self, result: RequestResult) -> float | None:
        """Learn from one result; return its estimated queue wait (None if it had no token)."""
        if result.t_first_token_ns is None:
            return None
        to_first = (result.t_first_token_ns - result.t_send_ns) / 1e9
        prompt = result.prompt_tokens or 0
        self._baseline.observe(prompt, to_first)
        prefill = result.server_prefill_seconds
        if prefill is None:
            prefill = self._baseline(prompt) or 0.0
        wait = max(0.0, to_first - prefill)
        if result.ok and result.t_last_token_ns is not None:
            decode = (result.t_end_ns - result.t_first_token_ns) / 1e9
            self._recent.append((self._clock(), wait, decode))
        return wait

    def estimate(self) -> Estimate:
        now = self._clock()
        while self._recent and self._recent[0][0] < now - self._window:
            self._recent.popleft()
        recent = self._recent
        mean_wait = sum(w for _, w, _ in recent) / len(recent) if recent else None
        mean_decode = sum(d for _, _, d in recent) / len(recent) if recent else None
        own = self.own_load
        if own is not None and own.slots > 0:
            slots = own.slots
            own_waiting = min(own.awaiting_first_token, max(0, own.total - slots))
            return Estimate(float(own_waiting), float(min(own.total, slots)), mean_wait)
        drain = self.server_drain_rate()
        if drain is None and recent:
            drain = len(recent) / self._window
        waiting = None if drain is None or mean_wait is None else drain * mean_wait
        running = None if drain is None or mean_decode is None else drain * mean_decode
        return Estimate(waiting, running, mean_wait)
