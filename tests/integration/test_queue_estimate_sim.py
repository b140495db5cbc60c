"""Queue-depth estimate versus the simulator's exact waiting count (docs/design.md §6).

Bound (binding, from the issue): at every load level the mean absolute error of the waiting
estimate is at most max(1 request, 20 % of the mean true depth).
"""

from __future__ import annotations

from tests.support.daemon import simulator
from tests.support.margins import holds
from tests.support.queue_accuracy import (
    FACTORS,
    evidence,
    measure_capacity_in_process,
    run_own_load_levels,
    table,
)


async def test_waiting_estimate_tracks_simulator_truth() -> None:
    async with simulator(slots=4, decode_step_seconds=0.02, decode_slowdown=0.05) as sim:
        capacity = await measure_capacity_in_process(
            sim, workers=8, seconds=5, prompt="hello " * 30, max_tokens=16
        )
        rates = [capacity * factor for factor in FACTORS]
        levels = await run_own_load_levels(
            sim, rates, seconds=12, prompt_tokens=48, max_tokens=16, warmup_seconds=1.0
        )
    report = f"{table(capacity, levels)}\n{evidence(levels)}"
    print("\n" + report)
    for i, level in enumerate(levels):
        assert holds(f"waiting MAE, level {i}", level.mae, at_most=level.bound), report
    # Learned from the peak overlap of the load's own requests: the engine's -np / slots.
    assert levels[-1].slots == 4, report
