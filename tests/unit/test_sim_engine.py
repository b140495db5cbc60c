"""Engine scheduling on a virtual clock: exact step times, queueing, KV admission, drops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from prober.sim.config import SimConfig
from prober.sim.engine import Emission, Engine, EngineRequest


class VirtualClock:
    """Time moves only when the engine sleeps, so step times are exact."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> VirtualClock:
    return VirtualClock()


@asynccontextmanager
async def running(engine: Engine) -> AsyncIterator[None]:
    task = asyncio.create_task(engine.run())
    yield
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def _drain(req: EngineRequest) -> list[Emission]:
    out: list[Emission] = []
    while not out or not out[-1].last:
        out.append(await req.out.get())
    return out


def _cfg(**kw: object) -> SimConfig:
    base: dict[str, object] = {
        "prefill_base_seconds": 0.1,
        "prefill_tokens_per_second": 100.0,
        "decode_step_seconds": 0.02,
        "decode_slowdown": 0.0,
    }
    return SimConfig(**(base | kw))  # type: ignore[arg-type]


async def test_one_slot_serves_fifo_with_exact_times(clock: VirtualClock) -> None:
    engine = Engine(_cfg(slots=1), clock=clock, sleep=clock.sleep)
    async with running(engine):
        a, b = engine.submit(10, 3), engine.submit(10, 3)
        ems_a, ems_b = await _drain(a), await _drain(b)
    # prefill = 0.1 + 10/100 = 0.2 s yields the first token; then one token per 0.02 s step.
    assert [e.at for e in ems_a] == pytest.approx([0.20, 0.22, 0.24])
    # b waits for a's slot, then pays its own prefill.
    assert [e.at for e in ems_b] == pytest.approx([0.44, 0.46, 0.48])
    assert [e.last for e in ems_b] == [False, False, True]
    stats = engine.stats()
    assert (stats.request_success_total, stats.generation_tokens_total) == (2, 6)
    assert stats.prompt_tokens_total == 20


async def test_batch_slowdown_and_shared_prefill(clock: VirtualClock) -> None:
    cfg = _cfg(
        slots=2, prefill_base_seconds=0.01, prefill_tokens_per_second=1e9, decode_slowdown=0.5
    )
    engine = Engine(cfg, clock=clock, sleep=clock.sleep)
    async with running(engine):
        a, b = engine.submit(1, 3), engine.submit(1, 3)
        ems_a = await _drain(a)
        await _drain(b)
    # Both prefills share the first step (0.02 s); each decode step of 2 costs 0.02*1.5.
    assert [e.at for e in ems_a] == pytest.approx([0.02, 0.05, 0.08], abs=1e-6)


async def test_tokens_per_chunk_flushes_at_reasoning_end(clock: VirtualClock) -> None:
    engine = Engine(_cfg(tokens_per_chunk=4), clock=clock, sleep=clock.sleep)
    async with running(engine):
        ems = await _drain(engine.submit(1, 10, reasoning_tokens=3))
    assert [e.tokens for e in ems] == [3, 4, 3]


async def test_kv_budget_holds_the_queue_head(clock: VirtualClock) -> None:
    engine = Engine(_cfg(slots=4, kv_capacity_tokens=100), clock=clock, sleep=clock.sleep)
    with pytest.raises(ValueError, match="exceeds the KV capacity"):
        engine.submit(10, 91)
    async with running(engine):
        reqs = [engine.submit(8, 40) for _ in range(3)]
        await reqs[0].out.get()
        stats = engine.stats()
        assert (stats.running, stats.waiting) == (2, 1)
        assert stats.kv_usage == pytest.approx(0.96)


async def test_gone_clients_leave_queue_and_slots(clock: VirtualClock) -> None:
    engine = Engine(_cfg(slots=1), clock=clock, sleep=clock.sleep)
    gone = {"a": False, "b": False}
    async with running(engine):
        a = engine.submit(1, 1000, is_gone=lambda: gone["a"])
        b = engine.submit(1, 1000, is_gone=lambda: gone["b"])
        c = engine.submit(1, 2)
        await a.out.get()
        gone["b"] = True  # queued client leaves first
        gone["a"] = True
        while not (await a.out.get()).dropped:
            pass
        assert (await b.out.get()).dropped
        ems_c = await _drain(c)
    assert len(ems_c) == 2
    assert engine.stats().running == engine.stats().waiting == 0


async def test_endless_runs_until_cancelled(clock: VirtualClock) -> None:
    engine = Engine(_cfg(), clock=clock, sleep=clock.sleep)
    async with running(engine):
        req = engine.submit(1, 2, endless=True)
        ems = [await req.out.get() for _ in range(50)]
        engine.cancel(req)
        assert engine.stats().running == 0
    assert not any(e.last for e in ems)
