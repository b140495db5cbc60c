"""Queue depth from probes alone: the engine serves other clients and reports nothing.

What each probe yields (`ProbeSample`), and how the figures follow (README, "Queue depth"):

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

Waiting: a probe is admitted at a departure, so it waits for the `L` requests ahead of it and
the residual time to the first departure, on average one interval when the slots finish
independently (their merged departures are close to a Poisson stream): `W ≈ (L + 1) / μ`,
hence `L ≈ μ·W − 1`. `W` is the mean of the last 5 s of probes (at least the last two), or
the wait a probe still without its first token has already served, whichever is longer, so
a queue shows before the probe that is stuck in it comes back.
Running: every slot while a queue exists (a queue of less than one request for its share of
the window, where its length is known); otherwise the other sequences the recent probes
decoded beside, `(gap − α) / β`, less the prober's own companion where it decoded too, made
only where one more sequence lengthens the step by a fifth of α or more (`_MIN_SLOWDOWN`).
The prober's own probes in flight are counted exactly on top, time-averaged like the rest.
Slots: the operator's hint, else learned once probes have decoded at full batch:
`1 + (gap_full − α) / β`, with β from at least 40 pairs.
"""

from __future__ import annotations

import itertools
import random
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prober.kinds import Basis, Drain

_RECENT_SECONDS = 5.0  # waits: probes a second apart, about a 5 s mean
# ... and at least the last two: in a queue a probe's job takes its wait and its decode (3 to
# 4 s at twice the slots on llama-server), and with one the figure jumped each time the
# older of two probes left the window, the information unchanged (there: 1.5 requests high
# for two seconds, where the true depth was 5).
_MIN_WAITS = 2
# Below saturation one probe sees a batch that comes and goes within its decode: the running
# figure averages the probes of a longer window.
_RUNNING_SECONDS = 10.0
_SERVICE_SECONDS = 30.0  # full-batch service times: the drain rate of the last half minute
_STALE_SECONDS = 300.0  # past this, an old probe says nothing about now
# The running figure's β is the median jump of the pairs (`_pair_beta`). Of five, three
# disturbed ones (below) decide it, a likely cause of the 3.46 running read for 2.23 at half
# load on CI (2026-12-03, the hinted simulator, before its first full batch): eight.
_MIN_PAIRS = 8
# Slots are read from β, which pairs give from jumps clustered at 0, β and 2β (a foreign
# request leaving or joining while a pair is read: together about half of the pairs at half
# load on the simulator, 2026-12-03, some of them between clusters). `one_more` finds β's
# cluster from the jumps' mean. In a model of those jumps (`bench/slots_learning.py`) that
# misses 10 to 24 % of learnings with 15 pairs and 0.5 to 5 % with 40, where a median seed
# missed 12 to 29 % and 1.4 to 10 % (seen on the simulator's test with 15 pairs and the
# median: 18 and 3 slots learned for 4 in seven runs).
_MIN_SLOT_PAIRS = 40
_MIN_GAPS = 2  # per side of a pair, and per probe for a gap at all
_MIN_FULL = 3  # probes seen decoding at full batch before the slots are learned
_MAX_SLOTS = 4096
_CLUSTER_STEPS = 8  # `one_more`: it settles in two or three
# `learned_slots`: resamples of the pairs and full-batch gaps, and the share of them that must
# read the same slots. In the model of `bench/slots_learning.py` (the simulator's jumps, gaps
# noisy by 0.3 to 1 ms against a β of 6 ms; 2026-12-04), 40 pairs read a wrong count 0.4 to
# 6 % of the time unguarded, 0 to 0.3 % guarded, unknown 4 to 40 %; 64 pairs 0 to 2 % wrong
# unguarded, never guarded, unknown 0.5 to 22 %. With noise half of β, unguarded 50 to 64 %
# wrong; guarded 0.3 to 8 %, the rest unknown.
_SLOTS_RESAMPLES = 64
_SLOTS_AGREEMENT = 0.8
# The running figure below saturation reads the batch from how much a probe's gap grew over
# α; it is made only where one more sequence lengthens the step by at least this share of α.
# Between probes at one batch size, gaps moved by 13 to 28 % of their length on a 2-core
# machine (2026-12-04, `bench/decode_slowdown.py`). One more sequence lengthened the step by
# 0.30 of α on the simulator the tests run (pairs' median jump over the least gap) and 1.12 on
# llama-server, but by −0.05 on vLLM's CPU build (0.04 by least squares against its own count).
# There the figure read 3.0 for a true 1.6 and 3.5 for 2.8, whatever the load. A GPU far from its
# compute limit reads its weights once a step whatever the batch: expected as flat (unmeasured).
_MIN_SLOWDOWN = 0.2
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
class ForeignEstimate:
    waiting: float | None
    running: float | None
    wait_seconds: float | None
    slots: int | None
    basis: Basis
    drain: float | None = None  # departures per second while a queue lasts
    drain_basis: Drain = Drain.NONE
    queue: bool = False  # the wait says requests wait now, however many


