"""prober.runtime: the event loop choice (uvloop detected, asyncio on request) and GC tuning."""

from __future__ import annotations

import asyncio
import gc
import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from prober import runtime
from prober.settings import ConfigError, load_settings

CONFIG = """\
server:
  event_loop: {choice}
targets:
  - {{name: a, url: "http://x/v1", model: m}}
"""


@pytest.fixture
def no_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make uvloop look uninstalled, to the loop factory and to settings validation."""
    real_import, real_find = importlib.import_module, importlib.util.find_spec

    def import_module(name: str, package: str | None = None) -> ModuleType:
        if name == "uvloop":
            raise ModuleNotFoundError("No module named 'uvloop'")
        return real_import(name, package)

    def find_spec(name: str, package: str | None = None) -> object:
        return None if name == "uvloop" else real_find(name, package)

    monkeypatch.setattr(importlib, "import_module", import_module)
    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def _check(choice: runtime.EventLoopChoice, expect: str) -> None:
    loop, name = runtime.new_event_loop(choice)
    try:
        assert name.split()[0] == expect
        assert loop.run_until_complete(asyncio.sleep(0, "ran")) == "ran"
    finally:
        loop.close()


def test_asyncio_on_request() -> None:
    loop, name = runtime.new_event_loop("asyncio")
    try:
        assert name == "asyncio"
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()


def test_auto_picks_uvloop_when_installed() -> None:
    pytest.importorskip("uvloop")
    _check("auto", "uvloop")
    _check("uvloop", "uvloop")


@pytest.mark.usefixtures("no_uvloop")
def test_auto_falls_back_to_asyncio_without_uvloop() -> None:
    _check("auto", "asyncio")
    with pytest.raises(runtime.LoopUnavailable, match="uvloop is not installed"):
        runtime.new_event_loop("uvloop")


@pytest.mark.usefixtures("no_uvloop")
def test_demanding_missing_uvloop_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text(CONFIG.format(choice="uvloop"))
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert info.value.problems == [
        "server.event_loop: uvloop is not installed (pip install 'llm-prober[fast]')"
    ]
    path.write_text(CONFIG.format(choice="auto"))
    assert load_settings(path).server.event_loop == "auto"


def test_unknown_loop_names_the_field(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text(CONFIG.format(choice="trio"))
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    assert len(info.value.problems) == 1
    assert info.value.problems[0].startswith("server.event_loop: ")


@pytest.fixture
def restore_gc() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restore_gc")
def test_tune_gc_freezes_the_start_up_heap_and_raises_gen0() -> None:
    before = gc.get_threshold()
    assert runtime.tune_gc() == before
    assert gc.get_threshold() == runtime.GC_THRESHOLDS
    assert gc.get_freeze_count() > 1000  # what the interpreter and imports allocated
    # Cycles made after start-up are still collected.
    cycle: list[object] = []
    cycle.append(cycle)
    del cycle
    assert gc.collect() >= 1


async def test_start_now_runs_a_task_up_to_its_first_wait_where_python_can() -> None:
    """Python 3.12+: the first step has run when `start_now` returns (an eager task); 3.11:
    it runs at the loop's next pass, as `create_task` does."""
    ran: list[str] = []

    async def request() -> str:
        ran.append("written")
        await asyncio.sleep(0)
        ran.append("answered")
        return "done"

    task = runtime.start_now(request())
    assert ran == (["written"] if sys.version_info >= (3, 12) else [])
    assert await task == "done"
    assert ran == ["written", "answered"]


def test_the_loop_gets_the_gil_back_within_a_millisecond() -> None:
    before = sys.getswitchinterval()
    try:
        assert runtime.favour_the_loop() == before
        assert sys.getswitchinterval() == pytest.approx(runtime.SWITCH_INTERVAL_SECONDS)
        assert before > runtime.SWITCH_INTERVAL_SECONDS  # CPython's default is 5 ms
    finally:
        sys.setswitchinterval(before)
