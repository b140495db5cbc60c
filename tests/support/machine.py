"""What else the machine was doing: evidence for a failing accuracy test's message.

The engine tests judge figures that move with the machine's pace, and the machines that run
them are shared. When one fails, its message should say whether the machine was the cause:

    lag = LoopLag()                 # inside the test's event loop
    async with lag, snapshot_at(30) as machine:  # machine: [snapshot() 30 s in], if so long
        ...                         # lag: the loop's worst lateness on a 0.1 s timer, steal
    f"{report}\n{lag}\n{''.join(machine)}"

Linux only (`/proc`); elsewhere the snapshot says it has nothing to show.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import TracebackType

_TICK_SECONDS = 0.1


def _cpu_times() -> list[int] | None:
    try:
        return [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None


class LoopLag:
    """The longest a 0.1 s timer of the running loop fired late while it was entered, and the
    share of CPU time the hypervisor stole over the same span (`/proc/stat`'s steal)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.late_ticks = 0  # ticks more than 1 s late
        self._task: asyncio.Task[None] | None = None
        self._cpu_before: list[int] | None = None
        self.steal: float | None = None

    async def _watch(self) -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(_TICK_SECONDS)
            late = time.monotonic() - start - _TICK_SECONDS
            self.worst = max(self.worst, late)
            self.late_ticks += late > 1.0

    async def __aenter__(self) -> LoopLag:
        self._cpu_before = _cpu_times()
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        after = _cpu_times()
        if self._cpu_before and after and len(after) > 7:
            spent = [b - a for a, b in zip(self._cpu_before, after, strict=False)]
            self.steal = spent[7] / max(sum(spent), 1)

    def __str__(self) -> str:
        steal = "unknown" if self.steal is None else f"{100 * self.steal:.1f} %"
        return (
            f"test loop: worst lateness {self.worst:.2f} s, {self.late_ticks} ticks over 1 s late;"
            f" CPU steal {steal}"
        )


def process_stats() -> Iterator[tuple[int, str, list[str]]]:
    """(pid, command name, the fields after it) of each process `/proc/<pid>/stat` names."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            comm, rest = stat.read_text().split("(", 1)[1].rsplit(")", 1)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        yield int(stat.parent.name), comm, rest.split()


def _process_ticks() -> dict[int, int]:
    # Fields after the name: state is the first, utime and stime the 12th and 13th.
    return {pid: int(f[11]) + int(f[12]) for pid, _, f in process_stats() if len(f) > 12}


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(raw.decode(errors="replace").replace("\0", " ").split())[:160] or "?"


def snapshot(processes: int = 6, window: float = 1.0) -> str:
    """Load average, and the processes busiest over the next `window` seconds (blocking: a
    failure's message, not a measurement), as text."""
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "machine: no /proc to read"
    before = _process_ticks()
    time.sleep(window)
    after = _process_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    shares = [((after[pid] - before.get(pid, after[pid])) / hz / window, pid) for pid in after]
    busy = sorted(shares, reverse=True)[:processes]
    lines = [f"  {share:4.0%} {pid:>7} {_command_line(pid)}" for share, pid in busy if share > 0]
    return f"machine: load {load} on {os.cpu_count()} CPUs; busiest over {window:.0f} s:\n" + (
        "\n".join(lines) or "  (nothing busy)"
    )


@asynccontextmanager
async def snapshot_at(seconds: float) -> AsyncIterator[list[str]]:
    """Yields a list that holds `snapshot()`, taken in a thread `seconds` into the block, once
    the block has lasted that long (empty otherwise)."""
    taken: list[str] = []

    async def take() -> None:
        await asyncio.sleep(seconds)
        taken.append(await asyncio.to_thread(snapshot))

    task = asyncio.create_task(take())
    try:
        yield taken
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
