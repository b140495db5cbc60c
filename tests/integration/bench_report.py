"""Reading bench's JSON report in tests: one figure by its key path."""

from __future__ import annotations

from typing import Any


def fig(level: dict[str, Any], *path: str) -> float:
    node: Any = level
    for key in path:
        node = node[key]
    return float(node)
