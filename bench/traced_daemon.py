"""The daemon with Python's heap traced, for `soak.py --tracemalloc`:

    python bench/traced_daemon.py DIR run --config FILE

Runs `prober.cli` with `tracemalloc` on (one frame per allocation). On SIGUSR1 it writes
the traced size of the Python heap, in bytes, to `DIR/traced`; on SIGUSR2 a snapshot to
`DIR/snapshot-N.bin` (N counting from 0). Each file appears whole (written aside, then
renamed). Python runs a signal handler on the main thread between two bytecodes, so here
between two steps of the daemon's event loop.
"""

from __future__ import annotations

import itertools
import os
import signal
import sys
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from types import FrameType


def publish(folder: Path, name: str, write: Callable[[Path], object]) -> None:
    """`folder/name`, written by `write` beside it and renamed, so a reader sees it whole."""
    part = folder / f".{name}.part"
    write(part)
    os.replace(part, folder / name)


def main() -> int:
    if len(sys.argv) < 3 or not Path(sys.argv[1]).is_dir():
        print("usage: traced_daemon.py DIR ARGS...: DIR an existing folder for the answers, "
              "ARGS what `python -m prober.cli` takes", file=sys.stderr)  # fmt: skip
        return 2
    folder = Path(sys.argv[1])
    snapshots = itertools.count()

    def traced(_: int, __: FrameType | None) -> None:
        size = tracemalloc.get_traced_memory()[0]
        publish(folder, "traced", lambda path: path.write_text(str(size)))

    def snapshot(_: int, __: FrameType | None) -> None:
        name = f"snapshot-{next(snapshots)}.bin"
        publish(folder, name, tracemalloc.take_snapshot().dump)

    tracemalloc.start(1)
    signal.signal(signal.SIGUSR1, traced)
    signal.signal(signal.SIGUSR2, snapshot)
    from prober.cli import main as cli

    return cli(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
