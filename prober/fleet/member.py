"""One target's live state on this replica, kept by its name (`Member`), and how it ends.

A member holds what the target has learned and what runs for it: its `Target` (the prompt
calibration), client session and connection pool, `TargetCapacity` (the estimator: learned
slots, pairs, α/β, drain rate), `LoadDriver`, the engine-scrape watcher, and the `/probe`
requests in flight. Its probe job is the scheduler's, by the same name. Nothing here is held
by the configuration object: a reload that leaves a target's settings equal leaves its
member as it is.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from prober.capacity.target import TargetCapacity
from prober.load.driver import LoadDriver
from prober.result import RequestResult
from prober.targets import Target


@dataclass(eq=False)
class Member:
    """A target's live state. `probed`: this replica probes it (its shard owns it); a member
    that is not probed runs only its load, if it has one, and answers `/probe`."""

    target: Target
    session: aiohttp.ClientSession
    probed: bool
    capacity: TargetCapacity | None = None
    load: LoadDriver | None = None
    watcher: asyncio.Task[None] | None = None
    sends: set[asyncio.Task[RequestResult]] = field(default_factory=set)  # `/probe` requests

    @property
    def name(self) -> str:
        return self.target.name

    def watch(self) -> None:
        """(Re)start the engine-scrape watcher on the member's session, where it probes."""
        self.unwatch()
        if self.probed and self.capacity is not None:
            self.watcher = asyncio.create_task(
                self.capacity.watch(self.session), name=f"watch:{self.name}"
            )

    def unwatch(self) -> asyncio.Task[None] | None:
        """Cancel the watcher; returns it, to be awaited."""
        watcher, self.watcher = self.watcher, None
        if watcher is not None:
            watcher.cancel()
        return watcher


async def drain_tasks(tasks: Collection[asyncio.Task[Any]], grace_seconds: float) -> None:
    """Give `tasks` the grace, then cancel what is left and wait for it to end."""
    pending = {t for t in tasks if not t.done()}
    if pending:
        _, pending = await asyncio.wait(pending, timeout=grace_seconds)
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=1.0)


async def ended(task: asyncio.Task[Any] | None) -> None:
    """Wait for a cancelled task to end, whatever it ends with."""
    if task is not None:
        await asyncio.gather(task, return_exceptions=True)
