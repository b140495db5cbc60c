"""The decode model of the probes-alone estimate: how a probe's token gaps grow with the
batch it decodes in, and the slots they say.

    gap(b) ≈ α + β·(b − 1)

(the model llm-d's variant autoscaler uses). α is the lowest gap of any probe (a probe
decoding alone); β is the jump in a probe's gaps when its companion probe joins its batch
(`DecodeModel.observe_pair`), or, with the slot count known, the secant from α to the gap of
probes that decoded at full batch. The sequences beside a probe are `(gap − α) / β`, made only
where one more sequence lengthens the step by a fifth of α or more (`_MIN_SLOWDOWN`, judged by
the jumps' median or their trimmed mean, `mean_jump`, whichever clears it; first said once
the pairs are sure of it, `settled`). Slots,
without the operator's hint, are learned once probes have decoded at full batch, `MIN_FULL`
of them in a row:
`1 + (gap_full − α) / β`, β the centre of the pairs' cluster of one more sequence
(`one_more`, `cluster_centre`, `slots_from`), from at least 40 pairs.

Owns `median_gap` (a probe's gap from its token stamps), `DecodeModel` and those slot-learning
helpers; `probes.ProbesAloneEstimator` reads them.
"""

from __future__ import annotations

import bisect
import itertools
import math
import random
import statistics
from collections import deque
from collections.abc import Iterable, Sequence

