"""Queue-depth estimate from the prober's own background load versus vLLM's own count.

The acceptance experiment of the llama-server test on vLLM (`--max-num-seqs 4`): the
daemon's Poisson load at 0.2× to 1.5× the capacity measured first, no `metrics_url`; at
every level the waiting estimate's mean absolute error against `vllm:num_requests_waiting`
must be at most max(1 request, 20 % of the mean true depth). The slots learned from the load's
own overlap are printed and asserted at least the true 4. By the plain peak they once read 5
(a handoff whose timing misled, `capacity.own.SlotOccupancy`), and the waiting figure at capacity
missed its bound (MAE 1.13); with the support rule they read 4.
"""

from __future__ import annotations

import pytest

from tests.support.queue_accuracy import evidence, measure_capacity, run_levels, table
from tests.support.vllm import SLOTS

pytestmark = pytest.mark.vllm
FACTORS = (0.2, 0.6, 1.0, 1.5)
PROMPT_TOKENS, MAX_TOKENS = 48, 16
FIXED_LENGTH = {"ignore_eos": True}


async def test_waiting_estimate_tracks_vllm(vllm: str) -> None:
    capacity = await measure_capacity(
        vllm, workers=2 * SLOTS, seconds=20, prompt="hello " * 40, max_tokens=MAX_TOKENS,
        extra_body=FIXED_LENGTH,
    )  # fmt: skip
    levels = await run_levels(
        vllm, [capacity * factor for factor in FACTORS], seconds=25,
        prompt_tokens=PROMPT_TOKENS, max_tokens=MAX_TOKENS, warmup_seconds=2.0,
        extra_body=FIXED_LENGTH,
    )  # fmt: skip
    report = f"{table(capacity, levels)}\n{evidence(levels)}"
    print("\nvLLM --max-num-seqs 4, own load\n" + report, flush=True)
    for level in levels:
        assert level.mae <= level.bound, report
    assert levels[-1].slots >= SLOTS, report
