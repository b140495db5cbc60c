"""Queue-depth estimate versus a real llama-server's `llamacpp:requests_deferred`.

The acceptance test of docs/design.md §6: 4 slots, the prober's own background load at 0.2× to
1.5× the capacity measured first in this test; at every level the mean absolute error of the
waiting estimate must be at most max(1 request, 20 % of the mean true depth). The bound is
binding: if the estimate misses it, improve the method, never the bound.
"""

from __future__ import annotations

import pytest

from tests.support.engine import llama_server_fixture
from tests.support.margins import holds
from tests.support.queue_accuracy import on_engine

pytestmark = pytest.mark.engine
engine = llama_server_fixture(4)


async def test_waiting_estimate_tracks_llama_server(engine: str) -> None:
    levels, report = await on_engine(
        engine, workers=8, capacity_seconds=25, seconds=30, note="llama-server -np 4, own load"
    )
    print("\n" + report, flush=True)
    for i, level in enumerate(levels):
        assert holds(f"waiting MAE, level {i}", level.mae, at_most=level.bound), report
    # Learned from the peak overlap of the load's own requests: the engine's -np / slots.
    assert levels[-1].slots == 4, report
