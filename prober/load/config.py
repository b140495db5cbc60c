"""The `load:` section of a target: where the open-loop arrivals come from and how long each
request is (prober/load/workload.py draws them, prober/load/driver.py sends them).

Exactly one source of arrivals: `rate` (mean arrivals/s, gaps by `arrival`, gamma's shape
`burstiness`), `schedule` (rate steps) or `trace` (a replayed JSONL file, read and checked in
full here, at load time: a bad line is a configuration error naming the file and line).
`prompt_tokens` and `max_tokens` are a count or a `LengthConfig`; `*_spread` stays the
shorthand of a uniform spread around a count. Every fault names its field.
"""

from __future__ import annotations

from typing import Annotated, Any, Self

from pydantic import Field, PrivateAttr, field_validator, model_validator

from prober.kinds import Arrival, LengthDist
from prober.load import workload
from prober.section import PositiveSeconds, Section
from prober.validation import bound, field_error, wrong

MAX_RATE = workload.MAX_RATE  # arrivals/s, on average, of any source
# A slower rate's first arrival could lie past any run (1e-300/s: 1e300 s away) and past what
# a timer can be set to; one arrival in about 28 hours is the least a load sends.
MIN_RATE = 1e-5
Tokens = Annotated[int, Field(ge=1, le=workload.MAX_TOKENS)]
TokenCount = Annotated[float, Field(gt=0, le=workload.MAX_TOKENS)]
# The parameters each length distribution takes: required, then optional.
_LENGTH_PARAMS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fixed": (("value",), ()),
    "uniform": (("min", "max"), ()),
    "normal": (("mean", "std", "max"), ("min",)),
    "lognormal": (("median", "sigma", "max"), ("min",)),
    "empirical": (("values",), ("weights",)),
}


class LengthConfig(Section):
    """A distribution of token counts (prompt or answer); prober/load/workload.py draws from it.

    normal and lognormal are truncated to [min, max] (drawn from the distribution
    conditioned on the window, never clipped onto its bounds); min defaults to 1.
    """

    dist: LengthDist
    value: Tokens | None = None
    min: Tokens | None = None
    max: Tokens | None = None
    mean: TokenCount | None = None
    std: TokenCount | None = None
    median: TokenCount | None = None
    sigma: Annotated[float, Field(gt=0, le=10)] | None = None
    values: Annotated[list[Tokens], Field(min_length=1, max_length=10_000)] | None = None
    weights: (
        Annotated[list[Annotated[float, Field(ge=0, le=1e12)]], Field(max_length=10_000)] | None
    ) = None

    @field_validator("values", "weights", mode="before")
    @classmethod
    def _no_bool_items(cls, value: Any) -> Any:
        if isinstance(value, list) and any(isinstance(v, bool) for v in value):
            raise ValueError("must be numbers, not true or false")
        return value

    @model_validator(mode="after")
    def _params(self) -> Self:
        required, optional = _LENGTH_PARAMS[self.dist]
        given = self.model_fields_set - {"dist"}
        for name in sorted(given - {*required, *optional}):
            takes = ", ".join((*required, *optional))
            raise field_error(name, f"not a parameter of {self.dist} (it takes {takes})", None)
        for name in required:
            if getattr(self, name) is None:
                raise field_error(name, f"required by {self.dist}", None)
        if self.max is not None and self.max < (self.min or 1):
            problem = bound("at least", f"min ({self.min or 1})", self.max)
            raise field_error("max", problem, self.max)
        if self.weights is not None and len(self.weights) != len(self.values or []):
            raise field_error("weights", "must give one weight per value", self.weights)
        if self.weights is not None and not sum(self.weights) > 0:
            raise field_error("weights", "must not all be 0", self.weights)
        self.sampler()  # a window without mass, weights all 0: refused now, not at run time
        return self

    @classmethod
    def fixed(cls, tokens: int) -> LengthConfig:
        return cls(dist="fixed", value=tokens)

    def sampler(self) -> workload.LengthSampler:
        low, high = self.min or 1, self.max or 1
        match self.dist:
            case "fixed":
                return workload.Fixed(self.value or 1)
            case "uniform":
                return workload.Uniform(low, high)
            case "normal":
                return workload.normal(self.mean or 1, self.std or 1, low, high)
            case "lognormal":
                return workload.lognormal(self.median or 1, self.sigma or 1, low, high)
        return workload.Empirical(self.values or [], self.weights)


