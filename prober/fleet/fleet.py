"""The set of targets this replica runs, changed at run time by `Fleet.apply`.

`apply(desired, shard)` compares the targets wanted (by name) with the members running:

- equal settings: untouched (its counters, estimator, session, load and schedule go on);
- changed: what `changes.RESETS` names for the changed keys restarts, nothing else;
- removed: no new probe or arrival; its requests in flight get `grace_seconds`, then are
  cancelled and counted; its watcher stops, its session closes, and then every series with
  its `target` label leaves the registry (`Metrics.forget`);
- added: starts as at start-up, its warm-up first.

A target whose shard owner changes (a new `shard:`) restarts on this replica as if removed and
added. A target named in `whole_load` (a discovered one: only its owner is handed it) runs its
whole `load:` here; any other carries this replica's share of it (`LoadDriver`'s `shard`).
Everything with I/O (API keys, CA files: `Target.from_config`) is done before anything
changes, so a fault there changes nothing; `before_commit` (the web config's swap) runs at
that point too. Applies are serialized. The scheduler, the recorder and the capacity
collector read the fleet's mappings live, so a reload is followed without rebuilding them.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from prober.capacity.own import OwnLoad
from prober.capacity.target import CapacityCollector, TargetCapacity
from prober.fleet.changes import Effect, effects
from prober.fleet.member import Member, drain_tasks, ended
from prober.fleet.shard import owns
from prober.load.driver import LoadDriver, Shard
from prober.logs import get_logger
from prober.metrics import Labels, Metrics
from prober.record import Recorder, ScrapeRecorder
from prober.request.wire import client_session
from prober.schedule import ProbeScheduler
from prober.settings import TargetConfig
from prober.targets import Target

log = get_logger("prober.fleet")
LOCKSTEP_TARGETS = 3  # targets starting together on one load seed: said (`_say_lockstep`)


def _say_lockstep(started: Iterable[Target]) -> None:
    """One line per load seed shared by `LOCKSTEP_TARGETS` or more targets starting together.
    A seed fixes the instants, so their requests leave at once: a burst on the daemon, each
    of them set up in the same turn of its loop (docs/performance.md §9), and on any gateway
    they share. Said, not changed: the same instants for the same seed is what a seed is for
    (an A/B of two endpoints under one schedule)."""
    seeds = Counter(
        load.seed
        for target in started
        if (load := target.config.load) is not None and load.seed is not None
        and load.trace is None
    )  # fmt: skip
    for seed, count in sorted(seeds.items()):
        if count >= LOCKSTEP_TARGETS:
            log.warning("load_lockstep", seed=seed, targets=count,
                        note="their arrivals leave at the same instants: give each its own"
                        " seed, or none")  # fmt: skip


@dataclass(frozen=True)
class Applied:
    """What one `apply` did, by target name."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: Mapping[str, frozenset[Effect]] = field(default_factory=dict)
    unchanged: int = 0

    def summary(self) -> str:
        return (
            f"{len(self.added)} added, {len(self.removed)} removed, "
            f"{len(self.changed)} changed, {self.unchanged} unchanged"
        )


