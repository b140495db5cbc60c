"""Queue-depth estimate from what a client can see (docs/design.md §6).

Queue wait of one request: `W_q = (t_first_token − t_send) − prefill(n_prompt)`. The prefill
is the server's own figure where it reports one (llama-server `timings.prompt_ms`, Ollama
`prompt_eval_duration`); otherwise a baseline learned from the lower envelope of TTFT versus
prompt length (TTFT grows linearly with prompt length when nothing queues).

Waiting and running requests, by the first basis that has what it needs:
1. own load: the prober's background load is the traffic. Of its requests in flight, those
   beyond the engine's parallel slots wait, and no request that already has its first token
   waits: `waiting = min(awaiting_first_token, max(0, in_flight − slots))`, with `slots` the
   operator's hint or the most requests seen holding a slot at once (`SlotOccupancy`).
2. probes: the traffic is someone else's; the probes' queue wait, decode slowdown and service
   time give both figures (`probes.ProbesAloneEstimator`), with the slots hinted or learned, and
   waiting only where the traffic's shape is stated or counted by the engine.
3. the server's completion counter as the drain rate, `L_q = μ · W_q` (Little's law on the
   queue: a queue only exists when every slot is busy, so it drains at capacity).
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from prober.capacity.decode import median_gap
from prober.capacity.probes import ProbesAloneEstimator, ProbeSample, queue_threshold
from prober.kinds import Basis, Drain
from prober.result import RequestResult

_ENVELOPE_BINS = 24  # log2 bins of prompt length: 1 .. 16M tokens
_WINDOW_SECONDS = 30.0
# Slot handoffs between consecutive requests are not overlaps.
_HANDOFF_MARGIN_SECONDS = 0.05
_PAIR_GAPS = 4  # gaps on each side of a companion's join
# `SlotOccupancy`: starts that saw `c` or more, as a share of those that saw the next lower
# count seen or more, for `c` to count as the slots.
_SUPPORT = 0.2


@dataclass(frozen=True, slots=True)
class Estimate:
    waiting: float | None
    running: float | None
    wait_seconds: float | None
    basis: Basis = Basis.NONE
    slots: int | None = None
    drain: float | None = None  # departures per second while a queue lasts
    drain_basis: Drain = Drain.NONE
    # Whether requests wait now, where that is known without their number (probes alone: a
    # wait over a free slot's); None where `waiting` says it.
    queue: bool | None = None


class OwnLoad:
    """Live counts the load driver keeps for its in-flight requests.

    `slots` is the engine's parallel slots as the estimator's `SlotOccupancy` learns them
    from finished requests (not from requests in flight: one whose stream has not ended may
    already have handed its slot to the next, and counting it read 5 slots on a 4-slot
    llama-server under load).
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

    def finished(self, *, had_first_token: bool) -> None:
        self.total -= 1
        if not had_first_token:
            self.awaiting_first_token -= 1


