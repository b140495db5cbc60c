"""The offered load over time: piecewise-linear segments in units of one replica's capacity.

A trace is written in real-deployment seconds and compressed by the experiment's factor.
`rate_at(t)` is the arrival rate at `t` (requests/s once multiplied by the capacity);
`arrivals` draws a non-homogeneous Poisson schedule by thinning (Lewis and Shedler), seeded,
as absolute offsets so the sender never drifts; a trace that names a file to `replay` is sent
as that file's own requests instead (`replayed`), scaled in time and rate to its envelope.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from prober.load.workload import Replay, Request, check_trace, read_trace, replay, resolve_trace


@dataclass(frozen=True, slots=True)
class Segment:
    """The load goes linearly from `begin` to `end` over `seconds`."""

    name: str
    seconds: float
    begin: float
    end: float


@dataclass(frozen=True, slots=True)
class Trace:
    """The load's envelope, and what the report reads from it.

    `replay`: a trace file (`builtin:NAME` or a path, prober/load/workload.py's format) whose own
    requests the traffic process sends, arrival for arrival with their lengths, scaled so that
    the envelope's load is met; empty: Poisson arrivals at the envelope's rate, every request
    of the engine profile's shape. `columns`: the phases the report's table shows;
    `recovery_phase`: the phase after whose start the recovery is timed."""

    segments: tuple[Segment, ...]
    replay: str = ""
    replay_seconds: float = 0.0  # of the replayed file's time, that the segments cover
    columns: tuple[str, ...] = ("ramp", "step", "spike")
    recovery_phase: str = "step"

    @property
    def seconds(self) -> float:
        return sum(s.seconds for s in self.segments)

    def compressed(self, factor: float) -> Trace:
        segments = tuple(Segment(s.name, s.seconds / factor, s.begin, s.end) for s in self.segments)
        return replace(self, segments=segments)

    def spans(self, name: str) -> list[tuple[float, float]]:
        """[start, end) of each run of adjacent segments called `name`, in order."""
        found: list[tuple[float, float]] = []
        t = 0.0
        for s in self.segments:
            if s.name == name:
                if found and found[-1][1] == t:
                    found[-1] = (found[-1][0], t + s.seconds)
                else:
                    found.append((t, t + s.seconds))
            t += s.seconds
        return found

    def phase(self, name: str) -> tuple[float, float]:
        """[start, end) of the first run of segments called `name`."""
        spans = self.spans(name)
        if not spans:
            raise KeyError(name)
        return spans[0]

    def mean(self) -> float:
        """The load averaged over the trace (replica capacities)."""
        return sum(s.seconds * (s.begin + s.end) / 2 for s in self.segments) / self.seconds

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
    return Trace(
        (
            Segment("baseline", 120, 1.2, 1.2),
            Segment("ramp", 360, 1.2, 2.0),
            Segment("step", 240, 3.0, 3.0),
        )
    )


# `diurnal`: the shipped trace's day (prober/load/traces/diurnal.jsonl, 300 s) stands for this long.
DIURNAL_DAY_SECONDS = 1800.0
DIURNAL_MEAN_LOAD = 1.6  # replica capacities over the day (night 0.5, midday 2.3, bursts 3 to 7)
_DIURNAL_BIN_SECONDS = 2.0  # of the file's time: 12 s of the day
_AROUND = 10  # bins each side of a bin: its neighbourhood
# A bin this many times its neighbourhood's median, and 1.5 times the mean, is a burst.
_BURST_OVER = 2.0


def diurnal(scale: float = 1.0) -> Trace:
    """The shipped trace replayed: a daily cycle with four bursts and mixed lengths.

    The envelope is the file's arrivals counted in bins of 2 s of its time, scaled so that
    the day averages `DIURNAL_MEAN_LOAD` capacities; each bin is named by what it is: a
    `burst` (twice the median of its 40 s neighbourhood or more, and 1.5 times the mean),
    `night` (that median below 0.6 of the mean), `midday` (above 1.3 of it) or `day`. The
    traffic process sends the file's own requests, copied or thinned to that mean
    (`replay`). `scale` shortens the day."""
    path = resolve_trace("builtin:diurnal")
    stamps = [r.timestamp_ms / 1000 for r in read_trace(path)]
    first = stamps[0]
    bins = math.ceil((stamps[-1] - first) / _DIURNAL_BIN_SECONDS + 1e-9) or 1
    counts = [0] * bins
    for t in stamps:
        counts[min(bins - 1, int((t - first) / _DIURNAL_BIN_SECONDS))] += 1
    mean = sum(counts) / bins
    seconds = DIURNAL_DAY_SECONDS * scale / bins
    segments = []
    for i, n in enumerate(counts):
        # The median of 40 s of the file around the bin: an 8 s burst does not move it.
        around = statistics.median(counts[max(0, i - _AROUND) : i + _AROUND + 1])
        if n >= _BURST_OVER * around and n >= 1.5 * mean:
            name = "burst"
        elif around < 0.6 * mean:
            name = "night"
        elif around > 1.3 * mean:
            name = "midday"
        else:
            name = "day"
        load = DIURNAL_MEAN_LOAD * n / mean
        segments.append(Segment(name, seconds, load, load))
    return Trace(
        tuple(segments),
        replay="builtin:diurnal",
        replay_seconds=bins * _DIURNAL_BIN_SECONDS,
        columns=("night", "midday", "burst"),
        recovery_phase="midday",
    )


TRACES: dict[str, Callable[[float], Trace]] = {
    "standard": standard,
    "short": short,
    "diurnal": diurnal,
}


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


def replayed(trace: Trace, capacity: float, seed: int) -> Iterator[Request]:
    """The file's requests over the trace (compressed seconds), copied or thinned so that the
    trace's mean load is sent on average; their lengths are the file's.

    The replay sends a line's copies at the line's instant; here every copy but the first is
    moved to a uniform instant before the next line's, so the file's envelope is kept without
    a synchronised arrival of k identical requests that no user population produces.
    """
    path = resolve_trace(trace.replay)
    summary = check_trace(path)
    rate_scale = trace.mean() * capacity * trace.seconds / summary.requests
    spec = Replay(
        path,
        summary,
        time_scale=trace.seconds / trace.replay_seconds,
        rate_scale=rate_scale,
        loop=False,
        seed=seed,
    )
    rng = random.Random(seed ^ 0x5EED)
    group: list[Request] = []
    for request in replay(spec):
        if group and request.offset != group[0].offset:
            yield from _spread(group, min(request.offset, trace.seconds), rng)
            group = []
        if request.offset >= trace.seconds:
            return
        group.append(request)
    if group:
        yield from _spread(group, trace.seconds, rng)


def _spread(copies: list[Request], before: float, rng: random.Random) -> list[Request]:
    """The first of `copies` at its instant, the others at uniform instants up to `before`."""
    at = copies[0].offset
    moved = [replace(c, offset=at + rng.random() * (before - at)) for c in copies[1:]]
    return [copies[0], *sorted(moved, key=lambda c: c.offset)]
