"""One target's capacity signals with plain numbers and a fake clock (no server, no scrape).

`TargetCapacity` places companions (with every probe while the slowdown is learned, then with
`pair_share` of them), takes the server's completion rate from its scrapes, and its estimate
picks a basis: the prober's own load, the probes, or the server's drain rate.
"""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from prober.capacity.decode import _MIN_PAIRS, _MIN_SLOT_PAIRS
from prober.capacity.own import OwnLoad, _companion_stretches
from prober.capacity.server import Engine, ServerSnapshot
from prober.capacity.target import CapacityCollector, TargetCapacity, saturation
from prober.kinds import Basis
from prober.metrics import Metrics
from prober.record import Mode, Recorder, ScrapeRecorder
from prober.result import Outcome, RequestResult
from prober.settings import TargetConfig
from prober.targets import Target
from tests.support.clock import Clock

S = 1_000_000_000


def capacity(
    clock: Clock, own_load: OwnLoad | None = None, metrics: Metrics | None = None, **kw: Any
) -> TargetCapacity:
    cfg = TargetConfig(name="t", url="http://127.0.0.1:1/v1", model="m", **kw)
    scrapes = ScrapeRecorder(metrics or Metrics(CollectorRegistry()))
    return TargetCapacity(Target.from_config(cfg), scrapes, own_load, clock=clock)


def probe(
    send: float, first: float, gaps: list[float], *, end: float | None = None
) -> RequestResult:
    """A result sent at `send` s with its first token at `first` s and the given token gaps."""
    stamps = [int(first * S)]
    for g in gaps:
        stamps.append(stamps[-1] + int(g * S))
    return RequestResult(
        Outcome.OK, int(send * S), int(send * S), stamps[-1] if end is None else int(end * S),
        t_first_token_ns=stamps[0], t_first_content_ns=stamps[0], t_last_token_ns=stamps[-1],
        token_event_ns=tuple(stamps), prompt_tokens=40, output_tokens=len(stamps),
        server_prefill_seconds=0.05,
    )  # fmt: skip


# -- companions ------------------------------------------------------------------------------


def test_no_companion_before_a_probe_has_decoded() -> None:
    cap = capacity(Clock(), slots=4)
    assert cap.companion_delay(0.4, 0.0) is None
    cap.observe(probe(0.0, 0.05, [0.02] * 10))  # load: not a probe, it teaches no decode
    assert cap.companion_delay(0.4, 0.0) is None


def test_companions_go_with_every_probe_while_learning_then_with_pair_share() -> None:
    cap = capacity(Clock(), slots=4, pair_share=0.25)
    cap.observe(probe(0.0, 0.05, [0.02] * 10), probe=True)  # decodes 0.2 s
    for draw in (0.0, 0.5, 0.99):  # learning: whatever the draw
        assert cap.companion_delay(0.4, draw) == pytest.approx(0.08)
    foreign = cap.estimator.probes_alone
    assert foreign is not None
    for _ in range(_MIN_PAIRS):  # these tell the slowdown where the slots are hinted
        foreign.decode.observe_pair(0.020, 0.026)
    assert not foreign.learning
    assert cap.companion_delay(0.4, 0.2) == pytest.approx(0.08)
    assert cap.companion_delay(0.4, 0.25) is None
    assert cap.companion_delay(0.4, 0.9) is None


def test_without_a_slots_hint_learning_lasts_until_the_slots_are_learned() -> None:
    cap = capacity(Clock(), pair_share=0.0)
    cap.observe(probe(0.0, 0.05, [0.02] * 10), probe=True)
    foreign = cap.estimator.probes_alone
    assert foreign is not None
    for _ in range(_MIN_PAIRS):
        foreign.decode.observe_pair(0.020, 0.026)
    assert cap.companion_delay(0.4, 0.99) is not None  # so few pairs do not give the slots
    for _ in range(_MIN_SLOT_PAIRS - _MIN_PAIRS):
        foreign.decode.observe_pair(0.020, 0.026)
    assert cap.companion_delay(0.4, 0.99) is not None  # no probe at full batch yet
    for _ in range(3):
        foreign.decode.observe(0.038, full_batch=True)
    assert foreign.slots == 4  # 1 + (38 − 20) / 6
    assert cap.companion_delay(0.4, 0.99) is None


def test_a_probe_records_its_queue_wait() -> None:
    metrics = Metrics(CollectorRegistry())
    cap = capacity(Clock(), metrics=metrics, slots=4)
    recorder = Recorder(metrics, {"t": cap})
    # 0.55 s to first, 0.05 prefill
    recorder.record(cap.target, probe(0.0, 0.55, [0.02] * 10), Mode.PROBE)
    sample = metrics.registry.get_sample_value(
        "llmprober_queue_wait_seconds_sum", {"target": "t", "model": "m"}
    )
    assert sample == pytest.approx(0.5)


# -- the pair's decode stretches -------------------------------------------------------------


