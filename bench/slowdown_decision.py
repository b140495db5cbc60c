"""How soon, and how often wrongly, the pairs of probes first say whether an engine's decode
slowdown can be read from the probes' gaps, in the model of the jumps of `slots_learning.py`.

The running figure below saturation is made only where one more sequence lengthens the step
by a fifth of α (`decode._MIN_SLOWDOWN`). A learner is fed one pair at a time, as a daemon
reads them; each row is an engine: the simulator the tests run (β 0.3 α), one a little above
the threshold (0.25 α), llama-server's larger and wider slowdown (0.8 α, noise a third of it)
and vLLM's CPU build, whose step barely grows against its gaps' noise (0.05 α, noise 0.1 α).
For the decision at the eighth pair whatever it reads (the estimator before 2026-12-06) and
for the first one `DecodeModel.settled` allows (the threshold outside the jumps' mean ± two
standard errors, or 32 pairs): the share of learners whose first decision was wrong, and the
pairs it took (median and 90th percentile).

    .venv/bin/python bench/slowdown_decision.py [--trials 4000]
"""

from __future__ import annotations

import argparse
import random
import statistics

from slots_learning import model_jumps

from prober.capacity import decode
from prober.capacity.decode import DecodeModel

# (name, α ms, β/α, the gaps' noise as a share of α)
ENGINES = (
    ("simulator", 20.0, 0.3, 0.025),
    ("simulator", 20.0, 0.3, 0.05),
    ("just over", 20.0, 0.25, 0.025),
    ("llama-server", 43.0, 0.8, 0.25),
    ("vLLM CPU", 30.0, 0.05, 0.1),
)
MAX_PAIRS = 64


def first_decisions(
    rng: random.Random, alpha_ms: float, beta_ms: float, noise_ms: float, p_left: float,
    p_joined: float,
) -> tuple[tuple[bool, int], tuple[bool, int]]:  # fmt: skip
    """((readable said at the eighth pair, 8), (readable first settled, at which pair))."""
    model = DecodeModel()
    model.observe(alpha_ms / 1000, full_batch=False)
    eighth: tuple[bool, int] | None = None
    jumps = model_jumps(rng, MAX_PAIRS, p_left, p_joined, noise_ms, beta_ms)
    for i, jump in enumerate(jumps, 1):
        model.observe_pair(alpha_ms / 1000, (alpha_ms + jump) / 1000)
        if i == decode._MIN_PAIRS:
            eighth = (model.resolves(None), i)
        if (said := model.readable()) is not None:
            assert eighth is not None
            return eighth, (said, i)
    raise AssertionError("never settled")  # `_MAX_UNSURE_PAIRS` < MAX_PAIRS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trials", type=int, default=4000)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    rng = random.Random(args.seed)
    print(f"{args.trials} learners a row; first decision: share wrong, pairs (median, p90)")
    print(
        f"{'engine':>12} {'β/α':>5} {'noise/α':>7} {'left/joined':>11}"
        f" {'8th: wrong':>10}  {'settled: wrong':>14} {'pairs':>5} {'p90':>4}"
    )
    for name, alpha, ratio, noise in ENGINES:
        truth = ratio >= decode._MIN_SLOWDOWN
        for p_left, p_joined in ((0.25, 0.25), (0.32, 0.18)):
            runs = [
                first_decisions(rng, alpha, ratio * alpha, noise * alpha, p_left, p_joined)
                for _ in range(args.trials)
            ]
            old = sum(said != truth for (said, _), _ in runs) / args.trials
            new = sum(said != truth for _, (said, _) in runs) / args.trials
            pairs = sorted(at for _, (_, at) in runs)
            p90 = pairs[int(0.9 * (len(pairs) - 1))]
            print(
                f"{name:>12} {ratio:5.2f} {noise:7.3f} {p_left:5.2f}/{p_joined:<5.2f}"
                f" {old:10.3f}  {new:14.3f} {statistics.median(pairs):5.0f} {p90:4d}"
            )


if __name__ == "__main__":
    main()
