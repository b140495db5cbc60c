"""A request's deadlines (`Timeouts`) and the one set of their defaults, which a target's
`timeouts:` section, bench and `probe` take theirs from. What a deadline that passed means is
`classify`'s; `send` keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_seconds: float
    first_token_seconds: float
    idle_seconds: float
    total_seconds: float


# The one set of defaults: a target's `timeouts:` section (settings.TimeoutsConfig), bench's
# `--timeout` (first token and total: the total's) and `probe --timeout` (the first token's)
# take theirs from here.
DEFAULT_TIMEOUTS = Timeouts(
    connect_seconds=5.0, first_token_seconds=60.0, idle_seconds=30.0, total_seconds=300.0
)
# bench's `--connect-timeout`, shorter than a target's: an unreachable server fails the sweep's
# pre-flight, and bench exits 1, within it (a daemon's probe is retried at its next run).
BENCH_CONNECT_SECONDS = 3.0
