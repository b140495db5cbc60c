"""`Discovery`: the one composer of the desired set, `static ∪ discovered`, and the groups'
refresh loops.

Every change of the set reaches the fleet through here, serialized: the first set at start
(`start`), a group's changed answer (debounced: changes within `debounce_seconds` of each other
reach the fleet once), and a reload (`reconfigure`, handed the new validated `Settings` by the
reloader), so a reload never drops the discovered targets and a refresh never undoes a reload.

Each group's source is asked at start (all at once: a group whose source cannot answer says
so in one log line, and the rest start without it) and then every refresh interval
(`file_sd`'s files are looked at every `FILE_POLL_SECONDS` too, so a changed file is seen
within seconds). A good answer updates the group's `GroupState`; a failed one keeps its last
good list. On a shard, only the discovered targets whose name the shard owns are built and
handed over (`GroupState.members(owns)`); their load is this replica's alone (`whole_load`).

A reload keeps an unchanged group as it is (its loop, source and targets); a group whose
source or declared labels changed gets a new source, asked once before the set is applied,
and keeps its last good list until that source answers; a changed template makes the group's
targets again (the fleet restarts only what changed); a removed group's targets leave (the
fleet drains them); an added group is asked once, as at start. A reload the fleet refuses
(`ConfigError`) changes nothing here either.

Its series are made at scrape time (`collect`, `series.families`).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Protocol

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from prober.config.errors import ConfigError
from prober.config.group import TargetGroupConfig
from prober.config.model import Settings
from prober.config.target import TargetConfig
from prober.discovery.dns import DnsSd
from prober.discovery.files import FileSd
from prober.discovery.http import HttpSd
from prober.discovery.series import families
from prober.discovery.source import Fault, Fetched, Reason, Source
from prober.discovery.state import Clash, GroupState, Member, merge, same_set
from prober.fleet.fleet import Applied
from prober.fleet.shard import owns
from prober.logs import get_logger

log = get_logger("prober.discovery")

FILE_POLL_SECONDS = 5.0
DEFAULT_DEBOUNCE_SECONDS = 1.0
Shard = tuple[int, int]


class Applier(Protocol):
    """What the set is handed to: `prober.fleet.Fleet`."""

    closing: bool

    async def apply(
        self,
        desired: Mapping[str, TargetConfig],
        shard: Shard = (0, 1),
        *,
        before_commit: Callable[[], None] | None = None,
        whole_load: Collection[str] = (),
    ) -> Applied: ...


def make_source(group: TargetGroupConfig) -> Source:
    """The source a group's configuration names."""
    if group.file_sd is not None:
        return FileSd(group.file_sd, group.labels)
    if group.http_sd is not None:
        return HttpSd(group.http_sd, group.labels)
    assert group.dns is not None  # exactly one source, validated
    return DnsSd(group.dns, group.labels)


def same_source(a: TargetGroupConfig, b: TargetGroupConfig) -> bool:
    """Whether a source made for `a` serves `b` (the same source and declared labels)."""
    return (a.file_sd, a.http_sd, a.dns, a.labels) == (b.file_sd, b.http_sd, b.dns, b.labels)


class _Group:
    """A group's source, state and counts."""

    def __init__(self, config: TargetGroupConfig, source: Source, state: GroupState) -> None:
        self.config = config
        self.source = source
        self.state = state
        self.errors: Counter[Reason] = Counter()
        self.last_refresh: float | None = None
        self.failing: Reason | None = None  # the reason last logged, until it answers again
        self.interval = config.refresh_interval_seconds
        if config.file_sd is not None:
            self.interval = min(self.interval, FILE_POLL_SECONDS)

    @property
    def name(self) -> str:
        return self.config.group

    def successor(self, config: TargetGroupConfig, source: Source) -> _Group:
        """This group under a changed configuration: its list and counts carried over."""
        group = _Group(config, source, self.state.carried(config))
        group.errors = self.errors.copy()
        group.last_refresh, group.failing = self.last_refresh, self.failing
        return group


