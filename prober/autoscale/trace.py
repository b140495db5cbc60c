"""The offered load over time: piecewise-linear segments in units of one replica's capacity.

A trace is written in real-deployment seconds and compressed by the experiment's factor.
`rate_at(t)` is the arrival rate at `t` (requests/s once multiplied by the capacity);
`arrivals` draws a non-homogeneous Poisson schedule by thinning (Lewis and Shedler), seeded,
as absolute offsets so the sender never drifts.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Segment:
    """The load goes linearly from `begin` to `end` over `seconds`."""

    name: str
    seconds: float
    begin: float
    end: float


@dataclass(frozen=True, slots=True)
class Trace:
    segments: tuple[Segment, ...]

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.segments)

    def compressed(self, factor: float) -> Trace:
        return Trace(tuple(Segment(s.name, s.seconds / factor, s.begin, s.end)
                           for s in self.segments))  # fmt: skip

    def phase(self, name: str) -> tuple[float, float]:
        """[start, end) of the first segment called `name`."""
        t = 0.0
        for s in self.segments:
            if s.name == name:
                return t, t + s.seconds
            t += s.seconds
        raise KeyError(name)

    def rate_at(self, t: float) -> float:
        start = 0.0
        for s in self.segments:
            if t < start + s.seconds:
                share = (t - start) / s.seconds if s.seconds > 0 else 0.0
                return s.begin + (s.end - s.begin) * share
            start += s.seconds
        return 0.0

    def peak(self) -> float:
        return max(max(s.begin, s.end) for s in self.segments)


def standard(scale: float = 1.0) -> Trace:
    """Real-time trace (s, load in replica capacities): baseline, ramp, step, spike.

    `scale` shortens every segment (the short test uses it); the shape is unchanged."""
    parts = (
        Segment("baseline", 240, 1.2, 1.2),
        Segment("ramp", 360, 1.2, 2.0),
        Segment("step", 480, 3.0, 3.0),
        Segment("settle", 300, 2.0, 2.0),
        Segment("spike", 90, 3.6, 3.6),
        Segment("after", 330, 2.0, 2.0),
    )
    return Trace(tuple(Segment(p.name, p.seconds * scale, p.begin, p.end) for p in parts))


def short(scale: float = 1.0) -> Trace:
    """The standard trace up to its step, shortened where nothing is decided (12 minutes;
    `scale` is accepted for symmetry with `standard` and ignored)."""
    return Trace((
        Segment("baseline", 120, 1.2, 1.2),
        Segment("ramp", 360, 1.2, 2.0),
        Segment("step", 240, 3.0, 3.0),
    ))  # fmt: skip


TRACES: dict[str, Callable[[float], Trace]] = {"standard": standard, "short": short}


def arrivals(trace: Trace, capacity: float, seed: int) -> Iterator[float]:
    """Arrival offsets (s) of a Poisson process with rate `capacity × rate_at(t)`."""
    rng = random.Random(seed)
    top = capacity * trace.peak()
    if top <= 0:
        return
    t, end = 0.0, trace.seconds
    while True:
        t += rng.expovariate(top)
        if t >= end:
            return
        if rng.random() * top <= capacity * trace.rate_at(t):
            yield t
