"""The README stays a manual, and what it and the docs point at exists.

The README opens with the command CI runs (.ci/run calls exactly it), is at most 300 lines
(derivations, proofs and histories live in docs/), and every link in it, in CONTRIBUTING.md
and in docs/ resolves, as does every repository path the README names in backticks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
MAX_LINES = 300
# A path inside a code span or block: a folder of the repository and a file or folder under it
# (`bench/perf_idle.py --seconds 300`, `pytest -s tests/vllm/...`).
_CODE = re.compile(r"```.*?```|`[^`\n]+`", re.S)
_TOP = "bench|deploy|docs|grafana|prober|scripts|tests"
_PATH = re.compile(rf"(?<![\w/.-])((?:{_TOP})/[\w./-]*[\w/])")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_opens_with_the_command_ci_runs() -> None:
    first_block = README.read_text().split("```", 2)[1]
    ci = (ROOT / ".ci" / "run").read_text()
    assert "./scripts/test\n" in ci
    assert re.search(r"^\./scripts/test\s", first_block, re.M), first_block


def test_the_readme_is_a_manual() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines: move details to docs/"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page: Path) -> None:
    broken = [
        target
        for target in _LINK.findall(page.read_text())
        if not target.startswith(("http://", "https://", "mailto:"))
        and not (page.parent / target).exists()
    ]
    assert broken == []


def test_every_path_the_readme_names_exists() -> None:
    code = " ".join(_CODE.findall(README.read_text()))
    named = set(_PATH.findall(code))
    assert len(named) >= 10, named  # the check sees the README's paths
    missing = sorted(p for p in named if not (ROOT / p).exists())
    assert missing == []
