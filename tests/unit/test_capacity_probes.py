"""The probes-alone queue estimate, with plain numbers and a fake clock (no server)."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from prober.capacity.decode import (
    _MAX_UNSURE_PAIRS,
    _MIN_PAIRS,
    _MIN_SLOT_PAIRS,
    DecodeModel,
    cluster_centre,
    median_gap,
    one_more,
    slots_from,
)
from prober.capacity.inflight import ProbesInFlight
from prober.capacity.own import QueueEstimator
from prober.capacity.probes import Basis, ProbesAloneEstimator, ProbeSample, Shape, Traffic
from prober.kinds import Drain
from tests.support.clock import Clock
from tests.support.results import timed_result

ALPHA, BETA = 0.020, 0.006  # gap(b) = α + β·(b − 1)


def gap(batch: int) -> float:
    return ALPHA + BETA * (batch - 1)


def learned_model(full_batch: int = 4) -> DecodeModel:
    model = DecodeModel()
    model.observe(gap(1), full_batch=False)
    for others in range(_MIN_SLOT_PAIRS):
        model.observe_pair(gap(1 + others % 3), gap(2 + others % 3))
    for _ in range(3):
        model.observe(gap(full_batch), full_batch=True)
    return model


def test_median_gap_is_per_token_and_needs_three_events() -> None:
    stamps = [0, 20_000_000, 40_000_000, 100_000_000, 120_000_000]  # one prefill spike
    assert median_gap(stamps, 1.0) == pytest.approx(0.020)
    assert median_gap(stamps, 4.0) == pytest.approx(0.005)  # 4 tokens per event
    assert median_gap(stamps[:2], 1.0) is None


def test_decode_model_learns_alpha_beta_and_the_slots() -> None:
    model = learned_model(full_batch=6)
    assert model.alpha == pytest.approx(ALPHA)
    assert model.beta(None) == pytest.approx(BETA)  # from the pairs' median jump
    assert model.learned_slots() == 6  # 1 + (gap_full − α) / β
    assert model.others(gap(3), None) == pytest.approx(2.0)
    assert model.others(gap(9), 6) == pytest.approx(5.0)  # never more than the other slots


def test_decode_model_prefers_the_secant_once_a_full_batch_is_seen() -> None:
    model = DecodeModel()
    model.observe(gap(1), full_batch=False)
    for _ in range(_MIN_PAIRS):
        model.observe_pair(0.010, 0.030)  # noisy pairs: a jump of 20 ms
    model.observe(gap(4), full_batch=True)
    assert model.beta(4) == pytest.approx(BETA)  # (gap_full − α) / (slots − 1)
    assert model.beta(None) == pytest.approx(0.020)  # slots unknown: the pairs


def test_slots_are_not_learned_from_too_little() -> None:
    model = DecodeModel()
    model.observe(gap(1), full_batch=False)
    model.observe(gap(4), full_batch=True)
    assert model.learning(slots_known=True)
    assert model.learned_slots() is None
    for _ in range(_MIN_PAIRS):
        model.observe_pair(gap(1), gap(2))
    assert not model.learning(slots_known=True)  # enough for β where the slots are hinted
    assert model.learning(slots_known=False)
    model.observe(gap(4), full_batch=True)
    model.observe(gap(4), full_batch=True)
    assert model.learned_slots() is None  # too few pairs to read the slots from
    for _ in range(_MIN_SLOT_PAIRS - _MIN_PAIRS - 1):
        model.observe_pair(gap(1), gap(2))
    assert model.learned_slots() is None  # one short
    model.observe_pair(gap(1), gap(2))
    assert not model.learning(slots_known=False)
    assert model.learned_slots() == 4


def test_learned_slots_survive_pairs_that_a_foreign_request_disturbed() -> None:
    """A foreign request leaving while a pair is read makes a jump of 0, one joining a jump of
    2β: a third of the pairs disturbed, as many each way, and the slots are still right."""
    model = DecodeModel()
    model.observe(gap(1), full_batch=False)
    for _ in range(3):
        model.observe(gap(4), full_batch=True)
    for i in range(_MIN_SLOT_PAIRS):
        jump = (0.0, 2 * BETA, BETA)[i % 3]
        model.observe_pair(gap(1), gap(1) + jump)
    assert model.learned_slots() == 4


def test_one_full_batch_probe_is_not_enough_for_the_slots() -> None:
    model = DecodeModel()
    model.observe(gap(1), full_batch=False)
    model.observe(gap(4), full_batch=True)
    for _ in range(_MIN_SLOT_PAIRS):
        model.observe_pair(gap(1), gap(2))
    assert model.learned_slots() is None
    model.observe(gap(4), full_batch=True)
    model.observe(gap(4), full_batch=True)
    assert model.learned_slots() == 4


def test_probe_occupancy_is_time_averaged_over_the_window() -> None:
    clock = Clock()
    probes = ProbesInFlight(clock)
    start = clock.now
    key = probes.begin()  # waits 1 s, prefills 0.2 s, decodes 2.8 s
    clock.now = start + 1.2
    probes.first_token(key)
    clock.now = start + 4.0
    probes.end(key)
    clock.now = start + 5.0
    waiting, holding = probes.occupancy(clock.now, 5.0, prefill=0.2)
    assert waiting == pytest.approx(1.0 / 5)
    assert holding == pytest.approx(3.0 / 5)
    live = probes.begin()
    clock.now += 1.0  # in flight 1 s without a token: waiting but for the prefill
    assert probes.waited(clock.now) == [pytest.approx(1.0)]
    waiting, holding = probes.occupancy(clock.now, 5.0, prefill=0.2)
    assert waiting == pytest.approx(0.8 / 5)  # the first probe waited before the window
    assert holding == pytest.approx((3.0 + 0.2) / 5)
    probes.end(live)


PROBE_SHAPE = Shape(40, 16)
LIKE_PROBES = Traffic(PROBE_SHAPE, Drain.TRAFFIC_PROBES)  # `traffic: probes`
UNSTATED = Traffic(None, Drain.PROBE_SHAPE)  # no `traffic:`, no engine counters


def _estimator(
    clock: Clock, hint: int | None = 4, traffic: Traffic = LIKE_PROBES
) -> ProbesAloneEstimator:
    return ProbesAloneEstimator(PROBE_SHAPE, lambda: traffic, hint, ProbesInFlight(clock), clock)


def _queued(clock: Clock, wait: float, decode: float = 0.75, prefill: float = 0.05) -> ProbeSample:
    return ProbeSample(clock.now, wait, prefill, decode, gap(4), True)


def test_waiting_is_drain_rate_times_wait_less_one_interval() -> None:
    clock = Clock()
    est = _estimator(clock)
    est.decode = learned_model()
    est.observe(_queued(clock, wait=2.0))  # service 0.8 s at full batch: μ = 4 / 0.8 = 5/s
    figure = est.estimate(prefill_guess=0.05)
    assert figure.basis is Basis.PROBES_HINT
    assert figure.slots == 4
    assert figure.waiting == pytest.approx(5.0 * 2.0 - 1.0)
    assert figure.running == pytest.approx(4.0)  # a queue: every slot busy


def test_a_passing_queue_counts_only_the_probes_that_met_it() -> None:
    """Of four probes one found every slot busy and waited 0.6 s (5 · 0.6 − 1 = 2 ahead of
    it), three found a free slot (none ahead): 0.5 waiting on average. A whole departure off
    the mean wait (5 · 0.15 − 1) read none."""
    clock = Clock()
    est = _estimator(clock)
    est.decode = learned_model()
    est.observe(_queued(clock, wait=2.0))  # the drain rate: μ = 5/s
    clock.now += 6.0
    est.observe(_queued(clock, wait=0.6))
    for _ in range(3):
        clock.now += 1.0
        est.observe(ProbeSample(clock.now, 0.01, 0.05, 0.5, gap(2), False))
    figure = est.estimate(prefill_guess=0.05)
    assert figure.wait_seconds == pytest.approx(0.1575)  # over a free slot's: a queue
    assert figure.waiting == pytest.approx(0.5)


def test_the_running_figure_is_what_the_probes_met_not_the_waiting_figure() -> None:
    """Two of the five probes of the last 10 s found every slot busy (the share of the time
    every slot was), three decoded beside one other: 0.4 · 4 + 0.6 · 1, whatever the drain
    rate the waiting figure rests on. Blended by the waiting figure instead, a shape read
    twice the true one moved the running figure with it."""
    figures = []
    for traffic in (LIKE_PROBES, Traffic(Shape(80, 31), Drain.TRAFFIC)):
        clock = Clock()
        est = _estimator(clock, traffic=traffic)
        est.decode = learned_model()
        est.observe(_queued(clock, wait=2.0))
        clock.now += 6.0
        est.observe(_queued(clock, wait=0.6))
        for _ in range(3):
            clock.now += 1.0
            est.observe(ProbeSample(clock.now, 0.01, 0.05, 0.5, gap(2), False))
        figures.append(est.estimate(prefill_guess=0.05))
    assert figures[0].waiting != pytest.approx(figures[1].waiting)
    assert [f.running for f in figures] == pytest.approx([0.4 * 4 + 0.6 * 1] * 2)


def test_traffic_of_another_shape_scales_the_service_time() -> None:
    clock = Clock()
    twice = Traffic(Shape(80, 31), Drain.TRAFFIC)  # twice the prompt, twice the decode
    est = _estimator(clock, traffic=twice)
    est.decode = learned_model()
    est.observe(_queued(clock, wait=2.0))  # their service: 0.1 + 1.5 = 1.6 s, μ = 2.5/s
    assert est.estimate(0.05).waiting == pytest.approx(2.5 * 2.0 - 1.0)


def test_the_drain_rate_says_whose_shape_it_rests_on() -> None:
    """The shape's giver is exported from the start, the rate once a probe has queued."""
    for traffic, drain in (
        (LIKE_PROBES, 5.0),
        (Traffic(Shape(80, 31), Drain.TRAFFIC), 2.5),
        (Traffic(Shape(80, 31), Drain.ENGINE_SHAPE), 2.5),
    ):
        clock = Clock()
        est = _estimator(clock, traffic=traffic)
        est.decode = learned_model()
        assert (est.estimate(0.05).drain, est.estimate(0.05).drain_basis) == (None, traffic.basis)
        est.observe(_queued(clock, wait=2.0))  # the probes' service 0.8 s at full batch
        figure = est.estimate(0.05)
        assert figure.drain == pytest.approx(drain)
        assert figure.drain_basis is traffic.basis


