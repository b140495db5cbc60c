"""Whose word the probes-alone waiting depth rests on: the traffic's shape stated by the
operator (`traffic:`), read from the engine's request and token counters, or given by nobody,
and then the depth withheld while the shape-free figures stay (plain numbers, a fake clock,
the recorded vLLM exposition)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from prometheus_client import CollectorRegistry, generate_latest
from structlog.testing import capture_logs

from prober.capacity import target as target_module
from prober.capacity.decode import _MIN_PAIRS, DecodeModel
from prober.capacity.probes import ProbeSample, Shape, Traffic
from prober.capacity.server import ServerSnapshot, TokenTotals, parse_metrics
from prober.capacity.target import CapacityCollector, TargetCapacity
from prober.kinds import Drain
from prober.metrics import Metrics
from prober.record import Mode, Recorder, ScrapeRecorder
from prober.settings import TargetConfig
from prober.targets import Target
from tests.support.clock import Clock
from tests.support.results import timed_result
from tests.unit.test_capacity_probes import gap, learned_model

PROBE = {"prompt_tokens": 40, "max_tokens": 16}
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def fixture_text(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text(encoding="utf-8")


def _target(**kw: Any) -> Target:
    cfg = TargetConfig(name="t", url="http://127.0.0.1:1/v1", model="m", slots=4, **PROBE, **kw)
    return Target.from_config(cfg)


class Daemon:
    """One target's capacity, recorder and collector on one registry, as the daemon has them."""

    def __init__(self, clock: Clock, **kw: Any) -> None:
        self.registry = CollectorRegistry()
        metrics = Metrics(self.registry)
        self.target = _target(**kw)
        self.cap = TargetCapacity(self.target, ScrapeRecorder(metrics), clock=clock)
        self.recorder = Recorder(metrics, {"t": self.cap})
        self.registry.register(CapacityCollector([self.cap]))

    def probe(self, wait: float) -> None:
        """A probe of 40 prompt and 16 output tokens that waited `wait` s for a slot (its
        prefill 0.05 s, the server's own figure), then decoded at full batch."""
        first = wait + 0.05
        end = first + 15 * gap(4)
        result = timed_result(0.0, first, end, prefill=0.05, prompt_tokens=40, gaps=[gap(4)] * 15)
        self.recorder.record(self.target, result, Mode.PROBE)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def _value(text: str, series: str) -> float | None:
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return None if found is None else float(found.group(1))


WAITING = 'llmprober_queue_depth{model="m",source="estimate",state="waiting",target="t"}'
RUNNING = 'llmprober_queue_depth{model="m",source="estimate",state="running",target="t"}'
SATURATION = 'llmprober_saturation{model="m",source="estimate",target="t"}'
DRAIN = 'llmprober_queue_drain_rate{model="m",target="t"}'


def _drain_basis(text: str) -> str:
    [basis] = re.findall(r'llmprober_queue_drain_basis\{basis="(\w+)".*\} 1\.0', text)
    return basis


def test_no_traffic_nor_metrics_url_exports_the_wait_and_running_but_no_depth() -> None:
    """The new user's case: `slots:` given, no `traffic:`, no engine counters. The probes
    wait 2 s in a queue; the depth (and saturation above the knee, and the drain rate) would
    rest on their shape, which nobody gave; the waits and every busy slot need none."""
    daemon = Daemon(Clock())
    for _ in range(2):
        daemon.probe(wait=2.0)
    text = daemon.text()
    assert _value(text, 'llmprober_queue_wait_seconds_count{model="m",target="t"}') == 2.0
    assert _value(text, 'llmprober_queue_wait_seconds_sum{model="m",target="t"}') == (
        pytest.approx(4.0, abs=1e-6)
    )
    assert _value(text, RUNNING) == 4.0
    assert WAITING not in text
    assert SATURATION not in text  # above the knee: 1 + waiting / slots, the waiting unknown
    assert DRAIN not in text
    assert _drain_basis(text) == "probe_shape"
    # Said to look like the probes, the same probes give a depth: μ = 4 / their service.
    told = Daemon(Clock(), traffic="probes")
    for _ in range(2):
        told.probe(wait=2.0)
    text = told.text()
    service = 0.05 + 15 * gap(4)
    assert _value(text, WAITING) == pytest.approx(4 / service * 2.0 - 1.0, rel=1e-3)
    assert _value(text, SATURATION) is not None
    assert _drain_basis(text) == "traffic_probes"


