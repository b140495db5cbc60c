"""How close an accuracy or timing assertion came to its bound, for `bench/flakiness.py`.

An accuracy test asserts `holds(name, observed, at_least=...)` (or `at_most=`) instead of a
bare comparison: the comparison is the same one, and where the variable `PROBER_TEST_MARGINS`
names a file, one JSON line per check is appended to it: the test, the quantity, what was
observed, the bound, and the margin as a share of the bound's scale (positive: held). The
benchmark runs each test several times and reads the worst margin of each quantity, so a test
that passes by a hair is seen before it fails at random.
"""

from __future__ import annotations

import json
import math
import os

# Not `LLMPROBER_…`: a daemon a test starts reads every variable of that prefix as a setting,
# and one it does not know stops it (it did, under `bench/flakiness.py`).
MARGINS_VARIABLE = "PROBER_TEST_MARGINS"


def holds(
    name: str,
    observed: float,
    *,
    at_least: float | None = None,
    at_most: float | None = None,
    scale: float | None = None,
) -> bool:
    """Whether `at_least ≤ observed ≤ at_most` (one or both given); recorded either way.

    The margin is the distance to the nearer bound over `scale` (default: the bound's size,
    or 1 where the bound is 0): 0.2 means a fifth of the bound's scale to spare, −0.1 a miss
    by a tenth."""
    if at_least is None and at_most is None:
        raise ValueError("holds() needs at_least or at_most")
    spare = []
    if at_least is not None:
        spare.append((observed - at_least) / _scale(at_least, scale))
    if at_most is not None:
        spare.append((at_most - observed) / _scale(at_most, scale))
    margin = min(spare) if not math.isnan(observed) else -math.inf
    _record(name, observed, at_least, at_most, margin)
    return margin >= 0


def _scale(bound: float, scale: float | None) -> float:
    if scale is not None:
        return scale
    return abs(bound) if bound else 1.0


def _record(
    name: str, observed: float, low: float | None, high: float | None, margin: float
) -> None:
    path = os.environ.get(MARGINS_VARIABLE)
    if not path:
        return
    test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    row = {"test": test, "check": name, "observed": _finite(observed),
           "at_least": low, "at_most": high, "margin": _finite(margin)}  # fmt: skip
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None
