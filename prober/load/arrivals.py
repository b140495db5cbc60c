"""Inter-arrival schedules for open-loop load: Poisson, constant or gamma, at a fixed rate or
a rate that follows piecewise-constant steps; seeded.

Each generator yields absolute offsets in seconds from the start of the run, so the driver
sleeps until `start + offset` and never drifts (a relative sleep after each send would close
the loop and hide a slow server).

- `poisson`: exponential gaps of mean 1/rate.
- `constant`: the n-th arrival at exactly n/rate (a product, not a running sum: no rounding
  drift however long the run).
- `gamma`: gamma gaps of shape k = `burstiness` and mean 1/rate, as `vllm bench
  --burstiness`: k = 1 is Poisson, k < 1 burstier (the gaps' coefficient of variation is
  1/√k), k > 1 smoother.

A schedule (`scheduled_offsets`) varies the rate by time change: the process above is drawn
at rate 1 in "operational time" s, and each arrival is placed at the instant t where the
cumulative rate Λ(t) = ∫ rate reaches s. For Poisson this is exactly a non-homogeneous Poisson
process; for constant, each step receives exactly rate × seconds arrivals per pass; a step of
rate 0 is a pause. Looping repeats the steps; otherwise the arrivals end with the last step.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Iterator, Sequence

from prober.kinds import Arrival


def arrival_offsets(
    kind: Arrival, rate: float, seed: int | None = None, *, burstiness: float = 1.0
) -> Iterator[float]:
    """Offsets (seconds since start) of arrivals at `rate` per second, without end."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    if burstiness <= 0:
        raise ValueError(f"burstiness must be positive, got {burstiness}")
    rng = random.Random(seed)
    offset = 0.0
    n = 0
    while True:
        if kind == "poisson":
            offset += rng.expovariate(rate)
        elif kind == "gamma":
            offset += rng.gammavariate(burstiness, 1.0 / (burstiness * rate))
        else:
            n += 1
            offset = n / rate  # multiply, not add: no accumulated rounding drift
        yield offset


class RateClock:
    """Maps operational time (cumulative expected arrivals) to seconds for rate steps.

    `steps` are (seconds, rate) pairs; at least one rate must be positive.
    """

    def __init__(self, steps: Sequence[tuple[float, float]], *, loop: bool) -> None:
        if not steps or any(s <= 0 or r < 0 for s, r in steps):
            raise ValueError("steps need positive durations and rates of 0 or more")
        self._starts: list[float] = []
        self._cum: list[float] = []
        self._rates = [r for _, r in steps]
        t = a = 0.0
        for seconds, rate in steps:
            self._starts.append(t)
            self._cum.append(a)
            t += seconds
            a += seconds * rate
        if a <= 0:
            raise ValueError("at least one step needs a rate above 0")
        self.period = t  # seconds of one pass
        self.arrivals_per_pass = a
        self._loop = loop

    @property
    def mean_rate(self) -> float:
        return self.arrivals_per_pass / self.period

    def time_at(self, s: float) -> float | None:
        """The instant where the cumulative rate reaches `s`; None past the end of a pass
        that does not loop."""
        passes, rest = divmod(s, self.arrivals_per_pass)
        if passes >= 1 and not self._loop:
            return None
        # bisect_right lands past every step of rate 0 (its cumulative rate equals the
        # next step's), so the division below never divides by a zero rate.
        i = bisect.bisect_right(self._cum, rest) - 1
        return passes * self.period + self._starts[i] + (rest - self._cum[i]) / self._rates[i]


def scheduled_offsets(
    kind: Arrival,
    steps: Sequence[tuple[float, float]],
    *,
    loop: bool,
    seed: int | None = None,
    burstiness: float = 1.0,
) -> Iterator[float]:
    """Offsets of arrivals whose rate follows `steps` ((seconds, rate) pairs), by time change."""
    clock = RateClock(steps, loop=loop)
    for s in arrival_offsets(kind, 1.0, seed, burstiness=burstiness):
        t = clock.time_at(s)
        if t is None:
            return
        yield t