def test_without_traffic_saturation_below_the_knee_stays() -> None:
    """No request waits: saturation is busy slots / slots, which needs no shape."""
    daemon = Daemon(Clock())
    foreign = daemon.cap.estimator.probes_alone
    assert foreign is not None
    foreign.decode = learned_model()
    for batch in (2, 3, 4):  # the probes decoded beside 1, 2 and 3 others: 2 on average
        foreign.observe(ProbeSample(foreign._clock(), 0.0, 0.05, 0.5, gap(batch), False))
    text = daemon.text()
    assert WAITING not in text
    assert _value(text, RUNNING) == pytest.approx(2.0)
    assert _value(text, SATURATION) == pytest.approx(0.5)


# -- the shape from the engine's counters -----------------------------------------------------


def _vllm(others: int, prompt: int, output: int, own: tuple[int, int, int] = (0, 0, 0)) -> str:
    """The recorded vLLM exposition with `others` more requests finished, of `prompt` and
    `output` tokens each, and the prober's `own` (requests, prompt, output tokens) besides."""
    text = fixture_text("vllm")
    n, p, o = others + own[0], others * prompt + own[1], others * output + own[2]
    for name, old, more in (
        ("request_prompt_tokens_count", 11.0, n),
        ("request_generation_tokens_count", 11.0, n),
        ("request_prompt_tokens_sum", 426.0, p),
        ("request_generation_tokens_sum", 132.0, o),
    ):
        line = f'vllm:{name}{{engine="0",model_name="m"}} '
        assert text.count(line + f"{old}\n") == 1
        text = text.replace(line + f"{old}\n", line + f"{old + more}\n")
    return text


def test_the_recorded_vllm_exposition_gives_its_finished_requests_tokens() -> None:
    """The histograms' counts and sums (one observation per finished request) win over the
    counters, which count the tokens of requests still running too (587 prompt tokens)."""
    assert parse_metrics(fixture_text("vllm")).lengths == TokenTotals(11.0, 426.0, 132.0)
    counters_only = "\n".join(
        line
        for line in fixture_text("vllm").splitlines()
        if "request_prompt_tokens" not in line and "request_generation_tokens" not in line
    )
    assert parse_metrics(counters_only).lengths == TokenTotals(11.0, 587.0, 154.0)


def test_the_engines_counters_give_the_traffics_shape_less_the_probers_own() -> None:
    """Between two scrapes 40 other requests of 80 + 31 tokens finished, and 10 probes of
    40 + 16: the shape is the others' alone, a basis of its own, and the depth follows it."""
    clock = Clock()
    daemon = Daemon(clock)
    cap = daemon.cap
    assert cap.traffic() == Traffic(None, Drain.PROBE_SHAPE)
    cap._keep(parse_metrics(_vllm(0, 0, 0)), clock.now)
    for _ in range(10):
        clock.now += 1.0
        daemon.probe(wait=0.0)  # 40 prompt tokens, 16 output tokens each
    clock.now += 1.0
    cap._keep(parse_metrics(_vllm(40, 80, 31, own=(10, 400, 160))), clock.now)
    assert cap.traffic() == Traffic(Shape(80.0, 31.0), Drain.ENGINE_SHAPE)
    foreign = cap.estimator.probes_alone
    assert foreign is not None
    foreign.decode = learned_model()
    clock.now += 10.0  # the free-slot probes leave the wait's window
    for _ in range(4):  # the probes' service 0.8 s; a request of the others' shape 1.6 s
        foreign.observe(ProbeSample(clock.now, 2.0, 0.05, 0.75, gap(4), True))
    text = daemon.text()
    assert _drain_basis(text) == "engine_shape"
    assert _value(text, DRAIN) == pytest.approx(2.5)
    assert _value(text, WAITING) == pytest.approx(2.5 * 2.0 - 1.0)


def test_the_engine_shape_needs_enough_requests_and_survives_a_reset() -> None:
    clock = Clock()
    cap = Daemon(clock).cap
    cap._keep(parse_metrics(_vllm(0, 0, 0)), clock.now)
    clock.now += 5.0
    cap._keep(parse_metrics(_vllm(15, 80, 31)), clock.now)
    assert cap.traffic().basis is Drain.PROBE_SHAPE  # 15 requests: too few for a mean
    clock.now += 5.0
    cap._keep(parse_metrics(_vllm(16, 80, 31)), clock.now)
    assert cap.traffic() == Traffic(Shape(80.0, 31.0), Drain.ENGINE_SHAPE)
    # The engine restarted: its counts start again, lower. The last shape holds until the
    # new counts give one, read from the restart on (not across it).
    clock.now += 5.0
    cap._keep(parse_metrics(fixture_text("vllm")), clock.now)
    assert cap.traffic().shape == Shape(80.0, 31.0)
    clock.now += 5.0
    cap._keep(parse_metrics(_vllm(20, 100, 51)), clock.now)
    assert cap.traffic() == Traffic(Shape(100.0, 51.0), Drain.ENGINE_SHAPE)


