"""Configuration is bounded in size, values and depth wherever it comes from, and every fault
is one line with its control characters shown escaped."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from prober.config.sources import MAX_DEPTH, MAX_FILE_BYTES, MAX_VALUES, MAX_VARIABLE_CHARS
from prober.settings import ConfigError, load_settings

TARGET = "  - name: a\n    url: http://127.0.0.1:1/v1\n    model: m\n"


def problems(path: Path | None, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_settings(path, env or {})
    assert all("\n" not in p and "\x1b" not in p for p in info.value.problems), info.value
    return info.value.problems


def test_list_indices_from_the_environment_are_ordered_as_numbers() -> None:
    env: dict[str, str] = {}
    for i in range(12):
        env |= {f"LLMPROBER_TARGETS__{i}__NAME": f"t{i}",
                f"LLMPROBER_TARGETS__{i}__URL": f"http://127.0.0.1:{i + 1}/v1",
                f"LLMPROBER_TARGETS__{i}__MODEL": "m"}  # fmt: skip
    names = [t.name for t in load_settings(None, env).targets]
    assert names == [f"t{i}" for i in range(12)]


def test_json_nested_past_the_bound_is_one_line() -> None:
    deep = '{"a":' * 20_000 + "1" + "}" * 20_000
    got = problems(None, {"LLMPROBER_TARGETS__0__HEADERS": deep})
    assert got == [f"targets[0].headers: environment variable LLMPROBER_TARGETS__0__HEADERS "
                   f"holds {len(deep)} characters, over {MAX_VARIABLE_CHARS}"]  # fmt: skip
    deeper = "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1)
    got = problems(None, {"LLMPROBER_TARGETS__0__HEADERS": deeper})
    assert got == ["targets[0].headers: environment variable LLMPROBER_TARGETS__0__HEADERS "
                   f"nests deeper than {MAX_DEPTH} levels"]  # fmt: skip


@pytest.mark.parametrize("name", ["LLMPROBER_TARGETS__0__\x1b[31mX", "LLMPROBER_TARGETS__0__A\nB"])
def test_control_characters_in_a_variable_name_are_shown_escaped(name: str) -> None:
    got = problems(None, {name: "1"})
    assert len(got) == 1
    assert repr(name) in got[0]


def test_a_file_past_the_size_bound_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = tmp_path / "big.yml"
    path.write_text("targets:\n" + TARGET + "# " + "x" * MAX_FILE_BYTES + "\n")
    (got,) = problems(path)
    assert got.startswith(f"config: {path} is {path.stat().st_size} bytes, over the")


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    path = tmp_path / "fifo.yml"
    os.mkfifo(path)
    seen: list[list[str]] = []
    worker = threading.Thread(target=lambda: seen.append(problems(path)), daemon=True)
    worker.start()
    worker.join(10)
    assert seen == [[f"config: {path} is not a regular file"]]


def test_aliases_that_expand_past_the_bound_are_refused(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1},"
              f" *a{i - 1}, *a{i - 1}, *a{i - 1}, *a{i - 1}]" for i in range(1, 9)]  # fmt: skip
    path = tmp_path / "laughs.yml"
    path.write_text("\n".join(lines) + "\n")
    assert problems(path) == [f"config: {path} holds more than {MAX_VALUES} values"]


def test_nesting_past_the_bound_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "deep.yml"
    path.write_text("targets: " + "[" * 100 + "]" * 100 + "\n")
    assert problems(path) == [f"config: {path} nests deeper than {MAX_DEPTH} levels"]
