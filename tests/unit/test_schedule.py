"""The probe scheduler and the recorder, with a fake endpoint and fake clocks (no server).

The endpoint stands in for `Target.send`: it answers at once, or holds a probe until told, so
what is asserted is what the scheduler does with each result, not how long anything took.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, cast

import aiohttp
import pytest
import structlog
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED
from prometheus_client import CollectorRegistry

from prober.capacity.target import TargetCapacity
from prober.logs import setup_logging
from prober.metrics import Metrics
from prober.record import Mode, Recorder, ScrapeRecorder, cancelled
from prober.result import Outcome, RequestResult
from prober.schedule import ProbeScheduler
from prober.settings import TargetConfig
from prober.targets import Target
from tests.support.clock import Clock

MS = 1_000_000
SESSION = cast(aiohttp.ClientSession, object())  # the fake endpoint never uses it
SESSIONS = {"t": SESSION}  # every target here is named "t"
WALL = 1_700_000_000.0


def answer(t_sched_ns: int, outcome: Outcome = Outcome.OK) -> RequestResult:
    """A probe that queued 0, took 5 ms to its first token and decoded 11 tokens in 10 ms."""
    stamps = tuple(t_sched_ns + 5 * MS + i * MS for i in range(11))
    return RequestResult(
        outcome, t_sched_ns, t_sched_ns, stamps[-1] + MS, request_id="rid",
        t_first_byte_ns=stamps[0], t_first_token_ns=stamps[0], t_first_content_ns=stamps[0],
        t_last_token_ns=stamps[-1], token_event_ns=stamps, prompt_tokens=40,
        output_tokens=len(stamps), server_prefill_seconds=0.005,
    )  # fmt: skip


class Endpoint:
    """`Target.send` for one target: every call answers `answer(...)`.

    With `hold`, a probe waits after its first token until `release` is set, or, in a pair,
    until its companion has been sent (the companion joins a decode still going on)."""

    def __init__(self) -> None:
        self.sends = 0
        self.active = 0
        self.hold = False
        self.pair = False
        self.release = asyncio.Event()
        self.entered = asyncio.Event()  # a probe is in flight
        self.joined = asyncio.Event()
        self.outcome = Outcome.OK

    async def send(
        self,
        session: aiohttp.ClientSession,
        t_sched_ns: int,
        *,
        on_first_token: Callable[[], None] | None = None,
        **_: Any,
    ) -> RequestResult:
        self.sends += 1
        self.active += 1
        self.entered.set()
        try:
            if on_first_token is not None:
                on_first_token()
            if self.active == 2:
                self.joined.set()
            elif self.pair:
                await asyncio.wait_for(self.joined.wait(), 5.0)
            elif self.hold:
                await self.release.wait()
            return answer(t_sched_ns, self.outcome)
        finally:
            self.active -= 1


def target(endpoint: Endpoint, **kw: Any) -> Target:
    cfg = TargetConfig(name="t", url="http://127.0.0.1:1/v1", model="m", **{"warmup": 0, **kw})
    t = Target.from_config(cfg)
    t.send = endpoint.send  # type: ignore[method-assign]
    return t


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"target": "t", "model": "m", **labels})


def requests(metrics: Metrics, mode: str = "probe", outcome: str = "ok") -> float | None:
    return value(metrics, "llmprober_requests_total", mode=mode, outcome=outcome)


async def test_each_probe_run_records_its_outcome_and_the_target_becomes_ready() -> None:
    endpoint = Endpoint()
    t = target(endpoint)
    metrics = Metrics(CollectorRegistry())
    scheduler = ProbeScheduler(SESSIONS, [t], Recorder(metrics, wall_clock=lambda: WALL))
    assert not scheduler.ready
    await scheduler._job("t")
    assert scheduler.ready
    endpoint.outcome = Outcome.HTTP_5XX
    await scheduler._job("t")
    assert requests(metrics) == 1.0
    assert requests(metrics, outcome="http_5xx") == 1.0
    assert value(metrics, "llmprober_probe_success") == 0.0  # the last one failed
    assert value(metrics, "llmprober_last_probe_timestamp_seconds") == WALL


async def test_warm_up_probes_are_sent_but_never_recorded() -> None:
    endpoint = Endpoint()
    metrics = Metrics(CollectorRegistry())
    scheduler = ProbeScheduler(SESSIONS, [target(endpoint, warmup=2)], Recorder(metrics))
    await scheduler._job("t")
    await scheduler._job("t")  # warmed once per target
    assert endpoint.sends == 4
    assert requests(metrics) == 2.0


async def soon(event: asyncio.Event) -> None:
    """Wait for `event`, bounded: a bug fails the test instead of hanging it."""
    await asyncio.wait_for(event.wait(), 10.0)


def started(endpoint: Endpoint, metrics: Metrics) -> ProbeScheduler:
    """A running scheduler whose first probe is due at once; the next only in an hour."""
    scheduler = ProbeScheduler(
        SESSIONS, [target(endpoint, interval_seconds=3600)], Recorder(metrics)
    )
    scheduler.start()
    return scheduler


async def test_a_run_due_while_probes_in_flight_is_reached_is_skipped_and_counted() -> None:
    endpoint = Endpoint()
    endpoint.hold = True
    metrics = Metrics(CollectorRegistry())
    scheduler = started(endpoint, metrics)
    skipped = asyncio.Event()
    scheduler._scheduler.add_listener(
        lambda _: skipped.set(), EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED
    )
    try:
        await soon(endpoint.entered)  # held in flight
        for count in (1.0, 2.0):
            skipped.clear()
            scheduler._scheduler.modify_job("t", next_run_time=datetime.now(UTC))
            await soon(skipped)
            assert value(metrics, "llmprober_probe_skipped_total") == count
        assert endpoint.sends == 1  # probes_in_flight = 1: no second probe went out
        endpoint.release.set()
    finally:
        await scheduler.drain(5.0)
    assert requests(metrics) == 1.0  # the held probe finished within the grace


async def test_a_probe_cut_by_the_drain_is_recorded_as_cancelled() -> None:
    endpoint = Endpoint()
    endpoint.hold = True
    metrics = Metrics(CollectorRegistry())
    scheduler = started(endpoint, metrics)
    await soon(endpoint.entered)
    await scheduler.drain(0.0)
    assert requests(metrics, outcome="cancelled") == 1.0
    assert scheduler.ready  # a cancelled probe still finished as a probe


async def test_a_companion_joins_the_probe_when_the_capacity_asks_for_one() -> None:
    endpoint = Endpoint()
    t = target(endpoint, slots=4)
    metrics = Metrics(CollectorRegistry())
    cap = TargetCapacity(t, ScrapeRecorder(metrics), clock=Clock())
    pairs: list[tuple[RequestResult, RequestResult]] = []
    observe_pair = cap.observe_pair

    def spy(primary: RequestResult, companion: RequestResult) -> tuple[float | None, float | None]:
        pairs.append((primary, companion))
        return observe_pair(primary, companion)

    cap.observe_pair = spy  # type: ignore[method-assign]
    scheduler = ProbeScheduler(SESSIONS, [t], Recorder(metrics, {"t": cap}))
    # No probe decoded yet: the capacity knows no decode time to place a companion in.
    assert cap.companion_delay(0.4, 0.0) is None
    await scheduler._job("t")
    assert (endpoint.sends, pairs) == (1, [])
    # Still learning the slowdown: every probe now takes a companion 40 % into its decode.
    assert cap.companion_delay(0.4, 0.99) == pytest.approx(0.004)
    endpoint.pair = True
    await scheduler._job("t")
    assert endpoint.sends == 3
    assert len(pairs) == 1
    primary, companion = pairs[0]
    assert companion.t_sched_ns > primary.t_sched_ns
    assert requests(metrics) == 3.0  # the companion is a probe too
    assert value(metrics, "llmprober_queue_wait_seconds_count") == 3.0  # both of the pair


async def test_every_probe_is_counted_in_flight_for_the_estimate_while_it_runs() -> None:
    endpoint = Endpoint()
    endpoint.hold = True
    t = target(endpoint)
    clock = Clock()
    metrics = Metrics(CollectorRegistry())
    cap = TargetCapacity(t, ScrapeRecorder(metrics), clock=clock)
    scheduler = ProbeScheduler(SESSIONS, [t], Recorder(metrics, {"t": cap}))
    job = asyncio.create_task(scheduler._job("t"))
    await soon(endpoint.entered)
    clock.now += 2.0
    # It has its first token: in flight, but no longer waiting for one.
    assert cap.probes.waited(clock.now) == []
    assert cap.probes.occupancy(clock.now, 2.0, 0.0) == pytest.approx((0.0, 1.0))
    endpoint.release.set()
    await job
    clock.now += 2.0
    assert cap.probes.occupancy(clock.now, 2.0, 0.0) == pytest.approx((0.0, 0.0))


# -- the recorder ----------------------------------------------------------------------------


def test_load_results_feed_metrics_and_the_estimate_but_no_probe_gauges() -> None:
    t = target(Endpoint())
    metrics = Metrics(CollectorRegistry())
    cap = TargetCapacity(t, ScrapeRecorder(metrics), clock=Clock())
    Recorder(metrics, {"t": cap}).record(t, answer(0), Mode.LOAD)
    assert requests(metrics, mode="load") == 1.0
    assert value(metrics, "llmprober_probe_success") is None
    assert value(metrics, "llmprober_queue_wait_seconds_count") == 1.0
    # A load request is not a probe: the probes-alone estimate has nothing to place pairs by.
    assert cap.companion_delay(0.4, 0.0) is None


def test_a_probe_feeds_the_probes_alone_estimate() -> None:
    t = target(Endpoint())
    metrics = Metrics(CollectorRegistry())
    cap = TargetCapacity(t, ScrapeRecorder(metrics), clock=Clock())
    Recorder(metrics, {"t": cap}).record(t, answer(0), Mode.PROBE)
    assert value(metrics, "llmprober_queue_wait_seconds_count") == 1.0
    assert cap.companion_delay(0.4, 0.0) == pytest.approx(0.004)


def test_an_on_demand_probe_is_a_probe_in_the_metrics_but_never_in_the_estimate() -> None:
    t = target(Endpoint())
    metrics = Metrics(CollectorRegistry())
    cap = TargetCapacity(t, ScrapeRecorder(metrics), clock=Clock())
    Recorder(metrics, {"t": cap}, wall_clock=lambda: WALL).record(t, answer(0), Mode.ON_DEMAND)
    assert requests(metrics) == 1.0
    assert value(metrics, "llmprober_probe_success") == 1.0
    assert value(metrics, "llmprober_queue_wait_seconds_count") is None


@pytest.mark.parametrize(
    ("mode", "error"),
    [
        (Mode.PROBE, "cancelled at shutdown"),
        (Mode.ON_DEMAND, "cancelled at shutdown"),
        (Mode.LOAD, "load stopped"),
    ],
)
def test_a_cancelled_result_says_why_it_ended(mode: Mode, error: str) -> None:
    r = cancelled(5, mode)
    assert (r.outcome, r.error, r.t_sched_ns) == (Outcome.CANCELLED, error, 5)
    assert r.t_send_ns == r.t_end_ns >= 5


async def test_the_companion_probe_is_marked_in_its_log_line() -> None:
    endpoint = Endpoint()
    t = target(endpoint, slots=4)
    metrics = Metrics(CollectorRegistry())
    cap = TargetCapacity(t, ScrapeRecorder(metrics), clock=Clock())
    scheduler = ProbeScheduler(SESSIONS, [t], Recorder(metrics, {"t": cap}))
    with logged() as lines:
        await scheduler._job("t")  # alone: no decode time to place a companion in yet
        assert cap.companion_delay(0.4, 0.99) is not None
        endpoint.pair = True
        await scheduler._job("t")
    probes = [line for line in lines() if line["event"] == "probe_ok"]
    assert [line.get("companion") for line in probes] == [None, None, True]
    assert endpoint.sends == 3


@contextmanager
def logged(level: str = "info") -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """The JSON log lines written inside the block at `level`, as a function to call after."""
    root, apscheduler = logging.getLogger(), logging.getLogger("apscheduler")
    saved = (root.handlers[:], root.level, apscheduler.level, structlog.get_config())
    stream = io.StringIO()
    setup_logging("json", level, stream=stream)
    try:
        yield lambda: [json.loads(x) for x in stream.getvalue().splitlines() if x.startswith("{")]
    finally:
        root.handlers[:], root_level, apscheduler_level, config = saved
        root.setLevel(root_level)
        apscheduler.setLevel(apscheduler_level)
        structlog.configure(**config)


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
async def test_apschedulers_start_lines_only_at_debug(level: str, shown: bool) -> None:
    """apscheduler's "Adding job tentatively", "Added job" and "Scheduler started" lines come
    with every start: shown at debug only."""
    endpoint = Endpoint()
    scheduler = ProbeScheduler(SESSIONS, [target(endpoint)], Recorder(Metrics(CollectorRegistry())))
    with logged(level) as lines:
        scheduler.start()
        await soon(endpoint.entered)
        await scheduler.drain(1.0)
    events = " ".join(str(line["event"]) for line in lines())
    for text in ("Adding job tentatively", "Added job", "Scheduler started"):
        assert (text in events) is shown, events
