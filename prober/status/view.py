"""The status page's view model: what each target shows, read from the fleet's live state.

Everything here is made into short strings before a template sees it: every string that came
from a server, a configuration or a discovery source is cut to a bound and made one printable,
redacted line (`logs.safe_line`), and the templates escape it again (autoescaping), so a
hostile error text is shown as text. A page shows at most `PAGE_TARGETS` targets and each
target at most `RECENT_PROBES` probes: its size is bounded whatever the fleet and its history.

What other parts of the daemon add is read where it exists and skipped where it does not: the
engine state (`TargetCapacity.engine_state`, as `/-/engine` answers), a probe's answer checks
(`prober.recent` takes them from the result), discovery (a `DiscoveryView`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol
from urllib.parse import quote

import yarl

from prober.capacity.own import Estimate
from prober.capacity.target import WITHHELD_FIX, TargetCapacity
from prober.fleet.member import Member
from prober.kinds import Drain
from prober.load.driver import LoadDriver
from prober.logs import safe_line
from prober.recent import ProbeRecord, RecentProbes
from prober.result import Outcome

PAGE_TARGETS = 50  # targets on one page of the index; the rest on the next pages
TEXT_CHARS = 200  # of a name, model, address or message
URL_CHARS = 300


class Origin(Protocol):
    """Where a discovered target came from."""

    @property
    def group(self) -> str: ...

    @property
    def address(self) -> str: ...


class DiscoveryView(Protocol):
    """What the page reads of discovery (`prober.discovery.Discovery`)."""

    def origin(self, name: str) -> Origin | None: ...

    def groups(self) -> list[tuple[str, float | None, str | None]]: ...


@dataclass(frozen=True, slots=True)
class ProbeRow:
    """One probe as a row: every figure already a string."""

    when: str
    when_full: str
    age: str
    outcome: str
    css: str  # ok, slow (ok but not good), bad
    status: str
    ttft: str
    ttfo: str
    tpot: str
    e2e: str
    tokens: str
    finish: str
    checks: str
    error: str
    companion: bool


@dataclass(frozen=True, slots=True)
class QueueView:
    basis: str
    drain_basis: str
    slots: str
    waiting: str
    running: str
    wait: str
    drain: str
    withheld_fix: str  # what to set, where the waiting depth is withheld; "" otherwise
    server: str  # the engine's own figures, where it reports them


@dataclass(frozen=True, slots=True)
class Line:
    """A state and its detail: `css` is ok, bad or idle."""

    text: str
    css: str = "idle"


@dataclass(frozen=True, slots=True)
class LoadView:
    rate: str
    in_flight: int
    sent: int
    dropped: int


@dataclass(frozen=True, slots=True)
class TargetView:
    name: str
    href: str
    model: str
    source: str
    url: str
    probed: bool
    probes: int
    last: ProbeRow | None
    recent: tuple[ProbeRow, ...]
    queue: QueueView | None
    scrape: Line
    load: LoadView | None
    engine: EngineView | None


@dataclass(frozen=True, slots=True)
class Group:
    name: str
    refreshed: str
    state: Line


@dataclass(frozen=True, slots=True)
class PageView:
    version: str
    now: str
    total: int
    page: int
    pages: int
    targets: tuple[TargetView, ...]
    reload: Line | None
    groups: tuple[Group, ...]


@dataclass(frozen=True)
class Sources:
    """Where the page reads from: the live fleet and its recorder's recent probes, the last
    reload and discovery, where each exists."""

    members: Callable[[], dict[str, Member]]
    recent: RecentProbes
    version: str
    last_reload: Callable[[], tuple[float, bool, str] | None] = lambda: None
    discovery: Callable[[], DiscoveryView | None] = lambda: None
    wall_clock: Callable[[], float] = time.time


def text(value: object, limit: int = TEXT_CHARS) -> str:
    """Any string shown: one printable, redacted line, cut."""
    return safe_line(str(value), limit)


def public_url(url: str) -> str:
    """`url` without its user and password (its query kept), as shown."""
    try:
        parsed = yarl.URL(url)
    except (ValueError, TypeError):
        return "(not a URL)"
    if parsed.user is not None or parsed.password is not None:
        parsed = parsed.with_user(None)
    return text(str(parsed), URL_CHARS)


def seconds(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "–"
    if abs(value) < 1.0:
        return f"{value * 1000:.3g} ms"
    return f"{value:.2f} s"


def clock(at: float) -> tuple[str, str]:
    """(HH:MM:SS UTC, the full date and time) of a Unix time."""
    stamp = time.gmtime(at)
    return time.strftime("%H:%M:%S UTC", stamp), time.strftime("%Y-%m-%d %H:%M:%S UTC", stamp)


def age(at: float, now: float) -> str:
    ago = max(0.0, now - at)
    if ago < 90:
        return f"{ago:.0f} s ago"
    if ago < 5400:
        return f"{ago / 60:.0f} min ago"
    return f"{ago / 3600:.1f} h ago"


def probe_row(record: ProbeRecord, now: float) -> ProbeRow:
    when, when_full = clock(record.wall_end)
    ok = record.outcome is Outcome.OK
    tokens = str(record.output_tokens)
    if record.reasoning_tokens:
        tokens += f" ({record.reasoning_tokens} reasoning)"
    checks = ", ".join(
        f"{c.check} pass" if c.passed else f"{c.check} FAIL: {c.detail}" for c in record.checks
    )
    return ProbeRow(
        when=when,
        when_full=when_full,
        age=age(record.wall_end, now),
        outcome=record.outcome.value + ("" if record.answered or not ok else " (no answer)"),
        css="ok" if ok and record.good else "slow" if ok else "bad",
        status="–" if record.http_status is None else str(record.http_status),
        ttft=seconds(record.ttft_seconds),
        ttfo=seconds(record.ttfo_seconds),
        tpot=seconds(record.tpot_seconds),
        e2e=seconds(record.e2e_seconds),
        tokens=tokens,
        finish=record.finish_reason.value,
        checks=checks,
        error=record.error,  # made safe and cut as it was recorded
        companion=record.companion,
    )


def queue_view(cap: TargetCapacity, est: Estimate) -> QueueView:
    withheld = est.drain_basis is Drain.PROBE_SHAPE and est.waiting is None
    hinted = cap.target.config.slots is not None
    slots = "unknown" if est.slots is None else f"{est.slots} ({'hint' if hinted else 'learned'})"
    snap = cap.snapshot
    server = ""
    if snap is not None:
        parts = [f"engine {snap.engine.value}"]
        if snap.waiting is not None:
            parts.append(f"waiting {snap.waiting:g}")
        if snap.running is not None:
            parts.append(f"running {snap.running:g}")
        if snap.kv_usage_ratio is not None:
            parts.append(f"KV cache {snap.kv_usage_ratio:.0%}")
        server = ", ".join(parts)
    return QueueView(
        basis=est.basis.value,
        drain_basis=est.drain_basis.value,
        slots=slots,
        waiting="withheld" if withheld else _count(est.waiting),
        running=_count(est.running),
        wait=seconds(est.wait_seconds),
        drain="–" if est.drain is None else f"{est.drain:.2f} req/s",
        withheld_fix=WITHHELD_FIX if withheld else "",
        server=server,
    )


def _count(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{value:.1f}"


def scrape_line(member: Member, now: float) -> Line:
    cfg = member.target.config
    if cfg.metrics_url is None:
        return Line("not configured (no metrics_url)")
    if not member.probed:
        return Line("scraped by the replica that probes it")
    last = None if member.capacity is None else member.capacity.last_scrape
    if last is None:
        return Line("not scraped yet")
    if last.error:
        return Line(f"failing {age(last.at, now)}: {text(last.error, 240)}", "bad")
    return Line(f"ok {age(last.at, now)}", "ok")


def load_view(load: LoadDriver | None) -> LoadView | None:
    if load is None:
        return None
    return LoadView(
        rate=f"{load.rate:.2f} req/s",
        in_flight=load.own_load.total,
        sent=load.sent,
        dropped=load.dropped,
    )


_ENGINE_CSS = {"ok": "ok", "busy": "slow", "stalled": "bad", "down": "bad"}


@dataclass(frozen=True, slots=True)
class EngineView:
    """The engine's state (ok, busy, stalled, down) and why (`reason` names the state too), as
    `/-/engine` answers."""

    state: str
    reason: str
    css: str


def engine_view(cap: TargetCapacity, est: Estimate) -> EngineView | None:
    try:
        verdict = cap.engine_state(est)
    except Exception:  # /-/engine and /metrics report a fault of the judge; the page goes on
        return None
    state = verdict.state.value
    return EngineView(state, text(verdict.reason, 240), _ENGINE_CSS.get(state, "idle"))


def target_view(
    member: Member, sources: Sources, now: float, discovery: DiscoveryView | None
) -> TargetView:
    name, cfg = member.name, member.target.config
    origin = None if discovery is None else discovery.origin(name)
    source = (
        "static"
        if origin is None
        else f"discovered: group {text(origin.group)}, address {text(origin.address)}"
    )
    records = sources.recent.of(name)
    rows = tuple(probe_row(r, now) for r in records)
    cap = member.capacity
    est = None if cap is None else cap.estimate()  # guarded: a fault costs the figures only
    return TargetView(
        name=text(name, 400),
        href="/targets/" + quote(name, safe="/:"),
        model=text(cfg.model),
        source=source,
        url=public_url(cfg.url),
        probed=member.probed,
        probes=sources.recent.count(name),
        last=rows[0] if rows else None,
        recent=rows,
        queue=None if cap is None or est is None else queue_view(cap, est),
        scrape=scrape_line(member, now),
        load=load_view(member.load),
        engine=None if cap is None or est is None else engine_view(cap, est),
    )


def page_view(sources: Sources, names: Sequence[str], *, page: int = 1, pages: int = 1) -> PageView:
    """The page of the targets `names` (those of them still running)."""
    now = sources.wall_clock()
    members = sources.members()
    discovery = sources.discovery()
    targets = tuple(target_view(members[n], sources, now, discovery) for n in names if n in members)
    return PageView(
        version=sources.version,
        now=clock(now)[1],
        total=len(members),
        page=page,
        pages=pages,
        targets=targets,
        reload=_reload_line(sources.last_reload(), now),
        groups=() if discovery is None else _groups(discovery.groups(), now),
    )


def _reload_line(last: tuple[float, bool, str] | None, now: float) -> Line | None:
    if last is None:
        return None
    at, ok, message = last
    return Line(
        f"{'ok' if ok else 'failed'} {age(at, now)}: {text(message, 300)}", "ok" if ok else "bad"
    )


def _groups(
    groups: Iterable[tuple[str, float | None, str | None]], now: float
) -> tuple[Group, ...]:
    out = []
    for name, refreshed, failing in list(groups)[:PAGE_TARGETS]:
        state = (
            Line("answering", "ok") if failing is None else Line(f"failing: {text(failing)}", "bad")
        )
        out.append(Group(text(name), "never" if refreshed is None else age(refreshed, now), state))
    return tuple(out)


def index_names(members: Iterable[str], page: int) -> tuple[list[str], int, int]:
    """The names on index page `page` (from 1; clamped), the page, and the number of pages."""
    names = sorted(members)
    pages = max(1, math.ceil(len(names) / PAGE_TARGETS))
    page = min(max(1, page), pages)
    start = (page - 1) * PAGE_TARGETS
    return names[start : start + PAGE_TARGETS], page, pages