def test_without_a_shape_the_depth_is_withheld_and_the_shape_free_figures_stay() -> None:
    """Nobody gave the traffic's shape: no waiting figure and no drain rate (the probes' own
    shape read 25 waiting for a true 4 against answers 7.5 times theirs), while the wait in
    seconds, whether a queue exists and the running figure need no shape."""
    clock = Clock()
    est = _estimator(clock, traffic=UNSTATED)
    est.decode = learned_model()
    for batch in (2, 3, 4):  # below the knee: the decode slowdown gives running
        est.observe(ProbeSample(clock.now, 0.0, 0.05, 0.5, gap(batch), False))
    figure = est.estimate(0.05)
    assert (figure.waiting, figure.queue, figure.basis) == (None, False, Basis.NONE)
    assert figure.running == pytest.approx(2.0)
    assert figure.wait_seconds == 0.0
    # One probe of four found a queue: every slot busy for a quarter of the window, a share
    # of the probes that needs no shape; the other three decoded beside 1, 2 and 3 others.
    est.observe(_queued(clock, wait=2.0))
    figure = est.estimate(0.05)
    assert (figure.waiting, figure.queue) == (None, True)
    assert figure.running == pytest.approx(0.25 * 4 + 0.75 * 2.0)
    clock.now += 6.0
    for _ in range(4):  # a queue throughout (the last four): every slot busy, its length unknown
        est.observe(_queued(clock, wait=2.0))
    figure = est.estimate(0.05)
    assert (figure.waiting, figure.drain, figure.drain_basis) == (None, None, Drain.PROBE_SHAPE)
    assert (figure.queue, figure.running, figure.slots) == (True, 4.0, 4)
    assert figure.wait_seconds == pytest.approx(2.0)