def median_gap(stamps: list[int] | tuple[int, ...], tokens_per_event: float) -> float | None:
    """Median seconds per token between token events; None with too few events.

    Events carrying several tokens each (a stream interval) spread their gap over them."""
    if len(stamps) < _MIN_GAPS + 1:
        return None
    gaps = [(b - a) / 1e9 for a, b in itertools.pairwise(stamps)]
    return statistics.median(gaps) / tokens_per_event


class DecodeModel:
    """`gap(b) = α + β·(b − 1)`, learned from probes and pairs of probes."""

    def __init__(self) -> None:
        self._gaps: deque[float] = deque(maxlen=256)
        self._full: deque[float] = deque(maxlen=32)
        self._jumps: deque[float] = deque(maxlen=64)
        self._seen = 0  # observations so far: the learned slots are read again once it moves
        self._slots: tuple[int, int | None] = (-1, None)  # (at `_seen`, the slots learned)

    def observe(self, gap: float, *, full_batch: bool) -> None:
        self._gaps.append(gap)
        self._seen += 1
        if full_batch:
            self._full.append(gap)

    def observe_pair(self, before: float, after: float) -> None:
        """A probe's gap before and after its companion joined: one more sequence."""
        self._jumps.append(after - before)
        self._seen += 1

    @property
    def alpha(self) -> float | None:
        return min(self._gaps) if self._gaps else None

    @property
    def gap_full(self) -> float | None:
        return statistics.median(self._full) if self._full else None

    def _pair_beta(self) -> float | None:
        """The median jump: the slope across the batches the pairs were read at, for the
        running figure. On llama-server, whose step does not grow linearly with the batch,
        `one_more` put that figure's MAE at half load at 0.63 to 1.10 against a bound of
        1.00 in four runs (three reading high); the median at 0.43 to 0.78 in seven."""
        if len(self._jumps) < _MIN_PAIRS:
            return None
        beta = statistics.median(self._jumps)
        return beta if beta > 0 else None

    def beta(self, slots: int | None) -> float | None:
        """The secant from a probe alone to a full batch where both are measured (two well
        observed anchors), else the median jump of pairs (noisier: the other sequences come
        and go while a pair is read)."""
        alpha, full = self.alpha, self.gap_full
        if slots is None or slots < 2 or alpha is None or full is None or full <= alpha:
            return self._pair_beta()
        return (full - alpha) / (slots - 1)

    def learning(self, slots_known: bool) -> bool:
        """Too few pairs yet to tell the slowdown of one more sequence, or, where the slots
        must be learned, too few to read them from."""
        return len(self._jumps) < (_MIN_PAIRS if slots_known else _MIN_SLOT_PAIRS)

    def learned_slots(self) -> int | None:
        """`1 + (gap_full − α) / β`, β the jump of one more sequence (`one_more`), where the
        data agree on it: read again from resamples of the same pairs and full-batch gaps, at
        least `_SLOTS_AGREEMENT` of the readings must give the same count, else None (the
        slots unknown, and no figure that rests on them). An engine whose step grows by little
        against the gaps' noise (vLLM on a CPU: 1 to 4 ms a sequence against 30 ms gaps)
        reads a β that moves with every few pairs, and slots with it (4, then 8 for 4 in two
        runs, 2026-12-02): saying nothing is better than a figure twice the truth."""
        if self._slots[0] != self._seen:
            self._slots = (self._seen, self._agreed_slots())
        return self._slots[1]

    def _agreed_slots(self) -> int | None:
        if len(self._jumps) < _MIN_SLOT_PAIRS or len(self._full) < _MIN_FULL:
            return None
        alpha, jumps, full = self.alpha, list(self._jumps), list(self._full)
        if alpha is None or (read := slots_from(jumps, full, alpha)) is None:
            return None
        rng = random.Random(self._seen)  # the same data, the same answer
        agree = sum(
            slots_from(rng.choices(jumps, k=len(jumps)), rng.choices(full, k=len(full)), alpha)
            == read
            for _ in range(_SLOTS_RESAMPLES)
        )
        return read if agree >= _SLOTS_AGREEMENT * _SLOTS_RESAMPLES else None

    def resolves(self, slots: int | None) -> bool:
        """Whether one more sequence lengthens the step by enough to tell the batch from the
        gaps' noise (`_MIN_SLOWDOWN` of α)."""
        return _resolved(self.alpha, self.beta(slots))

    def others(self, gap: float, slots: int | None) -> float | None:
        """Sequences that decoded beside a probe whose gap was `gap`; None where the slowdown
        of one more sequence is unknown or too small to tell (`resolves`)."""
        alpha, beta = self.alpha, self.beta(slots)
        if alpha is None or beta is None or not _resolved(alpha, beta):
            return None
        others = max(0.0, (gap - alpha) / beta)
        return others if slots is None else min(others, slots - 1.0)