def test_counts_no_request_can_have_give_no_shape() -> None:
    """A hostile or broken /metrics: negative totals are none, and a mean answer under one
    token or past a million is no shape."""
    clock = Clock()
    cap = Daemon(clock).cap
    negative = fixture_text("vllm").replace(
        'vllm:request_prompt_tokens_sum{engine="0",model_name="m"} 426.0',
        'vllm:request_prompt_tokens_sum{engine="0",model_name="m"} -426.0',
    )
    assert parse_metrics(negative).lengths is None
    for prompt, output in ((80, 0), (2_000_000, 31)):
        cap._keep(parse_metrics(_vllm(0, 0, 0)), clock.now)
        clock.now += 5.0
        cap._keep(parse_metrics(_vllm(40, prompt, output)), clock.now)
        assert cap.traffic().basis is Drain.PROBE_SHAPE


def test_the_operators_word_comes_before_the_engines() -> None:
    clock = Clock()
    cap = Daemon(clock, traffic={"prompt_tokens": 20, "output_tokens": 120}).cap
    cap._keep(parse_metrics(_vllm(0, 0, 0)), clock.now)
    clock.now += 5.0
    cap._keep(parse_metrics(_vllm(40, 80, 31)), clock.now)
    assert cap.traffic() == Traffic(Shape(20, 120), Drain.TRAFFIC)
    probes = Daemon(clock, traffic="probes").cap
    assert probes.traffic() == Traffic(Shape(40, 16), Drain.TRAFFIC_PROBES)


# -- one line at start ------------------------------------------------------------------------


def _watch_logs(monkeypatch: pytest.MonkeyPatch, **kw: Any) -> list[dict[str, Any]]:
    """What `watch` logs for a target without `metrics_url` (it returns at once)."""

    async def watch() -> None:
        async with aiohttp.ClientSession() as session:
            await Daemon(Clock(), **kw).cap.watch(session)

    with capture_logs() as logs:
        # A logger of this capture's own: the module's may be cached from an earlier test.
        monkeypatch.setattr(target_module, "log", structlog.get_logger("prober.capacity"))
        asyncio.run(watch())
    return logs


def test_a_withheld_depth_is_said_once_at_start_with_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    [line] = _watch_logs(monkeypatch)
    assert (line["event"], line["log_level"], line["target"]) == (
        "queue_depth_withheld",
        "warning",
        "t",
    )
    for remedy in ("traffic: {prompt_tokens", "traffic: probes", "metrics_url"):
        assert remedy in line["fix"]
    assert _watch_logs(monkeypatch, traffic="probes") == []
    assert _watch_logs(monkeypatch, traffic={"prompt_tokens": 20, "output_tokens": 120}) == []


def test_an_engine_without_token_counters_is_said_once_at_its_first_scrape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """llama-server reports its queue but counts no requests: its own waiting count is the
    figure, and the estimate's depth is withheld."""
    cap = Daemon(Clock()).cap
    snap: ServerSnapshot = parse_metrics(fixture_text("llamacpp"))
    assert snap.lengths is None
    with capture_logs() as logs:
        monkeypatch.setattr(target_module, "log", structlog.get_logger("prober.capacity"))
        for at in (0.0, 5.0):
            cap._keep(snap, at)
    [line] = logs
    assert line["event"] == "queue_depth_withheld"
    assert "llamacpp" in line["why"]


def test_whether_the_gaps_can_tell_the_batch_is_said_once_then_on_change(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Why a running figure below saturation is made or not, with what the pairs read: one
    line when the pairs first say, then one where that changes, at most once a minute."""
    clock = Clock()
    cap = Daemon(clock).cap
    alone = cap.estimator.probes_alone
    assert alone is not None
    flat = DecodeModel()  # one more sequence adds nothing
    flat.observe(gap(1), full_batch=False)
    for _ in range(_MIN_PAIRS):
        flat.observe_pair(gap(1), gap(1))
    with capture_logs() as logs:
        monkeypatch.setattr(target_module, "log", structlog.get_logger("prober.capacity"))
        cap._note_slowdown()  # no pairs yet: nothing to say
        alone.decode = learned_model()  # forty pairs, each a jump of β = 0.3 α
        cap._note_slowdown()
        cap._note_slowdown()
        alone.decode = flat
        clock.now += 30.0
        cap._note_slowdown()  # changed, but within the minute
        clock.now += 31.0
        cap._note_slowdown()
    readable, unreadable = logs
    assert (readable["event"], readable["target"], readable["pairs"]) == (
        "decode_slowdown_readable", "t", 40,
    )  # fmt: skip
    assert (readable["alpha_ms"], readable["median_jump_ms"]) == (20.0, 6.0)
    assert (unreadable["event"], unreadable["mean_jump_ms"]) == ("decode_slowdown_unreadable", 0.0)