def test_a_queue_gives_every_slot_before_any_pair_is_read() -> None:
    """A daemon started into a queue: no pair can join a full batch, so the decode slowdown
    is unread, but while a whole request waits every slot is busy."""
    clock = Clock()
    est = _estimator(clock)
    est.observe(_queued(clock, wait=2.0))
    est.observe(_queued(clock, wait=2.0))
    figure = est.estimate(0.05)
    assert figure.basis is Basis.PROBES_HINT
    assert figure.waiting == pytest.approx(5.0 * 2.0 - 1.0)
    assert figure.running == 4.0


def test_below_saturation_running_comes_from_the_decode_slowdown() -> None:
    clock = Clock()
    est = _estimator(clock)
    est.decode = learned_model()
    for batch in (2, 3, 4):  # the probe decoded beside 1, 2 and 3 others
        est.observe(ProbeSample(clock.now, 0.0, 0.05, 0.5, gap(batch), False))
    figure = est.estimate(0.05)
    assert figure.waiting == 0.0
    assert figure.running == pytest.approx(2.0)


def test_no_running_figure_where_one_more_sequence_barely_slows_the_step() -> None:
    """vLLM's CPU build: one more sequence lengthened a 46 ms step by 1 to 6 ms, less than the
    gaps moved between probes at one batch size. Below a fifth of α, the gaps cannot tell the
    batch: no running figure below saturation, every slot while a whole request waits."""
    clock = Clock()
    est = _estimator(clock)
    slight = DecodeModel()  # β = 0.19 α: just too little
    slight.observe(ALPHA, full_batch=False)
    for _ in range(_MIN_PAIRS):
        slight.observe_pair(ALPHA, ALPHA * 1.19)
    assert not slight.resolves(None)
    assert slight.others(ALPHA * 1.5, None) is None
    est.decode = slight
    for batch in (2, 3, 4):
        est.observe(ProbeSample(clock.now, 0.0, 0.05, 0.5, ALPHA * (1 + 0.19 * batch), False))
    figure = est.estimate(0.05)
    assert (figure.basis, figure.waiting, figure.running) == (Basis.PROBES_HINT, 0.0, None)
    clock.now += 6.0  # then a queue: two of the last four probes waited 2 s each, μ = 5/s,
    for _ in range(2):  # so 5 · 2 − 1 = 9 ahead of each, none ahead of the other two
        est.observe(_queued(clock, wait=2.0))
    figure = est.estimate(0.05)
    assert (figure.waiting, figure.running) == (pytest.approx(4.5), 4.0)
    flat = DecodeModel()  # the pairs' median jump at or below 0: no slowdown at all
    flat.observe(ALPHA, full_batch=False)
    for _ in range(_MIN_PAIRS):
        flat.observe_pair(ALPHA, ALPHA * 0.99)
    est.decode = flat
    clock.now += 30.0
    for _ in range(4):
        est.observe(ProbeSample(clock.now, 0.0, 0.05, 0.5, ALPHA, False))
    figure = est.estimate(0.05)
    assert (figure.basis, figure.waiting, figure.running) == (Basis.PROBES_HINT, 0.0, None)
    learning = DecodeModel()  # fewer than eight pairs: still learning, no basis yet
    learning.observe(ALPHA, full_batch=False)
    est.decode = learning
    assert est.estimate(0.05).basis is Basis.NONE
    enough = DecodeModel()  # β = 0.21 α: read
    enough.observe(ALPHA, full_batch=False)
    for _ in range(_MIN_PAIRS):
        enough.observe_pair(ALPHA, ALPHA * 1.21)
    assert enough.resolves(None)
    assert enough.others(ALPHA * 1.42, None) == pytest.approx(2.0)