def lengths_field(value: Any) -> Any:
    """A plain token count is the fixed distribution (`prompt_tokens: 128`); a mapping is a
    distribution; anything else is refused in words that name both forms."""
    if isinstance(value, str) and value.strip().isdecimal():  # the environment gives text
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(bound("at least", 1, value))
        if value > workload.MAX_TOKENS:
            raise ValueError(bound("at most", workload.MAX_TOKENS, value))
        return {"dist": "fixed", "value": value}
    if isinstance(value, dict | LengthConfig):
        return value
    dists = " | ".join(_LENGTH_PARAMS)
    raise ValueError(wrong(f"a token count or a distribution (dist: {dists})", value, shown=40))


def spread_lengths(default: int, spread_fraction: float) -> LengthConfig:
    """`*_spread`, the shorthand of a uniform spread of ±fraction around a count."""
    if spread_fraction <= 0:
        return LengthConfig.fixed(default)
    low = max(1, round(default * (1 - spread_fraction)))
    high = max(low, round(default * (1 + spread_fraction)))
    return LengthConfig(dist="uniform", min=low, max=high)


class RateStep(Section):
    seconds: PositiveSeconds
    rate: Annotated[float, Field(ge=0, le=MAX_RATE)]  # arrivals/s; 0 is a pause

    @field_validator("rate")
    @classmethod
    def _pause_or_rate(cls, rate: float) -> float:
        if 0 < rate < MIN_RATE:
            raise ValueError(f"must be 0 (a pause) or at least {MIN_RATE:g}, got {rate:g}")
        return rate


class RateSchedule(Section):
    """Piecewise-constant rate: each step lasts `seconds`; `loop` repeats the steps, else the
    arrivals end after the last one."""

    steps: Annotated[list[RateStep], Field(min_length=1, max_length=10_000)]
    loop: bool = True

    @field_validator("steps")
    @classmethod
    def _some_rate(cls, steps: list[RateStep]) -> list[RateStep]:
        if all(step.rate == 0 for step in steps):
            raise ValueError("at least one step needs a rate above 0")
        return steps

    def pairs(self) -> list[tuple[float, float]]:
        return [(step.seconds, step.rate) for step in self.steps]

    @property
    def mean_rate(self) -> float:
        return sum(s * r for s, r in self.pairs()) / sum(s for s, _ in self.pairs())

    def scaled(self, factor: float) -> RateSchedule:
        steps = [RateStep(seconds=s.seconds, rate=s.rate * factor) for s in self.steps]
        return RateSchedule(steps=steps, loop=self.loop)


class TraceConfig(Section):
    """Replay of a JSONL trace (prober/load/workload.py), read and checked in full at load time."""

    path: str  # a file, or builtin:NAME for one shipped in prober/load/traces/
    time_scale: Annotated[float, Field(gt=0, le=10_000)] = 1.0  # 0.1: ten times faster
    rate_scale: Annotated[float, Field(ge=0.01, le=100)] = 1.0  # requests x k, same timeline
    loop: bool = True
    block_tokens: Annotated[int, Field(ge=1, le=65_536)] = 512  # tokens per hash id
    _summary: workload.TraceSummary | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _read(self) -> Self:
        try:
            path = workload.resolve_trace(self.path)
            self._summary = workload.check_trace(
                path, time_scale=self.time_scale, rate_scale=self.rate_scale
            )
        except ValueError as exc:  # TraceError: FILE:LINE: problem
            raise field_error("path", str(exc), self.path) from None
        if self.loop and self._summary.period_seconds <= 0:
            problem = "a trace whose requests share one instant cannot loop: set loop: false"
            raise field_error("loop", problem, self.loop)
        return self

    @property
    def summary(self) -> workload.TraceSummary:
        assert self._summary is not None  # set by the validator
        return self._summary

    def replay(
        self, *, rate: float | None, seed: int | None, shard: tuple[int, int]
    ) -> workload.Replay:
        """The replay plan; `rate` (mean requests/s) sets the time scale instead."""
        summary = self.summary
        time_scale = self.time_scale if rate is None else summary.mean_rate / rate
        return workload.Replay(
            workload.resolve_trace(self.path),
            summary,
            time_scale,
            self.rate_scale,
            self.loop,
            self.block_tokens,
            seed,
            shard,
        )


# Set with a trace, these would be ignored: the trace gives times and lengths.
_TRACE_GIVES = (
    "arrival",
    "burstiness",
    "schedule",
    "prompt_tokens",
    "max_tokens",
    "prompt_tokens_spread",
    "max_tokens_spread",
)