def _resolved(alpha: float | None, beta: float | None) -> bool:
    """β at least `_MIN_SLOWDOWN` of α, both known."""
    return alpha is not None and beta is not None and beta >= _MIN_SLOWDOWN * alpha


def slots_from(jumps: Sequence[float], full: Sequence[float], alpha: float) -> int | None:
    """`1 + (gap_full − α) / β`: the slots that pairs' `jumps` and full-batch gaps `full` say."""
    beta = one_more(jumps)
    if beta is None:
        return None
    return min(_MAX_SLOTS, max(1, round(1 + (statistics.median(full) - alpha) / beta)))


def one_more(jumps: Iterable[float]) -> float | None:
    """β from the jumps of pairs: the centre of the cluster of one more sequence.

    The jumps cluster at 0 (a foreign request left while the companion joined), β and 2β
    (one joined too), each cluster spread by the noise of the gaps, with a few between (a
    change in the middle of the gaps a jump is read from). Foreign requests leave about as
    often as they join, so the jumps' mean lands near β; their median is in whichever
    cluster holds the middle pair, by chance the 0 or the 2β one (`_MIN_SLOT_PAIRS`).
    Inside β's cluster the slots read from β still move with where β lands (on the
    simulator, β 6 ms, jumps of 3.4 to 6.9 ms in its cluster read 5 and 6 slots for 4), so
    from the mean on, until it stays, β is the median of the jumps within half of it
    either way (the 0 and 2β clusters fall outside). None when the mean is not positive."""
    values = list(jumps)
    return cluster_centre(values, statistics.fmean(values)) if values else None


def cluster_centre(values: Sequence[float], seed: float) -> float | None:
    """From `seed` on, until it stays, the median of the values within half of it either
    way: the centre of the cluster `seed` lies in. None when `seed` is not positive."""
    if seed <= 0:
        return None
    centre = seed
    for _ in range(_CLUSTER_STEPS):
        near = [v for v in values if centre / 2 <= v <= 1.5 * centre]
        if not near or (again := statistics.median(near)) == centre:
            break
        centre = again
    return centre


