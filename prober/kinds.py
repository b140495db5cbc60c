"""The closed sets of values that configuration, flags and code share, each spelled once.

The lowest layer: it imports nothing from `prober`, so settings, the request path, the bench
and the simulator can all take their choices from here. Enums where code branches on the
member, `Literal` aliases where the value is only passed on; each `Literal` has a tuple of its
values beside it for argparse's `choices=`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal, get_args


class Api(StrEnum):
    """The wire protocol of a target: OpenAI chat, OpenAI completions, or Ollama's native API."""

    CHAT = "chat"
    COMPLETIONS = "completions"
    OLLAMA = "ollama"


class Engine(StrEnum):
    """An inference engine whose /metrics the prober understands."""

    vllm = "vllm"
    llamacpp = "llamacpp"
    sglang = "sglang"
    tgi = "tgi"


# Open-loop arrivals: exponential gaps, evenly spaced, or gamma gaps (shape = burstiness).
Arrival = Literal["poisson", "constant", "gamma"]
ARRIVALS: tuple[Arrival, ...] = get_args(Arrival)

# Distributions of prompt and answer lengths in tokens (prober/load/workload.py).
LengthDist = Literal["fixed", "uniform", "normal", "lognormal", "empirical"]
LENGTH_DISTS: tuple[LengthDist, ...] = get_args(LengthDist)

# auto: uvloop when installed (prober/runtime.py).
EventLoopChoice = Literal["auto", "uvloop", "asyncio"]
EVENT_LOOPS: tuple[EventLoopChoice, ...] = get_args(EventLoopChoice)

# pooled: keep-alive connections are reused; fresh: every request opens its own.
Connection = Literal["pooled", "fresh"]
CONNECTIONS: tuple[Connection, ...] = get_args(Connection)

LogLevel = Literal["debug", "info", "warning", "error"]
LOG_LEVELS: tuple[LogLevel, ...] = get_args(LogLevel)

LogFormat = Literal["auto", "json", "console"]
LOG_FORMATS: tuple[LogFormat, ...] = get_args(LogFormat)

# The delta field the simulator streams reasoning tokens in (llama-server's, vLLM's).
ReasoningField = Literal["reasoning_content", "reasoning"]
REASONING_FIELDS: tuple[ReasoningField, ...] = get_args(ReasoningField)


class Basis(StrEnum):
    """What a target's queue estimate rests on, best first."""

    SERVER = "server"
    OWN_LOAD = "own_load"
    PROBES_HINT = "probes_hint"
    PROBES_LEARNED = "probes_learned"
    NONE = "none"


class Drain(StrEnum):
    """What the queue estimate's drain rate (departures per second while a queue lasts)
    rests on, best first. For the probes-alone estimate, `slots / T` with T the service time
    of a request of the traffic's shape, it names who gave that shape, whether or not a queue
    has yet given a rate; `none` where the estimate needs no rate (own load) or has none."""

    SERVER = "server"  # the engine's completion counter, scraped
    ENGINE_SHAPE = "engine_shape"  # the shape from the engine's request and token counters
    TRAFFIC = "traffic"  # the `traffic: {prompt_tokens, output_tokens}` the operator gave
    TRAFFIC_PROBES = "traffic_probes"  # `traffic: probes`: the operator said probe-shaped
    # Nobody gave a shape: a depth would rest on the probes' own, an assumption nobody made,
    # so no waiting figure (nor rate, nor saturation above the knee) is exported.
    PROBE_SHAPE = "probe_shape"
    NONE = "none"
