"""How soon, and how often wrongly, the pairs of probes first say whether an engine's decode
slowdown can be read from the probes' gaps, in the model of the jumps of `slots_learning.py`.

The running figure below saturation is made only where one more sequence lengthens the step
by a fifth of α (`decode._MIN_SLOWDOWN`), judged by the jumps' median or their trimmed mean,
whichever clears it. A learner is fed one pair at a time, as a daemon reads them; each row is
an engine and a mixture of the jumps' clusters (`slots_learning.MIXES`: foreign requests
leaving and joining alike, leaving more, and the simulator's own mixture of 2026-12-07 with
clusters at −β and β/2 too). The engines: the simulator as the hinted probes-alone test runs
it (β 0.5 α) and as it ran before (0.3 α, as the other simulator tests still do), one a
little above the threshold (0.25 α), llama-server's larger and wider slowdown (0.8 α, noise a
third of it) and vLLM's CPU build, whose step barely grows against its gaps' noise (0.05 α,
noise 0.1 α). Three first decisions: at the eighth pair
whatever it reads (the estimator before 2026-12-06); once the threshold lies outside the
trimmed mean ± two standard errors (before 2026-12-07); and the first `DecodeModel.settled`
allows (the mean's interval or the sign test on the median: readable where either is sure of
it, unreadable where both are). Either waits at most 32 pairs. For each: the share of
learners whose first decision was wrong; for the last, the pairs it took (median, 90th
percentile).

    .venv/bin/python bench/slowdown_decision.py [--trials 4000]
"""

from __future__ import annotations

import argparse
import random
import statistics

from slots_learning import ALPHA_MS, MIXES, model_jumps

from prober.capacity import decode
from prober.capacity.decode import DecodeModel

# (name, β/α, the gaps' noise as a share of α, α ms)
ENGINES = (
    ("simulator", 0.5, 0.025, ALPHA_MS),
    ("sim. before", 0.3, 0.025, ALPHA_MS),
    ("just over", 0.25, 0.025, ALPHA_MS),
    ("llama-server", 0.8, 0.25, 43.0),
    ("vLLM CPU", 0.05, 0.1, 30.0),
)
MAX_PAIRS = 64


def _fed(jumps: list[float], alpha_ms: float) -> DecodeModel:
    model = DecodeModel()
    model.observe(alpha_ms / 1000, full_batch=False)
    for jump in jumps:
        model.observe_pair(alpha_ms / 1000, (alpha_ms + jump) / 1000)
    return model


def first_words(jumps: list[float], alpha_ms: float) -> tuple[bool, bool, bool, int]:
    """(readable at the eighth pair, as first said by the mean alone, as first settled, at
    which pair it settled)."""
    eighth = _fed(jumps[: decode._MIN_PAIRS], alpha_ms).resolves(None)
    threshold = decode._MIN_SLOWDOWN * alpha_ms
    by_mean = next(
        _fed(jumps[:i], alpha_ms).resolves(None)
        for i in range(decode._MIN_PAIRS, len(jumps) + 1)
        if i >= decode._MAX_UNSURE_PAIRS or decode._mean_side(jumps[:i], threshold) != 0
    )
    model = _fed([], alpha_ms)
    for i, jump in enumerate(jumps, 1):
        model.observe_pair(alpha_ms / 1000, (alpha_ms + jump) / 1000)
        if (said := model.readable()) is not None:
            return eighth, by_mean, said, i
    raise AssertionError("never settled")  # `_MAX_UNSURE_PAIRS` < MAX_PAIRS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    print(f"{args.trials} learners a row; first decision: share wrong, pairs (median, p90)")
    print(
        f"{'engine':>12} {'β/α':>5} {'noise/α':>7} {'mixture':>19}"
        f" {'8th':>6} {'mean':>6} {'now':>6} {'pairs':>5} {'p90':>4}"
    )
    for name, ratio, noise, alpha in ENGINES:
        truth = ratio >= decode._MIN_SLOWDOWN
        for mix in MIXES[:2] + MIXES[3:]:
            runs = [
                first_words(model_jumps(rng, MAX_PAIRS, mix, noise * alpha, ratio * alpha), alpha)
                for _ in range(args.trials)
            ]
            wrong = [sum(run[k] != truth for run in runs) / args.trials for k in range(3)]
            pairs = sorted(run[3] for run in runs)
            p90 = pairs[int(0.9 * (len(pairs) - 1))]
            shares = "/".join(f"{share:.2f}" for share in mix)
            print(
                f"{name:>12} {ratio:5.2f} {noise:7.3f} {shares:>19}"
                f" {wrong[0]:6.3f} {wrong[1]:6.3f} {wrong[2]:6.3f}"
                f" {statistics.median(pairs):5.0f} {p90:4d}"
            )


if __name__ == "__main__":
    main()