def test_the_slowdown_is_readable_where_the_jumps_median_or_mean_clears_the_threshold() -> None:
    """At half load the jumps cluster at 0 (a foreign request left as the companion joined,
    or a step that stopped growing near full batch), β and 2β. With half of them at 0 the
    median lies between 0 and β, under the threshold, for a step that grows by 0.3 α: the
    trimmed mean still says it grows, and is the β the figure then uses. A few jumps far
    below the rest pull the mean under it while the median stands in β's cluster: the
    median. Noise about 0 with one foreign prefill inside a gap (a jump of 0.9 α) is still
    no slowdown."""
    beta = 0.3 * ALPHA
    split = DecodeModel()
    split.observe(ALPHA, full_batch=False)
    jumps = [0.0] * 5 + [beta] * 2 + [2 * beta] * 3
    for jump in jumps:
        split.observe_pair(ALPHA, ALPHA + jump)
    assert statistics.median(jumps) < 0.2 * ALPHA  # the median alone: no figure
    assert split.mean_jump() == pytest.approx(0.225 * ALPHA)  # a tenth off either end
    assert split.resolves(None)
    assert split.others(ALPHA * 1.45, None) == pytest.approx(2.0)
    pulled = DecodeModel()
    pulled.observe(ALPHA, full_batch=False)
    for jump in [0.25] * 6 + [-0.5] * 4:
        pulled.observe_pair(ALPHA, ALPHA * (1 + jump))
    assert pulled.mean_jump() == pytest.approx(-0.25 / 8 * ALPHA)  # (3 · −0.5 + 5 · 0.25) / 8
    assert pulled.others(ALPHA * 1.5, None) == pytest.approx(2.0)  # β = 0.25 α, the median
    flat = DecodeModel()
    flat.observe(ALPHA, full_batch=False)
    for jump in (-0.1, 0.05, -0.05, 0.02, 0.0, 0.1, -0.02, 0.9, -0.08, 0.04):
        flat.observe_pair(ALPHA, ALPHA * (1 + jump))
    assert flat.mean_jump() == pytest.approx(0.0075 * ALPHA)  # the 0.9 and the −0.1 cut
    assert not flat.resolves(None)
    assert flat.others(ALPHA * 1.5, None) is None


def test_the_first_word_on_the_slowdown_waits_until_the_pairs_are_sure() -> None:
    """Eight pairs of an engine whose step grows by 0.3 α, read at half load: half of them at
    0 (a foreign request left as the companion joined). Their mean, 0.16 α, lies under the
    threshold of 0.2 α but within two standard errors of it: not yet said, so pairs still go
    with every probe and the estimate has no basis (no claim that the batch cannot be read).
    More pairs say it; the word, once said, is kept. Pairs that never settle it are decided at
    `_MAX_UNSURE_PAIRS`."""
    clock = Clock()
    est = _estimator(clock)
    model = DecodeModel()
    model.observe(ALPHA, full_batch=False)
    for jump in (0.0, 0.0, 0.0, 0.0, 0.05, 0.3, 0.3, 0.6):
        model.observe_pair(ALPHA, ALPHA * (1 + jump))
    assert model.mean_jump() == pytest.approx(0.15625 * ALPHA)
    assert not model.resolves(None)  # as read now: too little
    assert (model.settled(), model.readable(), model.learning(slots_known=True)) == (
        False, None, True,
    )  # fmt: skip
    est.decode = model
    for _ in range(4):
        est.observe(ProbeSample(clock.now, 0.0, 0.05, 0.5, ALPHA * 1.3, False))
    assert est.estimate(0.05).basis is Basis.NONE
    pairs = _MIN_PAIRS
    while model.readable() is None:
        model.observe_pair(ALPHA, ALPHA * 1.3)
        pairs += 1
    assert model.readable()
    assert pairs < _MAX_UNSURE_PAIRS
    assert not model.learning(slots_known=True)
    figure = est.estimate(0.05)
    assert (figure.basis, figure.running) == (Basis.PROBES_HINT, pytest.approx(1.0, abs=0.1))
    for _ in range(6):  # enough to put the mean back near the threshold: still said
        model.observe_pair(ALPHA, ALPHA)
    assert model.settled()
    assert not model.learning(slots_known=True)
    even = DecodeModel()  # a mean on the threshold: said at the cap, whatever it reads
    even.observe(ALPHA, full_batch=False)
    for i in range(_MAX_UNSURE_PAIRS - 1):
        even.observe_pair(ALPHA, ALPHA * (1.2 + (0.5 if i % 2 else -0.5)))
    assert even.readable() is None
    even.observe_pair(ALPHA, ALPHA * 1.7)
    assert even.readable() is not None


