"""Inter-arrival schedules for open-loop load: Poisson or constant, seeded.

Each generator yields absolute offsets in seconds from the start of the run, so the driver
sleeps until `start + offset` and never drifts (a relative sleep after each send would close
the loop and hide a slow server).
"""

from __future__ import annotations

import random
from collections.abc import Iterator

from prober.kinds import Arrival


def arrival_offsets(kind: Arrival, rate: float, seed: int | None = None) -> Iterator[float]:
    """Offsets (seconds since start) of arrivals at `rate` per second, without end."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    rng = random.Random(seed)
    offset = 0.0
    n = 0
    while True:
        if kind == "poisson":
            offset += rng.expovariate(rate)
        else:
            n += 1
            offset = n / rate  # multiply, not add: no accumulated rounding drift
        yield offset
