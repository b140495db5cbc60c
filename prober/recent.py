"""The last probes of each target, as the status page shows them: a ring of `RECENT_PROBES`.

`Recorder.record` is the one writer (the one place a result is recorded, so the page and
`/metrics` count the same probes: scheduled probes and their companions, never load, never a
`/probe`, whose metrics go to a registry of their own). Each ring keeps small frozen
summaries, not results: a result holds every token's arrival stamp, up to `max_tokens` of
them. A server's error text is made one printable, redacted line of at most `ERROR_CHARS`
characters here, once, as every error is (`logs.safe_line`), so the page's size is bounded
whatever the servers sent and however long the daemon ran.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from prober import timings
from prober.logs import safe_line
from prober.result import FinishReason, Outcome, RequestResult

RECENT_PROBES = 20  # kept per target
ERROR_CHARS = 240  # of each probe's error text (the result's own bound is 300)
CHECK_CHARS = 160  # of each answer check's reason for failing


@dataclass(frozen=True, slots=True)
class CheckVerdict:
    """One answer check of a probe (`expect:`): its name, whether it held, and why not."""

    check: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ProbeRecord:
    """What the status page shows of one finished probe."""

    wall_end: float  # Unix time it was recorded: `llmprober_last_probe_timestamp_seconds`
    outcome: Outcome
    good: bool
    answered: bool
    http_status: int | None
    ttft_seconds: float | None
    ttfo_seconds: float | None
    tpot_seconds: float | None
    e2e_seconds: float | None
    output_tokens: int
    reasoning_tokens: int
    finish_reason: FinishReason
    error: str  # one printable, redacted line, at most ERROR_CHARS
    checks: tuple[CheckVerdict, ...] = ()
    companion: bool = False  # sent while another probe decoded (the estimate's pairs)
    request_id: str = ""


def summary(result: RequestResult, *, wall_end: float, good: bool, companion: bool) -> ProbeRecord:
    """The record of `result`; its error and check reasons cut and redacted."""
    return ProbeRecord(
        wall_end=wall_end,
        outcome=result.outcome,
        good=good,
        answered=result.answered,
        http_status=result.http_status,
        ttft_seconds=timings.ttft(result),
        ttfo_seconds=timings.ttfo(result),
        tpot_seconds=timings.tpot(result),
        e2e_seconds=timings.e2e(result),
        output_tokens=result.output_tokens,
        reasoning_tokens=result.reasoning_tokens,
        finish_reason=result.finish_reason,
        error=safe_line(result.error, ERROR_CHARS) if result.error else "",
        checks=_checks(result),
        companion=companion,
        request_id=result.request_id[:64],
    )


def _checks(result: RequestResult) -> tuple[CheckVerdict, ...]:
    """The answer checks the result carries, where results carry them (`expect:`)."""
    found = getattr(result, "checks", ())  # a field of the answer checks' results
    return tuple(
        CheckVerdict(
            str(getattr(c.check, "value", c.check)),
            bool(c.passed),
            safe_line(str(c.detail or ""), CHECK_CHARS),
        )
        for c in tuple(found)[:8]  # a target has at most five kinds of check
    )


class RecentProbes:
    """The last `keep` probes of every target, by target name, newest last, and how many
    each target has had since it started here."""

    def __init__(self, keep: int = RECENT_PROBES) -> None:
        self.keep = keep
        self._rings: dict[str, deque[ProbeRecord]] = {}
        self._counts: dict[str, int] = {}

    def add(self, name: str, record: ProbeRecord) -> None:
        ring = self._rings.get(name)
        if ring is None:
            ring = self._rings[name] = deque(maxlen=self.keep)
        ring.append(record)
        self._counts[name] = self._counts.get(name, 0) + 1

    def of(self, name: str) -> tuple[ProbeRecord, ...]:
        """The target's kept probes, newest first."""
        return tuple(reversed(self._rings.get(name, ())))

    def last(self, name: str) -> ProbeRecord | None:
        ring = self._rings.get(name)
        return ring[-1] if ring else None

    def count(self, name: str) -> int:
        return self._counts.get(name, 0)

    def forget(self, name: str) -> None:
        """A target removed: its probes go with its series."""
        self._rings.pop(name, None)
        self._counts.pop(name, None)