class SlotOccupancy:
    """The most requests seen holding an engine slot at once, read so a stray handoff cannot
    raise it.

    A finished request held its slot from `first token − prefill` (prefill: the server's own
    figure, else the envelope baseline) until its last token. Whenever a queue existed, every
    slot was held, so the overlap of these intervals reaches the slot count. Intervals are
    shrunk by a small margin at both ends, so a slot handed from one request to the next is not
    counted twice.

    The start of each interval sees some number of intervals holding a slot (itself included).
    The slots are the largest count `c` whose starts (those that saw `c` or more) are at least
    `_SUPPORT` of those that saw the next lower count seen, or more, over the kept intervals.
    Under a queue nearly every start sees the whole house, so the true count passes at once; a
    handoff whose timing misleads by more than the margin is a few starts among many and does
    not (vLLM's CPU build read 5 slots for `--max-num-seqs 4` by the plain peak). With few
    intervals it is the plain peak. `peak` never falls: a quiet spell does not unlearn slots.
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
        self._intervals.append([start, end, float(count)])
        self.peak = max(self.peak, self._supported())
        return self.peak

    def _supported(self) -> int:
        seen = sorted(Counter(int(interval[2]) for interval in self._intervals).items())
        higher, at_least = seen.pop()  # the top count, and the starts that saw it or more
        while seen:
            count, starts = seen.pop()
            if at_least >= _SUPPORT * (at_least + starts):
                return higher
            higher, at_least = count, at_least + starts
        return higher


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
    """One target's estimate; `observe()` each finished request, `estimate()` at scrape time.

    `slots_hint` is the operator's slot count; `probes_alone` estimates from probes alone;
    `server_drain_rate` is the engine's completion rate where its counters are scraped.
    """

    def __init__(
        self,
        *,
        window_seconds: float = _WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        slots_hint: int | None = None,
        probes_alone: ProbesAloneEstimator | None = None,
        own_load: OwnLoad | None = None,
        server_drain_rate: Callable[[], float | None] = lambda: None,
    ) -> None:
        self._window = window_seconds
        self._clock = clock
        self._baseline = PrefillBaseline()
        self._occupancy = SlotOccupancy()
        # (finish time, queue wait, decode seconds) of recent successful requests.
        self._recent: deque[tuple[float, float, float]] = deque()
        self._sums = [0.0, 0.0]  # of the waits and decode times in `_recent`, kept as it moves
        self._slots_hint = slots_hint
        self._prefills: deque[float] = deque(maxlen=16)
        self.probes_alone = probes_alone
        self.own_load = own_load
        self.server_drain_rate = server_drain_rate

    def observe(self, result: RequestResult, *, probe: bool = False) -> float | None:
        """Learn from one result; return its estimated queue wait (None if it had no token).

        A probe's result also feeds the probes-alone estimate; a load request's does not.
        """
        learned = self._learn(result)
        if learned is None:
            return None
        wait, prefill = learned
        if probe and self.probes_alone is not None and _decoded(result):
            stamps = result.token_event_ns
            gap = median_gap(stamps, _tokens_per_event(result))
            self.probes_alone.observe(self._sample(result, wait, prefill, gap))
        return wait

    def observe_pair(
        self, primary: RequestResult, companion: RequestResult
    ) -> tuple[float | None, float | None]:
        """A probe and the companion sent while it decoded: both are probes, and the first
        probe's gaps before and after the companion joined its batch give the slowdown of one
        more sequence. Returns both queue waits."""
        waits = self._learn(primary), self._learn(companion)
        out = tuple(None if w is None else w[0] for w in waits)
        alone = self.probes_alone
        if alone is None or waits[0] is None or not _decoded(primary):
            return out[0], out[1]
        per_event = _tokens_per_event(primary)
        before, after = _split_at_companion(primary, companion)
        gap_before = median_gap(before, per_event)
        beside = median_gap(after, per_event)
        stretches = tuple(
            (gap, own) for gap, own in ((gap_before, 0), (beside, 1)) if gap is not None
        )
        alone.observe(self._sample(primary, *waits[0], gap_before, stretches=stretches))
        # The jump is read from the gaps right before and right after the join: the other
        # sequences change less in a few steps than over the whole decode.
        near_before = median_gap(before[-_PAIR_GAPS - 1 :], per_event)
        if waits[1] is not None and _decoded(companion):
            comp_wait, comp_prefill = waits[1]
            # Judged queued by the first probe's gap: the same engine, at the same moment.
            sample = self._sample(
                companion,
                comp_wait,
                comp_prefill,
                None,
                step=gap_before,
                stretches=_companion_stretches(primary, companion),
            )
            alone.observe(sample)
            gap_after = median_gap(after[: _PAIR_GAPS + 1], per_event)
            free_slot = comp_wait <= queue_threshold(gap_before)
            if free_slot and near_before is not None and gap_after is not None:
                alone.decode.observe_pair(near_before, gap_after)
        return out[0], out[1]

    def _learn(self, result: RequestResult) -> tuple[float, float] | None:
        """(queue wait, prefill) of one result, after learning the baseline and slots from it."""
        if result.t_first_token_ns is None:
            return None
        to_first = (result.t_first_token_ns - result.t_send_ns) / 1e9
        prompt = result.prompt_tokens or 0
        self._baseline.observe(prompt, to_first)
        prefill = result.server_prefill_seconds
        if prefill is None:
            prefill = self._baseline(prompt) or 0.0
        self._prefills.append(prefill)
        wait = max(0.0, to_first - prefill)
        if _decoded(result):
            # A slot is free once the last token is out: the end of the stream (usage,
            # [DONE]) can reach the client after the next request already has that slot.
            assert result.t_last_token_ns is not None
            decode = (result.t_last_token_ns - result.t_first_token_ns) / 1e9
            now = self._clock()
            self._recent.append((now, wait, decode))
            self._sums[0] += wait
            self._sums[1] += decode
            self._forget_before(now - self._window)
            slot_start = result.t_first_token_ns / 1e9 - prefill
            peak = self._occupancy.add(slot_start, result.t_last_token_ns / 1e9)
            if self.own_load is not None:
                self.own_load.slots = max(self.own_load.slots, peak)
        return wait, prefill

    def _sample(
        self,
        result: RequestResult,
        wait: float,
        prefill: float,
        gap: float | None,
        *,
        step: float | None = None,
        stretches: tuple[tuple[float, int], ...] = (),
    ) -> ProbeSample:
        """`step`: the decode gap that tells a queue from a free slot, the probe's own if unset."""
        assert result.t_first_token_ns is not None
        assert result.t_last_token_ns is not None
        # To the last token: the slot is free then, whenever the stream's end arrives.
        decode = (result.t_last_token_ns - result.t_first_token_ns) / 1e9
        queued = wait > queue_threshold(gap if step is None else step)
        return ProbeSample(self._clock(), wait, prefill, decode, gap, queued, stretches)

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
        own = self.own_load
        if own is not None and (slots := self._slots_hint or own.slots) > 0:
            own_waiting = min(own.awaiting_first_token, max(0, own.total - slots))
            running = float(min(own.total, slots))
            return Estimate(float(own_waiting), running, mean_wait, Basis.OWN_LOAD, slots)
        if self.probes_alone is not None:
            prefill = statistics.median(self._prefills) if self._prefills else 0.0
            f = self.probes_alone.estimate(prefill)
            if f.basis is not Basis.NONE or self.server_drain_rate() is None:
                return Estimate(
                    f.waiting,
                    f.running,
                    f.wait_seconds,
                    f.basis,
                    f.slots,
                    f.drain,
                    f.drain_basis,
                    f.queue,
                )
        drain = self.server_drain_rate()
        if drain is None or mean_wait is None:
            return Estimate(None, None, mean_wait)
        mean_decode = max(0.0, self._sums[1]) / len(recent)
        return Estimate(
            drain * mean_wait,
            drain * mean_decode,
            mean_wait,
            Basis.SERVER,
            drain=drain,
            drain_basis=Drain.SERVER,
        )