class ProbesInFlight:
    """The prober's own probes: when each began, got its first token and ended.

    `occupancy()` gives the time-averaged number of them waiting for and holding a slot over
    the last few seconds, the same smoothing the foreign figures have."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._live: dict[int, list[float | None]] = {}  # key → [begin, first token]
        self._done: deque[tuple[float, float | None, float]] = deque(maxlen=64)
        self._keys = itertools.count()

    def begin(self) -> int:
        key = next(self._keys)
        self._live[key] = [self._clock(), None]
        return key

    def first_token(self, key: int) -> None:
        if (stamps := self._live.get(key)) is not None and stamps[1] is None:
            stamps[1] = self._clock()

    def end(self, key: int) -> None:
        if (stamps := self._live.pop(key, None)) is not None:
            begin, first = stamps
            assert begin is not None
            self._done.append((begin, first, self._clock()))

    def waited(self, now: float) -> list[float]:
        """Seconds each probe still without a first token has been in flight."""
        return [now - b for b, first in self._live.values() if b is not None and first is None]

    def occupancy(self, now: float, window: float, prefill: float) -> tuple[float, float]:
        """(waiting, holding a slot), each averaged over the last `window` seconds.

        A probe waits from its start until `first token − prefill` and holds a slot from then
        on; one still without a token waits until `now − prefill`."""
        start = now - window
        waiting = holding = 0.0
        live = ((b, f, now) for b, f in self._live.values() if b is not None)
        for begin, first, end in itertools.chain(self._done, live):
            if end < start:
                continue
            admitted = max(begin, (now if first is None else first) - prefill)
            waiting += max(0.0, min(admitted, end) - max(begin, start))
            holding += max(0.0, end - max(admitted, start))
        return waiting / window, holding / window


class ForeignEstimator:
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

    def estimate(self, prefill_guess: float) -> ForeignEstimate:
        now = self._clock()
        traffic = self._traffic()
        recent = self._recent(now, least=_MIN_WAITS)
        if not recent:
            return ForeignEstimate(
                None, None, None, self.slots, Basis.NONE, drain_basis=traffic.basis
            )
        live = [w - prefill_guess for w in self.probes.waited(now)]
        wait = max([statistics.fmean(s.wait for s in recent), *live])
        own_waiting, own_holding = self.probes.occupancy(now, _RECENT_SECONDS, prefill_guess)
        slots = self.slots
        drain = self.drain(now, slots, traffic)
        free = queue_threshold(self._step(recent))
        queue = wait > free
        # No shape, no depth: a figure from the probes' shape would be an assumption nobody
        # made. Whether a queue exists needs none.
        waiting = self._waiting(wait, drain, queue) if traffic.shape is not None else None
        running = self._running(self._recent(now, _RUNNING_SECONDS), slots, own_holding)
        told = traffic.basis
        if slots is None:
            # No slots, no figure: a running count from the decode slowdown alone read 5.9
            # for 2.4 on vLLM without the hint, whose step barely grows (2026-12-04).
            return ForeignEstimate(None, None, wait, None, Basis.NONE, drain, told, queue)
        # Every slot is busy while a queue lasts. Where the decode slowdown cannot tell the
        # batch, or has not been read yet (a daemon started into a queue), running is known
        # only while a queue lasts throughout.
        share = _queue_share(waiting, queue, [*(s.wait for s in recent), *live], free)
        if share >= 1:
            running = float(slots)
        elif share > 0 and running is not None:
            running += (slots - running) * share
        # Otherwise a running figure missing for want of data (fewer than eight pairs, no
        # recent decode) leaves the estimate without a basis; one that the pairs say the decode
        # slowdown cannot give (a jump under a fifth of α, or none: `DecodeModel.resolves`)
        # does not.
        pairs_read = not self.decode.learning(slots_known=True)
        unseeable = pairs_read and not self.decode.resolves(None)
        if waiting is None or (running is None and not unseeable):
            # With the slots hinted, running (and saturation below the knee) needs no drain
            # rate: it is made before any probe has queued, and with no shape given.
            return ForeignEstimate(waiting, running, wait, slots, Basis.NONE, drain, told, queue)
        basis = Basis.PROBES_HINT if self._hint is not None else Basis.PROBES_LEARNED
        waiting += own_waiting
        return ForeignEstimate(waiting, running, wait, slots, basis, drain, told, queue)

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

    @staticmethod
    def _waiting(wait: float, drain: float | None, queue: bool) -> float | None:
        """Foreign requests waiting now, `μ·W − 1`; 0 without a queue, None when μ is
        unknown."""
        if not queue:
            return 0.0
        if drain is None:
            return None
        return max(0.0, drain * wait - _RESIDUAL_DEPARTURES)

    def _service(self, now: float, shape: Shape) -> float:
        """Median full-batch service time of the current queue's own probes (of the last
        `_SERVICE_SECONDS`, at least the last `_MIN_FULL`), so the drain rate follows the
        engine's pace; before the queue has one, of every queued probe's. A probe that waited
        briefly at light load decoded in a batch soon short again: its service is shorter
        than a full batch's, and mixed into a lasting queue's it held μ high (on
        llama-server, the half-minute after a light load read about a tenth fast: a waiting
        figure half a request high at twice the slots; on vLLM, while a queue had fewer than
        three probes of its own, μ read 7 % fast, 2026-12-03)."""
        full = self._full_service
        queue = list(itertools.islice(full, len(full) - self._queue_run, None))
        recent = _recent_service(queue, now) or _recent_service(full, now)
        services = [self._traffic_service(prefill, decode, shape) for prefill, decode in recent]
        return statistics.median(services) if services else 0.0

    def _running(
        self, recent: list[ProbeSample], slots: int | None, own_holding: float
    ) -> float | None:
        """Sequences beside the recent probes (less our companion), plus our probes now."""
        stretches = (
            stretch
            for s in recent
            for stretch in (s.stretches or (((s.gap, 0),) if s.gap is not None else ()))
        )
        beside = ((self.decode.others(gap, None), companions) for gap, companions in stretches)
        top = float("inf") if slots is None else slots - 1.0
        others = [min(max(0.0, o - ours), top) for o, ours in beside if o is not None]
        if not others:
            return None
        running = statistics.fmean(others) + own_holding
        return running if slots is None else min(running, float(slots))


def _queue_share(waiting: float | None, queue: bool, waits: list[float], free: float) -> float:
    """The part of the window a queue lasted, every slot busy: a queue of less than one
    request was there for part of it only. Its length unknown (no traffic shape, or no drain
    rate yet), the share of the recent probes, those still without a token included, that
    found one (waited longer than a `free` slot's wait), a figure that needs no shape."""
    if waiting is not None:
        return min(waiting, 1.0)
    if not queue:
        return 0.0
    return sum(w > free for w in waits) / len(waits)


def _recent_service(
    services: Sequence[tuple[float, float, float]], now: float
) -> list[tuple[float, float]]:
    """(prefill, decode) of the full-batch probes of the last `_SERVICE_SECONDS`, or of the
    last `_MIN_FULL` if fewer."""
    recent = [(p, d) for at, p, d in services if at >= now - _SERVICE_SECONDS]
    if len(recent) < _MIN_FULL:
        recent = [(p, d) for _, p, d in itertools.islice(reversed(services), _MIN_FULL)]
    return recent


def queue_threshold(gap: float | None) -> float:
    """Waits up to two decode steps (and 20 ms of network) are a free slot, not a queue:
    an engine admits a new request between steps."""
    return 0.02 + 2 * (gap or 0.0)
