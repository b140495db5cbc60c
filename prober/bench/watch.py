"""Is the client itself the bottleneck? Its CPU and event-loop lag over one measured level.

Every latency bench reports is a stamp taken on this process's event loop. When the loop is
busy (too many streams for one core, another process on the same core), a request is
written late and a worker resumes late: the client's own queueing then shows up in TTFT as
if it were the server's. `ClientWatch` measures, over the level's clock only:

- `cpu_share`: this process's CPU time over wall time (1.0 = a whole core; the loop runs on
  one thread, so it can use no more than that);
- `loop_lag_seconds`: how late a timer set every `LAG_INTERVAL_SECONDS` fires, i.e. how long
  the loop was busy with other work when it fell due. uvloop's timers have millisecond
  resolution, so about 1 ms of it is the timer's own rounding.

`verdict()` marks the level as client-bound when the client was near a core, or when it was
materially busy and its loop lag was material against the latencies the level measured; the
report then says that the level's latencies include the client's queueing and are not to be
trusted. A lag at an idle client comes from outside it (another process on its core, the
timer's rounding): it is noted, with its share of what was measured, but the client is not
what held the level up.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from prober.bench import stats

LAG_INTERVAL_SECONDS = 0.01
# Near a core: the loop has no idle time left to absorb a burst of reads or sends.
CPU_SHARE_LIMIT = 0.90
# A lag counts against the client only when the client itself was busy: below a quarter of a
# core its loop idles three quarters of the time, and a late timer then means the process was
# not scheduled (another process on the core), which fewer streams would not change.
CPU_BUSY_SHARE = 0.25
# The absolute floor: TTFT p99 within 3 ms of the truth is the accuracy goal
# (docs/performance.md), and uvloop's timers round to a millisecond.
LOOP_LAG_P99_LIMIT_SECONDS = 0.003
# ...and the scale: a late stamp matters against what it times. Lag p99 must also reach this
# share of the finest latency the level measured (the smaller of its TTFT p50 and ITL p50):
# 3.5 ms against a 300 ms TTFT is 1 %, within any level-to-level noise.
LAG_SHARE_OF_SCALE = 0.05
_MAX_LAG_SAMPLES = 1_000_000  # ~2.8 h of samples at 10 ms: a bound, not a limit in practice


@dataclass(frozen=True, slots=True)
class ClientLoad:
    """What the client spent over one level's clock."""

    wall_seconds: float
    cpu_seconds: float
    lags: tuple[float, ...]

    @property
    def cpu_share(self) -> float | None:
        return self.cpu_seconds / self.wall_seconds if self.wall_seconds > 0 else None


class ClientWatch:
    """`start()` when a level's clock starts, `stop()` when it ends; returns a `ClientLoad`."""

    def __init__(self, interval: float = LAG_INTERVAL_SECONDS) -> None:
        self._interval = interval
        self._lags: list[float] = []
        self._handle: asyncio.TimerHandle | None = None
        self._due = 0.0
        self._wall0 = self._cpu0 = 0.0

    def start(self) -> None:
        self._lags = []
        self._wall0, self._cpu0 = time.perf_counter(), time.process_time()
        self._arm(time.perf_counter())

    def _arm(self, now: float) -> None:
        # perf_counter, not loop.time(): uvloop's loop clock only moves once per iteration.
        self._due = now + self._interval
        loop = asyncio.get_running_loop()
        self._handle = loop.call_at(loop.time() + self._interval, self._tick)

    def _tick(self) -> None:
        now = time.perf_counter()
        if len(self._lags) < _MAX_LAG_SAMPLES:
            self._lags.append(max(0.0, now - self._due))
        self._arm(now)

    def stop(self) -> ClientLoad:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        wall = time.perf_counter() - self._wall0
        return ClientLoad(wall, time.process_time() - self._cpu0, tuple(self._lags))


def verdict(
    load: ClientLoad, event_loop: str, scale_seconds: float | None = None
) -> dict[str, object]:
    """The report's `client` block: figures, whether the client was the bottleneck, and why.

    `scale_seconds`: the finest latency the level measured (TTFT p50 or ITL p50, the smaller);
    None when it measured none (then only the absolute lag limit applies).
    """
    lag = stats.distribution(load.lags)
    share = load.cpu_share
    p99 = lag["p99"]
    limit = max(LOOP_LAG_P99_LIMIT_SECONDS, LAG_SHARE_OF_SCALE * (scale_seconds or 0.0))
    of_scale = p99 / scale_seconds if p99 is not None and scale_seconds else None
    reasons = []
    if share is not None and share >= CPU_SHARE_LIMIT:
        reasons.append(f"client CPU {share:.2f} of a core (limit {CPU_SHARE_LIMIT:.2f})")
    note = None
    if p99 is not None and p99 > limit:
        lagged = _lag_text(float(p99), of_scale)
        if share is not None and share >= CPU_BUSY_SHARE:
            reasons.append(f"event-loop lag p99 {lagged} at client CPU {share:.2f} of a core "
                           f"({_LIMITS})")  # fmt: skip
        else:
            note = (
                f"event-loop lag p99 {lagged} while the client was idle ({share or 0:.2f} of "
                "a core): another process delayed it; stamps may be late by that much"
            )
    return {
        "event_loop": event_loop,
        "cpu_seconds": load.cpu_seconds,
        "cpu_share": share,
        "loop_lag_seconds": lag,
        "latency_scale_seconds": scale_seconds,
        "lag_p99_share_of_scale": of_scale,
        "client_bound": bool(reasons),
        "reasons": reasons,
        "note": note,
        "latencies_trustworthy": not reasons,
    }


_LIMITS = (
    f"limits {LOOP_LAG_P99_LIMIT_SECONDS * 1000:g} ms, {LAG_SHARE_OF_SCALE:.0%} of the latency, "
    f"{CPU_BUSY_SHARE:g} of a core busy"
)


def _lag_text(p99: float, of_scale: float | None) -> str:
    share = f" = {of_scale:.0%} of the latency measured" if of_scale is not None else ""
    return f"{p99 * 1000:.1f} ms{share}"