# The running figure's β is the median jump of the pairs (`_pair_beta`). Of five, three
# disturbed ones (below) decide it (a running figure of 3.46 for 2.23 at half load on the
# hinted simulator, before its first full batch): eight.
_MIN_PAIRS = 8
# Slots are read from β, which pairs give from jumps clustered at 0, β and 2β (a foreign
# request leaving or joining while a pair is read: together about half of the pairs at half
# load on the simulator, some of them between clusters). `one_more` finds β's
# cluster from the jumps' mean. In a model of those jumps (`bench/slots_learning.py`) that
# misses 10 to 24 % of learnings with 15 pairs and 0.5 to 5 % with 40, where a median seed
# missed 12 to 29 % and 1.4 to 10 % (seen on the simulator's test with 15 pairs and the
# median: 18 and 3 slots learned for 4 in seven runs).
_MIN_SLOT_PAIRS = 40
_MIN_GAPS = 2  # per side of a pair, and per probe for a gap at all
# Probes seen decoding at full batch before the slots are learned, one after another (no
# probe that found a free slot between): a probe that waited for a slot while no queue
# lasted decodes at full batch only until the next request leaves. Below saturation such
# probes read 27 to 38 ms where a lasting queue's read 38 (the simulator's full batch): their
# median, 34.7 ms, read 3 slots for 4 until a queue's own outnumbered them, 34 s into it.
MIN_FULL = 3
_MAX_SLOTS = 4096
_CLUSTER_STEPS = 8  # `one_more`: it settles in two or three
_HALF_CLUSTER = 2.0  # `one_more`: how much more of the jumps make β than β/2
# `learned_slots`: resamples of the pairs and full-batch gaps, and the share of them that must
# read the same slots. In the model of `bench/slots_learning.py` (the simulator's jumps, gaps
# noisy by 0.3 to 1 ms against a β of 6 ms), 40 pairs read a wrong count 0.4 to
# 6 % of the time unguarded, 0 to 0.3 % guarded, unknown 4 to 40 %; 64 pairs 0 to 2 % wrong
# unguarded, never guarded, unknown 0.5 to 22 %. With noise half of β, unguarded 50 to 64 %
# wrong; guarded 0.3 to 8 %, the rest unknown.
_SLOTS_RESAMPLES = 64
_SLOTS_AGREEMENT = 0.8
# ... and the share that keeps a count once agreed, while the data still read it. On the
# simulator's test without the hint the data read 4 for 4 at all 59 reads over 155 s, while
# the resamples that agreed moved over 42 to 61 of 64 around the bar of 52: the slots, and
# every figure resting on them, were dropped seven times (in one run of five before, unknown
# for the last 20 s of the half-load level and the first 31 s of the first queue). In the
# model of `bench/slots_learning.py` (a learner read after every pair, 40 to 120 pairs),
# keeping at 0.65 drops a count 0.03 to 0.47 times a learner instead of 0.2 to 3.7 and
# halves the reads unknown, none wrong; where the gaps' noise is half of β the reads wrong go
# from 0.7-5.1 % to 1.0-7.9 % (keeping at 0.5: to 1-13 %), over 90 % unknown either way.
_SLOTS_KEEP = 0.65
# The running figure below saturation reads the batch from how much a probe's gap grew over
# α; it is made only where one more sequence lengthens the step by at least this share of α.
# Between probes at one batch size, gaps moved by 13 to 28 % of their length on a 2-core
# machine (`bench/decode_slowdown.py`). One more sequence lengthened the step by
# 0.30 of α on the simulator the tests run (pairs' median jump over the least gap) and 1.12 on
# llama-server, but by −0.05 on vLLM's CPU build (0.04 by least squares against its own count).
# There the figure read 3.0 for a true 1.6 and 3.5 for 2.8, whatever the load. A GPU far from its
# compute limit reads its weights once a step whatever the batch: expected as flat (unmeasured).
_MIN_SLOWDOWN = 0.2
# Whether the slowdown clears `_MIN_SLOWDOWN` is first said once the pairs are sure of what
# `readable` will say (`settled`): readable where the jumps' mean lies over the threshold by
# this many standard errors or the sign test puts their median over it (`_SIGN_LEVEL`),
# unreadable only where both put it under; or at `_MAX_UNSURE_PAIRS` pairs whatever they read.
# The simulator's jumps spread by about a fifth of α over clusters at 0, β and 2β: eight pairs
# read its 0.3 α slowdown under the threshold (a fresh machine's run: mean 0.17 α, median
# 0.07 α at the eighth pair), and pairs that bunched in the 0 cluster spread so little that
# the mean's own interval was sure of it (CI, 2026-12-07: 13 pairs, mean 0.08 α, no running
# figure for a whole level). In `bench/slowdown_decision.py`'s model a wrong first word at
# the eighth pair for 11 % of learners, the mean's alone 2.6 %, both's 1.1 % (where foreign
# requests leave more often than they join: 24, 12, 8 %); 0.5 α: 2, 0.1, 0.1 %. llama-server's
# and vLLM's settle at a median of 8 to 10 pairs. Until then the pairs go with every probe and
# no figure claims the slowdown unreadable.
_SURE_ERRORS = 2.0
_MAX_UNSURE_PAIRS = 32
# The sign test's level on either side (`_median_side`): about what two standard errors
# leave on one side of a normal mean (2.3 %).
_SIGN_LEVEL = 0.025


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
        # The full-batch gaps of runs of at least `MIN_FULL` (the slots are read from these),
        # and the current run's, until it is one.
        self._queued: deque[float] = deque(maxlen=32)
        self._run: list[float] = []
        self._jumps: deque[float] = deque(maxlen=64)
        self._seen = 0  # observations so far: the learned slots are read again once it moves
        self._slots: tuple[int, int | None] = (-1, None)  # (at `_seen`, the slots learned)
        self._beta: tuple[int, float | None] = (-1, None)  # (at `_seen`, `_pair_beta`)
        self._settled = False  # `settled`: once said, kept

    def observe(self, gap: float, *, full_batch: bool) -> None:
        self._gaps.append(gap)
        self._seen += 1
        if not full_batch:
            self._run.clear()
            return
        self._full.append(gap)
        if len(self._run) < MIN_FULL:
            self._run.append(gap)
            if len(self._run) == MIN_FULL:
                self._queued.extend(self._run)
        else:
            self._queued.append(gap)

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

    def mean_jump(self) -> float | None:
        """What one more sequence adds to the step on average over the batches the pairs were
        read at: the jumps' mean, a tenth trimmed at either end (a foreign prefill inside a
        gap). Foreign requests leave about as often as they join while a pair is read, so the
        jumps' clusters at 0 and 2β balance about β; the median lands in whichever cluster
        holds the middle pair, and an engine whose step stops growing near full batch puts
        the pairs read there in the 0 one (llama-server's gaps: 43 ms at both 3 and 4
        sequences, bench/README.md). Judged by the median, the simulator's 0.3 α slowdown read
        under the 0.2 α threshold for two thirds of a level at half load in one run of five,
        and llama-server's (0.5 to 1.1 α) for 93 % of one in one run of two
        (docs/flakiness.md). None with fewer than `_MIN_PAIRS` pairs."""
        if len(self._jumps) < _MIN_PAIRS:
            return None
        return statistics.fmean(_trimmed(self._jumps))

    def _pair_beta(self) -> float | None:
        """β for the running figure: the median jump, the slope across the batches the pairs
        were read at. On llama-server, whose step does not grow linearly with the batch,
        `one_more` put that figure's MAE at half load at 0.63 to 1.10 against a bound of
        1.00 in four runs (three reading high); the median at 0.43 to 0.78 in seven. Where the
        median landed under the threshold (in the cluster of no change) while the jumps' mean
        clears it (`mean_jump`), the mean: a β near 0 would read any gap as a full batch. The
        slowdown is readable where either clears it: each misses the simulator's 0.28 α now
        and then with a level's 8 to 16 pairs (jumps spread by 0.31 α: the mean's error 0.08
        to 0.11 α; the median's cluster comes and goes), and on vLLM's CPU build neither
        passed 0.08 α. Where neither does, the larger, which `_resolved` then refuses.
        Read again only once an observation came in: the running figure asks for it once per
        stretch of every recent probe, at each scrape."""
        if self._beta[0] != self._seen:
            self._beta = (self._seen, self._read_pair_beta())
        return self._beta[1]

    def _read_pair_beta(self) -> float | None:
        mean = self.mean_jump()
        if mean is None:
            return None
        median = statistics.median(self._jumps)
        beta = next((b for b in (median, mean) if _resolved(self.alpha, b)), max(median, mean))
        return beta if beta > 0 else None

    def beta(self, slots: int | None) -> float | None:
        """The secant from a probe alone to a full batch where both are measured (two well
        observed anchors), else the pairs' jump (`_pair_beta`; noisier: the other sequences
        come and go while a pair is read)."""
        alpha, full = self.alpha, self.gap_full
        if slots is None or slots < 2 or alpha is None or full is None or full <= alpha:
            return self._pair_beta()
        return (full - alpha) / (slots - 1)

    def learning(self, slots_known: bool) -> bool:
        """Too few pairs yet to tell the slowdown of one more sequence (`settled`), or, where
        the slots must be learned, too few to read them from."""
        return not self.settled() or (not slots_known and len(self._jumps) < _MIN_SLOT_PAIRS)

    def settled(self) -> bool:
        """Whether the pairs have said if the slowdown clears `_MIN_SLOWDOWN` of α: at least
        `_MIN_PAIRS` of them and the threshold outside their trimmed mean ± `_SURE_ERRORS`
        standard errors, or `_MAX_UNSURE_PAIRS` of them whatever they read. Once said, the
        pairs after it move the decision (`resolves`) but never take it back to unsaid: a
        figure that comes and goes with every pair is worse than one a pair late."""
        if not self._settled and len(self._jumps) >= _MIN_PAIRS:
            self._settled = len(self._jumps) >= _MAX_UNSURE_PAIRS or self._sure()
        return self._settled

    def _sure(self) -> bool:
        """Sure of what `readable` will say: it says readable where the median or the mean
        clears the threshold, so the pairs are sure of that where either surely clears it,
        and sure of the contrary only where both surely fall short."""
        if self.alpha is None:
            return False
        threshold = _MIN_SLOWDOWN * self.alpha
        sides = (_mean_side(self._jumps, threshold), _median_side(self._jumps, threshold))
        return 1 in sides or sides == (-1, -1)

    def learned_slots(self) -> int | None:
        """`1 + (gap_full − α) / β`, β the jump of one more sequence (`one_more`), where the
        data agree on it: read again from resamples of the same pairs and full-batch gaps, at
        least `_SLOTS_AGREEMENT` of the readings must give the same count, else None (the
        slots unknown, and no figure that rests on them). An engine whose step grows by little
        against the gaps' noise (vLLM on a CPU: 1 to 4 ms a sequence against 30 ms gaps)
        reads a β that moves with every few pairs, and slots with it (4, then 8 for 4 in two
        runs): saying nothing is better than a figure twice the truth. A count once agreed is
        kept while the data still read it and `_SLOTS_KEEP` of the resamples do: a bar met
        by a margin within the resamples' own spread would otherwise drop and restore it from
        one pair to the next."""
        if self._slots[0] != self._seen:
            self._slots = (self._seen, self._agreed_slots(held=self._slots[1]))
        return self._slots[1]

    def _agreed_slots(self, held: int | None) -> int | None:
        if len(self._jumps) < _MIN_SLOT_PAIRS or len(self._queued) < MIN_FULL:
            return None
        alpha, jumps, full = self.alpha, list(self._jumps), list(self._queued)
        if alpha is None or (read := slots_from(jumps, full, alpha)) is None:
            return None
        rng = random.Random(self._seen)  # the same data, the same answer
        agree = sum(
            slots_from(rng.choices(jumps, k=len(jumps)), rng.choices(full, k=len(full)), alpha)
            == read
            for _ in range(_SLOTS_RESAMPLES)
        )
        bar = _SLOTS_KEEP if read == held else _SLOTS_AGREEMENT
        return read if agree >= bar * _SLOTS_RESAMPLES else None

    def readable(self) -> bool | None:
        """Whether the pairs say the batch can be read from the gaps (`resolves`); None until
        they have said (`settled`)."""
        return self.resolves(None) if self.settled() else None

    def reading(self) -> dict[str, float | int | None]:
        """What the pairs read, for a log line: α and the jumps' median and trimmed mean in
        ms, and how many pairs."""
        alpha, mean = self.alpha, self.mean_jump()
        median = statistics.median(self._jumps) if self._jumps else None
        ms = {"alpha_ms": alpha, "median_jump_ms": median, "mean_jump_ms": mean}
        return {k: None if v is None else round(v * 1e3, 3) for k, v in ms.items()} | {
            "pairs": len(self._jumps)
        }

    def resolves(self, slots: int | None) -> bool:
        """Whether one more sequence lengthens the step by enough to tell the batch from the
        gaps' noise (`_MIN_SLOWDOWN` of α): by the secant where the slots and a full batch
        are known, else by the jumps' median or mean (`_pair_beta`)."""
        return _resolved(self.alpha, self.beta(slots))

    def others(self, gap: float, slots: int | None) -> float | None:
        """Sequences that decoded beside a probe whose gap was `gap`; None where the slowdown
        of one more sequence is unknown or too small to tell (`resolves`)."""
        alpha, beta = self.alpha, self.beta(slots)
        if alpha is None or beta is None or not _resolved(alpha, beta):
            return None
        others = max(0.0, (gap - alpha) / beta)
        return others if slots is None else min(others, slots - 1.0)


