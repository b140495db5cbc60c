"""What a group holds between refreshes, and the one set of targets: pure, the clock passed in.

`GroupState` keeps each address a group's source gave, and when it was last absent: an
address leaves only once it has been absent `remove_after_seconds` (a source that fails keeps
its last good list, so a failure never counts as absence). Its targets are made by the group's
template (`TargetGroupConfig.target`), once per address while the group is unchanged, so an
unchanged target is the same `TargetConfig` on every refresh; an address the template cannot
make a valid target of is left out and reported once. On a shard (`shard.count` > 1) only the
addresses whose target name this replica owns are built at all (`members(owns)`: the name
template alone decides, rendezvous hashing of the name, `prober.fleet.shard`), so each replica
builds and runs its share of a group, never the whole of it. A changed group's configuration
(`carried`) keeps the addresses and their absence clocks and builds its targets afresh.

`merge` makes the desired set, keyed by target name: the static targets first, then each
group in the order of `target_groups:`, each group's addresses in order. A name already taken
(a static target's, an earlier group's, or an earlier address's of the same group, where
the `name` template leaves the address out) keeps its first owner; the later one is skipped
and returned as a `Clash`, which the runner logs once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pydantic import ValidationError

from prober.config.group import TargetGroupConfig
from prober.config.target import TargetConfig
from prober.discovery.source import Discovered, Fault, Reason, clean
from prober.validation import describe, field_path


@dataclass(frozen=True, slots=True)
class Member:
    """A discovered target: its configuration and where it came from."""

    group: str
    address: str
    labels: tuple[tuple[str, str], ...]
    config: TargetConfig


@dataclass(frozen=True, slots=True)
class Clash:
    name: str
    group: str
    address: str
    owner: str  # "static", or the group that has the name

    def line(self) -> str:
        return (
            f"target name {self.name} of group {self.group} (address {self.address}) is "
            f"taken by {self.owner}: skipped"
        )


class GroupState:
    """One group's addresses across refreshes."""

    def __init__(self, config: TargetGroupConfig) -> None:
        self.config = config
        self._labels: dict[str, tuple[tuple[str, str], ...]] = {}
        self._absent_since: dict[str, float] = {}
        self._built: dict[str, TargetConfig | None] = {}
        self.refused: list[Fault] = []  # made by the last `members`: each address once

    def update(self, found: Iterable[Discovered], now: float) -> None:
        """A good answer of the source at `now`: absent addresses start (or go on) waiting."""
        given = {d.address: d.labels for d in found}
        for address in list(self._labels):
            if address not in given:
                since = self._absent_since.setdefault(address, now)
                if now - since >= self.config.remove_after_seconds:
                    del self._labels[address], self._absent_since[address]
                    self._built.pop(address, None)
        for address, labels in given.items():
            self._labels[address] = labels
            self._absent_since.pop(address, None)

    def carried(self, config: TargetGroupConfig) -> GroupState:
        """The state under a changed configuration of the group: the same addresses, labels
        and absence clocks (nothing is wiped), every target built again by the new template."""
        state = GroupState(config)
        state._labels = dict(self._labels)
        state._absent_since = dict(self._absent_since)
        return state

    @property
    def addresses(self) -> list[str]:
        return sorted(self._labels)

    def members(self, owns: Callable[[str], bool] = lambda _: True) -> list[Member]:
        """The group's targets whose name `owns` accepts, in address order; `refused` holds
        the addresses newly left out (an address refused once is not reported again while it
        stays). An address another shard owns is not built."""
        self.refused = []
        out = []
        for address in self.addresses:
            if not owns(self._name(address)):
                continue
            if address not in self._built:
                self._built[address] = self._build(address)
            config = self._built[address]
            if config is not None:
                out.append(Member(self.config.group, address, self._labels[address], config))
        return out

    def _name(self, address: str) -> str:
        """The target name of `address` (sources give checked addresses; one that has no name
        is refused by `_build`, on the one shard that owns the empty name)."""
        try:
            return self.config.name_for(address)
        except ValueError:
            return ""

    def _build(self, address: str) -> TargetConfig | None:
        try:
            return self.config.target(address)
        except ValidationError as exc:
            err = exc.errors()[0]
            problem = f"{field_path(err['loc'])}: {describe(err)}"
        except ValueError as exc:
            problem = str(exc)
        detail = f"address {clean(address, 80)}: {problem}"
        self.refused.append(Fault(Reason.INVALID_TARGET, detail))
        return None


def merge(
    static: Sequence[TargetConfig], groups: Iterable[Sequence[Member]]
) -> tuple[dict[str, TargetConfig], dict[str, Member], list[Clash]]:
    """The desired set by name, the discovered members by name, and the names skipped."""
    desired = {t.name: t for t in static}
    members: dict[str, Member] = {}
    clashes = []
    for group in groups:
        for member in group:
            name = member.config.name
            if name in desired:
                owner = members[name].group if name in members else "static"
                owner = f"group {owner}" if name in members else "a static target"
                clashes.append(Clash(name, member.group, member.address, owner))
                continue
            desired[name] = member.config
            members[name] = member
    return desired, members, clashes


def same_set(a: Mapping[str, TargetConfig], b: Mapping[str, TargetConfig]) -> bool:
    """Whether two desired sets hold the same targets (the very same configurations)."""
    return a.keys() == b.keys() and all(a[name] is b[name] for name in a)
