"""A target's `series:` turns its ITL and phase histograms off (docs/performance.md, "Fleet
scale"): nothing of them is recorded, the rest is, and a reload that turns one off removes
the series it had."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from prober.metrics import Metrics
from prober.record import Mode, Recorder
from prober.result import Outcome, RequestResult
from prober.settings import TargetConfig
from prober.targets import Target

MS = 1_000_000


def target(name: str, **series: bool) -> Target:
    config: dict[str, Any] = {"name": name, "url": "http://127.0.0.1:1/v1", "model": "m"}
    return Target.from_config(TargetConfig.model_validate({**config, "series": series}))


def streamed() -> RequestResult:
    """A probe on a fresh connection with four tokens: three gaps and every phase."""
    return RequestResult(
        Outcome.OK, 0, 3 * MS, 60 * MS, request_id="r", t_begin_ns=MS, t_resolved_ns=2 * MS,
        t_connected_ns=3 * MS, reused=False, t_first_byte_ns=20 * MS, t_first_token_ns=30 * MS,
        t_last_token_ns=60 * MS, token_event_ns=(30 * MS, 40 * MS, 50 * MS, 60 * MS),
        output_tokens=4,
    )  # fmt: skip


def families(registry: CollectorRegistry, name: str) -> dict[str, int]:
    """Samples of target `name`, by family."""
    counts: dict[str, int] = {}
    for family in registry.collect():
        found = sum(s.labels.get("target") == name for s in family.samples)
        if found:
            counts[family.name] = found
    return counts


def test_series_off_records_no_itl_and_no_phases_and_the_rest() -> None:
    registry = CollectorRegistry()
    recorder = Recorder(Metrics(registry))
    full, lean = target("full"), target("lean", itl=False, phases=False)
    for each in (full, lean):
        recorder.describe(each)
        recorder.record(each, streamed(), Mode.PROBE)
        recorder.record(each, streamed(), Mode.LOAD)
    kept, cut = families(registry, "full"), families(registry, "lean")
    assert kept["llmprober_itl_seconds"] > 0
    assert kept["llmprober_probe_phase_seconds"] > 0
    assert "llmprober_itl_seconds" not in cut
    assert "llmprober_probe_phase_seconds" not in cut
    assert {k: v for k, v in kept.items() if k in cut} == cut  # the rest as the full one's
    assert (
        registry.get_sample_value(
            "llmprober_ttft_seconds_count", {"target": "lean", "model": "m", "mode": "probe"}
        )
        == 1
    )


def test_a_reload_that_turns_itl_off_removes_its_series() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    recorder = Recorder(metrics)
    before = target("t")
    recorder.describe(before)
    recorder.record(before, streamed(), Mode.PROBE)
    assert "llmprober_itl_seconds" in families(registry, "t")
    before.update(target("t", itl=False).spec)  # what the fleet does for a DESCRIBE change
    recorder.describe(before)
    after = families(registry, "t")
    assert "llmprober_itl_seconds" not in after
    assert after["llmprober_probe_phase_seconds"] > 0
