"""Fixtures shared by the unit tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No stray LLMPROBER_* variable from the developer's shell, and a fresh folder as the
    working directory (no stray config files)."""
    for name in list(os.environ):
        if name.upper().startswith("LLMPROBER_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
