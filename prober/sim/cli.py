"""Command-line flags of `llm-prober sim`, and their translation into a `SimConfig`.

Flags default to None and only the ones given are passed on, so `SimConfig` stays the single
source of defaults and of validation; the help text quotes those defaults.
"""

from __future__ import annotations

import argparse
import math

from prober.kinds import REASONING_FIELDS
from prober.sim.config import SimConfig
from prober.sim.faults import parse_fault
from prober.validation import wrong

# flag, SimConfig field, type, help
_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--model", "model", str, "model name served"),
    ("--slots", "slots", int, "parallel sequences (continuous batching)"),
    ("--prefill-tps", "prefill_tokens_per_second", float, "prefill speed, tokens/s"),
    ("--prefill-base", "prefill_base_seconds", float, "fixed prefill cost per request, s"),
    ("--decode-step", "decode_step_seconds", float, "decode step with one sequence, s"),
    ("--decode-slowdown", "decode_slowdown", float, "step growth per extra running sequence"),
    ("--max-tokens", "default_max_tokens", int, "output length when the request sets none"),
    ("--reasoning-tokens", "reasoning_tokens", int, "first N output tokens are reasoning"),
    ("--tokens-per-chunk", "tokens_per_chunk", int, "tokens per streamed event"),
    ("--kv-capacity", "kv_capacity_tokens", int, "KV budget in tokens, 0 = unlimited"),
    ("--seed", "seed", int, "seed of the random faults"),
    ("--keepalive", "keepalive_seconds", float, "interval of ': ping' comments, s"),
)


def _dest(name: str) -> str:
    # Prefixed so the simulator's flags never collide with the host parser's own.
    return f"sim_{name}"


def _fault_rate(text: str) -> tuple[str, float]:
    """`--fault-rate NAME=P` as (NAME, P); a ValueError naming the flag, as bench's flags do
    (`--fault-rate: must be ..., got ...`), so `sim` prints it as one line and exits 2."""
    spec, _, raw = text.rpartition("=")
    try:
        prob = float(raw)
    except ValueError:
        prob = math.nan
    if not spec or not 0 <= prob <= 1:
        allowed = "NAME=P, a fault and a probability in [0, 1]"
        raise ValueError(f"--fault-rate: {wrong(allowed, text)}")
    try:
        parse_fault(spec)
    except ValueError as exc:  # its words name the fault and the known ones
        raise ValueError(f"--fault-rate: {exc}") from None
    return spec, prob


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator's flags to `parser` (in their own argument group)."""
    defaults = SimConfig()
    group = parser.add_argument_group("simulator")
    for flag, name, kind, text in _FLAGS:
        default = getattr(defaults, name)
        group.add_argument(
            flag,
            dest=_dest(name),
            type=kind,
            metavar=flag[2:].upper().replace("-", "_"),
            help=f"{text} (default {default})",
        )
    group.add_argument(
        "--reasoning-field",
        dest=_dest("reasoning_field"),
        choices=REASONING_FIELDS,
        help=f"delta field of reasoning tokens (default {defaults.reasoning_field})",
    )
    group.add_argument(
        "--no-timings",
        dest=_dest("timings"),
        action="store_const",
        const=False,
        help="omit llama-server style timings from the last token chunk",
    )
    group.add_argument(
        "--fault-rate",
        dest=_dest("fault_rates"),
        action="append",
        metavar="NAME=P",
        help="inject fault NAME (e.g. status:503, stall_after:5) on a fraction P of requests; "
        "repeatable",
    )


def sim_config_from_args(ns: argparse.Namespace) -> SimConfig:
    """The SimConfig the parsed flags describe; ValueError names the bad field or flag."""
    kwargs: dict[str, object] = {}
    names = [name for _, name, _, _ in _FLAGS] + ["reasoning_field", "timings"]
    for name in names:
        value = getattr(ns, _dest(name), None)
        if value is not None:
            kwargs[name] = value
    texts: list[str] | None = getattr(ns, _dest("fault_rates"), None)
    if texts:
        rates: dict[str, float] = {}
        for text in texts:
            spec, prob = _fault_rate(text)
            if spec in rates:
                raise ValueError(f"--fault-rate: {wrong('one rate per fault', text)}")
            rates[spec] = prob
        kwargs["fault_rates"] = rates
    return SimConfig(**kwargs)  # type: ignore[arg-type]
