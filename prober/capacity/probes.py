"""Queue depth from probes alone: the engine serves other clients and reports nothing.

What each probe yields (`ProbeSample`), and how the figures follow (docs/design.md §6):

- its queue wait `W = (t_first_token − t_send) − prefill`, with the server's own prefill where
  it reports one, else the lower-envelope baseline;
- its decode gap: the median gap between its tokens, which grows with the batch it decodes in,
  `gap(b) ≈ α + β·(b − 1)` (the model llm-d's variant autoscaler uses). α is the lowest gap of
  any probe (a probe decoding alone); β is the jump in a probe's gaps when its companion probe
  joins its batch (`observe_pair`), or, with the slot count known, the secant from α to the gap
  of probes that decoded at full batch;
- its service time (prefill + decode), which at full batch gives the drain rate: a queue only
  exists while every slot is busy, and then the engine admits requests at `μ = slots / T`,
  T the service time of a request of the traffic's mean shape (`Traffic`): the `traffic:` the
  operator gave (or `traffic: probes`, the probes' own), else the one the engine's request
  and token counters give. No reading tried so far gives T without a shape (`bench/README.md`,
  the drain rate), so where nobody gave one (`Drain.PROBE_SHAPE`) no waiting figure is made:
  the probes' own shape assumed read 25 waiting for a true 4 against answers 7.5 times the
  probes'. The wait in seconds, the running figure and whether a queue exists need no shape.

Waiting: a probe that finds every slot busy is admitted at a departure, so it waits for the
`L` requests ahead of it and the residual time to the first departure, on average one interval
when the slots finish independently (their merged departures are close to a Poisson stream):
`W ≈ (L + 1) / μ`, hence `L ≈ μ·W − 1`; one that finds a slot free has none ahead. Over the
probes of the last 5 s (at least the last four) `L ≈ μ·W̄ − q`, W̄ the mean wait with a free
slot's counted 0 and q the share that found every slot busy (`μ·W − 1` where all did); or,
where longer, what a probe still without its first token has already waited, so a queue
shows before the probe that is stuck in it comes back.
Running: every slot while a queue lasts the whole window; otherwise what the probes of the
last 10 s met as they came, `q·slots + (1 − q)·b`: q the share of them that found every slot
busy, b the other sequences the rest decoded beside, `(gap − α) / β`, less the prober's own
companion where it decoded too, made only where one more sequence lengthens the step by a
fifth of α or more (`decode._MIN_SLOWDOWN`, judged by the pairs' median or mean jump,
whichever clears it: `DecodeModel._pair_beta`). The prober's own probes in flight are counted
exactly in b, time-averaged like the rest.
Slots: the operator's hint, else learned once probes have decoded at full batch:
`1 + (gap_full − α) / β`, with β from at least 40 pairs.

This module owns the estimator (`ProbesAloneEstimator`) and the records it takes and gives; the
decode model and the slots it learns are `decode`'s, the prober's own probes in flight
`inflight`'s.
"""

from __future__ import annotations

import itertools
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prober.capacity.decode import MIN_FULL, DecodeModel
from prober.capacity.inflight import ProbesInFlight
from prober.kinds import Basis, Drain

_RECENT_SECONDS = 5.0  # waits: probes a second apart, about a 5 s mean
# ... and at least the last four: in a queue a probe's job takes its wait and its decode (3 to
# 4 s at twice the slots on llama-server, 12 s on a slow CPU's vLLM), so the window holds few.
# With one, the figure jumped each time the older of two probes left the window, the
# information unchanged (there: 1.5 requests high for two seconds, where the true depth was
# 5). Each wait is the sum of about L + 1 departure intervals, so μ·W of one probe varies by
# about √(L + 1) requests: two waits (a probe and its companion, one cycle) left an error of
# 1.3 at a true 4.8 on vLLM; four halve its variance. Where probes are frequent
# (no queue, or a short one) the 5 s window holds four anyway and nothing lags more.
_MIN_WAITS = 4
# Below saturation one probe sees a batch that comes and goes within its decode: the running
# figure averages the probes of a longer window.
_RUNNING_SECONDS = 10.0
_SERVICE_SECONDS = 30.0  # full-batch service times: the drain rate of the last half minute
_STALE_SECONDS = 300.0  # past this, an old probe says nothing about now
# A probe is admitted at a departure. From a random instant the next departure is, on
# average, (1 + cv²) / 2 intervals away, cv the variation of the intervals between
# departures; slots that finish independently of each other merge into a stream close to a
# Poisson one (cv ≈ 1): one interval.
_RESIDUAL_DEPARTURES = 1.0


