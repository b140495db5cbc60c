"""What one bench sweep measures: the validated, frozen `BenchConfig`, built once and passed down.

A pydantic model like every config of the project (prober/validation.py). A fault is one
`ValueError` line that starts with the flag at fault (`--concurrency: ...`), so the command
line can print it and exit 2. `target_config()` turns the sweep into the daemon's own
`TargetConfig`, so bench sends through the same `Target.send` path, and `load_config(rate)`
a rate level into the daemon's `LoadConfig`, so the open loop is the daemon's `LoadDriver`.

Workloads take the daemon's own sections: `input_len` / `output_len` a count or a length
distribution, `schedule` a `RateSchedule`, `trace` a `TraceConfig`. A rate level is always a
mean rate in requests/s: a schedule's steps are scaled to it (its shape kept), a trace's time
is (as the daemon's `rate` with a `trace`), so the knee and the capacity stay in req/s.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Self

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails

from prober.config.flags import TARGET_FLAGS, TargetFlags
from prober.kinds import Api, Arrival, EventLoopChoice
from prober.load.config import LengthConfig, LoadConfig, RateSchedule, TraceConfig, lengths_field
from prober.request import BENCH_CONNECT_SECONDS, DEFAULT_TIMEOUTS
from prober.settings import TargetConfig, field_path
from prober.timings import Slo
from prober.validation import OneLineModel, describe, within, wrong

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


# The flag each field is set by, for the one-line error (`levels` names its own: it depends
# on the mode).
FLAGS = {
    "url": "--url",
    "model": "--model",
    "mode": "--mode",
    "num_requests": "--num-requests",
    "duration_seconds": "--duration",
    "input_len": "--input-len",
    "output_len": "--output-len",
    "cache_bust": "--no-cache-bust",
    "warmup": "--warmup",
    "seed": "--seed",
    "api": "--api",
    "arrival": "--arrival",
    "slo_ttft_seconds": "--slo-ttft",
    "slo_tpot_seconds": "--slo-tpot",
    "slo_e2e_seconds": "--slo-e2e",
    "capacity_goodput": "--capacity-goodput",
    "target_rate": "--target-rate",
    "ignore_eos": "--ignore-eos",
    "api_key_env": "--api-key-env",
    "headers": "--header",
    "api_key_header": "--api-key-header",
    "ca_file": "--ca-file",
    "timeout_seconds": "--timeout",
    "connect_timeout_seconds": "--connect-timeout",
    "max_in_flight": "--max-in-flight",
    "event_loop": "--event-loop",
    "burstiness": "--burstiness",
    "schedule": "--schedule",
    "trace": "--trace",
}
# The flag behind each field of the daemon's load that a rate level fills in.
_LOAD_FLAGS = {
    "prompt_tokens": "--input-len",
    "max_tokens": "--output-len",
    "rate": "--levels",
    "arrival": "--arrival",
    "burstiness": "--burstiness",
    "schedule": "--schedule",
    "trace": "--trace",
    "max_in_flight": "--max-in-flight",
    "seed": "--seed",
}
# The flag behind each field of the daemon's target that the sweep fills in (its bounds: a
# week at most, a million tokens at most).
_TARGET_FLAGS: dict[tuple[int | str, ...], str] = {
    ("url",): "--url",
    ("model",): "--model",
    ("prompt_tokens",): "--input-len",
    ("max_tokens",): "--output-len",
    ("api_key_env",): "--api-key-env",
    ("slo", "ttft_seconds"): "--slo-ttft",
    ("slo", "tpot_seconds"): "--slo-tpot",
    ("slo", "e2e_seconds"): "--slo-e2e",
    ("timeouts", "connect_seconds"): "--connect-timeout",
    ("timeouts", "first_token_seconds"): "--timeout",
    ("timeouts", "total_seconds"): "--timeout",
    ("timeouts", "idle_seconds"): "--timeout",
    **TARGET_FLAGS,  # --header, --api-key-header, --ca-file
}
Count = Annotated[int, Field(ge=1)]
Seconds = Annotated[float, Field(gt=0)]


class BenchConfig(OneLineModel):
    url: str
    model: str
    mode: Mode = Mode.CONCURRENCY
    levels: tuple[int | float, ...] = (1, 2, 4, 8)  # ints stay ints: the flags print them back
    num_requests: Count | None = 32
    duration_seconds: Seconds | None = None
    input_len: LengthConfig = LengthConfig.fixed(128)
    output_len: LengthConfig = LengthConfig.fixed(64)
    cache_bust: bool = True
    warmup: Annotated[int, Field(ge=0)] = 2
    seed: int = 0
    api: Api = Api.CHAT
    arrival: Arrival = "poisson"
    burstiness: Annotated[float, Field(ge=0.01, le=100)] | None = None
    schedule: RateSchedule | None = None
    trace: TraceConfig | None = None
    slo_ttft_seconds: Seconds = 2.0
    slo_tpot_seconds: Seconds = 0.2
    slo_e2e_seconds: Seconds | None = None
    capacity_goodput: float = 0.9
    target_rate: Seconds | None = None
    ignore_eos: bool = False
    api_key_env: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    api_key_header: str | None = None
    ca_file: Path | None = None
    timeout_seconds: Seconds = DEFAULT_TIMEOUTS.total_seconds  # of the first token, and total
    connect_timeout_seconds: Seconds = BENCH_CONNECT_SECONDS
    max_in_flight: Count = 1000
    event_loop: EventLoopChoice = "auto"

    @classmethod
    def problem(cls, err: ErrorDetails) -> str:
        if not err["loc"]:  # a check across fields: its message names the flags itself
            return describe(err)
        field = str(err["loc"][0])
        text = describe(err)
        if field in FLAGS and len(err["loc"]) > 1:  # inside a section: `--trace: path: ...`
            return f"{FLAGS[field]}: {field_path(err['loc'][1:])}: {text}"
        return f"{FLAGS.get(field, field_path(err['loc']))}: {text}"

    @field_validator("input_len", "output_len", mode="before")
    @classmethod
    def _lengths(cls, value: Any) -> Any:
        return lengths_field(value)

    @field_validator("trace", mode="before")
    @classmethod
    def _trace_path(cls, value: Any) -> Any:
        return {"path": value} if isinstance(value, str) else value  # `--trace FILE`

    @field_validator("capacity_goodput")
    @classmethod
    def _goodput(cls, value: float) -> float:
        if not 0 < value <= 1:
            raise ValueError(within(0, 1, value, open_low=True))
        return value

    @field_validator("api_key_env")
    @classmethod
    def _api_key_set(cls, value: str | None) -> str | None:
        if value is not None and not os.environ.get(value):
            raise ValueError(f"environment variable {value} is unset")
        return value

    @model_validator(mode="after")
    def _sweep(self) -> Self:
        _check_levels(self.mode, self.levels)
        if (self.num_requests is None) == (self.duration_seconds is None):
            raise ValueError("--num-requests / --duration: give exactly one")
        count, top = self.num_requests, max(self.levels)
        if count is not None and self.mode is Mode.CONCURRENCY and count < top:
            raise ValueError(
                f"--num-requests: {count} is below the largest concurrency {int(top)}; "
                "some workers would never send"
            )
        if not self.cache_bust and self.input_len.dist != "fixed":
            raise ValueError(
                "--no-cache-bust: one prompt for every request: give a plain --input-len"
            )
        shaped = [f for f in ("trace", "schedule", "burstiness") if getattr(self, f) is not None]
        if shaped and self.mode is Mode.CONCURRENCY:
            raise ValueError(f"{FLAGS[shaped[0]]}: an open-loop option: add --mode rate")
        if self.trace is not None:
            for name in sorted({"input_len", "output_len", "arrival"} & self.model_fields_set):
                raise ValueError(f"{FLAGS[name]}: the trace gives it: remove one of the two")
            for name in sorted({"time_scale", "rate_scale"} & self.trace.model_fields_set):
                raise ValueError(f"--trace: {name}: each level's rate sets the trace's speed")
        # Built once here so a bad URL or model is a flag error, not a failure mid-sweep.
        self.target_config()
        if self.mode is Mode.RATE:
            self.load_config(max(self.levels))
        return self

    @property
    def nominal_input(self) -> int:
        """The prompt length of the pre-flight, warm-ups and connection warming: the median
        of `input_len`, or a trace's mean."""
        if self.trace is not None:
            return round(self.trace.summary.mean_input)
        return self.input_len.sampler().nominal

    def load_config(self, rate: float) -> LoadConfig:
        """A rate level as the daemon's load: `rate` is the level's mean arrivals/s."""
        fields: dict[str, Any] = {"max_in_flight": self.max_in_flight, "seed": self.seed}
        if self.trace is not None:
            fields |= {"trace": self.trace, "rate": rate}
        else:
            fields |= {
                "arrival": self.arrival,
                "burstiness": self.burstiness,
                "prompt_tokens": self.input_len,
                "max_tokens": self.output_len,
            }
            if self.schedule is None:
                fields["rate"] = rate
            else:
                fields["schedule"] = self.schedule.scaled(rate / self.schedule.mean_rate)
        try:
            return LoadConfig(**fields)
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = err["loc"]
            flag = _LOAD_FLAGS.get(str(loc[0]), field_path(loc))
            inner = (
                f"{field_path(loc[1:])}: " if len(loc) > 1 and str(loc[0]) in _LOAD_FLAGS else ""
            )
            raise ValueError(f"{flag}: {inner}{describe(err)}") from None

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
            "prompt_tokens": self.nominal_input,
            "max_tokens": self.output_len.sampler().nominal,
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
                "idle_seconds": min(DEFAULT_TIMEOUTS.idle_seconds, self.timeout_seconds),
            },
            **TargetFlags(self.headers, self.api_key_header, self.ca_file).fields(),
        }
        try:
            return TargetConfig(**fields)
        except ValidationError as exc:
            err = exc.errors()[0]
            where = _TARGET_FLAGS.get(err["loc"], field_path(err["loc"]))
            raise ValueError(f"{where}: {describe(err)}") from None

    def as_json(self) -> dict[str, Any]:
        """The configuration as recorded in the report (the key's variable name, never a key)."""
        out = self.model_dump(mode="json", exclude={"input_len", "output_len", "trace"})
        out["headers"] = sorted(self.headers)  # names only: a value may be a credential
        for name in ("input_len", "output_len"):
            lengths: LengthConfig = getattr(self, name)  # a plain count stays a number
            out[name] = (
                lengths.value if lengths.dist == "fixed" else lengths.model_dump(exclude_none=True)
            )
        out["trace"] = None if self.trace is None else self.trace.model_dump()
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
                raise ValueError(f"{flag}: each {wrong(f'an integer 1..{MAX_CONCURRENCY}', value)}")
        elif not (math.isfinite(value) and 0 < value <= MAX_RATE):
            raise ValueError(f"{flag}: each rate {within(0, MAX_RATE, value, open_low=True)}")
    if list(levels) != sorted(set(levels)):
        raise ValueError(f"{flag}: levels {wrong('strictly increasing', list(levels))}")


def parse_levels(flag: str, text: str, *, integers: bool) -> tuple[float, ...]:
    """`"1,2,4"` → (1, 2, 4); one clear `ValueError` naming the flag otherwise."""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"{flag}: {wrong('a comma-separated list', text)}")
    values: list[float] = []
    for part in parts:
        try:
            values.append(int(part) if integers else float(part))
        except ValueError:
            kind = "integers" if integers else "numbers"
            raise ValueError(f"{flag}: {wrong(f'{kind} separated by commas', text)}") from None
    return tuple(values)
