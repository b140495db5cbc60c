"""How often the slots learned from pairs of probes miss, in a model of the pairs' jumps.

A pair's jump is β·(1 + Δf): one more sequence (the companion), plus the foreign requests
that joined (Δf > 0) or left (Δf < 0) while its gaps were read; some land between clusters
(a change in the middle of the gaps a jump is read from), and each carries the gaps' noise.
The mixtures (`MIXES`) are what the simulator's foreign-traffic test showed at half load:
balanced and skewed both ways (2026-12-03: of 16 pairs a run, about a quarter near 0, a third
near β, a quarter near 2β, the rest between), and its 64 jumps of 2026-12-07 with clusters at
−β and β/2 too. Each learning reads `1 + (gap_full − α) / β` with β from the cluster search
seeded at the jumps' median (the estimator before 2026-12-03), at their mean (before
2026-12-07), and from `one_more` (the mean's, or the cluster at twice it where that holds
more than twice the jumps). Prints the share of learnings that miss the slots,
and, for the learner as the estimate runs it (`DecodeModel.learned_slots`, which reports a
count only where 64 resamples of its pairs and full-batch gaps agree on it), the share wrong
and the share unknown; the noise of 3 ms, half of β, is an engine whose step barely grows
with the batch against its gaps' jitter (vLLM on a CPU). Then a learner as a daemon runs
it, read after every pair (`stream`): the share of reads wrong and unknown, and how often a
known count is dropped, with a count kept at the bar that first agreed it and at the lower
one that keeps it (`decode._SLOTS_KEEP`).

    .venv/bin/python bench/slots_learning.py [--trials 4000] [--slots 4]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable
from typing import NamedTuple

from prober.capacity import decode
from prober.capacity.decode import DecodeModel, cluster_centre, one_more

BETA_MS = 6.0  # the simulator's decode slowdown: 0.3 × its 20 ms step
ALPHA_MS = 20.0


class Mix(NamedTuple):
    """Shares of the pairs whose jump is 0 (one foreign request left), 2β (one joined), −β
    (two left), β/2 (a change halfway through the gaps a jump is read from); β takes the rest
    up to 0.85, and 0.15 land between clusters."""

    left: float
    joined: float
    two_left: float = 0.0
    half: float = 0.0


# Balanced, more leaving, more joining (the 2026-12-03 shape), and what 64 jumps of the
# simulator's test without the hint held on 2026-12-07 (7 near −β, 13 near 0, 10 near β/2,
# 21 near β, 12 near 2β, 1 at 3β), scaled to leave 0.15 between clusters.
MIXES = (Mix(0.25, 0.25), Mix(0.32, 0.18), Mix(0.18, 0.32), Mix(0.17, 0.16, 0.09, 0.13))


def model_jumps(
    rng: random.Random, n: int, mix: Mix, noise: float, beta: float = BETA_MS
) -> list[float]:
    """`n` jumps drawn from `mix`, each with the gaps' noise."""
    p_left, p_joined, p_two_left, p_half = mix
    out = []
    for _ in range(n):
        u = rng.random()
        if u < p_left:
            jump = 0.0
        elif (u := u - p_left) < p_joined:
            jump = 2 * beta
        elif (u := u - p_joined) < p_two_left:
            jump = -beta
        elif (u := u - p_two_left) < p_half:
            jump = beta / 2
        elif u < 0.85 - p_left - p_joined - p_two_left:  # u is past left, joined, two left
            jump = beta
        else:  # between clusters
            jump = rng.uniform(-beta, 3 * beta)
        out.append(jump + rng.gauss(0.0, noise))
    return out


def _mix(mix: Mix) -> str:
    return "/".join(f"{share:.2f}" for share in mix)


def _median_seeded(jumps: list[float]) -> float | None:
    return cluster_centre(jumps, statistics.median(jumps))


def _mean_seeded(jumps: list[float]) -> float | None:
    return cluster_centre(jumps, statistics.fmean(jumps))


def miss_rate(
    estimator: Callable[[list[float]], float | None], rng: random.Random, trials: int,
    pairs: int, slots: int, mix: Mix, noise: float,
) -> float:  # fmt: skip
    span = BETA_MS * (slots - 1)  # gap_full − α
    misses = 0
    for _ in range(trials):
        beta = estimator(model_jumps(rng, pairs, mix, noise))
        misses += beta is None or round(1 + span / beta) != slots
    return misses / trials


