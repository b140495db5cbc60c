"""What one bench sweep measures: the validated, frozen `BenchConfig`, built once and passed down.

Every check raises `ValueError` whose text starts with the flag at fault (`--concurrency: ...`),
so the command line can print it as one line and exit 2. `target_config()` turns the sweep
into the daemon's own `TargetConfig`, so bench sends through the same `Target.send` path.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from prober.kinds import EVENT_LOOPS, Api, Arrival, EventLoopChoice
from prober.settings import TargetConfig, field_path
from prober.timings import Slo

MAX_CONCURRENCY = 10_000
MAX_RATE = 10_000.0


class Mode(StrEnum):
    CONCURRENCY = "concurrency"  # closed loop: C workers, each sends when its last request ends
    RATE = "rate"  # open loop: Poisson (or constant) arrivals at R requests/s


@dataclass(frozen=True, slots=True)
class Level:
    """One load level of a sweep: a concurrency (closed loop) or a rate (open loop)."""

    mode: Mode
    value: float

    def key(self) -> dict[str, int | float]:
        """The level's JSON identity: `{"concurrency": C}` or `{"rate": R}`."""
        if self.mode is Mode.CONCURRENCY:
            return {"concurrency": int(self.value)}
        return {"rate": self.value}

    def label(self) -> str:
        return f"c={int(self.value)}" if self.mode is Mode.CONCURRENCY else f"{self.value:g} req/s"


@dataclass(frozen=True, slots=True)
class BenchConfig:
    url: str
    model: str
    mode: Mode = Mode.CONCURRENCY
    levels: tuple[float, ...] = (1, 2, 4, 8)
    num_requests: int | None = 32
    duration_seconds: float | None = None
    input_len: int = 128
    output_len: int = 64
    cache_bust: bool = True
    warmup: int = 2
    seed: int = 0
    api: Api = Api.CHAT
    arrival: Arrival = "poisson"
    slo_ttft_seconds: float = 2.0
    slo_tpot_seconds: float = 0.2
    slo_e2e_seconds: float | None = None
    capacity_goodput: float = 0.9
    target_rate: float | None = None
    ignore_eos: bool = False
    api_key_env: str | None = None
    timeout_seconds: float = 300.0
    connect_timeout_seconds: float = 3.0
    max_in_flight: int = 1000
    event_loop: EventLoopChoice = "auto"

    def __post_init__(self) -> None:
        _check_levels(self.mode, self.levels)
        if (self.num_requests is None) == (self.duration_seconds is None):
            raise ValueError("--num-requests / --duration: give exactly one")
        if self.num_requests is not None:
            _at_least("--num-requests", self.num_requests, 1)
            if self.mode is Mode.CONCURRENCY and self.num_requests < max(self.levels):
                raise ValueError(
                    f"--num-requests: {self.num_requests} is below the largest concurrency "
                    f"{int(max(self.levels))}; some workers would never send"
                )
        if self.duration_seconds is not None:
            _positive("--duration", self.duration_seconds)
        _at_least("--input-len", self.input_len, 1)
        _at_least("--output-len", self.output_len, 1)
        _at_least("--warmup", self.warmup, 0)
        _at_least("--max-in-flight", self.max_in_flight, 1)
        for flag, value in (
            ("--slo-ttft", self.slo_ttft_seconds),
            ("--slo-tpot", self.slo_tpot_seconds),
            ("--slo-e2e", self.slo_e2e_seconds),
            ("--target-rate", self.target_rate),
            ("--timeout", self.timeout_seconds),
            ("--connect-timeout", self.connect_timeout_seconds),
        ):
            if value is not None:
                _positive(flag, value)
        if not 0 < self.capacity_goodput <= 1:
            raise ValueError(f"--capacity-goodput: must be in (0, 1], got {self.capacity_goodput}")
        if self.api_key_env is not None and not os.environ.get(self.api_key_env):
            raise ValueError(f"--api-key-env: environment variable {self.api_key_env} is unset")
        if self.event_loop not in EVENT_LOOPS:
            raise ValueError(f"--event-loop: auto, uvloop or asyncio, got {self.event_loop!r}")
        # Built once here so a bad URL or model is a flag error, not a failure mid-sweep.
        self.target_config()

    @property
    def sweep(self) -> list[Level]:
        return [Level(self.mode, v) for v in self.levels]

    @property
    def slo(self) -> Slo:
        return Slo(self.slo_ttft_seconds, self.slo_tpot_seconds, self.slo_e2e_seconds)

    def target_config(self) -> TargetConfig:
        """The sweep as the daemon's target: same prompts, timeouts, credentials and TLS."""
        fields: dict[str, Any] = {
            "name": "bench",
            "url": self.url,
            "model": self.model,
            "api": self.api,
            "prompt_tokens": self.input_len,
            "max_tokens": self.output_len,
            "cache_bust": self.cache_bust,
            "api_key_env": self.api_key_env,
            "extra_body": {"ignore_eos": True} if self.ignore_eos else {},
            "slo": {
                "ttft_seconds": self.slo_ttft_seconds,
                "tpot_seconds": self.slo_tpot_seconds,
                "e2e_seconds": self.slo_e2e_seconds,
            },
            "timeouts": {
                "connect_seconds": self.connect_timeout_seconds,
                "first_token_seconds": self.timeout_seconds,
                "total_seconds": self.timeout_seconds,
                "idle_seconds": min(30.0, self.timeout_seconds),
            },
        }
        try:
            return TargetConfig(**fields)
        except ValidationError as exc:
            err = exc.errors()[0]
            flag = {"url": "--url", "model": "--model"}.get(str(err["loc"][0]), "")
            where = flag or field_path(err["loc"])
            raise ValueError(f"{where}: {str(err['msg']).removeprefix('Value error, ')}") from None

    def as_json(self) -> dict[str, Any]:
        """The configuration as recorded in the report (the key's variable name, never a key)."""
        out = asdict(self)
        out["mode"] = self.mode.value
        out["api"] = self.api.value
        out["levels"] = [lvl.key()[self.mode.value] for lvl in self.sweep]
        return out


