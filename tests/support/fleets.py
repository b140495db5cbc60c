"""A fleet that records each set discovery hands it, for tests of the composer alone."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping

from prober.fleet.fleet import Applied
from prober.settings import TargetConfig


class Recording:
    """Records each set it is handed (its names sorted) and the names whose load is whole."""

    closing = False

    def __init__(self) -> None:
        self.applied: list[list[str]] = []
        self.whole: list[list[str]] = []

    async def apply(
        self,
        desired: Mapping[str, TargetConfig],
        shard: tuple[int, int] = (0, 1),
        *,
        before_commit: Callable[[], None] | None = None,
        whole_load: Collection[str] = (),
    ) -> Applied:
        if before_commit is not None:
            before_commit()
        self.applied.append(sorted(desired))
        self.whole.append(sorted(whole_load))
        return Applied(added=tuple(desired))
