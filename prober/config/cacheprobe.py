"""A target's cache probe (`cache_probe:`): how long its shared prefix is, how often it runs.

Each run sends one prompt twice: first with a prefix drawn fresh for the run (a miss, which
warms the engine's prefix cache), then the same prompt again (a hit). docs/design.md §13 says
what is measured and why the first is made a miss.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, StrictInt

from prober.section import MAX_SECONDS
from prober.section import Section as _Strict


class CacheProbeConfig(_Strict):
    # Tokens of the prefix both requests share: at least a few of an engine's cache blocks
    # (vLLM's are 16 tokens), at most what a context holds.
    prefix_tokens: Annotated[StrictInt, Field(ge=16, le=131_072)] = 256
    interval_seconds: Annotated[float, Field(ge=1, le=MAX_SECONDS)] = 60.0
