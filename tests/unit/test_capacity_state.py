"""The engine state (issue 36 item 1) and the cached prompt tokens (item 3), from plain integers:
a fake clock, fed results and token stamps, no server.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from prober.capacity.state import EngineState, EngineWatch
from prober.metrics import Labels, Metrics
from prober.record import Recorder, confirmed
from prober.request.activity import StreamActivity
from prober.request.sse import SSEParser
from prober.request.stream import StreamState
from prober.result import Outcome, RequestResult
from prober.settings import TargetConfig
from prober.targets import Target
from prober.timings import Slo
from tests.support.sse import chunk, sse

S = 1_000_000_000
STALL = 10.0  # seconds
SLO_TTFT = 2.0


class Clock:
    def __init__(self) -> None:
        self.ns = 1000 * S

    def __call__(self) -> int:
        return self.ns

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * S)


def watch() -> tuple[EngineWatch, StreamActivity, Clock]:
    clock = Clock()
    activity = StreamActivity()
    return EngineWatch(activity, clock_ns=clock), activity, clock


def result(clock: Clock, outcome: Outcome, ttft: float | None = None) -> RequestResult:
    """A result that ended now, its first token `ttft` s after it was scheduled."""
    end = clock()
    sched = end - 5 * S
    first = None if ttft is None else sched + int(ttft * S)
    return RequestResult(
        outcome, sched, sched, end, t_first_token_ns=first, t_last_token_ns=first,
        token_event_ns=() if first is None else (first,),
    )  # fmt: skip


def judge(w: EngineWatch, saturation: float | None = None) -> EngineState:
    return w.judge(STALL, SLO_TTFT, saturation).state


def test_nothing_seen_is_ok() -> None:
    w, _, _ = watch()
    verdict = w.judge(STALL, SLO_TTFT)
    assert verdict.state is EngineState.OK
    assert verdict.serving
    assert "no request" in verdict.reason


def test_tokens_within_slo_are_ok_and_over_it_busy() -> None:
    w, activity, clock = watch()
    activity.token(clock())
    w.finished(result(clock, Outcome.OK, ttft=0.3))
    assert judge(w) is EngineState.OK
    w.finished(result(clock, Outcome.OK, ttft=3.0))
    assert judge(w) is EngineState.BUSY
    w.finished(result(clock, Outcome.OK, ttft=0.3), wait=2.5)  # a queue wait past the SLO
    assert judge(w) is EngineState.BUSY


def test_saturation_of_one_is_busy() -> None:
    w, activity, clock = watch()
    activity.token(clock())
    assert judge(w, saturation=0.99) is EngineState.OK
    assert judge(w, saturation=1.0) is EngineState.BUSY


def test_an_open_request_without_token_for_the_window_is_stalled_not_before() -> None:
    w, activity, clock = watch()
    activity.token(clock())
    w.finished(result(clock, Outcome.OK, ttft=0.2))
    clock.advance(1)
    activity.begin(clock())  # sent; nothing comes back
    clock.advance(STALL - 1.5)
    assert judge(w) is EngineState.OK  # the last token is still within the window
    clock.advance(1)
    assert judge(w) is EngineState.OK  # no token for the window, but it waited less
    clock.advance(1)
    verdict = w.judge(STALL, SLO_TTFT)
    assert verdict.state is EngineState.STALLED
    assert not verdict.serving
    assert "open for 10 s" in verdict.reason
    assert "counter not read" in verdict.reason


def test_a_token_on_a_stream_still_open_keeps_it_flowing() -> None:
    w, activity, clock = watch()
    activity.begin(clock())  # one long stream, never finished
    for _ in range(30):
        clock.advance(1)
        activity.token(clock())
    assert judge(w) is EngineState.OK


def test_the_engine_counter_moving_rules_out_a_stall_even_with_no_prober_token() -> None:
    """A full engine: the probe waits in its queue past the window, the engine generates."""
    w, activity, clock = watch()
    w.counter(100.0)
    activity.begin(clock())
    for step in range(15):
        clock.advance(1)
        w.counter(200.0 + step)
    verdict = w.judge(STALL, SLO_TTFT, saturation=1.5)
    assert verdict.state is EngineState.BUSY
    assert "counter moves" in verdict.reason


def test_a_still_counter_does_not_help_and_a_fallen_one_is_no_movement() -> None:
    w, activity, clock = watch()
    w.counter(100.0)
    activity.begin(clock())
    clock.advance(5)
    w.counter(100.0)
    w.counter(3.0)  # restarted
    clock.advance(6)
    verdict = w.judge(STALL, SLO_TTFT)
    assert verdict.state is EngineState.STALLED
    assert "counter still" in verdict.reason


def test_requests_that_timed_out_waiting_are_stalled() -> None:
    w, _, clock = watch()
    w.finished(result(clock, Outcome.TIMEOUT_FIRST_TOKEN))
    assert judge(w) is EngineState.STALLED
    clock.advance(STALL + 0.1)
    assert judge(w) is EngineState.OK  # it left the window, nothing else seen


@pytest.mark.parametrize(
    "outcome", [Outcome.CONNECT_ERROR, Outcome.TIMEOUT_CONNECT, Outcome.HTTP_5XX]
)
def test_only_refusals_in_the_window_are_down(outcome: Outcome) -> None:
    w, activity, clock = watch()
    activity.token(clock())
    w.finished(result(clock, Outcome.OK, ttft=0.2))
    clock.advance(3)
    w.finished(result(clock, outcome))
    assert judge(w) is EngineState.OK  # the good one and its token are still in the window
    clock.advance(STALL - 1)
    w.finished(result(clock, outcome))
    verdict = w.judge(STALL, SLO_TTFT)
    assert verdict.state is EngineState.DOWN
    assert outcome.value in verdict.reason


def test_a_refusal_beside_a_429_is_not_down_and_cancelled_is_ignored() -> None:
    w, _, clock = watch()
    w.finished(result(clock, Outcome.CONNECT_ERROR))
    w.finished(result(clock, Outcome.CANCELLED))
    assert judge(w) is EngineState.DOWN
    w.finished(result(clock, Outcome.HTTP_429))
    assert judge(w) is EngineState.OK


def test_tokens_flowing_are_never_down_or_stalled() -> None:
    w, activity, clock = watch()
    activity.begin(clock() - 60 * S)
    w.finished(result(clock, Outcome.HTTP_5XX))
    w.finished(result(clock, Outcome.TIMEOUT_FIRST_TOKEN))
    activity.token(clock())
    assert judge(w) is EngineState.OK


def test_activity_keeps_the_latest_token_and_the_oldest_open() -> None:
    activity = StreamActivity()
    a, b = activity.begin(5), activity.begin(9)
    activity.token(20)
    activity.token(15)  # stamped by another stream, earlier
    assert (activity.last_token_ns, activity.oldest_open_ns(), activity.open) == (20, 5, 2)
    activity.end(a)
    assert activity.oldest_open_ns() == 9
    activity.end(b)
    assert activity.oldest_open_ns() is None


# -- the stall window's default ----------------------------------------------------------------


def cfg(**kwargs: Any) -> TargetConfig:
    return TargetConfig(name="t", url="http://127.0.0.1:1/v1", model="m", **kwargs)


def test_stall_window_defaults_to_the_first_token_timeout_and_two_intervals() -> None:
    assert cfg().stall_window_seconds == 60.0 + 2 * 15.0
    custom = cfg(interval_seconds=5, timeouts={"first_token_seconds": 20})
    assert custom.stall_window_seconds == 30.0
    assert cfg(stall_seconds=7).stall_window_seconds == 7.0


# -- cached prompt tokens ------------------------------------------------------------------


def streamed(usage: dict[str, Any] | None, timings: dict[str, Any] | None = None) -> RequestResult:
    activity = StreamActivity()
    state = StreamState("rid", ndjson=False, activity=activity)
    reader = SSEParser(1 << 20)
    final: dict[str, Any] = {"choices": []}
    if usage is not None:
        final["usage"] = usage
    if timings is not None:
        final["timings"] = timings
    for t, event in enumerate([chunk({"content": " a"}), sse(final), sse("[DONE]")]):
        state.feed(reader, event, (t + 1) * S)
    assert activity.last_token_ns == S  # the token was stamped on the target's activity
    return state.result(Outcome.OK, t_sched_ns=0, t_send_ns=0, t_end_ns=4 * S, wall_start=0.0)


def test_cached_tokens_from_usage_details_and_llama_timings() -> None:
    usage = {"prompt_tokens": 300, "completion_tokens": 1}
    details = {**usage, "prompt_tokens_details": {"cached_tokens": 256}}
    assert streamed(details).cached_tokens == 256
    assert streamed(usage).cached_tokens is None
    assert streamed(usage, {"prompt_n": 44, "cache_n": 256}).cached_tokens == 256


@pytest.mark.parametrize("cached", [-1, 301, 2**60, 1.5, "256", True])
def test_cached_tokens_out_of_range_are_dropped(cached: Any) -> None:
    usage = {"prompt_tokens": 300, "completion_tokens": 1}
    sent = {**usage, "prompt_tokens_details": {"cached_tokens": cached}}
    assert streamed(sent).cached_tokens is None


def test_cached_tokens_are_exported_as_a_token_kind() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    r = streamed({"prompt_tokens": 300, "completion_tokens": 1,
                  "prompt_tokens_details": {"cached_tokens": 256}})  # fmt: skip
    metrics.record(r, Labels("t", "m"), "probe", Slo(2.0, 0.2))
    labels = {"target": "t", "model": "m", "mode": "probe"}
    assert (
        registry.get_sample_value("llmprober_tokens_total", {**labels, "kind": "prompt_cached"})
        == 256
    )
    assert registry.get_sample_value("llmprober_tokens_total", {**labels, "kind": "prompt"}) == 300


# -- the cache probe's records -----------------------------------------------------------------


def test_confirmed_needs_half_the_prefix() -> None:
    def with_cached(n: int | None) -> RequestResult:
        return RequestResult(Outcome.OK, 0, 0, 1, cached_tokens=n)

    assert [confirmed(with_cached(n), 256) for n in (None, 4, 127, 128, 256)] == [
        "unknown", "false", "false", "true", "true",
    ]  # fmt: skip


def test_cache_probe_records_miss_and_hit_apart() -> None:
    registry = CollectorRegistry()
    recorder = Recorder(Metrics(registry))
    target = Target.from_config(cfg(cache_probe={"prefix_tokens": 256}))
    recorder.describe(target)

    def sent(ttft: float, cached: int) -> RequestResult:
        first = int(ttft * S)
        return RequestResult(
            Outcome.OK, 0, 0, first + 1, t_first_token_ns=first, t_last_token_ns=first,
            token_event_ns=(first,), cached_tokens=cached,
        )  # fmt: skip

    recorder.record_cache_probe(target, sent(0.8, 4), sent(0.1, 240))
    labels = {"target": "t", "model": "m"}

    def count(result: str, confirmed: str) -> float | None:
        values = {**labels, "result": result, "confirmed": confirmed}
        return registry.get_sample_value("llmprober_cache_probe_total", values)

    assert (count("miss", "false"), count("hit", "true"), count("hit", "false")) == (1, 1, 0)
    ttft = "llmprober_cache_probe_ttft_seconds_sum"
    assert registry.get_sample_value(ttft, {**labels, "result": "miss"}) == pytest.approx(0.8)
    assert registry.get_sample_value(ttft, {**labels, "result": "hit"}) == pytest.approx(0.1)


def test_a_failed_scrape_between_two_good_ones_loses_no_movement() -> None:
    w, activity, clock = watch()
    activity.begin(clock())
    w.counter(100.0)
    clock.advance(6)
    w.counter(None)  # a busy engine answered its /metrics too late
    clock.advance(5)
    w.counter(120.0)
    assert judge(w) is EngineState.OK
    clock.advance(11)
    w.counter(None)
    verdict = w.judge(STALL, SLO_TTFT)
    assert verdict.state is EngineState.STALLED
    assert "counter not read" in verdict.reason


# -- silence: what the background load pauses on (load.silent_seconds) ------------------------


def test_a_request_waiting_through_the_window_without_a_token_is_silence() -> None:
    w, activity, clock = watch()
    assert not w.silent(STALL)  # nothing asked: not silent
    key = activity.begin(clock())
    clock.advance(STALL - 1)
    assert not w.silent(STALL)  # it has not waited the window yet
    clock.advance(1)
    assert w.silent(STALL)
    activity.token(clock())  # a token on any stream ends it
    assert not w.silent(STALL)
    activity.end(key)
    clock.advance(STALL + 1)
    assert not w.silent(STALL)  # an idle target is not silent


def test_requests_that_fail_without_a_token_are_silence_until_the_window_passes() -> None:
    w, _, clock = watch()
    w.finished(result(clock, Outcome.CONNECT_ERROR))
    assert w.silent(STALL)
    clock.advance(STALL + 0.1)
    assert not w.silent(STALL)  # nothing open, nothing ended in the window
    w.finished(result(clock, Outcome.CANCELLED))  # the prober's doing: not the engine's
    assert not w.silent(STALL)


def test_an_engine_counter_that_moves_is_not_silence() -> None:
    """A request queued behind other clients' traffic waits without a token while the engine
    works: where its counter is read and moves, the load goes on."""
    w, activity, clock = watch()
    w.counter(100.0)
    activity.begin(clock())
    clock.advance(STALL)
    w.counter(140.0)
    assert not w.silent(STALL)
    clock.advance(STALL)
    w.counter(140.0)
    assert w.silent(STALL)
