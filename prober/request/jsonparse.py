"""JSON of a response stream, parsed bounded: `loads`, through orjson when it is installed.

`stream.StreamState` parses every event and Ollama line with it; an answer check parses an
answer with the standard library's own (`prober.checks`), which needs no speed.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Callable
from typing import Any


def _pick_loads() -> Callable[[str | bytes], Any]:
    """`json.loads`, through orjson when it is installed (the `fast` extra).

    orjson parses a stream chunk about 3× faster. Whatever it refuses (NaN, Infinity, lone
    surrogates, non-UTF-8 encodings, nesting past 1024) goes on to `json.loads`, so what parses
    and what fails stays exactly as without it. One difference remains: integers beyond 64
    bits come back as floats, so such a token count (absurd from any server) is ignored; an
    integer of more than 64 digits is infinity either way (`_bounded_loads`).
    """
    try:
        orjson = importlib.import_module("orjson")
    except ImportError:
        return _bounded_loads
    fast = orjson.loads

    def loads(text: str | bytes) -> Any:
        try:
            return fast(text)
        except ValueError:
            return _bounded_loads(text)

    return loads


# An integer of more digits than this is nonsense as any count or duration: it parses as
# infinity (ignored by `_int` and `_number`). Python's int() refuses 4,300 digits and more,
# which made a whole stream `protocol_error` for a number in a field the prober ignores.
_MAX_INT_DIGITS = 64


def _bounded_int(text: str) -> int | float:
    return int(text) if len(text) <= _MAX_INT_DIGITS else math.inf


def _bounded_loads(text: str | bytes) -> Any:
    """`json.loads`, but a huge integer is infinity instead of a failed parse.

    The default parser is tried first (it is faster); only text it refuses is parsed again,
    so what fails for another reason still fails with its own message."""
    try:
        return json.loads(text)
    except ValueError as exc:
        try:
            return json.loads(text, parse_int=_bounded_int)
        except ValueError:
            raise exc from None


loads = _pick_loads()