def test_jumps_bunched_by_chance_do_not_make_the_pairs_sure_the_slowdown_is_unreadable() -> None:
    """Thirteen pairs of an engine whose step grows by 0.3 α, eight of them where a foreign
    request happened to leave as the companion joined (jumps near 0): their trimmed mean,
    0.10 α, lies more than two of its standard errors (0.035 α) under the 0.2 α threshold,
    because the sample bunched in two clusters and so spread little. Read from it alone, the
    pairs said "unreadable" and no running figure came for a whole level (CI, 2026-12-07:
    13 pairs, mean 0.08 α). Five of thirteen over the threshold is no evidence the median is
    under it (the sign test), so the word waits; pairs as the engine gives them then say
    readable. Where every jump is small both agree: unreadable, at the eighth pair."""
    bunched = DecodeModel()
    bunched.observe(ALPHA, full_batch=False)
    for jump in [0.02] * 8 + [0.25] * 5:
        bunched.observe_pair(ALPHA, ALPHA * (1 + jump))
    kept = sorted([0.02] * 8 + [0.25] * 5)[1:-1]
    error = statistics.stdev(kept) / math.sqrt(len(kept))
    assert 0.2 - statistics.fmean(kept) > 2 * error  # the mean alone would be sure
    assert bunched.readable() is None
    engine = itertools.cycle((0.3, 0.6, 0.3, 0.0))  # β, 2β, β, 0: 0.3 α on average
    while bunched.readable() is None:
        bunched.observe_pair(ALPHA, ALPHA * (1 + next(engine)))
    assert bunched.readable()
    flat = DecodeModel()
    flat.observe(ALPHA, full_batch=False)
    for jump in (0.02, -0.03, 0.05, 0.0, 0.12, 0.04, -0.02, 0.01):
        flat.observe_pair(ALPHA, ALPHA * (1 + jump))
    assert flat.readable() is False


def test_the_wait_is_the_mean_of_the_last_four_probes_at_least() -> None:
    """Probes a job apart (a wait and a decode each): the older ones leaving the 5 s window
    do not make the newest the whole figure."""
    clock = Clock()
    est = _estimator(clock)
    est.decode = learned_model()
    for wait in (1.0, 3.0, 2.0, 4.0):
        est.observe(_queued(clock, wait=wait))
        clock.now += 4.0
    clock.now -= 2.0  # the newest is 2 s old, the one before 6 s
    assert est.estimate(prefill_guess=0.05).wait_seconds == pytest.approx(2.5)
    for _ in range(4):
        clock.now += 1.0
        est.observe(_queued(clock, wait=3.0))
    # 4 s later the 4.0 has left the window too: four in the window, those
    assert est.estimate(prefill_guess=0.05).wait_seconds == pytest.approx(3.0)


def test_a_probe_stuck_in_the_queue_shows_before_it_returns() -> None:
    clock = Clock()
    est = _estimator(clock)
    est.decode = learned_model()
    est.observe(_queued(clock, wait=0.5))
    key = est.probes.begin()
    clock.now += 3.05  # no first token yet after 3 s
    assert est.estimate(prefill_guess=0.05).waiting == pytest.approx(5.0 * 3.0 - 1.0 + 3.0 / 5)
    est.probes.end(key)


def test_no_figure_without_slots_or_data() -> None:
    clock = Clock()
    est = _estimator(clock, hint=None)
    assert est.estimate(0.05).basis is Basis.NONE
    est.observe(_queued(clock, wait=2.0))
    figure = est.estimate(0.05)
    assert figure.basis is Basis.NONE
    assert figure.waiting is None
    est.decode = learned_model(full_batch=4)
    est.decode._full.clear()  # β from the pairs, but no probe at full batch: slots unknown
    est.decode._queued.clear()
    figure = est.estimate(0.05)
    assert (figure.basis, figure.waiting, figure.running) == (Basis.NONE, None, None)
    est.decode = learned_model(full_batch=4)
    figure = est.estimate(0.05)
    assert figure.basis is Basis.PROBES_LEARNED
    assert figure.slots == 4
    clock.now += 600  # old probes say nothing about now
    assert est.estimate(0.05).basis is Basis.NONE


