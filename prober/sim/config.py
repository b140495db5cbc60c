"""Simulator configuration: one frozen, validated `SimConfig` built once and passed down.

Every field is checked in `__post_init__`, and each error names the field, so a bad flag or
setting fails at start-up with a message the user can act on.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from prober.kinds import REASONING_FIELDS
from prober.sim.faults import validate_rates


def _check_int(name: str, value: object, low: int) -> None:
    # bool is an int subclass; `slots=True` is a typo, not a slot count.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


def _check_float(name: str, value: object, *, positive: bool) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a number, got {value!r}")
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value!r}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if not positive and value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


@dataclass(frozen=True)
class SimConfig:
    """How the simulated engine behaves. Times are in seconds, sizes in tokens."""

    model: str = "sim"
    slots: int = 4
    prefill_tokens_per_second: float = 2000.0
    prefill_base_seconds: float = 0.005
    decode_step_seconds: float = 0.02
    decode_slowdown: float = 0.05
    default_max_tokens: int = 64
    reasoning_tokens: int = 0
    reasoning_field: str = "reasoning_content"
    tokens_per_chunk: int = 1
    kv_capacity_tokens: int = 0
    timings: bool = True
    fault_rates: Mapping[str, float] = field(default_factory=dict)
    seed: int = 0
    keepalive_seconds: float = 5.0

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model.strip():
            raise ValueError(f"model must be a non-empty string, got {self.model!r}")
        _check_int("slots", self.slots, 1)
        _check_float("prefill_tokens_per_second", self.prefill_tokens_per_second, positive=True)
        _check_float("prefill_base_seconds", self.prefill_base_seconds, positive=False)
        # A zero decode step would let an endless stream spin the engine loop at 100 % CPU.
        _check_float("decode_step_seconds", self.decode_step_seconds, positive=True)
        _check_float("decode_slowdown", self.decode_slowdown, positive=False)
        _check_int("default_max_tokens", self.default_max_tokens, 1)
        _check_int("reasoning_tokens", self.reasoning_tokens, 0)
        if self.reasoning_field not in REASONING_FIELDS:
            raise ValueError(
                f"reasoning_field must be one of {REASONING_FIELDS}, got {self.reasoning_field!r}"
            )
        _check_int("tokens_per_chunk", self.tokens_per_chunk, 1)
        _check_int("kv_capacity_tokens", self.kv_capacity_tokens, 0)
        if not isinstance(self.timings, bool):
            raise ValueError(f"timings must be a bool, got {self.timings!r}")
        if not isinstance(self.fault_rates, Mapping):
            raise ValueError(f"fault_rates must be a mapping, got {self.fault_rates!r}")
        validate_rates(self.fault_rates)
        _check_int("seed", self.seed, -(2**63))
        _check_float("keepalive_seconds", self.keepalive_seconds, positive=True)
        # Freeze the mapping too: the config is shared by every request handler.
        object.__setattr__(self, "fault_rates", MappingProxyType(dict(self.fault_rates)))

    def prefill_seconds(self, prompt_tokens: int) -> float:
        """Cost of prefilling one prompt, alone on the engine."""
        return self.prefill_base_seconds + prompt_tokens / self.prefill_tokens_per_second

    def decode_seconds(self, batch: int) -> float:
        """Cost of one decode step for `batch` running sequences (batch >= 1)."""
        return self.decode_step_seconds * (1.0 + self.decode_slowdown * (batch - 1))
