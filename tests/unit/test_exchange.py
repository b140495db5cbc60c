"""prober.request.exchange: the meter's arithmetic with plain integers, and whose meter an
exchange takes (each task its own, the defaults outside any)."""

from __future__ import annotations

import asyncio

from prober.request.exchange import (
    DEFAULT_BOUNDS,
    HEAD_BYTES,
    HEAD_SLICE_BYTES,
    INTERIM_RESPONSES,
    ExchangeBounds,
    ExchangeMeter,
    bounded,
    exchange_meter,
)

BOUNDS = ExchangeBounds(body=10_000, framing=500)


def test_total_is_the_sum_of_the_parts() -> None:
    assert BOUNDS.total == HEAD_BYTES + 500 + 10_000
    assert ExchangeMeter(BOUNDS).total == BOUNDS.total


def test_head_slices_are_small_and_stop_at_the_head_bound() -> None:
    meter = ExchangeMeter(ExchangeBounds(body=1, framing=1, head=2500))
    assert meter.head_room(100_000) == HEAD_SLICE_BYTES
    assert meter.head_room(10) == 10
    assert meter.headed(1024, []) == ""
    assert meter.headed(1024, []) == ""
    assert meter.head_room(100_000) == 2500 - 2048
    problem = meter.headed(452, [])
    assert problem.startswith("response head larger than 2500 bytes"), problem
    assert meter.head_room(100_000) == 0


def test_a_final_status_ends_the_head_and_starts_the_framing_count() -> None:
    meter = ExchangeMeter(BOUNDS)
    assert meter.headed(300, [103, 100]) == ""
    assert not meter.head_done
    assert meter.headed(700, [200]) == ""
    assert meter.head_done
    assert meter.interim == 2
    assert meter.framing_line == 1000 + 500  # fed - body past it: framing past its bound


def test_101_is_final_and_1xx_past_the_bound_is_a_problem() -> None:
    meter = ExchangeMeter(BOUNDS)
    assert meter.headed(100, [101]) == ""
    assert meter.head_done
    meter = ExchangeMeter(BOUNDS)
    assert meter.headed(100, [103] * INTERIM_RESPONSES) == ""
    assert meter.headed(100, [103]) == f"more than {INTERIM_RESPONSES} interim (1xx) responses"


def test_begin_restarts_the_count_and_keeps_the_bounds() -> None:
    meter = ExchangeMeter(BOUNDS)
    assert not meter.engaged
    meter.arrived, meter.fed = 5, 5
    meter.headed(10, [200])
    meter.begin()
    assert (meter.arrived, meter.fed, meter.head, meter.head_done) == (0, 0, 0, False)
    assert meter.engaged
    assert meter.bounds is BOUNDS


async def test_each_task_takes_its_own_meter_and_none_outside() -> None:
    async def inside(bounds: ExchangeBounds) -> ExchangeMeter:
        with bounded(bounds) as meter:
            await asyncio.sleep(0)  # the other task sets its own meanwhile
            assert exchange_meter() is meter
            return meter

    small, large = ExchangeBounds(body=1, framing=1), ExchangeBounds(body=2, framing=2)
    first, second = await asyncio.gather(inside(small), inside(large))
    assert (first.bounds, second.bounds) == (small, large)
    outside = exchange_meter()
    assert outside.bounds == DEFAULT_BOUNDS
    assert outside is not exchange_meter()