def _with_full_batches(rng: random.Random, slots: int, noise: float, beta_ms: float) -> DecodeModel:
    """A learner that has seen a lone probe and three at full batch (their gaps as noisy as
    the jumps), no pair yet."""
    model = DecodeModel()
    model.observe(ALPHA_MS / 1000, full_batch=False)
    for _ in range(3):
        full = ALPHA_MS + beta_ms * (slots - 1) + rng.gauss(0.0, noise)
        model.observe(full / 1000, full_batch=True)
    return model


def guarded(
    rng: random.Random, trials: int, pairs: int, slots: int, mix: Mix, noise: float,
    beta_ms: float = BETA_MS,
) -> tuple[float, float]:  # fmt: skip
    """(share wrong, share unknown) of `DecodeModel.learned_slots`, which reads the slots only
    where resamples of its data agree on them; full-batch gaps carry the same noise."""
    wrong = unknown = 0
    for _ in range(trials):
        model = _with_full_batches(rng, slots, noise, beta_ms)
        for jump in model_jumps(rng, pairs, mix, noise, beta_ms):
            model.observe_pair(ALPHA_MS / 1000, (ALPHA_MS + jump) / 1000)
        learned = model.learned_slots()
        unknown += learned is None
        wrong += learned is not None and learned != slots
    return wrong / trials, unknown / trials


def stream(
    rng: random.Random, trials: int, slots: int, mix: Mix, noise: float,
    pairs: int = 120, keep: float | None = None,
) -> tuple[float, float, float]:  # fmt: skip
    """A daemon reading its slots after every pair from the fortieth to the `pairs`-th (full-
    batch gaps as above): (share of reads wrong, share unknown, times a known count was
    dropped per learner). `keep`: the share of resamples that keeps a count once agreed
    (`decode._SLOTS_KEEP`); None, the estimate's own."""
    wrong = unknown = drops = reads = 0
    saved = decode._SLOTS_KEEP
    decode._SLOTS_KEEP = saved if keep is None else keep
    try:
        for _ in range(trials):
            model = _with_full_batches(rng, slots, noise, BETA_MS)
            held = None
            for i, jump in enumerate(model_jumps(rng, pairs, mix, noise)):
                model.observe_pair(ALPHA_MS / 1000, (ALPHA_MS + jump) / 1000)
                if i + 1 < decode._MIN_SLOT_PAIRS:
                    continue
                learned = model.learned_slots()
                reads += 1
                unknown += learned is None
                wrong += learned is not None and learned != slots
                drops += held is not None and learned is None
                held = learned
    finally:
        decode._SLOTS_KEEP = saved
    return wrong / reads, unknown / reads, drops / trials


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=4000)
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    print(f"slots {args.slots}, β {BETA_MS} ms, {args.trials} learnings a row; share missed")
    print(
        f"{'left/joined/two left/half':>23} {'noise ms':>8} {'pairs':>5} {'median seed':>11}"
        f" {'mean seed':>9} {'one_more':>8}"
        f"  guarded: {'wrong':>5} {'unknown':>7}"
    )
    guard_trials = max(1, args.trials // 10)  # each learning resamples its data 64 times
    for mix in MIXES:
        for noise in (0.3, 1.0, 3.0):
            for pairs in (15, 40, 64):
                shape = (pairs, args.slots, mix, noise)
                seeds = (_median_seeded, _mean_seeded, one_more)
                rates = [miss_rate(est, rng, args.trials, *shape) for est in seeds]
                wrong, unknown = guarded(rng, guard_trials, *shape)
                print(
                    f"{_mix(mix):>23} {noise:8.1f} {pairs:5d} "
                    f"{rates[0]:11.3f} {rates[1]:9.3f} {rates[2]:8.3f}  {wrong:14.3f}"
                    f" {unknown:7.3f}"
                )
    stream_trials = max(1, args.trials // 60)  # a learner reads its slots 81 times
    print(f"\nread after every pair from the 40th to the 120th, {stream_trials} learners a row")
    head: tuple[tuple[str, int], ...] = (("left/joined/two left/half", 23), ("noise ms", 8))
    head += (("keep", 5), ("wrong", 6), ("unknown", 7))
    print(" ".join(f"{name:>{width}}" for name, width in head), f"{'drops':>6}")
    for mix in MIXES:
        for noise in (0.3, 1.0, 3.0):
            for keep in (decode._SLOTS_AGREEMENT, decode._SLOTS_KEEP):
                wrong, unknown, drops = stream(
                    rng, stream_trials, args.slots, mix, noise, keep=keep
                )
                print(
                    f"{_mix(mix):>23} {noise:8.1f} {keep:5.2f} "
                    f"{wrong:6.3f} {unknown:7.3f} {drops:6.2f}"
                )


if __name__ == "__main__":
    main()