def _check_levels(mode: Mode, levels: tuple[float, ...]) -> None:
    flag = "--concurrency" if mode is Mode.CONCURRENCY else "--levels"
    if not levels:
        raise ValueError(f"{flag}: give at least one level")
    for value in levels:
        if mode is Mode.CONCURRENCY:
            if not math.isfinite(value) or value != int(value) or not 1 <= value <= MAX_CONCURRENCY:
                raise ValueError(
                    f"{flag}: each must be an integer 1..{MAX_CONCURRENCY}, got {value}"
                )
        elif not (math.isfinite(value) and 0 < value <= MAX_RATE):
            raise ValueError(f"{flag}: each rate must be in (0, {MAX_RATE:g}] req/s, got {value}")
    if list(levels) != sorted(set(levels)):
        raise ValueError(f"{flag}: levels must be strictly increasing, got {list(levels)}")


def _at_least(flag: str, value: int, low: int) -> None:
    if value < low:
        raise ValueError(f"{flag}: must be at least {low}, got {value}")


def _positive(flag: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{flag}: must be a number greater than 0, got {value}")


def parse_levels(flag: str, text: str, *, integers: bool) -> tuple[float, ...]:
    """`"1,2,4"` → (1, 2, 4); one clear `ValueError` naming the flag otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"{flag}: expected a comma-separated list, got {text!r}")
    values: list[float] = []
    for part in parts:
        try:
            values.append(int(part) if integers else float(part))
        except ValueError:
            kind = "integers" if integers else "numbers"
            raise ValueError(f"{flag}: expected {kind} separated by commas, got {text!r}") from None
    return tuple(values)