def _decoded(result: RequestResult) -> bool:
    return result.ok and result.t_first_token_ns is not None and result.t_last_token_ns is not None


def _tokens_per_event(result: RequestResult) -> float:
    return max(1.0, result.output_tokens / max(len(result.token_event_ns), 1))


def _companion_stretches(
    primary: RequestResult, companion: RequestResult
) -> tuple[tuple[float, int], ...]:
    """The companion's decode beside the first probe (one own sequence) and after it (none).

    The first probe's decode ends with its last token, as everywhere in the estimate: its
    slot is free then, whenever the rest of its stream reaches the client."""
    end = primary.t_last_token_ns
    if end is None:
        return ()
    per_event = _tokens_per_event(companion)
    stamps = companion.token_event_ns
    beside = median_gap([t for t in stamps if t <= end], per_event)
    alone = median_gap([t for t in stamps if t > end], per_event)
    return tuple((gap, own) for gap, own in ((beside, 1), (alone, 0)) if gap is not None)


def _split_at_companion(
    primary: RequestResult, companion: RequestResult
) -> tuple[list[int], list[int]]:
    """The first probe's token stamps before the companion was sent, and while it decoded."""
    stamps = primary.token_event_ns
    before = [t for t in stamps if t <= companion.t_send_ns]
    first, last = companion.t_first_token_ns, companion.t_last_token_ns
    if first is None or last is None:
        return before, []
    return before, [t for t in stamps if first <= t <= last]
