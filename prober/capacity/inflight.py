"""The prober's own probes in flight, for the probes-alone estimate: when each began, got its
first token and ended, and from that how many of them waited for and held a slot over the
last few seconds (`ProbesInFlight`). The scheduler writes the stamps; `probes.ProbesAloneEstimator`
counts them on top of the foreign figures.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable


class ProbesInFlight:
    """The prober's own probes: when each began, got its first token and ended.

    `occupancy()` gives the time-averaged number of them waiting for and holding a slot over
    the last few seconds, the same smoothing the foreign figures have."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._live: dict[int, list[float | None]] = {}  # key → [begin, first token]
        self._done: deque[tuple[float, float | None, float]] = deque(maxlen=64)
        self._keys = itertools.count()

    def begin(self) -> int:
        key = next(self._keys)
        self._live[key] = [self._clock(), None]
        return key

    def first_token(self, key: int) -> None:
        if (stamps := self._live.get(key)) is not None and stamps[1] is None:
            stamps[1] = self._clock()

    def end(self, key: int) -> None:
        if (stamps := self._live.pop(key, None)) is not None:
            begin, first = stamps
            assert begin is not None
            self._done.append((begin, first, self._clock()))

    def waited(self, now: float) -> list[float]:
        """Seconds each probe still without a first token has been in flight."""
        return [now - b for b, first in self._live.values() if b is not None and first is None]

    def occupancy(self, now: float, window: float, prefill: float) -> tuple[float, float]:
        """(waiting, holding a slot), each averaged over the last `window` seconds.

        A probe waits from its start until `first token − prefill` and holds a slot from then
        on; one still without a token waits until `now − prefill`."""
        start = now - window
        waiting = holding = 0.0
        live = ((b, f, now) for b, f in self._live.values() if b is not None)
        for begin, first, end in itertools.chain(self._done, live):
            if end < start:
                continue
            admitted = max(begin, (now if first is None else first) - prefill)
            waiting += max(0.0, min(admitted, end) - max(begin, start))
            holding += max(0.0, end - max(admitted, start))
        return waiting / window, holding / window