def test_a_pair_gives_the_jump_of_one_more_sequence() -> None:
    clock = Clock()
    foreign = _estimator(clock)
    estimator = QueueEstimator(clock=clock, slots_hint=4, probes_alone=foreign)
    # The first probe decodes beside one other sequence; its companion, sent at 0.2 s into
    # that decode, joins at 0.3 s; the first probe's gaps then grow by β.
    before = [gap(2)] * 8
    after = [gap(3)] * 10
    end = 0.05 + sum(before) + 0.05 + sum(after)
    gaps = [*before, 0.05, *after]
    primary = timed_result(0.0, 0.05, end, gaps=gaps, prefill=0.05, prompt_tokens=40)
    c_send = 0.05 + sum(before) + 0.001
    c_end = c_send + 0.05 + 12 * gap(3)
    companion = timed_result(
        c_send, c_send + 0.05, c_end, gaps=[gap(3)] * 12, prefill=0.05, prompt_tokens=40
    )
    waits = estimator.observe_pair(primary, companion)
    assert waits[0] == pytest.approx(0.0, abs=1e-9)
    assert foreign.decode._jumps == pytest.approx([BETA])


def test_a_failing_estimate_costs_its_target_its_figures_not_the_scrape() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from prober.capacity.target import CapacityCollector, TargetCapacity
    from prober.metrics import Metrics
    from prober.record import ScrapeRecorder
    from prober.settings import TargetConfig
    from prober.targets import Target

    registry = CollectorRegistry()
    targets = [
        Target.from_config(TargetConfig(name=n, url="http://127.0.0.1:1/v1", model="m", slots=4))
        for n in ("broken", "fine")
    ]
    caps = [TargetCapacity(t, ScrapeRecorder(Metrics(CollectorRegistry()))) for t in targets]

    def boom() -> None:
        raise RuntimeError("estimator bug")

    caps[0].estimator.estimate = boom  # type: ignore[method-assign,assignment]
    registry.register(CapacityCollector(caps))
    text = generate_latest(registry).decode()
    assert 'llmprober_queue_estimate_basis{basis="none",model="m",target="fine"} 1.0' in text
    assert 'target="broken"' in text  # its basis says none
    assert 'llmprober_queue_estimate_basis{basis="none",model="m",target="broken"} 1.0' in text
    # no `traffic:`: the shape nobody gave, said from the start
    assert 'llmprober_queue_drain_basis{basis="probe_shape",model="m",target="fine"} 1.0' in text
    assert 'llmprober_queue_drain_basis{basis="none",model="m",target="broken"} 1.0' in text
    assert "llmprober_queue_drain_rate{" not in text  # no figure without a queued probe


def test_the_drain_rate_and_its_basis_are_exported() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from prober.capacity.target import CapacityCollector, TargetCapacity
    from prober.metrics import Metrics
    from prober.record import ScrapeRecorder
    from prober.settings import TargetConfig
    from prober.targets import Target

    cfg = TargetConfig(
        name="t", url="http://127.0.0.1:1/v1", model="m", slots=4, prompt_tokens=40,
        max_tokens=16, traffic={"output_tokens": 31, "prompt_tokens": 80},
    )  # fmt: skip
    cap = TargetCapacity(Target.from_config(cfg), ScrapeRecorder(Metrics(CollectorRegistry())))
    foreign = cap.estimator.probes_alone
    assert foreign is not None
    foreign.observe(ProbeSample(foreign._clock(), 2.0, 0.05, 0.75, 0.05, True))
    registry = CollectorRegistry()
    registry.register(CapacityCollector([cap]))
    text = generate_latest(registry).decode()
    assert 'llmprober_queue_drain_rate{model="m",target="t"} 2.5' in text
    assert 'llmprober_queue_drain_basis{basis="traffic",model="m",target="t"} 1.0' in text
    assert 'llmprober_queue_drain_basis{basis="probe_shape",model="m",target="t"} 0.0' in text


def test_server_saturation_divides_by_the_slots_hint_before_anything_is_learned() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from prober.capacity.server import Engine, ServerSnapshot
    from prober.capacity.target import CapacityCollector, TargetCapacity
    from prober.metrics import Metrics
    from prober.record import ScrapeRecorder
    from prober.settings import TargetConfig
    from prober.targets import Target

    cfg = TargetConfig(name="vllm", url="http://127.0.0.1:1/v1", model="m", slots=16)
    cap = TargetCapacity(Target.from_config(cfg), ScrapeRecorder(Metrics(CollectorRegistry())))
    # A new replica, half busy; its completion counter gives the estimate a drain rate (the
    # server basis, which knows no slots of its own).
    cap._keep(ServerSnapshot(Engine.vllm, 0.0, 8.0, None, 10.0), 100.0)
    cap._keep(ServerSnapshot(Engine.vllm, 0.0, 8.0, None, 30.0), 105.0)
    registry = CollectorRegistry()
    registry.register(CapacityCollector([cap]))
    text = generate_latest(registry).decode()
    assert 'llmprober_saturation{model="m",source="server",target="vllm"} 0.5' in text


