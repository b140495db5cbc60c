"""Configuration from the environment (issue 13): one field of one target by its index, and a
`LLMPROBER_*` variable that matches no setting is an error naming it (exit 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from prober.settings import ConfigError, load_settings

FILE = "targets:\n  - name: a\n    url: http://127.0.0.1:1/v1\n    model: m\n"


def config(tmp_path: Path, text: str = FILE) -> Path:
    path = tmp_path / "config.yml"
    path.write_text(text)
    return path


def problems(path: Path | None, env: dict[str, str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(path, env)
    return info.value.problems


def test_one_field_of_one_target_by_index(tmp_path: Path) -> None:
    s = load_settings(config(tmp_path), {"LLMPROBER_TARGETS__0__MODEL": "x"})
    assert s.targets[0].model == "x"
    assert s.targets[0].url == "http://127.0.0.1:1/v1"  # the rest from the file


def test_nested_field_of_a_target_and_a_number(tmp_path: Path) -> None:
    env = {"LLMPROBER_TARGETS__0__SLO__TTFO_SECONDS": "1.5", "LLMPROBER_TARGETS__0__SLOTS": "4"}
    target = load_settings(config(tmp_path), env).targets[0]
    assert target.slo.ttfo_seconds == 1.5
    assert target.slots == 4
    assert target.slo.ttft_seconds == 2.0  # the section's other fields keep their defaults


def test_one_past_the_end_adds_a_target(tmp_path: Path) -> None:
    env = {
        "LLMPROBER_TARGETS__1__NAME": "b",
        "LLMPROBER_TARGETS__1__URL": "http://127.0.0.1:2/v1",
        "LLMPROBER_TARGETS__1__MODEL": "n",
    }
    assert [t.name for t in load_settings(config(tmp_path), env).targets] == ["a", "b"]


def test_an_index_that_leaves_a_gap_is_an_error(tmp_path: Path) -> None:
    got = problems(config(tmp_path), {"LLMPROBER_TARGETS__3__MODEL": "x"})
    assert got == ["targets[3].model: index 3 leaves a gap: there are 1 items"]


def test_environment_alone_builds_a_target() -> None:
    env = {
        "LLMPROBER_TARGETS__0__NAME": "e",
        "LLMPROBER_TARGETS__0__URL": "http://127.0.0.1:1/v1",
        "LLMPROBER_TARGETS__0__MODEL": "m",
        "LLMPROBER_TARGETS__0__HEADERS": '{"X-Team": "search"}',
    }
    target = load_settings(None, env).targets[0]
    assert (target.name, target.headers) == ("e", {"X-Team": "search"})


@pytest.mark.parametrize(
    ("name", "problem"),
    [
        ("LLMPROBER_SERVR__LISTEN", "servr: unknown key, did you mean server?"),
        ("LLMPROBER_SERVER__LISTN", "server.listn: unknown key, did you mean listen?"),
        ("LLMPROBER_TARGETS__0__MODL", "targets[0].modl: unknown key, did you mean model?"),
        ("LLMPROBER_TARGETS__X__MODEL", "targets.x: unknown key"),
        ("LLMPROBER_SERVER__LISTEN__PORT", "server.listen.port: unknown key"),
        ("LLMPROBER_SERVER____LISTEN", "server.: unknown key"),
        ("LLMPROBER_NOPE", "nope: unknown key"),
    ],
)
def test_a_variable_matching_no_setting_is_an_error_naming_it(
    tmp_path: Path, name: str, problem: str
) -> None:
    """One line naming the variable, and the key meant where one is close."""
    assert problems(config(tmp_path), {name: "1"}) == [f"{problem} (environment variable {name})"]


def test_the_key_variable_of_a_target_and_the_cache_folder_are_not_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLMPROBER_MY_KEY", "sk-test-123456")  # read from os.environ
    monkeypatch.setenv("LLMPROBER_CACHE", "/tmp/cache")
    text = FILE + "    api_key_env: LLMPROBER_MY_KEY\n"
    assert load_settings(config(tmp_path, text)).targets[0].api_key_env == "LLMPROBER_MY_KEY"


def test_a_section_must_be_json(tmp_path: Path) -> None:
    got = problems(config(tmp_path), {"LLMPROBER_SERVER": "listen=1"})
    assert len(got) == 1
    assert got[0].startswith("server: environment variable LLMPROBER_SERVER is not valid JSON")


def test_a_value_from_the_environment_is_validated_like_the_file(tmp_path: Path) -> None:
    got = problems(config(tmp_path), {"LLMPROBER_TARGETS__0__CONNECTION": "sometimes"})
    assert got == ["targets[0].connection: must be one of 'pooled' or 'fresh', got 'sometimes'"]


def test_check_config_exits_2_naming_the_variable(tmp_path: Path) -> None:
    env = {"LLMPROBER_SERVR__LISTEN": "0.0.0.0:1", "PATH": "/usr/bin:/bin"}
    out = subprocess.run(
        [sys.executable, "-m", "prober.cli", "check-config", str(config(tmp_path))],
        capture_output=True, text=True, env=env, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr == (
        "servr: unknown key, did you mean server? (environment variable LLMPROBER_SERVR__LISTEN)\n"
    )