def _mean_side(jumps: Iterable[float], threshold: float) -> int:
    """1 where the jumps' trimmed mean lies above `threshold` by more than `_SURE_ERRORS`
    standard errors, −1 where below by as much, else 0."""
    trimmed = _trimmed(jumps)
    error = _SURE_ERRORS * statistics.stdev(trimmed) / math.sqrt(len(trimmed))
    mean = statistics.fmean(trimmed)
    return 1 if mean - threshold > error else -1 if threshold - mean > error else 0


def _median_side(jumps: Sequence[float], threshold: float) -> int:
    """The sign test: 1 where so few jumps lie under `threshold` that a median on it would
    leave that few under it less than `_SIGN_LEVEL` of the time, −1 where so few lie at or
    over it, else 0. It reads only which side each jump is on, so a sample whose jumps
    happen to bunch in one cluster cannot make it sure, as it can the mean's standard error."""
    n = len(jumps)
    above = sum(j >= threshold for j in jumps)
    if _tail(n - above, n) < _SIGN_LEVEL:
        return 1
    return -1 if _tail(above, n) < _SIGN_LEVEL else 0


def _tail(k: int, n: int) -> float:
    """P(at most k heads in n tosses of a fair coin)."""
    return math.fsum(math.comb(n, i) for i in range(k + 1)) / 2.0**n


