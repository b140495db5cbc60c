"""Simulator configuration: one frozen, validated `SimConfig` built once and passed down.

A pydantic model like every config of the project (prober/validation.py): a bad flag or
setting fails at start-up with one line that names the field ("slots: must be at least 1, got 0").
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import Field, field_validator
from pydantic_core import ErrorDetails

from prober.kinds import REASONING_FIELDS as REASONING_FIELDS  # re-exported
from prober.kinds import ReasoningField
from prober.sim.faults import validate_rates
from prober.validation import OneLineModel, describe, field_path, wrong

NonNegative = Annotated[float, Field(ge=0)]
Positive = Annotated[float, Field(gt=0)]


class SimConfig(OneLineModel):
    """How the simulated engine behaves. Times are in seconds, sizes in tokens."""

    model: str = "sim"
    slots: Annotated[int, Field(ge=1)] = 4
    prefill_tokens_per_second: Positive = 2000.0
    prefill_base_seconds: NonNegative = 0.005
    # A zero decode step would let an endless stream spin the engine loop at 100 % CPU.
    decode_step_seconds: Positive = 0.02
    decode_slowdown: NonNegative = 0.05
    default_max_tokens: Annotated[int, Field(ge=1)] = 64
    reasoning_tokens: Annotated[int, Field(ge=0)] = 0
    reasoning_field: ReasoningField = "reasoning_content"
    tokens_per_chunk: Annotated[int, Field(ge=1)] = 1
    kv_capacity_tokens: Annotated[int, Field(ge=0)] = 0
    timings: bool = True
    fault_rates: Mapping[str, float] = Field(default_factory=lambda: MappingProxyType({}))
    seed: Annotated[int, Field(ge=-(2**63))] = 0
    keepalive_seconds: Positive = 5.0

    @classmethod
    def problem(cls, err: ErrorDetails) -> str:
        text = describe(err)
        # validate_rates' messages name the field themselves ("fault_rates[...]: must be ...").
        if err["loc"][:1] == ("fault_rates",) and text.startswith("fault_rates"):
            return text
        return f"{field_path(err['loc'])}: {text}"

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError(wrong("a non-empty string", value))
        return value

    @field_validator("fault_rates", mode="before")
    @classmethod
    def _fault_rates(cls, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise ValueError(wrong("a mapping", value))
        validate_rates(value)
        return value

    @field_validator("fault_rates")
    @classmethod
    def _frozen(cls, value: Mapping[str, float]) -> Mapping[str, float]:
        # Frozen too: the config is shared by every request handler.
        return MappingProxyType(dict(value))

    def prefill_seconds(self, prompt_tokens: int) -> float:
        """Cost of prefilling one prompt, alone on the engine."""
        return self.prefill_base_seconds + prompt_tokens / self.prefill_tokens_per_second

    def decode_seconds(self, batch: int) -> float:
        """Cost of one decode step for `batch` running sequences (batch >= 1)."""
        return self.decode_step_seconds * (1.0 + self.decode_slowdown * (batch - 1))