def test_the_drain_rate_follows_the_engines_pace() -> None:
    """Full-batch service times of the last 30 s give μ: probes that waited when the engine
    was faster (or only briefly, at light load) do not hold it high once a queue lasts."""
    clock = Clock()
    est = _estimator(clock)
    est.decode = learned_model()
    for _ in range(5):
        est.observe(_queued(clock, wait=2.0, decode=0.15))  # service 0.2 s: μ = 20/s
    clock.now += 40.0
    for _ in range(3):
        est.observe(_queued(clock, wait=2.0))  # service 0.8 s: μ = 5/s
    assert est.estimate(prefill_guess=0.05).waiting == pytest.approx(5.0 * 2.0 - 1.0)
    clock.now += 40.0  # nothing newer: the last three still tell the pace
    est.observe(_queued(clock, wait=2.0))
    assert est.estimate(prefill_guess=0.05).waiting == pytest.approx(5.0 * 2.0 - 1.0)


def test_a_lasting_queue_drains_at_its_own_pace_not_at_light_loads() -> None:
    """Probes that waited briefly at light load decoded in a batch soon short again (a short
    service); from the first probe of a lasting queue on, μ is the queue's alone."""
    clock = Clock()
    est = _estimator(clock)
    est.decode = learned_model()
    for _ in range(3):
        est.observe(_queued(clock, wait=0.1, decode=0.35))  # service 0.4 s at light load
        clock.now += 1.0
        est.observe(ProbeSample(clock.now, 0.0, 0.05, 0.5, gap(2), False))  # a free slot
        clock.now += 1.0
    clock.now += 5.0  # the light load's waits leave the wait's window, not the 30 s
    for _ in range(4):
        est.observe(_queued(clock, wait=2.0))  # the queue: service 0.8 s, μ = 5/s
        clock.now += 1.0
        figure = est.estimate(prefill_guess=0.05)
        assert figure.drain == pytest.approx(5.0)  # not the light load's 10/s
    assert est.estimate(prefill_guess=0.05).waiting == pytest.approx(5.0 * 2.0 - 1.0)


def test_slots_are_read_from_the_centre_of_one_more_sequences_jumps() -> None:
    """Jumps spread around 0, β and 2β, more of them near 0 than a plain median can bear:
    their median (5.0 ms) reads 5 slots for 4; the centre of β's cluster (6.1 ms), found
    from their mean (4.5 ms), 4."""
    model = DecodeModel()
    model.observe(gap(1), full_batch=False)
    for _ in range(3):
        model.observe(gap(4), full_batch=True)
    jumps_ms = [-0.7, -0.3, 0.2, 0.4, 0.5, 0.8, 4.6, 5.0, 5.6, 6.1, 6.4, 6.9, 7.2, 12.4, 13.0]
    jumps_ms *= 3  # enough pairs for the slots
    for jump in jumps_ms:
        model.observe_pair(gap(1), gap(1) + jump / 1000)
    plain = statistics.median(jumps_ms) / 1000
    assert round(1 + (gap(4) - ALPHA) / plain) == 5
    assert model.learned_slots() == 4
    assert model.beta(None) == pytest.approx(plain)  # the running figure keeps the median


def test_slots_are_read_from_a_queue_not_from_a_probe_that_waited_once() -> None:
    """Probes that each waited for a slot while no queue lasted decoded at a shrinking batch:
    their gaps never teach the slots. Three in a row, a queue's, do."""
    model = DecodeModel()
    model.observe(gap(1), full_batch=False)
    for others in range(_MIN_SLOT_PAIRS):
        model.observe_pair(gap(1 + others % 3), gap(2 + others % 3))
    for _ in range(4):  # each alone: one waited, the next found a free slot
        model.observe(gap(3), full_batch=True)
        model.observe(gap(2), full_batch=False)
    assert model.gap_full == pytest.approx(gap(3))  # still a full batch's gap elsewhere
    assert model.learned_slots() is None
    model.observe(gap(4), full_batch=True)
    model.observe(gap(4), full_batch=True)
    assert model.learned_slots() is None  # two in a row
    model.observe(gap(4), full_batch=True)
    assert model.learned_slots() == 4  # three: the queue's gaps alone


def test_beta_is_not_the_cluster_at_half_of_it() -> None:
    """The simulator's jumps (ms, 64 pairs, 2026-12-07): clusters at −β, 0, β/2, β (6.1) and
    2β. Resamples whose mean fell low found the β/2 cluster (2.7 ms: 8 slots for 4) in one of
    six; the cluster at twice it, holding more than twice its jumps, is β."""
    jumps = [
        -9.0, -8.1, -6.6, -6.4, -6.2, -6.2, -6.0, -0.5, -0.5, -0.3, -0.3, -0.3, 0.1, 0.1, 0.2,
        0.2, 0.4, 0.5, 0.5, 0.6, 1.2, 1.8, 2.0, 2.5, 2.6, 2.7, 2.8, 2.8, 3.0, 3.1, 4.1, 4.6,
        5.2, 5.6, 5.8, 5.8, 6.0, 6.0, 6.1, 6.1, 6.1, 6.1, 6.2, 6.2, 6.4, 6.4, 6.5, 6.5, 6.5,
        6.5, 6.9, 11.3, 11.5, 11.6, 11.7, 11.7, 11.8, 11.9, 11.9, 12.0, 12.4, 12.9, 14.0, 17.7,
    ]  # fmt: skip
    rng = random.Random(2)
    resamples = [rng.choices(jumps, k=len(jumps)) for _ in range(200)]
    from_mean = [cluster_centre(r, statistics.fmean(r)) for r in resamples]
    assert sum(c is not None and c < 4.0 for c in from_mean) >= 20  # the β/2 cluster
    betas = [one_more(r) for r in resamples]
    assert sum(b is not None and 5.14 <= b <= 7.2 for b in betas) >= 0.8 * 200  # 4 slots
    assert one_more([0.0] * 10 + [6.0] * 14 + [12.0] * 13) == pytest.approx(6.0)  # not 2β