@dataclass(frozen=True, slots=True)
class Shape:
    """Prompt and output tokens of a request, or the mean of many (a fraction then)."""

    prompt_tokens: float
    output_tokens: float


@dataclass(frozen=True, slots=True)
class Traffic:
    """The mean shape of the engine's other requests and who gave it: the operator
    (`Drain.TRAFFIC`, `Drain.TRAFFIC_PROBES`) or the engine's counters (`Drain.ENGINE_SHAPE`);
    `shape` is None where nobody did (`Drain.PROBE_SHAPE`)."""

    shape: Shape | None
    basis: Drain


@dataclass(frozen=True, slots=True)
class ProbeSample:
    """What one finished probe says about the engine, in seconds."""

    at: float  # estimator clock when it finished
    wait: float
    prefill: float
    decode: float  # first token to end
    gap: float | None  # median per-token gap while it decoded without a companion
    queued: bool  # it waited for a slot: it then decoded at full batch
    # (median gap, own sequences beside it) of each stretch of its decode: before its
    # companion joined (0), and while the companion decoded beside it (1).
    stretches: tuple[tuple[float, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ProbesAloneEstimate:
    waiting: float | None
    running: float | None
    wait_seconds: float | None
    slots: int | None
    basis: Basis
    drain: float | None = None  # departures per second while a queue lasts
    drain_basis: Drain = Drain.NONE
    queue: bool = False  # the wait says requests wait now, however many


class ProbesAloneEstimator:
    """Waiting and running requests of an engine whose traffic the prober does not send."""

    def __init__(
        self,
        probe: Shape,
        traffic: Callable[[], Traffic],
        slots_hint: int | None,
        probes: ProbesInFlight,
        clock: Callable[[], float],
    ) -> None:
        """`traffic`: the shape of the engine's other requests now, and who gave it."""
        self._probe, self._traffic = probe, traffic
        self._hint = slots_hint
        self.probes = probes
        self._clock = clock
        self.decode = DecodeModel()
        self._samples: deque[ProbeSample] = deque(maxlen=256)
        # (at, prefill, decode) of probes at full batch: scaled to the traffic's shape when
        # read, as the shape the engine's counters give moves.
        self._full_service: deque[tuple[float, float, float]] = deque(maxlen=32)
        # How many of the last full-batch service times came after the last probe that found
        # a free slot: the current queue's own (see `_service`).
        self._queue_run = 0

    def observe(self, sample: ProbeSample) -> None:
        self._samples.append(sample)
        if sample.gap is not None:
            self.decode.observe(sample.gap, full_batch=sample.queued)
        if sample.queued:
            self._full_service.append((sample.at, sample.prefill, sample.decode))
            self._queue_run = min(self._queue_run + 1, len(self._full_service))
        else:
            self._queue_run = 0

    def drain(self, now: float, slots: int | None, traffic: Traffic) -> float | None:
        """Departures per second while a queue lasts, `slots / T` from the probes' service time
        at full batch scaled to the traffic's shape; None without the slots, a queued probe or
        a shape."""
        if slots is None or traffic.shape is None:
            return None
        service = self._service(now, traffic.shape)
        return slots / service if service > 0 else None

    def _traffic_service(self, prefill: float, decode: float, shape: Shape) -> float:
        """Service time of a request of `shape`, scaled from a probe's prefill and decode."""
        p = self._probe
        decode_share = max(shape.output_tokens - 1, 0.0) / max(p.output_tokens - 1, 1)
        return prefill * shape.prompt_tokens / p.prompt_tokens + decode * decode_share

    def typical_decode(self) -> float | None:
        """Median decode seconds of the last few probes."""
        last = list(itertools.islice(reversed(self._samples), 8))
        return statistics.median(s.decode for s in last) if last else None

    @property
    def slots(self) -> int | None:
        return self._hint if self._hint is not None else self.decode.learned_slots()

    @property
    def learning(self) -> bool:
        """Pairs still wanted with every probe (see `DecodeModel.learning`), and, without a
        hint, for as long as the slots are not learned (more pairs settle β)."""
        if self._hint is None and self.decode.learned_slots() is None:
            return True
        return self.decode.learning(slots_known=self._hint is not None)

    def estimate(self, prefill_guess: float) -> ProbesAloneEstimate:
        now = self._clock()
        traffic = self._traffic()
        recent = self._recent(now, least=_MIN_WAITS)
        if not recent:
            return ProbesAloneEstimate(
                None, None, None, self.slots, Basis.NONE, drain_basis=traffic.basis
            )
        waits = [s.wait for s in recent]
        live = [w - prefill_guess for w in self.probes.waited(now)]
        wait = max([statistics.fmean(waits), *live])
        own_waiting, own_holding = self.probes.occupancy(now, _RECENT_SECONDS, prefill_guess)
        slots = self.slots
        drain = self.drain(now, slots, traffic)
        free = queue_threshold(self._step(recent))
        queue = wait > free
        # No shape, no depth: a figure from the probes' shape would be an assumption nobody
        # made. Whether a queue exists needs none.
        waiting: float | None = None
        if traffic.shape is not None:
            waiting = _waiting(waits, live, free, drain) if queue else 0.0
        told = traffic.basis
        if slots is None:
            # No slots, no figure: a running count from the decode slowdown alone read 5.9
            # for 2.4 on vLLM without the hint, whose step barely grows.
            return ProbesAloneEstimate(None, None, wait, None, Basis.NONE, drain, told, queue)
        # Every slot is busy while a queue lasts. Where the decode slowdown cannot tell the
        # batch, or has not been read yet (a daemon started into a queue), running is known
        # only while a queue lasts throughout. A queue that lasted part of the window is in
        # the running figure already: its share of the probes met it (`_running`).
        running: float | None = float(slots)
        if not _queue_throughout(waiting, queue, [*waits, *live], free):
            running = self._running(self._recent(now, _RUNNING_SECONDS), slots, own_holding)
        # Otherwise a running figure missing for want of data (pairs that have not yet said
        # whether the slowdown can be read, no recent decode) leaves the estimate without a
        # basis; one that the pairs say the decode slowdown cannot give (a jump under a fifth
        # of α, or none: `DecodeModel.resolves`) does not.
        unseeable = self.decode.settled() and not self.decode.resolves(None)
        if waiting is None or (running is None and not unseeable):
            # With the slots hinted, running (and saturation below the knee) needs no drain
            # rate: it is made before any probe has queued, and with no shape given.
            return ProbesAloneEstimate(
                waiting, running, wait, slots, Basis.NONE, drain, told, queue
            )
        basis = Basis.PROBES_HINT if self._hint is not None else Basis.PROBES_LEARNED
        waiting += own_waiting
        return ProbesAloneEstimate(waiting, running, wait, slots, basis, drain, told, queue)

    def _recent(
        self, now: float, seconds: float = _RECENT_SECONDS, least: int = 1
    ) -> list[ProbeSample]:
        """The samples of the last `seconds`, or the last `least` of them if fewer (none
        older than `_STALE_SECONDS`)."""
        samples = [s for s in self._samples if s.at >= now - seconds]
        if len(samples) >= least:
            return samples
        last = itertools.islice(reversed(self._samples), least)
        return [s for s in last if s.at >= now - _STALE_SECONDS]

    def _step(self, recent: list[ProbeSample]) -> float | None:
        """The decode step that tells a queue from a free slot: at full batch where seen."""
        gaps = [s.gap for s in recent if s.gap is not None]
        return self.decode.gap_full or (statistics.median(gaps) if gaps else None)

    def _service(self, now: float, shape: Shape) -> float:
        """Median full-batch service time of the current queue's own probes (of the last
        `_SERVICE_SECONDS`, at least the last `MIN_FULL`), so the drain rate follows the
        engine's pace; before the queue has one, of every queued probe's. A probe that waited
        briefly at light load decoded in a batch soon short again: its service is shorter
        than a full batch's, and mixed into a lasting queue's it held μ high (on
        llama-server, the half-minute after a light load read about a tenth fast: a waiting
        figure half a request high at twice the slots; on vLLM, while a queue had fewer than
        three probes of its own, μ read 7 % fast)."""
        full = self._full_service
        queue = list(itertools.islice(full, len(full) - self._queue_run, None))
        recent = _recent_service(queue, now) or _recent_service(full, now)
        services = [self._traffic_service(prefill, decode, shape) for prefill, decode in recent]
        return statistics.median(services) if services else 0.0

    def _running(self, recent: list[ProbeSample], slots: int, own_holding: float) -> float | None:
        """The time-averaged batch, from what the recent probes met as they came: a probe
        that found every slot busy (its share `q` of the probes: the share of the time every
        slot was busy, probes being sent independently of the traffic) says `slots`; the
        others say the sequences they decoded beside (less our companion), plus our probes
        now: `q·slots + (1 − q)·(beside + ours)`.

        Blending the batch the stretches read with the waiting figure instead (every slot for
        `min(waiting, 1)` of the window) counted the probes that met a queue twice, their
        full-batch stretches and the queue's share, and carried the waiting figure's error
        into the running one, (slots − running) times over: at half the capacity on the
        simulator without the hint, a waiting figure 0.36 high (0.64 for 0.28) made about
        0.6 of a running figure 0.86 high (MAE 0.90, bound 1; docs/flakiness.md)."""
        readable = [
            (s.queued, others) for s in recent if (others := self._beside(s, slots)) is not None
        ]
        if not readable:
            return None
        free = [o for queued, values in readable if not queued for o in values]
        met = sum(queued for queued, _ in readable) / len(readable)
        if not free:
            return float(slots)
        batch = min(statistics.fmean(free) + own_holding, float(slots))
        return met * slots + (1 - met) * batch

    def _beside(self, sample: ProbeSample, slots: int) -> list[float] | None:
        """Foreign sequences beside `sample` in each stretch of its decode (less our own
        companion, at most `slots` − 1); None where none can be read."""
        stretches = sample.stretches or (((sample.gap, 0),) if sample.gap is not None else ())
        values = [
            min(max(0.0, others - ours), slots - 1.0)
            for gap, ours in stretches
            if (others := self.decode.others(gap, None)) is not None
        ]
        return values or None


def _waiting(
    waits: list[float], live: list[float], free: float, drain: float | None
) -> float | None:
    """Foreign requests waiting now, None while μ is unknown. A probe that found every slot
    busy waited `(L + 1) / μ`; one that found a slot free waited no departure (what it waited
    is a step boundary, `free`), so over the window `L ≈ μ·W̄ − q`, W̄ the mean of the busy
    finders' waits over every probe and q their share. Where all of them waited this is
    `μ·W − 1`; where few did, subtracting a whole departure from the mean read a passing queue
    low (0.12 to 0.15 of the saturation at 0.8 of the capacity, docs/flakiness.md). A probe
    still without its token waited at least `μ·w − 1` ahead of it."""
    if drain is None:
        return None
    busy = [w for w in waits if w > free]
    window = (drain * sum(busy) - _RESIDUAL_DEPARTURES * len(busy)) / len(waits)
    stuck = (drain * w - _RESIDUAL_DEPARTURES for w in live)
    return max(0.0, window, *stuck)


def _queue_throughout(waiting: float | None, queue: bool, waits: list[float], free: float) -> bool:
    """Whether a queue lasted the whole window, every slot busy throughout: a waiting
    figure of a request or more, or, its length unknown (no traffic shape, or no drain rate
    yet), every recent probe, those still without a token included, found one (waited
    longer than a `free` slot's wait), a figure that needs no shape."""
    if waiting is not None:
        return waiting >= 1
    return queue and all(w > free for w in waits)


def _recent_service(
    services: Sequence[tuple[float, float, float]], now: float
) -> list[tuple[float, float]]:
    """(prefill, decode) of the full-batch probes of the last `_SERVICE_SECONDS`, or of the
    last `MIN_FULL` if fewer."""
    recent = [(p, d) for at, p, d in services if at >= now - _SERVICE_SECONDS]
    if len(recent) < MIN_FULL:
        recent = [(p, d) for _, p, d in itertools.islice(reversed(services), MIN_FULL)]
    return recent


def queue_threshold(gap: float | None) -> float:
    """Waits up to two decode steps (and 20 ms of network) are a free slot, not a queue:
    an engine admits a new request between steps."""
    return 0.02 + 2 * (gap or 0.0)
