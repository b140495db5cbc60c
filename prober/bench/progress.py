"""The live progress display of a sweep: one rich progress bar per level, on stderr.

`SweepProgress` supplies the runner's `on_phase` and `on_result` callbacks; a level's bar
counts its measured requests (or runs open-ended with `--duration`) and shows its failures.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from prober.bench.config import Level
from prober.result import RequestResult


class SweepProgress:
    """Context manager; pass `on_phase` and `on_result` to `BenchRunner`."""

    def __init__(self, console: Console | None = None, *, enabled: bool = True) -> None:
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[failed]} failed"),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
            disable=not enabled,
        )
        self._task: TaskID | None = None
        self._failed = 0

    def __enter__(self) -> SweepProgress:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._progress.stop()

    def on_phase(self, level: Level, phase: str, expected: int | None) -> None:
        if phase == "warmup":
            self._task = self._progress.add_task(
                f"{level.label()} warm-up", total=expected, failed=0
            )
        elif phase == "measure":
            self._failed = 0
            if self._task is None:
                self._task = self._progress.add_task("", total=expected, failed=0)
            self._progress.reset(
                self._task, total=expected, description=f"{level.label()}", failed=0
            )
        elif phase == "done" and self._task is not None:
            self._progress.update(self._task, total=expected, completed=expected)
            self._task = None

    def on_result(self, result: RequestResult) -> None:
        if self._task is None:
            return
        if not result.ok:
            self._failed += 1
        self._progress.update(self._task, advance=1, failed=self._failed)
