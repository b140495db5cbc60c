"""The problem lines a configuration file gets: one helper for the tests of each section."""

from __future__ import annotations

from pathlib import Path

import pytest

from prober.settings import ConfigError, load_settings


def file_problems(tmp_path: Path, text: str) -> list[str]:
    """The problems `load_settings` reports for a config file holding `text`."""
    path = tmp_path / "config.yml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    return info.value.problems
