"""Queue-depth estimate versus a real llama-server's `llamacpp:requests_deferred`.

The acceptance test of docs/design.md §6: 4 slots, the prober's own background load at 0.2× to
1.5× the capacity measured first in this test; at every level the mean absolute error of the
waiting estimate must be at most max(1 request, 20 % of the mean true depth). The bound is
binding: if the estimate misses it, improve the method, never the bound.
"""

from __future__ import annotations

import pytest

from tests.support.engine import llama_server_fixture
from tests.support.queue_accuracy import evidence, measure_capacity, run_levels, table

pytestmark = pytest.mark.engine
engine = llama_server_fixture(4)

FACTORS = (0.2, 0.6, 1.0, 1.5)
PROMPT_TOKENS, MAX_TOKENS = 48, 16
FIXED_LENGTH = {"ignore_eos": True}  # every answer exactly MAX_TOKENS, so capacity is stable


async def test_waiting_estimate_tracks_llama_server(engine: str) -> None:
    capacity = await measure_capacity(
        engine, workers=8, seconds=25, prompt="hello " * 40, max_tokens=MAX_TOKENS,
        extra_body=FIXED_LENGTH,
    )  # fmt: skip
    levels = await run_levels(
        engine, [capacity * factor for factor in FACTORS], seconds=30,
        prompt_tokens=PROMPT_TOKENS, max_tokens=MAX_TOKENS, warmup_seconds=2.0,
        extra_body=FIXED_LENGTH,
    )  # fmt: skip
    report = f"{table(capacity, levels)}\n{evidence(levels)}"
    print("\n" + report, flush=True)
    for level in levels:
        assert level.mae <= level.bound, report
    # Learned from the peak overlap of the load's own requests: the engine's -np / slots.
    assert levels[-1].slots == 4, report