class Discovery(Collector):
    """The groups' refresh loops and the set they make with the static targets; see the
    module docstring."""

    def __init__(
        self,
        settings: Settings,
        fleet: Applier,
        *,
        sources: Callable[[TargetGroupConfig], Source] = make_source,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        debounce_seconds: float = DEFAULT_DEBOUNCE_SECONDS,
    ) -> None:
        self.fleet = fleet
        self.static = list(settings.targets)
        self.shard: Shard = (settings.shard.index, settings.shard.count)
        self.clock = clock
        self.wall = wall
        self.debounce_seconds = debounce_seconds
        self._sources = sources
        self._groups = [self._new_group(g) for g in settings.target_groups]
        self._lock = asyncio.Lock()  # one composition and apply at a time
        self._desired, self._members, _ = merge(self.static, [])
        self._published: Mapping[str, TargetConfig] | None = None
        self._clashes: set[Clash] = set()
        self._tasks: dict[_Group, asyncio.Task[None]] = {}
        self._publish: asyncio.Task[None] | None = None

    @property
    def closing(self) -> bool:
        return self.fleet.closing

    def owns(self, name: str) -> bool:
        """Whether this replica's shard owns the target `name`."""
        return owns(name, *self.shard)

    def origin(self, name: str) -> Member | None:
        """Where the discovered target `name` came from (group, address); None: static."""
        return self._members.get(name)

    def groups(self) -> list[tuple[str, float | None, str | None]]:
        """Each group: its name, its last good answer (Unix time; None: none yet) and why its
        source fails now (None: it answers)."""
        return [
            (g.config.group, g.last_refresh, None if g.failing is None else g.failing.value)
            for g in self._groups
        ]

    def desired_set(self) -> Mapping[str, TargetConfig]:
        """The static targets and every discovered one this shard owns now, by name."""
        return dict(self._desired)

    def _new_group(self, config: TargetGroupConfig) -> _Group:
        return _Group(config, self._sources(config), GroupState(config))

    async def start(self) -> Applied:
        """Ask every source once (a source that cannot answer is logged, not waited for
        beyond its own timeout), hand the fleet the first set, then refresh in the
        background."""
        await self._ask(self._groups)
        async with self._lock:
            self._remake(publish=False)
            applied = await self._apply()
        for group in self._groups:
            self._run(group)
        return applied

    async def reconfigure(
        self, settings: Settings, *, before_commit: Callable[[], None] | None = None
    ) -> Applied:
        """Apply a reload's validated `settings`; see the module docstring. `ConfigError`
        where the fleet refuses it, and then nothing changed."""
        old = {group.name: group for group in self._groups}
        groups, fresh = [], []
        for config in settings.target_groups:
            was = old.get(config.group)
            if was is None:
                fresh.append(self._new_group(config))
                groups.append(fresh[-1])
            elif was.config == config:
                groups.append(was)
            elif same_source(was.config, config):
                groups.append(was.successor(config, was.source))
            else:
                fresh.append(was.successor(config, self._sources(config)))
                groups.append(fresh[-1])
        await self._ask(fresh)
        async with self._lock:
            kept = (self.static, self.shard, self._groups)
            self._use(list(settings.targets), (settings.shard.index, settings.shard.count), groups)
            try:
                applied = await self._apply(before_commit)
            except BaseException:
                self._use(*kept)
                await asyncio.gather(*(group.source.close() for group in fresh))
                raise
        await self._retire([g for g in kept[2] if g not in groups], keep=groups)
        for group in groups:
            if group not in self._tasks:
                self._run(group)
        return applied

    def _use(self, static: list[TargetConfig], shard: Shard, groups: list[_Group]) -> None:
        """Compose from these from now (the set made again, not handed over)."""
        self.static, self.shard, self._groups = static, shard, groups
        self._remake(publish=False)

    async def _retire(self, gone: Sequence[_Group], keep: Sequence[_Group]) -> None:
        """Stop the loops of groups no longer in use; close the sources no group keeps."""
        tasks = [task for group in gone if (task := self._tasks.pop(group, None)) is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        in_use = {id(group.source) for group in keep}
        await asyncio.gather(*(g.source.close() for g in gone if id(g.source) not in in_use))

    def _run(self, group: _Group) -> None:
        self._tasks[group] = asyncio.create_task(self._loop(group), name=f"sd:{group.name}")

    async def stop(self) -> None:
        """Every loop and a pending hand-over stopped; the sources closed."""
        tasks = [*self._tasks.values(), *([self._publish] if self._publish else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = {}
        await asyncio.gather(*(group.source.close() for group in self._groups))

    async def _ask(self, groups: Sequence[_Group]) -> None:
        """A first answer of each of `groups`' sources, at once."""
        answers = await asyncio.gather(*(group.source.fetch() for group in groups))
        for group, fetched in zip(groups, answers, strict=True):
            self._take(group, fetched, first=True)

    async def refresh(self, group: _Group) -> None:
        """One answer of `group`'s source, counted and logged; the set made again."""
        fetched = await group.source.fetch()
        if self._take(group, fetched, first=False):
            self._remake()

    def _take(self, group: _Group, fetched: Fetched, *, first: bool) -> bool:
        """`fetched` counted, logged and, where it is an answer, kept; whether it was one."""
        name = group.name
        for fault in fetched.faults:
            group.errors[fault.reason] += 1
        if fetched.found is None:
            fault = fetched.faults[0] if fetched.faults else Fault(Reason.CONNECT, "no answer")
            if first or group.failing is not fault.reason:
                event = "discovery_unavailable" if first else "discovery_failed"
                log.warning(event, group=name, reason=fault.reason.value, detail=fault.detail,
                            kept=len(group.state.addresses))  # fmt: skip
            group.failing = fault.reason
            return False
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
        return True

    def _remake(self, *, publish: bool = True) -> None:
        """The desired set from the static targets and every group's members this shard
        owns; new refusals and clashes logged; a changed set handed over, debounced."""
        members = []
        for group in self._groups:
            members.append(group.state.members(self.owns))
            for fault in group.state.refused:
                group.errors[fault.reason] += 1
                log.warning("discovery_target_refused", group=group.name,
                            detail=fault.detail)  # fmt: skip
        self._desired, self._members, clashes = merge(self.static, members)
        for clash in clashes:
            if clash not in self._clashes:
                log.warning("discovery_name_clash", group=clash.group, target=clash.name,
                            address=clash.address, detail=clash.line())  # fmt: skip
        self._clashes = set(clashes)
        changed = self._published is not None and not same_set(self._desired, self._published)
        if publish and changed and (self._publish is None or self._publish.done()):
            self._publish = asyncio.create_task(self._debounced())

    async def _loop(self, group: _Group) -> None:
        while True:
            await asyncio.sleep(group.interval)
            await self.refresh(group)

    async def _debounced(self) -> None:
        await asyncio.sleep(self.debounce_seconds)
        async with self._lock:
            if self._published is not None and same_set(self._desired, self._published):
                return
            try:
                await self._apply()
            except ConfigError as exc:  # a target's key or CA file, read as it is built
                log.warning("discovery_apply_failed", error="; ".join(exc.problems),
                            note="the running set stays")  # fmt: skip
            except RuntimeError:  # the fleet is shutting down
                return

    async def _apply(self, before_commit: Callable[[], None] | None = None) -> Applied:
        desired = self._desired
        applied = await self.fleet.apply(
            dict(desired), self.shard, before_commit=before_commit, whole_load=set(self._members)
        )
        self._published = desired
        return applied

    def collect(self) -> Iterator[Metric]:
        """The discovery series, as they are now (prometheus-client asks at each scrape)."""
        counts = Counter(member.group for member in self._members.values())
        groups = [(g.name, counts[g.name], g.errors, g.last_refresh) for g in self._groups]
        owned = {name: config for name, config in self._desired.items() if self.owns(name)}
        members: Mapping[str, Member] = self._members
        gateways = {g.config.gateway: g.name for g in self._groups if g.config.gateway}
        yield from families(owned, members, groups, gateways)
