"""The fleet (prober/fleet/): the reset table, `Metrics.forget`, and `Fleet.apply` keeping or
restarting each target's state as the table says. No server: targets point at a closed port
and probe once an hour, so only what `apply` builds and keeps is looked at."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from prober.fleet.changes import RESETS, Effect, effects
from prober.fleet.fleet import Fleet
from prober.metric_specs import SPECS
from prober.metrics import Labels, Metrics
from prober.record import Mode, Recorder, ScrapeRecorder
from prober.result import Outcome, RequestResult
from prober.settings import TargetConfig
from prober.targets import Target
from prober.timings import Slo

BASE: dict[str, Any] = {
    "name": "a", "url": "http://127.0.0.1:1/v1", "model": "m", "interval_seconds": 3600,
    "jitter_seconds": 0, "warmup": 0, "metrics_url": "http://127.0.0.1:1/metrics",
    "load": {"rate": 0.001},
}  # fmt: skip

# One change of each row of the table, and the effect it must have.
ROWS: list[tuple[dict[str, Any], Effect]] = [
    ({"url": "http://127.0.0.1:2/v1"}, Effect.ENDPOINT),
    ({"model": "other"}, Effect.ENDPOINT),
    ({"api": "completions"}, Effect.ENDPOINT),
    ({"headers": {"X-Team": "a"}}, Effect.ENDPOINT),
    ({"tls": {"verify": False}}, Effect.ENDPOINT),
    ({"connection": "fresh"}, Effect.ENDPOINT),
    ({"cache_bust": False}, Effect.ENDPOINT),
    ({"prompt_tokens": 65}, Effect.ESTIMATE),
    ({"max_tokens": 17}, Effect.ESTIMATE),
    ({"slots": 4}, Effect.ESTIMATE),
    ({"traffic": "probes"}, Effect.ESTIMATE),
    ({"extra_body": {"temperature": 0}}, Effect.ESTIMATE),
    ({"load": None}, Effect.ESTIMATE),
    ({"load": {"rate": 0.002}}, Effect.LOAD),
    ({"metrics_url": None}, Effect.WATCH),
    ({"metrics_interval_seconds": 7}, Effect.WATCH),
    ({"interval_seconds": 1800}, Effect.SCHEDULE),
    ({"probes_in_flight": 2}, Effect.SCHEDULE),
    ({"slo": {"ttft_seconds": 1.0}}, Effect.DESCRIBE),
    ({"series": {"itl": False}}, Effect.DESCRIBE),
    ({"timeouts": {"connect_seconds": 1.0}}, Effect.SPEC),
    ({"pair_share": 0.1}, Effect.SPEC),
    ({"warmup": 2}, Effect.SPEC),
]


def config(**change: Any) -> TargetConfig:
    return TargetConfig.model_validate({**BASE, **change})


def test_the_table_names_every_target_key() -> None:
    assert set(TargetConfig.model_fields) - set(RESETS) == set()


@pytest.mark.parametrize(("change", "effect"), ROWS)
def test_each_change_has_its_rows_effect(change: dict[str, Any], effect: Effect) -> None:
    assert effects(config(), config(**change)) == {effect}


def test_equal_settings_have_no_effect() -> None:
    assert effects(config(), config()) == set()


def _result(request_id: str = "r") -> RequestResult:
    return RequestResult(Outcome.OK, 0, 1, 2, request_id=request_id)


def _series_of(registry: CollectorRegistry, target: str) -> list[str]:
    return [
        sample.name
        for family in registry.collect()
        for sample in family.samples
        if sample.labels.get("target") == target
    ]


def test_forget_removes_every_series_of_a_target_and_no_other() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    recorder = Recorder(metrics)
    targets = [Target.from_config(config(name=n, slo={"e2e_seconds": 9})) for n in "ab"]
    for target in targets:  # every writer of a per-target series
        recorder.describe(target)
        recorder.record(target, _result(), Mode.PROBE)
        recorder.record(target, _result(), Mode.LOAD)
        recorder.skipped(target)
        recorder.load_started(target, 1.0)
        recorder.load_in_flight(target, 1)
        recorder.load_dropped(target, "in_flight")
        ScrapeRecorder(metrics).scrape_failed(target)
    per_target = {s.name for s in SPECS if "target" in s.labels}
    assert all(s.labels[0] == "target" for s in SPECS if "target" in s.labels)
    before = _series_of(registry, "a")
    assert metrics.forget("a") > 0
    assert _series_of(registry, "a") == []
    assert sorted(_series_of(registry, "b")) == sorted(before)
    assert metrics.targets() == {"b"}
    # What the recorder wrote covers the table's per-target metrics that are not scrape-time.
    written = {
        name.removesuffix(suffix) for name in before for suffix in ("_bucket", "_sum", "_count", "")
    }
    assert len(per_target & written) >= 15
    recorder.record(targets[0], _result(), Mode.PROBE)  # a new record starts again at 1
    sample = registry.get_sample_value(
        "llmprober_requests_total", {"target": "a", "model": "m", "mode": "probe", "outcome": "ok"}
    )
    assert sample == 1.0


def test_an_slo_unset_again_leaves_no_line() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    labels = Labels("a", "m")
    metrics.describe_target(labels, Slo(2.0, 0.2, 5.0, None), 15)
    assert registry.get_sample_value("llmprober_slo_e2e_seconds", {"target": "a", "model": "m"})
    metrics.describe_target(labels, Slo(2.0, 0.2, None, None), 15)
    assert (
        registry.get_sample_value("llmprober_slo_e2e_seconds", {"target": "a", "model": "m"})
        is None
    )


@pytest.fixture
async def fleet() -> AsyncIterator[Fleet]:
    fleet = Fleet(Metrics(CollectorRegistry()), grace_seconds=0.2)
    fleet.scheduler.start()
    try:
        yield fleet
    finally:
        await fleet.drain(0.2)
        await fleet.close()


def _state(fleet: Fleet, name: str = "a") -> dict[str, Any]:
    member = fleet.members[name]
    job = fleet.scheduler._scheduler.get_job(name)  # the trigger and cap in use
    return {
        "target": member.target,
        "session": member.session,
        "capacity": member.capacity,
        "load": member.load,
        "watcher": member.watcher,
        "job": None if job is None else (str(job.trigger), job.max_instances),
    }


# What each effect replaces; the rest of the state must be the very same objects.
REPLACED = {
    Effect.ENDPOINT: {"target", "session", "capacity", "load", "watcher"},
    Effect.ESTIMATE: {"capacity", "load", "watcher"},
    Effect.LOAD: {"load"},
    Effect.WATCH: {"watcher"},
    Effect.SCHEDULE: {"job"},
    Effect.DESCRIBE: set(),
    Effect.SPEC: set(),
}


@pytest.mark.parametrize(("change", "effect"), ROWS)
async def test_apply_restarts_what_the_table_says(
    fleet: Fleet, change: dict[str, Any], effect: Effect
) -> None:
    other = config(name="b")
    await fleet.apply({"a": config(), "b": other})
    before, untouched = _state(fleet), _state(fleet, "b")
    applied = await fleet.apply({"a": config(**change), "b": other})
    assert applied.changed == {"a": frozenset({effect})}
    after = _state(fleet)
    for key, was in before.items():
        now = after[key]
        if key in REPLACED[effect] and was is not None:
            assert now is not was, key
            assert now != was, key
        elif key not in REPLACED[effect]:
            assert now is was or now == was, key
    assert _state(fleet, "b") == untouched  # the unchanged target: the same objects
    assert fleet.members["a"].target.config.model_dump() == config(**change).model_dump()


async def test_removed_target_leaves_and_its_session_closes(fleet: Fleet) -> None:
    await fleet.apply({"a": config(), "b": config(name="b")})
    fleet.recorder.describe(fleet.members["b"].target)
    session = fleet.members["b"].session
    applied = await fleet.apply({"a": config()})
    assert applied.removed == ("b",)
    assert set(fleet.members) == set(fleet.sessions) == set(fleet.capacity) == {"a"}
    await fleet.drain(0.2)  # waits for the retirement
    assert session.closed
    assert "b" not in fleet.metrics.targets()


async def test_a_shard_change_moves_only_the_targets_it_must(fleet: Fleet) -> None:
    names = [f"t{i}" for i in range(12)]
    wanted = {n: config(name=n, load=None) for n in names}
    await fleet.apply(wanted, (0, 1))
    kept = {n: fleet.members[n] for n in names}
    await fleet.apply(wanted, (0, 2))
    probed = {n for n, m in fleet.members.items() if m.probed}
    assert probed == {n for n in names if fleet.members[n].probed}
    assert 0 < len(probed) < len(names)
    for n in names:  # still probed here: untouched; moved away: restarted, unprobed
        assert (fleet.members[n] is kept[n]) == (n in probed)
    assert set(fleet.probed) == probed


async def test_targets_starting_on_one_load_seed_are_said_once(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """Three or more targets whose load starts together on one seed send at the same instants:
    one warning per such seed. Two on a seed (an A/B), targets without one, and a target that
    joins later (its instants count from its own start) are not said."""

    def seeded(name: str, seed: int | None) -> TargetConfig:
        return config(name=name, load={"rate": 0.001, "seed": seed})

    wanted = {n: seeded(n, 1) for n in "abc"} | {n: seeded(n, 2) for n in "de"}
    wanted |= {n: seeded(n, None) for n in "fgh"}
    await fleet.apply(wanted)
    said = [r.msg for r in caplog.records if isinstance(r.msg, dict)]
    lockstep = [m for m in said if m.get("event") == "load_lockstep"]
    assert [(m["seed"], m["targets"]) for m in lockstep] == [(1, 3)]
    caplog.clear()
    await fleet.apply(wanted | {"i": seeded("i", 1)})
    assert not [r for r in caplog.records if isinstance(r.msg, dict)
                and r.msg.get("event") == "load_lockstep"]  # fmt: skip