class LoadConfig(Section):
    """Open-loop background load: arrivals on an absolute schedule, capped in flight.

    The arrivals come from exactly one of `rate` (mean arrivals/s, law `arrival`), `schedule`
    (rate steps) or `trace` (replay; with `rate` too, its time is scaled to that mean rate).
    """

    rate: Annotated[float, Field(ge=MIN_RATE, le=MAX_RATE)] | None = None
    arrival: Arrival = "poisson"
    burstiness: Annotated[float, Field(ge=0.01, le=100)] | None = None  # gamma's shape
    schedule: RateSchedule | None = None
    trace: TraceConfig | None = None
    max_in_flight: Annotated[int, Field(ge=1, le=100_000)] = 64
    # No token on any of the target's streams (nor engine progress, where scraped) for this long
    # while a request waited or failed: arrivals are dropped (reason silent) until a token
    # comes, so a hung or unreachable target never holds max_in_flight streams. None: never.
    silent_seconds: Annotated[float, Field(gt=0, le=86_400)] | None = 10.0
    prompt_tokens: LengthConfig | None = None
    prompt_tokens_spread: Annotated[float, Field(ge=0, lt=1)] = 0.0
    max_tokens: LengthConfig | None = None
    max_tokens_spread: Annotated[float, Field(ge=0, lt=1)] = 0.0
    seed: int | None = None

    @field_validator("prompt_tokens", "max_tokens", mode="before")
    @classmethod
    def _lengths(cls, value: Any) -> Any:
        return None if value is None else lengths_field(value)

    @model_validator(mode="after")
    def _one_source(self) -> Self:
        given = self.model_fields_set
        if self.trace is not None:
            for name in _TRACE_GIVES:
                if name in given:
                    raise field_error(name, "the trace gives it: remove one of the two", None)
            scaled = {"time_scale", "rate_scale"} & self.trace.model_fields_set
            if self.rate is not None and scaled:
                problem = f"sets the trace's speed: give rate or trace.{min(scaled)}, not both"
                raise field_error("rate", problem, self.rate)
            if self.rate is not None and self.trace.summary.mean_rate <= 0:
                problem = "the trace's requests share one instant: there is no rate to scale"
                raise field_error("rate", problem, self.rate)
            plan = self.trace.replay(rate=self.rate, seed=None, shard=(0, 1))
            if plan.mean_rate > MAX_RATE:  # the driver could never catch up with its schedule
                problem = f"replays at {plan.mean_rate:.0f} requests/s, over the bound of "
                raise field_error("trace", problem + f"{MAX_RATE:.0f}: raise time_scale", None)
            if self.rate is not None:  # its own time scale: the pace is checked at this one
                try:
                    workload.check_trace(
                        plan.path, time_scale=plan.time_scale, rate_scale=plan.rate_scale
                    )
                except ValueError as exc:
                    raise field_error("rate", f"{exc}: lower the rate", self.rate) from None
            return self
        if self.rate is None and self.schedule is None:
            raise field_error("rate", "required (or a schedule, or a trace)", None)
        if self.rate is not None and self.schedule is not None:
            raise field_error("schedule", "give rate or schedule, not both", None)
        if self.arrival == "gamma" and self.burstiness is None:
            problem = "required with arrival: gamma (1 is Poisson, below 1 burstier)"
            raise field_error("burstiness", problem, None)
        if self.arrival != "gamma" and self.burstiness is not None:
            raise field_error("burstiness", "only with arrival: gamma", self.burstiness)
        for name in ("prompt_tokens", "max_tokens"):
            lengths: LengthConfig | None = getattr(self, name)
            if getattr(self, f"{name}_spread") > 0 and lengths and lengths.dist != "fixed":
                problem = f"a spread needs a plain {name}: give a spread or a distribution"
                raise field_error(f"{name}_spread", problem, None)
        return self

    def prompt_lengths(self, default: int) -> LengthConfig:
        """`prompt_tokens` as a distribution (the spread applied; `default`, the target's,
        when unset)."""
        return _with_spread(self.prompt_tokens, self.prompt_tokens_spread, default)

    def answer_lengths(self, default: int) -> LengthConfig:
        """`max_tokens` as a distribution, as `prompt_lengths`."""
        return _with_spread(self.max_tokens, self.max_tokens_spread, default)


def _with_spread(lengths: LengthConfig | None, spread: float, default: int) -> LengthConfig:
    if lengths is not None and lengths.dist != "fixed":
        return lengths
    return spread_lengths(lengths.value or default if lengths else default, spread)
