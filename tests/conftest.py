"""Shared test configuration: Hypothesis profiles, quiet logs.

`default` keeps property tests quick (200 examples); `HYPOTHESIS_PROFILE=fuzz` runs 20,000
examples per property for a long fuzzing session (see docs/fuzzing.md).
"""

from __future__ import annotations

import faulthandler
import os
import sys
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=200, deadline=None)
settings.register_profile(
    "fuzz",
    max_examples=20_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


# pytest-timeout's signal fails a test that runs past its timeout, but only where the alarm
# lands in the test's own frames: raised inside an event-loop callback (where the daemon's
# stream parsing runs) it is logged by the loop and lost, and a main thread that never gets
# the GIL back never sees it. This watchdog thread needs neither: past the timeout and this
# margin it prints every thread's stack and ends the run, so a hang costs one test's timeout,
# never the rest of CI's time, and leaves its stacks in the output.
HARD_STOP_MARGIN_SECONDS = 120.0
_stderr_fd: int | None = None  # the real stderr, kept before any test's output is captured


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    marker = item.get_closest_marker("timeout")
    limit = (
        float(marker.args[0]) if marker and marker.args else float(item.config.getini("timeout"))
    )
    faulthandler.dump_traceback_later(
        limit + HARD_STOP_MARGIN_SECONDS, exit=True, file=_stderr_fd or sys.stderr
    )
    try:
        return (yield)
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_configure() -> None:
    global _stderr_fd
    _stderr_fd = os.dup(2)  # capturing is suspended while plugins configure
    # In-process daemons log through structlog; without this its default printer would write
    # every debug event into the test output. Tests that inspect logs configure their own.
    from prober.logs import setup_logging

    setup_logging("json", "warning")


@pytest.fixture(scope="session")
def vllm() -> Iterator[str]:
    """One real vLLM (CPU build, `--max-num-seqs 4`) for the whole run: its base URL."""
    from tests.support.vllm import vllm_server

    with vllm_server() as base:
        yield base


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that use the `vllm` fixture run last, together: the engine starts once (about
    100 s) and holds its 5 GB only while they run, never beside the llama-server tests."""
    uses_vllm = [item for item in items if "vllm" in getattr(item, "fixturenames", ())]
    if uses_vllm:
        others = [item for item in items if "vllm" not in getattr(item, "fixturenames", ())]
        items[:] = others + uses_vllm
