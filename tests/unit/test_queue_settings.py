"""The queue estimate's per-target options: a wrong value is one line naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from prober.settings import ConfigError, TrafficConfig, load_settings

GE1 = "must be at least 1"
SHAPE = "'probes' or a mapping {prompt_tokens: N, output_tokens: N}"
BASE = "targets:\n  - {name: a, url: 'http://127.0.0.1:1/v1', model: m, %s}\n"


@pytest.mark.parametrize(
    ("option", "problem"),
    [
        ("slots: 0", f"targets[0].slots: {GE1}, got 0"),
        ("slots: -4", f"targets[0].slots: {GE1}, got -4"),
        ("slots: 2.5", "targets[0].slots: must be an integer, got 2.5"),
        ("slots: 4.0", "targets[0].slots: must be an integer, got 4.0"),
        ("slots: true", "targets[0].slots: must be an integer, got True"),
        ("slots: four", "targets[0].slots: must be an integer, got 'four'"),
        ("pair_share: 1.5", "targets[0].pair_share: must be at most 1, got 1.5"),
        ("probes_in_flight: 0", f"targets[0].probes_in_flight: {GE1}, got 0"),
        ("traffic: {prompt_tokens: 20, output_tokens: 0}",
         f"targets[0].traffic.output_tokens: {GE1}, got 0"),
        ("traffic: {prompt_tokens: 20, output_tokens: 120, shape: 3}",
         "targets[0].traffic.shape: unknown key"),
        # Both lengths or none: the other would be the probes', which nobody said.
        ("traffic: {prompt_tokens: 20}", "targets[0].traffic.output_tokens: required"),
        ("traffic: probe", f"targets[0].traffic: must be {SHAPE}, got 'probe'"),
        ("traffic: 120", f"targets[0].traffic: must be {SHAPE}, got 120"),
        ("traffic: [20, 120]", f"targets[0].traffic: must be {SHAPE}, got [20, 120]"),
    ],
)  # fmt: skip
def test_bad_queue_options_are_one_line_naming_the_field(
    tmp_path: Path, option: str, problem: str
) -> None:
    path = tmp_path / "config.yml"
    path.write_text(BASE % option)
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert err.value.problems == [problem]


def test_the_slots_hint_and_traffic_shape_are_read(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text(BASE % "slots: 32, traffic: {prompt_tokens: 512, output_tokens: 128}")
    [target] = load_settings(path).targets
    assert target.slots == 32
    assert (target.traffic.prompt_tokens, target.traffic.output_tokens) == (512, 128)
    assert target.pair_share == 0.5
    assert target.probes_in_flight == 1


def test_the_traffic_is_unstated_by_default_and_may_be_said_to_look_like_the_probes(
    tmp_path: Path,
) -> None:
    path = tmp_path / "config.yml"
    path.write_text(BASE % "slots: 4")
    assert load_settings(path).targets[0].traffic is None
    path.write_text(BASE % "traffic: probes")
    assert load_settings(path).targets[0].traffic == "probes"


def test_the_traffic_shape_comes_from_the_environment_too(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text(BASE % "slots: 4")
    env = "LLMPROBER_TARGETS__0__TRAFFIC"
    lengths = {f"{env}__PROMPT_TOKENS": "512", f"{env}__OUTPUT_TOKENS": "128"}
    assert load_settings(path, lengths).targets[0].traffic == TrafficConfig(
        prompt_tokens=512, output_tokens=128
    )
    assert load_settings(path, {env: "probes"}).targets[0].traffic == "probes"
    with pytest.raises(ConfigError) as err:
        load_settings(path, {**lengths, f"{env}__OUTPUT_TOKENS": "12.5"})
    wrong = "targets[0].traffic.output_tokens: must be an integer, got '12.5'"
    assert err.value.problems == [wrong]
