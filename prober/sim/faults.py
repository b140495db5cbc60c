"""Fault vocabulary of the simulator: what a fault spec means and which request gets one.

A fault is chosen per request, by the `X-Sim-Fault` header when present, otherwise at random
from the configured rates (seeded, so a run is repeatable). How each fault looks on the wire
is implemented in `stream.py`; this module only names and parses them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from prober.validation import within, wrong

FAULT_HEADER = "X-Sim-Fault"

# Bounds keep a typo from asking the server for a 40 GB event or a 200 status "error".
MAX_OVERSIZED_BYTES = 64 * 1024 * 1024
MIN_OVERSIZED_BYTES = 64


class FaultKind(StrEnum):
    """Every fault the simulator can inject; the value is the spec's name."""

    STATUS = "status"
    NO_FIRST_BYTE = "no_first_byte"
    NO_FIRST_TOKEN = "no_first_token"
    STALL_AFTER = "stall_after"
    TRUNCATE_AFTER = "truncate_after"
    CLOSE_MID_BODY = "close_mid_body"
    MALFORMED = "malformed"
    BAD_JSON = "bad_json"
    OVERSIZED = "oversized"
    ENDLESS = "endless"
    NO_TOKENS = "no_tokens"


# Faults written as NAME:INT, with the inclusive range the integer must lie in.
_ARG_RANGES: dict[FaultKind, tuple[int, int]] = {
    FaultKind.STATUS: (400, 599),
    FaultKind.STALL_AFTER: (0, 1_000_000),
    FaultKind.TRUNCATE_AFTER: (0, 1_000_000),
    FaultKind.OVERSIZED: (MIN_OVERSIZED_BYTES, MAX_OVERSIZED_BYTES),
}


@dataclass(frozen=True, slots=True)
class Fault:
    """One parsed fault: its kind and, for kinds that take one, the integer argument."""

    kind: FaultKind
    arg: int = 0


def parse_fault(spec: str) -> Fault:
    """Parse `name` or `name:INT`; raise ValueError saying what is wrong."""
    name, sep, raw_arg = spec.strip().partition(":")
    try:
        kind = FaultKind(name)
    except ValueError:
        known = ", ".join(k.value for k in FaultKind)
        raise ValueError(f"unknown fault {spec!r}; known: {known}") from None
    bounds = _ARG_RANGES.get(kind)
    if bounds is None:
        if sep:
            raise ValueError(f"fault {name!r} takes no argument, got {spec!r}")
        return Fault(kind)
    try:
        arg = int(raw_arg)
    except ValueError:
        raise ValueError(f"fault {name!r} needs an integer argument: {name}:N") from None
    low, high = bounds
    if not low <= arg <= high:
        raise ValueError(f"fault {name!r} argument {within(low, high, arg)}")
    return Fault(kind, arg)


def validate_rates(rates: Mapping[str, float]) -> None:
    """Check fault_rates: parsable specs, probabilities in [0, 1] that sum to at most 1."""
    total = 0.0
    for spec, prob in rates.items():
        if not isinstance(spec, str):
            raise ValueError(f"fault_rates: keys {wrong('fault specs', spec)}")
        try:
            parse_fault(spec)
        except ValueError as exc:
            raise ValueError(f"fault_rates: {exc}") from None
        if isinstance(prob, bool) or not isinstance(prob, int | float) or not 0 <= prob <= 1:
            raise ValueError(f"fault_rates[{spec!r}]: {wrong('a probability in [0, 1]', prob)}")
        total += prob
    if total > 1.0 + 1e-9:
        raise ValueError(f"fault_rates: must sum to at most 1, got {total:g}")


class FaultPicker:
    """Chooses the fault of each request; owns the seeded random stream for random faults."""

    def __init__(self, rates: Mapping[str, float], seed: int) -> None:
        self._rng = random.Random(seed)
        # Cumulative thresholds in insertion order, so one draw picks at most one fault.
        self._table: list[tuple[float, Fault]] = []
        acc = 0.0
        for spec, prob in rates.items():
            if prob > 0:
                acc += prob
                self._table.append((acc, parse_fault(spec)))

    def pick(self, header: str | None) -> Fault | None:
        """The header wins; otherwise draw. Raises ValueError for a bad header value."""
        if header is not None and header.strip():
            return parse_fault(header)
        if not self._table:
            return None
        draw = self._rng.random()
        for threshold, fault in self._table:
            if draw < threshold:
                return fault
        return None