class Fleet:
    """Every target's live state, by name; see the module docstring."""

    def __init__(self, metrics: Metrics, *, grace_seconds: float, keep_text: bool = False) -> None:
        self.metrics = metrics
        self.grace_seconds = grace_seconds
        self._keep_text = keep_text
        self.members: dict[str, Member] = {}
        # Live views the collaborators read by name: kept in step with `members`.
        self.sessions: dict[str, aiohttp.ClientSession] = {}
        self.probed: dict[str, Target] = {}
        self.capacity: dict[str, TargetCapacity] = {}
        self._scrapes = ScrapeRecorder(metrics)
        self.recorder = Recorder(metrics, self.capacity)
        self.scheduler = ProbeScheduler(self.sessions, self.probed, self.recorder)
        metrics.registry.register(CapacityCollector(self.capacity.values()))
        self.shard: Shard = (0, 1)
        self._whole_load: frozenset[str] = frozenset()
        self._lock = asyncio.Lock()
        self._retiring: dict[str, list[tuple[Labels | None, asyncio.Task[None]]]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.closing = False

    @property
    def targets(self) -> dict[str, Target]:
        return {name: m.target for name, m in self.members.items()}

    async def apply(
        self,
        desired: Mapping[str, TargetConfig],
        shard: Shard = (0, 1),
        *,
        before_commit: Callable[[], None] | None = None,
        whole_load: Collection[str] = (),
    ) -> Applied:
        """Make the running set `desired` on shard `shard` (index, count); see the module."""
        async with self._lock:
            if self.closing:
                raise RuntimeError("the fleet is shutting down")
            whole = frozenset(whole_load)
            plan = self._plan(desired, shard, whole)
            built = {name: Target.from_config(desired[name], keep_text=self._keep_text)
                     for name in (*plan.added, *plan.changed)}  # fmt: skip
            if before_commit is not None:
                before_commit()
            old_shard, self.shard = self.shard, shard
            self._whole_load = whole
            for name in plan.removed:
                self._retire(self.members.pop(name), forget=True)
            for name, found in plan.changed.items():
                await self._change(self.members[name], built[name], found, old_shard)
            for name in plan.added:
                await self._start(built[name])
            _say_lockstep(built[name] for name in plan.added)
        return plan

    def _plan(
        self, desired: Mapping[str, TargetConfig], shard: Shard, whole: frozenset[str]
    ) -> Applied:
        changed: dict[str, frozenset[Effect]] = {}
        for name, cfg in desired.items():
            member = self.members.get(name)
            if member is None:
                continue
            found = effects(member.target.config, cfg)
            if member.probed != owns(name, *shard):
                found.add(Effect.ENDPOINT)  # its shard moved: restarts here as a new target
            shared = (name in whole) != (name in self._whole_load) or shard != self.shard
            if shared and cfg.load is not None:
                found.add(Effect.LOAD)  # this replica's share of the load changed
            if found:
                changed[name] = frozenset(found)
        return Applied(
            added=tuple(n for n in desired if n not in self.members),
            removed=tuple(n for n in self.members if n not in desired),
            changed=changed,
            unchanged=len(desired) - len(changed) - sum(n not in self.members for n in desired),
        )

    async def _start(self, target: Target) -> None:
        """A new member, as at start-up: its series of a removed namesake gone first."""
        name, cfg = target.name, target.config
        for labels, task in self._retiring.get(name, []):
            if labels == target.labels:
                await ended(task)
        probed = owns(name, *self.shard)
        member = Member(target, client_session(), probed)
        self.members[name] = member
        self.sessions[name] = member.session
        if probed or cfg.load is not None:
            self._new_capacity(member)
        if probed:
            self.probed[name] = target
            member.watch()
            self.scheduler.add(target)
        self._restart_load(member)

    def _new_capacity(self, member: Member) -> None:
        own = OwnLoad() if member.target.config.load is not None else None
        member.capacity = TargetCapacity(member.target, self._scrapes, own_load=own)
        self.capacity[member.name] = member.capacity

    async def _change(
        self, member: Member, target: Target, found: frozenset[Effect], old_shard: Shard
    ) -> None:
        name = member.name
        if Effect.ENDPOINT in found:
            moved = member.probed != owns(name, *self.shard)
            labels_gone = moved or member.target.labels != target.labels
            self._retire(self.members.pop(name), forget=labels_gone)
            await self._start(target)
            return
        had_load = member.load is not None
        member.target.update(target.spec)
        if Effect.ESTIMATE in found:
            if member.probed or member.target.config.load is not None:
                self._new_capacity(member)
            else:  # its load taken away, on a replica that does not probe it
                self.capacity.pop(name, None)
                member.capacity = None
            member.watch()
            self._restart_load(member)
        else:
            if Effect.WATCH in found:
                member.watch()
            if Effect.LOAD in found:
                self._restart_load(member)
        if had_load and member.load is None:
            self.recorder.load_stopped(member.target)
        if member.probed and Effect.SCHEDULE in found:
            self.scheduler.reschedule(member.target)
        elif member.probed and Effect.DESCRIBE in found:
            self.recorder.describe(member.target)

    def _restart_load(self, member: Member) -> None:
        """Stop the member's load driver (its requests in flight get the grace, in the
        background) and start one on its current settings, if it has `load:`."""
        old, member.load = member.load, None
        if old is not None:
            self._in_background(old.stop(self.grace_seconds))
        cfg = member.target.config.load
        if cfg is None or member.capacity is None:
            return
        member.load = LoadDriver(
            member.session,
            member.target,
            cfg,
            self.recorder,
            own_load=member.capacity.own_load,
            engine=member.capacity.state,
            shard=(0, 1) if member.name in self._whole_load else self.shard,
        )
        member.load.start()

    def _retire(self, member: Member, *, forget: bool) -> None:
        """Take `member` out now; drain and close it in the background, then (with `forget`)
        remove its series."""
        name = member.name
        for view in (self.sessions, self.probed, self.capacity):
            view.pop(name, None)
        probes = self.scheduler.remove(name) if member.probed else set()
        watcher = member.unwatch()
        labels = member.target.labels if forget else None
        task = asyncio.create_task(self._finish(member, probes, watcher, labels))
        retiring = self._retiring.setdefault(name, [])
        retiring.append((labels, task))

        def done(_: asyncio.Task[None]) -> None:
            retiring.remove((labels, task))
            if not retiring and self._retiring.get(name) is retiring:
                del self._retiring[name]

        task.add_done_callback(done)

    async def _finish(
        self,
        member: Member,
        probes: set[asyncio.Task[Any]],
        watcher: asyncio.Task[None] | None,
        labels: Labels | None,
    ) -> None:
        grace = self.grace_seconds
        drains = [self.scheduler.finish(probes, grace), drain_tasks(member.sends, grace)]
        if member.load is not None:
            drains.append(member.load.stop(grace))
        await asyncio.gather(*drains, ended(watcher))
        await member.session.close()
        if self.members.get(member.name) is None:  # its recent probes, unless a namesake runs
            self.recorder.recent.forget(member.name)
        if labels is not None:
            gone = self.metrics.forget(labels.target, labels.model)
            log.info("target_removed", target=labels.target, model=labels.model, series=gone)

    def _in_background(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def drain(self, grace_seconds: float) -> None:
        """Shutdown: no new probe, arrival or apply; everything in flight gets the grace."""
        self.closing = True
        drains = [self.scheduler.drain(grace_seconds)]
        for member in self.members.values():
            drains.append(drain_tasks(member.sends, grace_seconds))
            if member.load is not None:
                drains.append(member.load.stop(grace_seconds))
        retiring = [task for pairs in self._retiring.values() for _, task in pairs]
        await asyncio.gather(*drains, *retiring, *self._background, return_exceptions=True)

    async def close(self) -> None:
        """After `drain`: watchers stopped, sessions closed."""
        watchers = [m.unwatch() for m in self.members.values()]
        await asyncio.gather(*(ended(w) for w in watchers))
        await asyncio.gather(*(m.session.close() for m in self.members.values()))
