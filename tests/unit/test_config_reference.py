"""docs/configuration.md lists every key of the configuration, as the code has it.

The keys are found by walking the models (`Settings` and every section below it, through
lists and unions: `targets`, `target_groups`, `server` and whatever is added), with
scripts/gen_config_reference.py's walk; a field added anywhere without a row fails here.
Each row's type and default must be the code's (the script writes them), and its meaning
must not be empty (a person writes it).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from pydantic import BaseModel, Field

ROOT = Path(__file__).resolve().parents[2]
FIX = "run `.venv/bin/python scripts/gen_config_reference.py`, then write the meanings"


def _generator() -> ModuleType:
    name = "gen_config_reference"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


gen = _generator()


def _cells() -> dict[str, list[str]]:
    """Each row of the generated tables by key: [key, environment, type, default, meaning]."""
    text = gen.DOC.read_text()
    assert gen.BEGIN in text, "the generated region's markers are gone"
    assert gen.END in text, "the generated region's markers are gone"
    found = {}
    for line in gen._region(text).splitlines():
        cells = [c.strip() for c in gen._CELL_SPLIT.split(line.strip())[1:-1]]
        if len(cells) == 5 and cells[0].startswith("`") and cells[0] != "`key`":
            found[cells[0].strip("`")] = cells
    return found


def test_every_key_of_the_code_has_a_row() -> None:
    rows = _cells()
    missing = [row.key for row in gen.rows() if row.key not in rows]
    assert missing == [], f"docs/configuration.md has no row for {missing}: {FIX}"


def test_the_walk_reaches_every_section() -> None:
    keys = {row.key for row in gen.rows()}
    for key in (
        "server.listen",
        "targets[N].slo.ttft_seconds",
        "targets[N].load.schedule.steps[N].rate",
        "targets[N].traffic.output_tokens",  # inside a union with a literal
        "target_groups[N].group",
        "target_groups[N].http_sd.basic_auth.username",
        "shard.count",
    ):
        assert key in keys


def test_each_rows_type_and_default_are_the_codes() -> None:
    rows = _cells()
    wrong = [
        (row.key, rows[row.key][2:4], [row.type, row.default])
        for row in [*gen.rows(), *gen.extra_rows(gen.meanings(gen.DOC.read_text()))]
        if row.key in rows and rows[row.key][1:4] != [f"`{row.env}`", row.type, row.default]
    ]
    assert wrong == [], f"rows that no longer match the code: {wrong}: {FIX}"


def test_every_row_says_what_its_key_is() -> None:
    empty = [key for key, cells in _cells().items() if not cells[4]]
    assert empty == [], f"rows without a meaning: {empty}"


def test_no_row_for_a_key_the_code_lacks() -> None:
    stale = [key for key in _cells() if gen.field_at(key) is None]
    assert stale == [], f"rows for keys that are no field: {stale}"


def test_the_file_is_what_the_script_writes() -> None:
    text = gen.DOC.read_text()
    assert gen.render(text) == text, FIX


class _Inner(BaseModel):
    depth: int = 3


class _Base(BaseModel):
    name: str = "a"
    inner: _Inner = _Inner()


class _Grown(_Base):
    name: str = "{group}"  # a changed default: a row of its own
    extra: list[_Inner] = Field(default_factory=list)


class _Top(BaseModel):
    items: list[_Base] = Field(default_factory=list)
    grown: _Grown | None = None


def test_a_new_field_anywhere_is_walked() -> None:
    """The walk is generic: a nested section, a list of them, a subclass that adds or
    changes keys; a section met again gets one row, not its keys again."""
    keys = [(row.key, row.default) for row in gen.rows(_Top)]
    assert keys == [
        ("items", "`[]`"),
        ("items[N].name", "`a`"),
        ("items[N].inner", "its keys' defaults"),
        ("items[N].inner.depth", "`3`"),
        ("grown", "none"),
        ("grown.name", "`{group}`"),
        ("grown.extra", "`[]`"),
    ]


@pytest.mark.parametrize(
    ("key", "env"),
    [
        ("server.listen", "LLMPROBER_SERVER__LISTEN"),
        ("targets[N].slo.ttft_seconds", "LLMPROBER_TARGETS__N__SLO__TTFT_SECONDS"),
        ("target_groups[N].dns.port", "LLMPROBER_TARGET_GROUPS__N__DNS__PORT"),
    ],
)
def test_the_environment_name(key: str, env: str) -> None:
    assert gen.Row(key, "", "", "").env == env
