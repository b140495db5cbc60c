"""When a target's probes fire: on a grid of its interval, at a phase of its own.

Each target's runs fall on `phase + k·interval` seconds of the epoch (plus the run's jitter),
its phase a stable hash of its name spread over the interval. Prometheus offsets each
target's scrapes the same way, and for the same reason: targets started together fired
together. With every job's first run at start and each next one an interval after the last,
the 500 targets of one discovered group all fired within the jitter's second, every 15 s,
and the daemon's dispatch lag p99 was near a second where its median was 2 ms
(`bench/fleet_scale.py`). On the grid the same fleet fires a target every 30 ms.

The first run still comes at once (a new target is probed, after its warm-up, as soon as it
is known); the second on the first grid instant at least one interval later, so a first
probe that takes most of an interval is not followed at once by a second one that its
in-flight cap would skip. A daemon restarted, or another shard given the target, probes it at
the same instants of the clock. And the runs keep the interval on average: apscheduler's
own interval trigger counts each run from the last one's jittered time, so its runs came
`jitter / 2` late on average and drifted (15.5 s apart for a 15 s interval with 1 s of
jitter).
"""

from __future__ import annotations

import hashlib
import math
import random
from datetime import UTC, datetime

from apscheduler.triggers.interval import IntervalTrigger

_EPSILON = 1e-5  # seconds: ten times a datetime's resolution


def phase(name: str, interval: float) -> float:
    """`name`'s offset on a grid of `interval` seconds, in [0, interval): the same in every
    process (a hash of the name, not Python's salted one)."""
    digest = hashlib.blake2b(name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 * interval


class PhasedInterval(IntervalTrigger):  # type: ignore[misc]  # apscheduler 3 has no types
    """apscheduler's interval trigger whose runs fall on the grid `start_date + k·interval`,
    whichever run came before (see the module)."""

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        if previous_fire_time is None:
            return super().get_next_fire_time(None, now)  # type: ignore[no-any-return]
        start, step = self.start_date.timestamp(), self.interval_length
        done = previous_fire_time.timestamp()
        # The grid instant after the slot the previous run belonged to: its own jitter (less
        # than an interval) never moves the next one. A datetime holds microseconds, so a run
        # on the grid can read a hair before its instant: without the margin it was taken
        # for the slot before, and the same instant came back forever (a scheduler that
        # never left its loop, at 0.2 s intervals).
        k = 0 if done < start - _EPSILON else math.floor((done - start + _EPSILON) / step) + 1
        fire = start + k * step
        if self.jitter is not None:
            fire += random.uniform(0, self.jitter)
        while fire <= done:  # never the previous run's instant, or one before it
            fire += step
        return datetime.fromtimestamp(fire, tz=self.timezone)


def phased(name: str, interval: float, jitter: float | None, now: datetime) -> PhasedInterval:
    """The trigger of `name`'s probes from `now`: its next run on its grid at least one
    interval from now (the first run, at once, is given apart)."""
    offset = phase(name, interval)
    earliest = now.timestamp() + interval
    k = math.ceil((earliest - offset) / interval)
    start = datetime.fromtimestamp(offset + k * interval, tz=UTC)
    return PhasedInterval(seconds=interval, start_date=start, timezone=UTC, jitter=jitter or None)
