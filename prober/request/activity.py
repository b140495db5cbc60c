"""What a target's streams are doing now, live: the last token on any of them, the requests open.

One `StreamActivity` per target, shared by every request sent to it (probes, load, `/probe`,
the cache probe): `Target.send` opens and closes each request on it, and the stream stamps
each token event on it as the event arrives (`StreamState`), so a stream still open counts
as soon as its tokens come, not when it ends. The engine state (`capacity/state.py`) reads
it at scrape time: whether tokens flow, and whether a request has waited for one.

Stamps are `time.perf_counter_ns()` values, as a result's are.
"""

from __future__ import annotations

import itertools


class StreamActivity:
    """The last token instant on any stream of one target, and its requests open."""

    __slots__ = ("_keys", "_open", "last_token_ns")

    def __init__(self) -> None:
        self.last_token_ns: int | None = None
        self._open: dict[int, int] = {}  # key -> when the request began
        self._keys = itertools.count()

    def token(self, t_ns: int) -> None:
        """A token event arrived at `t_ns` on one of the target's streams."""
        if self.last_token_ns is None or t_ns > self.last_token_ns:
            self.last_token_ns = t_ns

    def begin(self, t_ns: int) -> int:
        """A request began at `t_ns`; returns its key for `end`."""
        key = next(self._keys)
        self._open[key] = t_ns
        return key

    def end(self, key: int) -> None:
        self._open.pop(key, None)

    def oldest_open_ns(self) -> int | None:
        """When the longest-open request began; None when none is open."""
        return min(self._open.values(), default=None)

    @property
    def open(self) -> int:
        return len(self._open)
