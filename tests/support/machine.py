"""What else the machine was doing: evidence for a failing accuracy test's message.

The engine tests judge figures that move with the machine's pace, and the machines that run
them are shared. When one fails, its message should say whether the machine was the cause:

    lag = LoopLag()                 # inside the test's event loop
    async with lag, snapshot_at(30) as machine:  # machine: [snapshot() 30 s in], if so long
        ...                         # lag: the loop's worst lateness on a 0.1 s timer, how
    f"{report}\n{lag}\n{''.join(machine)}"  # long it waited for a CPU, steal, CPU pressure

A loop can be late because it was busy, blocked, or runnable with no CPU given to it; the
run-queue wait (`/proc/thread-self/schedstat`) and the kernel's CPU pressure tell the last apart.
Each busy process is shown with its niceness and session: with autogroup scheduling (on in
many kernels' defaults, and on these machines) niceness orders only the threads of one session.

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


def _run_delay() -> float | None:
    """Seconds the calling thread has spent runnable, waiting for a CPU."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _cpu_pressure() -> float | None:
    """Seconds, machine-wide, that some runnable task waited for a CPU (PSI `some` total)."""
    try:
        some = Path("/proc/pressure/cpu").read_text().splitlines()[0]
        return int(some.rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return None


def _delta(before: float | None, after: float | None, span: float) -> str:
    if before is None or after is None or span <= 0:
        return "unknown"
    return f"{100 * (after - before) / span:.0f} %"


class LoopLag:
    """The longest a 0.1 s timer of the running loop fired late while it was entered; the share
    of that span the loop's thread waited runnable for a CPU, and some task machine-wide did
    (CPU pressure); the share of CPU time the hypervisor stole (`/proc/stat`'s steal)."""

    def __init__(self) -> None:
        self.worst = 0.0
        self.late_ticks = 0  # ticks more than 1 s late
        self._task: asyncio.Task[None] | None = None
        self._cpu_before: list[int] | None = None
        self.steal: float | None = None
        self._start = 0.0
        self._waits: tuple[float | None, float | None] = (None, None)
        self.waited = "unknown"  # the loop's thread runnable without a CPU, share of the span
        self.pressure = "unknown"  # some task runnable without a CPU, share of the span

    async def _watch(self) -> None:
        while True:
            start = time.monotonic()
            await asyncio.sleep(_TICK_SECONDS)
            late = time.monotonic() - start - _TICK_SECONDS
            self.worst = max(self.worst, late)
            self.late_ticks += late > 1.0

    async def __aenter__(self) -> LoopLag:
        self._cpu_before = _cpu_times()
        self._start = time.monotonic()
        self._waits = (_run_delay(), _cpu_pressure())
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        span = time.monotonic() - self._start
        self.waited = _delta(self._waits[0], _run_delay(), span)
        self.pressure = _delta(self._waits[1], _cpu_pressure(), span)
        after = _cpu_times()
        if self._cpu_before and after and len(after) > 7:
            spent = [b - a for a, b in zip(self._cpu_before, after, strict=False)]
            self.steal = spent[7] / max(sum(spent), 1)

    def __str__(self) -> str:
        steal = "unknown" if self.steal is None else f"{100 * self.steal:.1f} %"
        return (
            f"test loop: worst lateness {self.worst:.2f} s, {self.late_ticks} ticks over 1 s late,"
            f" waiting for a CPU {self.waited} of the time; CPU pressure {self.pressure};"
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


def _process_ticks() -> dict[int, tuple[int, str]]:
    # Fields after the name: state is the first, session the 4th, utime and stime the 12th and
    # 13th, nice the 17th.
    return {
        pid: (int(f[11]) + int(f[12]), f"ni {f[16]:>3} sid {f[3]:>6}")
        for pid, _, f in process_stats()
        if len(f) > 16
    }


def _command_line(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(raw.decode(errors="replace").replace("\0", " ").split())[:160] or "?"


def snapshot(processes: int = 6, window: float = 1.0) -> str:
    """Load average, and the processes busiest over the next `window` seconds (blocking: a
    failure's message, not a measurement), as text. The window is timed, not assumed: a
    starved caller wakes late, and its shares are of the time that really passed."""
    try:
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "machine: no /proc to read"
    before, start = _process_ticks(), time.monotonic()
    time.sleep(window)
    after, spent = _process_ticks(), time.monotonic() - start
    hz = os.sysconf("SC_CLK_TCK")
    shares = [
        ((ticks - before.get(pid, (ticks, ""))[0]) / hz / spent, pid, about)
        for pid, (ticks, about) in after.items()
    ]
    busy = sorted(shares, reverse=True)[:processes]
    lines = [
        f"  {share:4.0%} {pid:>7} {about} {_command_line(pid)}"
        for share, pid, about in busy
        if share > 0
    ]
    return (
        f"machine: load {load} on {os.cpu_count()} CPUs; busiest over {spent:.1f} s"
        f" (asked {window:.1f}):\n" + ("\n".join(lines) or "  (nothing busy)")
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