def _trimmed(jumps: Iterable[float]) -> list[float]:
    """The jumps less a tenth at either end (a foreign prefill inside a gap)."""
    ordered = sorted(jumps)
    cut = len(ordered) // 10
    return ordered[cut : len(ordered) - cut]


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
    (one joined too), some at −β (two left), each spread by the noise of the gaps, and some
    between, about β/2 (a change in the middle of the gaps a jump is read from). Foreign
    requests leave about as often as they join, so the jumps' mean lands near β; their median
    is in whichever cluster holds the middle pair, by chance the 0 or the 2β one
    (`_MIN_SLOT_PAIRS`). Inside β's cluster the slots read from β still move with where β
    lands (on the simulator, β 6 ms, jumps of 3.4 to 6.9 ms in its cluster read 5 and 6 slots
    for 4), so from the mean on, until it stays, the centre is the median of the jumps within
    half of it either way (`cluster_centre`). A mean low by chance (a few more left than
    joined) settles there in the β/2 cluster instead: on the simulator's 64 jumps (a sixth of
    them near β/2, a third near β), in one resample in six to two in five (2.7 ms for 6.1:
    slots 8 for 4), so the resamples that guard the slots (`DecodeModel.learned_slots`)
    agreed on 4 in 0.57 to 0.87 of them, about their bar, for tens of seconds. So the
    cluster at twice the centre is read too, and taken where it holds more than
    `_HALF_CLUSTER` times the centre's jumps (each within a quarter of its own centre): β
    holds 1.6 to 3 times β/2's, 2β under β's (0.2 to 0.3 of the pairs against 0.33 to 0.4).
    On those jumps the resamples then read β within the band of 4 slots in 0.83 to 0.99 of
    them. In `bench/slots_learning.py`'s model of that mixture (40 to 64 pairs, gaps' noise
    0.3 to 1 ms) the learnings that miss go from 27-35 % to 11-28 %; in its earlier three
    (no β/2 cluster, no −β) from 0.1-6.3 % to 0-8.8 %; guarded, 0 to 2 % read wrong.
    None when the mean is not positive."""
    values = list(jumps)
    if not values:
        return None
    first = cluster_centre(values, statistics.fmean(values))
    if first is None:
        return None
    double = cluster_centre(values, 2 * first)
    if double is None:
        return first
    ordered = sorted(values)
    return double if _members(ordered, double) > _HALF_CLUSTER * _members(ordered, first) else first


def _members(ordered: Sequence[float], centre: float) -> int:
    """How many of the sorted `ordered` lie within a quarter of `centre` of it."""
    low = bisect.bisect_left(ordered, 0.75 * centre)
    return bisect.bisect_right(ordered, 1.25 * centre) - low


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