def test_slots_are_found_from_the_jumps_mean_where_their_median_is_near_zero() -> None:
    """Half the pairs disturbed by a foreign request leaving (jump 0), fewer by one joining
    (2β): the median falls between 0 and β (7 slots for 4), the mean in β's cluster."""
    model = DecodeModel()
    model.observe(gap(1), full_batch=False)
    for _ in range(3):
        model.observe(gap(4), full_batch=True)
    jumps = [0.0] * 22 + [BETA] * 12 + [2 * BETA] * 10
    for jump in jumps:
        model.observe_pair(gap(1), gap(1) + jump)
    assert round(1 + (gap(4) - ALPHA) / statistics.median(jumps)) == 7
    assert slots_from(jumps, [gap(4)], ALPHA) == 4
    # Resamples with fewer of β's own put the mean between clusters, where the search finds
    # none (7 slots); the cluster at twice that seed, β's, holds more: learned.
    assert cluster_centre(jumps, 0.6 * BETA) == pytest.approx(0.6 * BETA)
    assert one_more([0.0] * 25 + [BETA] * 10 + [2 * BETA] * 9) == pytest.approx(BETA)
    assert model.learned_slots() == 4


def test_slots_are_learned_only_where_resamples_of_the_pairs_agree() -> None:
    """β 2 ms against gaps that vary by 3 ms (vLLM on a CPU): the jumps' clusters overlap and
    the slots read from them move with every few pairs; unknown, never a wrong count."""
    assert learned_model().learned_slots() == 4  # steady data: learned
    unguarded = set()
    for seed in range(7, 12):
        rng, noisy = random.Random(seed), DecodeModel()
        noisy.observe(ALPHA, full_batch=False)
        full = [ALPHA + 3 * 0.002 + rng.gauss(0, 0.003) for _ in range(3)]
        for f in full:
            noisy.observe(f, full_batch=True)
        jumps = [rng.choice((0.0, 0.002, 0.004)) + rng.gauss(0, 0.003) for _ in range(64)]
        for jump in jumps:
            noisy.observe_pair(ALPHA, ALPHA + jump)
        unguarded.add(slots_from(jumps, full, ALPHA))
        assert noisy.learned_slots() is None
    assert len(unguarded) > 1  # read once, they would have said 3, 4 or 6


def test_a_count_once_agreed_is_kept_while_most_resamples_still_read_it() -> None:
    """The simulator's test without the hint: the data read 4 at every read while the
    resamples that agreed moved over 42 to 61 of 64 around the bar of 52. A count once agreed
    stays while the data read it and 0.65 of the resamples do; a new count needs the full bar."""

    def model(clean_first: bool, beta: float, seed: int) -> DecodeModel:
        m = DecodeModel()
        m.observe(gap(1), full_batch=False)
        for _ in range(3):
            m.observe(gap(4), full_batch=True)
        for _ in range(_MIN_SLOT_PAIRS):
            m.observe_pair(gap(1), gap(2))
        if clean_first:
            assert m.learned_slots() == 4  # steady pairs: agreed
        rng = random.Random(seed)  # then 64 noisy ones replace them: clusters at 0, β, 2β
        for _ in range(64):
            jump = rng.choice((0.0, beta, beta, 2 * beta)) + rng.gauss(0, 0.002)
            m.observe_pair(gap(1), gap(1) + jump)
        return m

    assert model(clean_first=False, beta=BETA, seed=5).learned_slots() is None  # under 52
    assert model(clean_first=True, beta=BETA, seed=5).learned_slots() == 4  # the same data
    moved = model(clean_first=True, beta=(gap(4) - ALPHA) / 4, seed=4)  # the data read 5
    assert moved.learned_slots() is None  # 4 no longer read, 5 not agreed
    assert moved._agreed_slots(held=5) == 5  # (agreed by 0.65: kept, had it been held)


def test_no_positive_jump_gives_no_beta_and_no_slots() -> None:
    model = DecodeModel()
    model.observe(gap(1), full_batch=False)
    for _ in range(3):
        model.observe(gap(4), full_batch=True)
    for _ in range(15):
        model.observe_pair(gap(2), gap(1))
    assert model.beta(None) is None
    assert model.learned_slots() is None
