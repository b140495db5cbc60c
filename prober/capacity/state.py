"""The engine's state, judged at scrape time from what the prober saw in the last `stall_seconds`.

One of four (docs/design.md §12 gives the definitions, the default window and the time each
state takes to turn):

- `down`: requests finished in the window and every one of them failed before any byte of a
  response (`connect_error`, `timeout_connect`) or with a 5xx, and no token came;
- `stalled`: no token arrived on any of the target's streams (probes, load, `/probe`, the
  cache probe, streams still open included: `request.activity.StreamActivity`) for the
  window, the engine's progress counter (where scraped) did not move in it or could not be
  read, and a request waited through it: one still open that began at least the window ago,
  or one that ended in it after waiting for a token in vain (`timeout_first_token`,
  `timeout_total`, `stalled`);
- `busy`: tokens flow (on a stream, or the engine's counter moved), and the last TTFT or
  queue wait in the window is over the TTFT SLO, or the saturation is at least 1;
- `ok`: otherwise (an idle engine, which nobody asked anything, is ok).

Tokens that flow rule out `stalled` and `down`: a full engine is busy, never stalled, since
restarting it for being full makes the queue worse. `EngineWatch` keeps the evidence and
writes nothing; `TargetCapacity` feeds it and `CapacityCollector` and `/-/engine` read it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum

from prober import timings
from prober.request.activity import StreamActivity
from prober.result import Outcome, RequestResult

_KEPT = 4096  # finished requests remembered: a window's worth at 68/s for a minute
_NS = 1_000_000_000


class EngineState(StrEnum):
    OK = "ok"
    BUSY = "busy"
    STALLED = "stalled"
    DOWN = "down"


@dataclass(frozen=True, slots=True)
class StateVerdict:
    """A state and the one line that says why."""

    state: EngineState
    reason: str

    @property
    def serving(self) -> bool:
        """Whether the engine serves (ok, busy): what `/-/engine` answers 200 for."""
        return self.state in (EngineState.OK, EngineState.BUSY)


# Failed before any byte of a response, or answered with a server error.
REFUSED = frozenset({Outcome.CONNECT_ERROR, Outcome.TIMEOUT_CONNECT, Outcome.HTTP_5XX})
# Accepted (connected, sent), then waited for a token in vain.
WAITED = frozenset({Outcome.TIMEOUT_FIRST_TOKEN, Outcome.TIMEOUT_TOTAL, Outcome.STALLED})


@dataclass(frozen=True, slots=True)
class _Seen:
    t_end_ns: int
    outcome: Outcome
    ttft: float | None
    wait: float | None


class EngineWatch:
    """One target's evidence: its streams' activity, its finished requests, and its engine's
    progress counter; `judge` says the state."""

    def __init__(
        self, activity: StreamActivity, *, clock_ns: Callable[[], int] = time.perf_counter_ns
    ) -> None:
        self.activity = activity
        self._clock_ns = clock_ns
        self._seen: deque[_Seen] = deque(maxlen=_KEPT)
        self._counter: float | None = None  # the last reading that succeeded
        self.counter_read = False  # whether the last scrape read it
        self._moved_ns: int | None = None  # the last reading at which the counter had grown

    def finished(self, result: RequestResult, wait: float | None = None) -> None:
        """A finished request of the target's (`wait`: its queue wait, where estimated)."""
        if result.outcome is Outcome.CANCELLED:
            return  # the prober's doing (shutdown, a stopped load): nothing of the engine's
        self._seen.append(_Seen(result.t_end_ns, result.outcome, timings.ttft(result), wait))

    def counter(self, value: float | None) -> None:
        """A reading of the engine's progress counter; None: the scrape failed or the engine
        exports none. Movement is against the last reading that succeeded, so one failed
        scrape between two good ones (a busy engine answers its /metrics late) loses none.
        A counter that fell is an engine that restarted: no movement."""
        self.counter_read = value is not None
        if value is None:
            return
        if self._counter is not None and value > self._counter:
            self._moved_ns = self._clock_ns()
        self._counter = value

    def silent(self, seconds: float) -> bool:
        """Whether the target has been silent for `seconds`: no token on any of its streams and
        no movement of the engine's counter (where read) in them, while a request waited
        through them (one open since) or one ended in them (without a token, then). What the
        background load pauses on (`load.silent_seconds`): cheaper than `judge`, it is asked
        at every arrival."""
        since = self._clock_ns() - int(seconds * _NS)
        last_token = self.activity.last_token_ns
        if last_token is not None and last_token > since:
            return False
        if self._moved_ns is not None and self._moved_ns > since:
            return False
        if self._seen and self._seen[-1].t_end_ns > since:
            return True
        oldest = self.activity.oldest_open_ns()
        return oldest is not None and oldest <= since

    def judge(
        self, stall_seconds: float, slo_ttft: float, saturation: float | None = None
    ) -> StateVerdict:
        """The state over the last `stall_seconds`, now."""
        now = self._clock_ns()
        since = now - int(stall_seconds * _NS)
        seen = [s for s in self._seen if s.t_end_ns > since]
        window = f"{stall_seconds:g} s"
        last_token = self.activity.last_token_ns
        streams = last_token is not None and last_token > since
        engine = self._moved_ns is not None and self._moved_ns > since
        if streams or engine:
            return _flowing(seen, slo_ttft, saturation, "streams" if streams else "counter")
        if seen and all(s.outcome in REFUSED for s in seen):
            kinds = ", ".join(sorted({s.outcome.value for s in seen}))
            return StateVerdict(
                EngineState.DOWN,
                f"down: all {len(seen)} requests in the last {window} failed ({kinds}), no token",
            )
        oldest = self.activity.oldest_open_ns()
        waiting = oldest is not None and oldest <= since
        waited = [s for s in seen if s.outcome in WAITED]
        if waiting or waited:
            counter = "still" if self.counter_read else "not read"
            what = (
                f"a request open for {(now - oldest) / _NS:.0f} s"
                if waiting and oldest is not None
                else f"{len(waited)} requests timed out waiting"
            )
            return StateVerdict(
                EngineState.STALLED,
                f"stalled: no token on any stream for {window} while {what};"
                f" engine counter {counter}",
            )
        if not seen:
            return StateVerdict(EngineState.OK, f"ok: no request ended in the last {window}")
        return StateVerdict(EngineState.OK, f"ok: no token in the last {window}, none waiting")


def _flowing(
    seen: list[_Seen], slo_ttft: float, saturation: float | None, source: str
) -> StateVerdict:
    """Tokens flow (on the prober's `streams`, or the engine's `counter` moved): busy or ok."""
    flow = "tokens flow" if source == "streams" else "the engine's token counter moves"
    with_token = [s for s in seen if s.ttft is not None]
    last = with_token[-1] if with_token else None
    if last is not None and last.ttft is not None and last.ttft > slo_ttft:
        return StateVerdict(
            EngineState.BUSY, f"busy: {flow}; TTFT {last.ttft:.3g} s over the SLO {slo_ttft:g} s"
        )
    if last is not None and last.wait is not None and last.wait > slo_ttft:
        return StateVerdict(
            EngineState.BUSY,
            f"busy: {flow}; queue wait {last.wait:.3g} s over the TTFT SLO {slo_ttft:g} s",
        )
    if saturation is not None and saturation >= 1.0:
        return StateVerdict(EngineState.BUSY, f"busy: {flow}; saturation {saturation:.2f}")
    ttft = f", TTFT {last.ttft:.3g} s" if last is not None and last.ttft is not None else ""
    return StateVerdict(EngineState.OK, f"ok: {flow}{ttft}")
