"""Configuration faults that say what was meant (issue 34, item 5): an unknown key names the
known key it is closest to, and a plain value where a section goes shows a mapping of that
section, in the file and the environment alike, one line each."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from prober import settings as s
from prober.section import unwrap
from prober.settings import ConfigError, load_settings
from prober.validation import mapping_example, unknown_key

TARGET = {"name": "a", "url": "http://127.0.0.1:1/v1", "model": "m"}

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/unit/conftest.py


def problems(tmp_path: Path, doc: dict[str, Any], env: dict[str, str] | None = None) -> list[str]:
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as info:
        load_settings(path, env or {})
    return info.value.problems


def _sections() -> list[tuple[str, type[BaseModel]]]:
    """(YAML path, section) of every field that holds one section, walked from `Settings`."""
    found: list[tuple[str, type[BaseModel]]] = []
    for root, model in (("", s.Settings), ("targets[0].", s.TargetConfig)):
        for name, info in model.model_fields.items():
            kind = unwrap(info.annotation)
            if isinstance(kind, type) and issubclass(kind, BaseModel):
                found.append((root + name, kind))
    return found


SECTIONS = _sections()


def test_every_section_is_found() -> None:
    paths = {path for path, _ in SECTIONS}
    assert {"server", "logging", "shard", "targets[0].slo", "targets[0].tls",
            "targets[0].timeouts", "targets[0].load"} <= paths  # fmt: skip


def _with(path: str, value: object) -> dict[str, Any]:
    if path.startswith("targets[0]."):
        return {"targets": [{**TARGET, path.removeprefix("targets[0]."): value}]}
    return {path: value, "targets": [TARGET]}


@pytest.mark.parametrize(("path", "section"), SECTIONS, ids=[p for p, _ in SECTIONS])
def test_a_plain_value_where_a_section_goes_shows_one(
    tmp_path: Path, path: str, section: type[BaseModel]
) -> None:
    assert problems(tmp_path, _with(path, 2.0)) == [
        f"{path}: must be a mapping such as {mapping_example(section)}, got 2.0"
    ]


@pytest.mark.parametrize(
    ("path", "value", "problem"),
    [
        ("targets[0].slo", 2.0, "must be a mapping such as {ttft_seconds: 2.0}, got 2.0"),
        ("targets[0].tls", [1], "must be a mapping such as {verify: true}, got [1]"),
        ("targets[0].load", "2", "must be a mapping such as {rate: ...}, got '2'"),
        ("server", "0.0.0.0:9470",
         "must be a mapping such as {listen: '0.0.0.0:9470'}, got '0.0.0.0:9470'"),
    ],
)  # fmt: skip
def test_the_example_is_the_sections_first_key(
    tmp_path: Path, path: str, value: object, problem: str
) -> None:
    assert problems(tmp_path, _with(path, value)) == [f"{path}: {problem}"]


def test_the_environment_says_the_same(tmp_path: Path) -> None:
    env = {"LLMPROBER_TARGETS__0__SLO": "2.0"}
    assert problems(tmp_path, {"targets": [TARGET]}, env) == [
        "targets[0].slo: must be a mapping such as {ttft_seconds: 2.0}, got 2.0"
    ]


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"targets": [TARGET], "srever": {}}, "srever: unknown key, did you mean server?"),
        ({"targets": [{**TARGET, "modle": "m"}]},
         "targets[0].modle: unknown key, did you mean model?"),
        ({"targets": [{**TARGET, "api_key_headr": "api-key"}]},
         "targets[0].api_key_headr: unknown key, did you mean api_key_header?"),
        ({"targets": [{**TARGET, "slo": {"ttft": 1}}]},
         "targets[0].slo.ttft: unknown key, did you mean ttft_seconds?"),
        ({"targets": [{**TARGET, "load": {"rate": 1, "max_inflight": 4}}]},
         "targets[0].load.max_inflight: unknown key, did you mean max_in_flight?"),
        ({"targets": [TARGET], "logging": {"levl": "debug"}},
         "logging.levl: unknown key, did you mean level?"),
        ({"targets": [{**TARGET, "colour": "blue"}]}, "targets[0].colour: unknown key"),
    ],
)  # fmt: skip
def test_an_unknown_key_names_the_one_meant(
    tmp_path: Path, doc: dict[str, Any], problem: str
) -> None:
    assert problems(tmp_path, doc) == [problem]


def test_an_unknown_variable_names_the_key_meant(tmp_path: Path) -> None:
    env = {"LLMPROBER_TARGETS__0__SLO__TTFT_SECOND": "1"}
    assert problems(tmp_path, {"targets": [TARGET]}, env) == [
        "targets[0].slo.ttft_second: unknown key, did you mean ttft_seconds? "
        "(environment variable LLMPROBER_TARGETS__0__SLO__TTFT_SECOND)"
    ]


def test_the_wording_helpers() -> None:
    assert unknown_key("modle", ["name", "model", "url"]) == "unknown key, did you mean model?"
    assert unknown_key("zzz", ["name", "model"]) == "unknown key"
    assert unknown_key("x", []) == "unknown key"
    assert mapping_example(s.SloConfig) == "{ttft_seconds: 2.0}"
    assert mapping_example(s.TlsConfig) == "{verify: true}"
    assert mapping_example(s.LoadConfig) == "{rate: ...}"
    assert unknown_key("tt", ["ttft_seconds"]) == "unknown key"  # too short to mean one
    assert unknown_key("interval", ["interval_seconds", "jitter_seconds"]) == (
        "unknown key, did you mean interval_seconds?"
    )
