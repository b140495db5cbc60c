"""Queue-depth estimate from what a client can see (DESIGN section 3).

Queue wait of one request: `W_q = (t_first_token − t_send) − prefill(n_prompt)`. The prefill
is the server's own figure where it reports one (llama-server `timings.prompt_ms`, Ollama
`prompt_eval_duration`); otherwise a baseline learned from the lower envelope of TTFT versus
prompt length (TTFT grows linearly with prompt length when nothing queues).

Waiting requests, in order of preference:
1. The prober's own background load is the traffic: of its requests in flight, those beyond
   the engine's parallel slots wait, and no request that already has its first token waits:
   `waiting = min(awaiting_first_token, max(0, in_flight − slots))`, with `slots` learned as
   the most requests seen holding a slot at once (`SlotOccupancy`), never configured.
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
# Slot handoffs between consecutive requests are not overlaps.
_HANDOFF_MARGIN_SECONDS = 0.05


@dataclass(frozen=True, slots=True)
class Estimate:
    waiting: float | None
    running: float | None
    wait_seconds: float | None


class OwnLoad:
    """Live counts the load driver keeps for its in-flight requests.

    `slots` is a lower bound on the engine's parallel slots: the most of our requests seen
    decoding at once, raised further by the estimator's `SlotOccupancy`.
    """

    __slots__ = ("awaiting_first_token", "slots", "total")

    def __init__(self) -> None:
        self.total = 0
        self.awaiting_first_token = 0
        self.slots = 0

    def sent(self) -> None:
        self.total += 1
        self.awaiting_first_token += 1

    def first_token(self) -> None:
        self.awaiting_first_token -= 1
        self.slots = max(self.slots, self.total - self.awaiting_first_token)

    def finished(self, *, had_first_token: bool) -> None:
        self.total -= 1
        if not had_first_token:
            self.awaiting_first_token -= 1


class SlotOccupancy:
    """The most requests seen holding an engine slot at once.

    A finished request held its slot from `first token − prefill` (prefill: the server's own
    figure, else the envelope baseline) until its end. Whenever a queue existed, every slot was
    held, so the peak overlap of these intervals reaches the slot count. Intervals are shrunk by
    a small margin at both ends, so a slot handed from one request to the next is not counted
    twice.
    """

    def __init__(self, keep: int = 256) -> None:
        self._intervals: deque[list[float]] = deque(maxlen=keep)  # [start, end, overlap at start]
        self.peak = 0

    def add(self, start: float, end: float) -> int:
        margin = min(_HANDOFF_MARGIN_SECONDS, 0.1 * (end - start))
        count = 1
        for interval in self._intervals:
            other_start, other_end = interval[0], interval[1]
            if other_start + margin <= start < other_end - margin:
                count += 1
            if start + margin <= other_start < end - margin:
                interval[2] += 1
                self.peak = max(self.peak, int(interval[2]))
        self._intervals.append([start, end, float(count)])
        self.peak = max(self.peak, count)
        return self.peak


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
        self._occupancy = SlotOccupancy()
        # (finish time, queue wait, decode seconds) of recent successful requests.
        self._recent: deque[tuple[float, float, float]] = deque()
        self._sums = [0.0, 0.0]  # of the waits and decode times in `_recent`, kept as it moves
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
            now = self._clock()
            self._recent.append((now, wait, decode))
            self._sums[0] += wait
            self._sums[1] += decode
            self._forget_before(now - self._window)
            slot_start = result.t_first_token_ns / 1e9 - prefill
            peak = self._occupancy.add(slot_start, result.t_end_ns / 1e9)
            if self.own_load is not None:
                self.own_load.slots = max(self.own_load.slots, peak)
        return wait

    def _forget_before(self, cutoff: float) -> None:
        # Also on every observation: a daemon nobody scrapes must not grow without bound.
        # Running sums keep `estimate()` O(1) per scrape, whatever the request rate.
        recent, sums = self._recent, self._sums
        while recent and recent[0][0] < cutoff:
            _, wait, decode = recent.popleft()
            sums[0] -= wait
            sums[1] -= decode
        if not recent:
            sums[0] = sums[1] = 0.0  # no rounding left over from the subtractions

    def estimate(self) -> Estimate:
        self._forget_before(self._clock() - self._window)
        recent = self._recent
        mean_wait = max(0.0, self._sums[0]) / len(recent) if recent else None
        mean_decode = max(0.0, self._sums[1]) / len(recent) if recent else None
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