def test_the_companion_decodes_beside_the_probe_until_its_last_token_not_its_stream_end() -> None:
    """The first probe's slot is free at its last token; a usage chunk and [DONE] that come
    0.5 s later must not count the companion's later tokens as decoded beside it."""
    primary = probe(0.0, 0.1, [0.02] * 20, end=1.0)  # last token at 0.5 s
    companion = probe(0.2, 0.3, [0.03] * 6 + [0.02] * 20)  # 0.03 beside, 0.02 alone
    stretches = dict((own, gap) for gap, own in _companion_stretches(primary, companion))
    assert stretches[1] == pytest.approx(0.03, rel=0.01)
    assert stretches[0] == pytest.approx(0.02, rel=0.01)


# -- the server's figures and the choice of basis --------------------------------------------


def snapshot(completed: float, waiting: float = 0.0, running: float = 2.0) -> ServerSnapshot:
    return ServerSnapshot(Engine.vllm, waiting, running, None, completed)


def test_the_server_drain_rate_comes_from_the_completion_counter_over_half_a_minute() -> None:
    clock = Clock()
    cap = capacity(clock)
    assert cap.server_drain_rate() is None
    cap._keep(snapshot(100.0), 1000.0)
    assert cap.server_drain_rate() is None  # one scrape gives no rate
    cap._keep(snapshot(120.0), 1010.0)
    assert cap.server_drain_rate() == pytest.approx(2.0)
    cap._keep(snapshot(200.0), 1040.0)  # the first scrape is past the window now
    assert cap.server_drain_rate() == pytest.approx(80.0 / 30.0)
    cap._keep(snapshot(5.0), 1045.0)  # a restart reset the counter: no rate
    assert cap.server_drain_rate() is None


def test_the_server_shows_its_slots_only_while_requests_wait() -> None:
    cap = capacity(Clock())
    cap._keep(snapshot(0.0, waiting=0.0, running=3.0), 1000.0)
    assert cap.server_slots() is None  # three running, none waiting: slots unknown
    cap._keep(snapshot(0.0, waiting=2.0, running=6.0), 1001.0)
    cap._keep(snapshot(0.0, waiting=1.0, running=5.0), 1002.0)
    assert cap.server_slots() == 6


def test_without_probes_the_estimate_falls_back_on_the_server_drain_rate() -> None:
    clock = Clock()
    cap = capacity(clock)
    assert cap.estimator.estimate().basis is Basis.NONE
    cap._keep(snapshot(0.0), clock.now - 10.0)
    cap._keep(snapshot(20.0), clock.now)  # 2 requests/s
    cap.observe(probe(0.0, 1.05, [0.1] * 10))  # load: waited 1.0 s, decoded 1.0 s
    est = cap.estimator.estimate()
    assert est.basis is Basis.SERVER
    assert est.waiting == pytest.approx(2.0)  # L_q = μ · W_q
    assert est.running == pytest.approx(2.0)


def test_the_prober_s_own_load_is_the_basis_once_the_slots_are_known() -> None:
    clock = Clock()
    own = OwnLoad()
    cap = capacity(clock, own, slots=2)
    assert cap.own_load is own  # the same object the load driver counts in
    cap._keep(snapshot(0.0), clock.now - 10.0)
    cap._keep(snapshot(20.0), clock.now)
    for _ in range(5):
        own.sent()
    own.first_token()
    own.first_token()
    est = cap.estimator.estimate()
    assert est.basis is Basis.OWN_LOAD
    assert (est.waiting, est.running, est.slots) == (3.0, 2.0, 2)


# -- saturation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("waiting", "running", "slots", "expected"),
    [
        (0.0, 2.0, 4, 0.5),  # below the knee: busy slots / slots
        (None, 4.0, 4, 1.0),
        (2.0, 4.0, 4, 1.5),  # above it: 1 + waiting / slots
        (1.0, 3.0, 4, 1.0),  # a request waiting for the next step below the knee
        (0.0, 9.0, 4, 1.0),  # a server that shows more running than slots: capped
        (0.0, 2.0, None, None),
        (0.0, 2.0, 0, None),
        (0.0, None, 4, None),
    ],
)
def test_saturation_is_continuous_at_the_knee(
    waiting: float | None, running: float | None, slots: int | None, expected: float | None
) -> None:
    assert saturation(waiting, running, slots) == (
        expected if expected is None else pytest.approx(expected)
    )


def test_server_saturation_uses_the_slots_the_server_showed_without_hint_or_estimate() -> None:
    cap = capacity(Clock())
    cap._keep(snapshot(0.0, waiting=2.0, running=4.0), 1000.0)  # 4 slots, seen full
    cap._keep(snapshot(0.0, waiting=0.0, running=2.0), 1001.0)
    registry = CollectorRegistry()
    registry.register(CapacityCollector([cap]))
    text = generate_latest(registry).decode()
    assert 'llmprober_saturation{model="m",source="server",target="t"} 0.5' in text
    assert 'llmprober_saturation{model="m",source="estimate"' not in text  # no estimate yet
