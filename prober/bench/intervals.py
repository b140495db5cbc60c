"""Confidence intervals of one bench level, by the bootstrap over its requests.

Pure and seeded: every interval comes from `REPLICATES` resamples (with replacement) of the
level's requests, drawn by a generator seeded from the statistic's name and the sample size,
so the same data gives the same interval on every run and machine. The interval is the
percentile interval: the (1 − CONFIDENCE)/2 and (1 + CONFIDENCE)/2 quantiles of the replicates.

- **Latency quantiles** (`quantile_intervals`): each replicate is the quantile of a resample
  of the per-request values. A quantile q gets an interval only when at least one value lies
  above it (n·(1 − q) ≥ 1: p90 from 10 requests, p95 from 20, p99 from 100): below that the
  quantile is the largest value or an interpolation towards it, and no resample can show how
  much larger it could be.
- **Throughput** (`throughput_intervals`): each request carries a share τ of the level's
  time and what it counts (completed, output tokens, good), so a rate is Σ counted / Σ τ; a
  replicate resamples requests with their τ (`throughput.py` says which τ, and why).

No interval at all below `MIN_REQUESTS` values: a bootstrap of a handful of values under-covers
badly, and the verdicts (`verdicts.py`) call nothing on a level without intervals.
"""

from __future__ import annotations

import math
import random
from array import array
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

CONFIDENCE = 0.95
REPLICATES = 1000
MIN_REQUESTS = 10
QUANTILES = (("p50", 0.50), ("p90", 0.90), ("p95", 0.95), ("p99", 0.99))

Interval = list[float]  # [low, high], as the JSON report carries it


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (NumPy's default method); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return _sorted_quantile(ordered, q)


def _sorted_quantile(ordered: Sequence[float], q: float) -> float:
    pos = q * (len(ordered) - 1)
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def _bounds(replicates: list[float]) -> Interval:
    ordered = sorted(replicates)
    tail = (1 - CONFIDENCE) / 2
    return [_sorted_quantile(ordered, tail), _sorted_quantile(ordered, 1 - tail)]


def _resamples(n: int, name: str) -> Iterator[list[int]]:
    """REPLICATES lists of n indices drawn with replacement, seeded by `name` and n.

    32 random bits an index, reduced modulo n (a bias of n / 2^32: none that shows), mapped
    in C: `random.choices` draws a float an index in Python, 5x slower at 1000 requests."""
    rng = random.Random(f"bootstrap:{name}:{n}")
    for _ in range(REPLICATES):
        yield list(map(n.__rmod__, array("I", rng.randbytes(4 * n))))


def quantile_intervals(
    columns: Mapping[str, Sequence[float]],
) -> dict[str, dict[str, Interval | None]]:
    """Intervals of p50/p90/p95/p99 of each column (None where there is not enough data).

    Columns of the same length share their resamples (one seed a length): the figures of one
    request set are resampled together, and the cost is one resampling a length."""
    out = {name: dict.fromkeys(key for key, _ in QUANTILES) for name in columns}
    sizes = {len(v) for v in columns.values() if len(v) >= MIN_REQUESTS}
    for n in sizes:
        wanted = [(key, q) for key, q in QUANTILES if n * (1 - q) >= 1 - 1e-9]
        same = {name: sorted(v) for name, v in columns.items() if len(v) == n}
        reps: dict[tuple[str, str], list[float]] = {
            (name, key): [] for name in same for key, _ in wanted
        }
        for idx in _resamples(n, "quantiles"):
            # Indices into the sorted values, sorted: the resample in order, no float sorting.
            idx.sort()
            for key, q in wanted:
                pos = q * (n - 1)
                low = math.floor(pos)
                i, j, frac = idx[low], idx[min(low + 1, n - 1)], pos - low
                for name, ordered in same.items():
                    a = ordered[i]
                    reps[name, key].append(a + (ordered[j] - a) * frac)
        for (name, key), r in reps.items():
            out[name][key] = _bounds(r)
    return out


@dataclass(frozen=True, slots=True)
class Share:
    """One request's share of the level's window and what it counts towards throughputs."""

    seconds: float
    ok: int
    tokens: int
    good: int


Count = Callable[[Share], int]
_COUNTS: dict[str, Count] = {
    "request_throughput": lambda s: s.ok,
    "output_token_throughput": lambda s: s.tokens,
    "goodput_requests_per_second": lambda s: s.good,
}


def throughput_intervals(shares: Sequence[Share], name: str) -> dict[str, Interval | None]:
    """Intervals of the request, output-token and goodput rates: Σ counted / Σ τ per replicate."""
    out: dict[str, Interval | None] = dict.fromkeys(_COUNTS)
    if len(shares) < MIN_REQUESTS or sum(s.seconds for s in shares) <= 0:
        return out
    seconds = [s.seconds for s in shares]
    counts = {key: [count(s) for s in shares] for key, count in _COUNTS.items()}
    reps: dict[str, list[float]] = {key: [] for key in _COUNTS}
    for idx in _resamples(len(shares), name):
        span = math.fsum(map(seconds.__getitem__, idx))
        if span <= 0:  # every picked request has no time share: nothing to divide by
            continue
        for key, column in counts.items():
            reps[key].append(sum(map(column.__getitem__, idx)) / span)
    return {key: _bounds(r) if r else None for key, r in reps.items()}


def ratio_interval(
    before: float, before_ci: Interval, after: float, after_ci: Interval
) -> tuple[float, float, float] | None:
    """after / before with its interval, from the two levels' own intervals (independent
    samples): MOVER (Zou & Donner 2008) on the log scale. None for a non-positive figure."""
    if min(before, after, *before_ci, *after_ci) <= 0:
        return None
    a_lo, a_hi = (math.log(before_ci[0]), math.log(before_ci[1]))
    b_lo, b_hi = (math.log(after_ci[0]), math.log(after_ci[1]))
    a, b = math.log(before), math.log(after)
    diff = b - a
    low = diff - math.hypot(b - b_lo, a_hi - a)
    high = diff + math.hypot(b_hi - b, a - a_lo)
    return math.exp(diff), math.exp(low), math.exp(high)
