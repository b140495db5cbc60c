"""`Discovery`: one refresh loop per group, and the desired set `static ∪ discovered`.

Each group's source is asked at start (all at once: a group whose source cannot answer says
so in one log line, and the rest start without it) and then every refresh interval
(`file_sd`'s files are looked at every `FILE_POLL_SECONDS` too, so a changed file is seen
within seconds). A good answer updates the group's `GroupState`; a failed one keeps its last
good list. Whenever the merged set of targets changes, `apply` gets it, debounced: changes
within `debounce_seconds` of each other reach it once.

Its series are made at scrape time (`collect`, a prometheus-client collector), from counts
it keeps: `llmprober_target_info` (one per target: `target`, `group` — empty for a static
target —, `address`, and the labels its group declares), `llmprober_discovery_targets`,
`llmprober_discovery_errors_total{group, reason}` (every reason from 0) and
`llmprober_discovery_last_refresh_timestamp_seconds` (the last good answer).
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence

import yarl
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from prober import metric_specs as specs
from prober.config.group import TargetGroupConfig
from prober.config.target import TargetConfig
from prober.discovery.dns import DnsSd
from prober.discovery.files import FileSd
from prober.discovery.http import HttpSd
from prober.discovery.source import Fault, Reason, Source
from prober.discovery.state import Clash, GroupState, Member, merge, same_set
from prober.logs import get_logger

log = get_logger("prober.discovery")

FILE_POLL_SECONDS = 5.0
DEFAULT_DEBOUNCE_SECONDS = 1.0
ApplyFn = Callable[[Mapping[str, TargetConfig]], Awaitable[None] | None]


def make_source(group: TargetGroupConfig) -> Source:
    """The source a group's configuration names."""
    if group.file_sd is not None:
        return FileSd(group.file_sd, group.labels)
    if group.http_sd is not None:
        return HttpSd(group.http_sd, group.labels)
    assert group.dns is not None  # exactly one source, validated
    return DnsSd(group.dns, group.labels)


class _Group:
    """A group's source, state and counts."""

    def __init__(self, config: TargetGroupConfig, source: Source) -> None:
        self.config = config
        self.source = source
        self.state = GroupState(config)
        self.errors: Counter[Reason] = Counter()
        self.last_refresh: float | None = None
        self.failing: Reason | None = None  # the reason last logged, until it answers again
        self.interval = config.refresh_interval_seconds
        if config.file_sd is not None:
            self.interval = min(self.interval, FILE_POLL_SECONDS)


