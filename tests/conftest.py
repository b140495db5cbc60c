"""Shared test configuration: Hypothesis profiles, quiet logs.

`default` keeps property tests quick (200 examples); `HYPOTHESIS_PROFILE=fuzz` runs 20,000
examples per property for a long fuzzing session (see docs/fuzzing.md).
"""

from __future__ import annotations

import os

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


def pytest_configure() -> None:
    # In-process daemons log through structlog; without this its default printer would write
    # every debug event into the test output. Tests that inspect logs configure their own.
    from prober.logs import setup_logging

    setup_logging("json", "warning")
