"""What a changed target setting restarts: the one table (docs/design.md §11 shows it).

A reload compares each target's old and new configuration key by key. Each key belongs to
one `Effect`, and a change restarts what its effect names and nothing else; an equal
configuration restarts nothing. `RESETS` is the table; `effects()` reads it; a unit test
checks that it names every key of `TargetConfig` and drives the daemon through each row.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

from prober.settings import TargetConfig


class Effect(StrEnum):
    """What a change restarts, from the most to the least."""

    # A different engine, or a different way in: a new `Target` (the prompt calibration
    # starts again), client session and pool, capacity (the estimate learns again), load
    # driver, engine watcher, and probe job with its warm-up. With `model`, the old model's
    # series leave once its requests in flight have ended.
    ENDPOINT = "endpoint"
    # What the estimate rests on: a new capacity (learned slots, pairs, α/β, drain rate,
    # calibration), engine watcher and load driver (its live count belongs to the capacity).
    ESTIMATE = "estimate"
    LOAD = "load"  # the load driver only (its live count, and the estimate, kept)
    WATCH = "watch"  # the engine-scrape watcher only
    SCHEDULE = "schedule"  # the probe job's interval, jitter and cap (next run one interval on)
    DESCRIBE = "describe"  # the SLO gauges; goodness is judged on the new SLO from now
    SPEC = "spec"  # nothing restarts: the next request is sent with it


RESETS: Mapping[str, Effect] = {
    "name": Effect.ENDPOINT,  # never seen changed: a new name is a new target
    "url": Effect.ENDPOINT,
    "model": Effect.ENDPOINT,
    "api": Effect.ENDPOINT,
    "tls": Effect.ENDPOINT,
    "proxy": Effect.ENDPOINT,  # another way in: a pool through the old proxy is not reused
    "connection": Effect.ENDPOINT,
    "headers": Effect.ENDPOINT,
    "secret_headers": Effect.ENDPOINT,
    "api_key_env": Effect.ENDPOINT,
    "api_key_file": Effect.ENDPOINT,
    "api_key_header": Effect.ENDPOINT,
    "api_key_prefix": Effect.ENDPOINT,
    "cache_bust": Effect.ENDPOINT,
    "prompt_tokens": Effect.ESTIMATE,
    "max_tokens": Effect.ESTIMATE,
    "extra_body": Effect.ESTIMATE,
    "question": Effect.ESTIMATE,  # what the probes send: their shape is the estimate's
    "slots": Effect.ESTIMATE,
    "traffic": Effect.ESTIMATE,
    "load": Effect.LOAD,  # ESTIMATE where a load is added or taken away (`effects`)
    "metrics_url": Effect.WATCH,
    "engine": Effect.WATCH,
    "metrics_interval_seconds": Effect.WATCH,
    "interval_seconds": Effect.SCHEDULE,
    "jitter_seconds": Effect.SCHEDULE,
    "probes_in_flight": Effect.SCHEDULE,
    "cache_probe": Effect.SCHEDULE,  # its job, by the same schedule
    "slo": Effect.DESCRIBE,
    "series": Effect.DESCRIBE,  # a family turned off leaves at once; one turned on, at its use
    "timeouts": Effect.SPEC,
    "pair_share": Effect.SPEC,
    "stall_seconds": Effect.SPEC,  # read at each judgement of the engine's state
    "warmup": Effect.SPEC,  # a target warms up when it starts; a running one has
    "expect": Effect.SPEC,  # the answer checks: the next result is judged by them
}


def effects(old: TargetConfig, new: TargetConfig) -> set[Effect]:
    """What changing `old` into `new` restarts; empty where every key is equal. The API
    key's content counts as its source does (a rotated key file is a new way in), and so do
    the proxy and its credentials as read (the environment's, a rotated auth file)."""
    keys = [key for key in type(old).model_fields if getattr(old, key) != getattr(new, key)]
    # A key the table does not know yet restarts everything: never less than it needs.
    found = {RESETS.get(key, Effect.ENDPOINT) for key in keys}
    if (old.load is None) != (new.load is None):  # the estimate's basis changes with it
        found.discard(Effect.LOAD)
        found.add(Effect.ESTIMATE)
    if old.read_secrets() != new.read_secrets() or old.read_proxy() != new.read_proxy():
        found.add(Effect.ENDPOINT)
    return found