class Discovery(Collector):
    """The groups' refresh loops and the desired set they make with the static targets."""

    def __init__(
        self,
        static: Sequence[TargetConfig],
        groups: Sequence[TargetGroupConfig],
        apply: ApplyFn | None = None,
        *,
        sources: Callable[[TargetGroupConfig], Source] = make_source,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        debounce_seconds: float = DEFAULT_DEBOUNCE_SECONDS,
        owns: Callable[[str], bool] = lambda _: True,
    ) -> None:
        self.static = list(static)
        self.apply = apply
        self.clock = clock
        self.wall = wall
        self.debounce_seconds = debounce_seconds
        self.owns = owns  # the targets this replica reports an info series for
        self._groups = [_Group(g, sources(g)) for g in groups]
        self._desired, self._members, _ = merge(self.static, [])
        self._published: Mapping[str, TargetConfig] | None = None
        self._clashes: set[Clash] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._publish: asyncio.Task[None] | None = None

    def desired_set(self) -> Mapping[str, TargetConfig]:
        """The static targets and every discovered one now, by name."""
        return dict(self._desired)

    async def start(self) -> None:
        """Ask every source once (a source that cannot answer is logged, not waited for
        beyond its own timeout), hand `apply` the first set, then refresh in the background."""
        await asyncio.gather(*(self.refresh(group, first=True) for group in self._groups))
        await self._hand_over()
        self._tasks = [asyncio.create_task(self._loop(group)) for group in self._groups]

    async def stop(self) -> None:
        tasks = [*self._tasks, *([self._publish] if self._publish else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = []
        await asyncio.gather(*(group.source.close() for group in self._groups))

    async def refresh(self, group: _Group, *, first: bool = False) -> None:
        """One answer of `group`'s source, counted and logged; the set made again."""
        fetched = await group.source.fetch()
        name = group.config.group
        for fault in fetched.faults:
            group.errors[fault.reason] += 1
        if fetched.found is None:
            fault = fetched.faults[0] if fetched.faults else Fault(Reason.CONNECT, "no answer")
            if first:
                log.warning("discovery_unavailable", group=name, reason=fault.reason.value,
                            detail=fault.detail, kept=len(group.state.addresses))  # fmt: skip
            elif group.failing is not fault.reason:
                log.warning("discovery_failed", group=name, reason=fault.reason.value,
                            detail=fault.detail, kept=len(group.state.addresses))  # fmt: skip
            group.failing = fault.reason
            return
        if group.failing is not None:
            log.info("discovery_recovered", group=name, found=len(fetched.found))
        group.failing = None
        for fault in fetched.faults:
            log.warning("discovery_fault", group=name, reason=fault.reason.value,
                        detail=fault.detail)  # fmt: skip
        if not fetched.found and fetched.empty_because and group.state.addresses:
            log.info("discovery_empty", group=name, because=fetched.empty_because,
                     leaving_after_seconds=group.config.remove_after_seconds)  # fmt: skip
        group.last_refresh = self.wall()
        group.state.update(fetched.found, self.clock())
        self._remake()

    def _remake(self) -> None:
        """The desired set from every group's members; new refusals and clashes logged."""
        members = []
        for group in self._groups:
            members.append(group.state.members())
            for fault in group.state.refused:
                group.errors[fault.reason] += 1
                log.warning("discovery_target_refused", group=group.config.group,
                            detail=fault.detail)  # fmt: skip
        self._desired, self._members, clashes = merge(self.static, members)
        for clash in clashes:
            if clash not in self._clashes:
                log.warning("discovery_name_clash", group=clash.group, target=clash.name,
                            address=clash.address, detail=clash.line())  # fmt: skip
        self._clashes = set(clashes)
        changed = self._published is not None and not same_set(self._desired, self._published)
        if changed and (self._publish is None or self._publish.done()):
            self._publish = asyncio.create_task(self._debounced())

    async def _loop(self, group: _Group) -> None:
        while True:
            await asyncio.sleep(group.interval)
            await self.refresh(group)

    async def _debounced(self) -> None:
        await asyncio.sleep(self.debounce_seconds)
        await self._hand_over()

    async def _hand_over(self) -> None:
        desired = self._desired
        if self._published is not None and same_set(desired, self._published):
            return
        self._published = desired
        if self.apply is not None:
            done = self.apply(dict(desired))
            if inspect.isawaitable(done):
                await done

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        """The discovery series, as they are now (prometheus-client asks at each scrape)."""
        info = GaugeMetricFamily(specs.TARGET_INFO.name, specs.TARGET_INFO.help)
        for name, config in self._desired.items():
            if self.owns(name):
                info.add_sample(specs.TARGET_INFO.name, self._info(name, config), 1.0)
        yield info
        targets = specs.gauge_family(specs.DISCOVERY_TARGETS)
        errors = specs.counter_family(specs.DISCOVERY_ERRORS)
        refreshed = specs.gauge_family(specs.DISCOVERY_LAST_REFRESH)
        counts = Counter(member.group for member in self._members.values())
        for group in self._groups:
            name = group.config.group
            targets.add_metric([name], counts[name])
            for reason in Reason:
                errors.add_metric([name, reason.value], group.errors[reason])
            if group.last_refresh is not None:
                refreshed.add_metric([name], group.last_refresh)
        yield from (targets, errors, refreshed)

    def _info(self, name: str, config: TargetConfig) -> dict[str, str]:
        member: Member | None = self._members.get(name)
        if member is None:
            url = yarl.URL(config.url)
            address = f"{url.raw_host}:{url.port}" if url.raw_host else ""
            if url.host and ":" in url.host:
                address = f"[{url.host}]:{url.port}"
            return {"target": name, "group": "", "address": address}
        return {"target": name, "group": member.group, "address": member.address,
                **dict(member.labels)}  # fmt: skip
