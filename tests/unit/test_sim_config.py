"""SimConfig validation, fault spec parsing, and the simulator's command-line flags."""

from __future__ import annotations

import argparse

import pytest

from prober.cli import main
from prober.sim import SimConfig, add_sim_arguments, sim_config_from_args
from prober.sim.faults import Fault, FaultKind, FaultPicker, parse_fault


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("model", "", "model: must be a non-empty string"),
        ("slots", 0, "slots: must be at least 1"),
        ("slots", True, "slots: must be an integer"),
        ("prefill_tokens_per_second", 0.0, "prefill_tokens_per_second: must be greater than 0"),
        ("prefill_base_seconds", -1.0, "prefill_base_seconds: must be at least 0"),
        ("decode_step_seconds", 0.0, "decode_step_seconds: must be greater than 0"),
        ("decode_step_seconds", float("nan"), "decode_step_seconds: must be finite"),
        ("decode_slowdown", -0.1, "decode_slowdown: must be at least 0"),
        ("default_max_tokens", 0, "default_max_tokens: must be at least 1"),
        ("reasoning_tokens", -1, "reasoning_tokens: must be at least 0"),
        ("reasoning_field", "thoughts", "reasoning_field: must be one of"),
        ("tokens_per_chunk", 0, "tokens_per_chunk: must be at least 1"),
        ("kv_capacity_tokens", -5, "kv_capacity_tokens: must be at least 0"),
        ("timings", 1, "timings: must be a bool"),
        ("fault_rates", {"explode": 0.1}, "fault_rates: unknown fault 'explode'"),
        ("fault_rates", {"status:503": 1.5}, r"fault_rates\['status:503'\]: must be a probability"),
        ("fault_rates", {"endless": 0.6, "no_tokens": 0.6}, "fault_rates: must sum to at most 1"),
        ("keepalive_seconds", 0, "keepalive_seconds: must be greater than 0"),
        # Strict types: text, floats and bools are not counts, whatever they would convert to.
        ("slots", "4", "slots: must be an integer, got '4'"),
        ("seed", 1.5, "seed: must be an integer, got 1.5"),
        ("decode_slowdown", "0.1", "decode_slowdown: must be a number, got '0.1'"),
        ("model", 3, "model: must be a string, got 3"),
        ("fault_rates", [("endless", 0.1)], "fault_rates: must be a mapping"),
        ("fault_rates", {"endless": "0.1"}, r"fault_rates\['endless'\]: must be a probability"),
        ("slot", 4, "^slot: unknown key$"),
    ],
)
def test_invalid_config_names_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SimConfig(**{field: value})  # type: ignore[arg-type]


def test_invalid_config_is_one_line() -> None:
    # The first fault only.
    with pytest.raises(ValueError, match=r"^slots: must be at least 1, got 0$") as info:
        SimConfig(reasoning_field="thoughts", slots=0)  # type: ignore[arg-type]
    assert "\n" not in str(info.value)


def test_defaults_are_valid_and_frozen() -> None:
    cfg = SimConfig(fault_rates={"status:503": 0.1})
    assert cfg.slots == 4
    with pytest.raises(TypeError):
        cfg.fault_rates["endless"] = 0.5  # type: ignore[index]
    with pytest.raises(ValueError, match="frozen"):
        cfg.slots = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    ("spec", "fault"),
    [
        ("status:429", Fault(FaultKind.STATUS, 429)),
        ("stall_after:0", Fault(FaultKind.STALL_AFTER, 0)),
        ("oversized:4000000", Fault(FaultKind.OVERSIZED, 4_000_000)),
        (" endless ", Fault(FaultKind.ENDLESS)),
    ],
)
def test_parse_fault(spec: str, fault: Fault) -> None:
    assert parse_fault(spec) == fault


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("boom", "unknown fault"),
        ("status", "needs an integer"),
        ("status:200", r"must be in \[400, 599\]"),
        ("endless:3", "takes no argument"),
        ("oversized:10", "must be in"),
    ],
)
def test_parse_fault_rejects(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_fault(spec)


def test_random_faults_are_seeded() -> None:
    def draws(seed: int) -> list[Fault | None]:
        picker = FaultPicker({"status:503": 0.3, "endless": 0.2}, seed)
        return [picker.pick(None) for _ in range(200)]

    first = draws(7)
    assert first == draws(7)
    assert 30 < sum(f == Fault(FaultKind.STATUS, 503) for f in first) < 90
    assert 15 < sum(f == Fault(FaultKind.ENDLESS) for f in first) < 65
    assert FaultPicker({"status:503": 1.0}, 0).pick("no_tokens") == Fault(FaultKind.NO_TOKENS)


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_sim_arguments(parser)
    return parser.parse_args(argv)


def test_flags_build_config() -> None:
    ns = _parse(
        [
            "--slots", "8", "--prefill-tps", "500", "--decode-step", "0.01",
            "--decode-slowdown", "0", "--reasoning-tokens", "5", "--max-tokens", "16",
            "--kv-capacity", "4096", "--fault-rate", "status:503=0.1",
            "--fault-rate", "stall_after:3=0.05", "--seed", "9", "--no-timings",
            "--reasoning-field", "reasoning",
        ]
    )  # fmt: skip
    assert sim_config_from_args(ns) == SimConfig(
        slots=8,
        prefill_tokens_per_second=500.0,
        decode_step_seconds=0.01,
        decode_slowdown=0.0,
        reasoning_tokens=5,
        default_max_tokens=16,
        kv_capacity_tokens=4096,
        fault_rates={"status:503": 0.1, "stall_after:3": 0.05},
        seed=9,
        timings=False,
        reasoning_field="reasoning",
    )
    assert sim_config_from_args(_parse([])) == SimConfig()


def test_bad_flags() -> None:
    with pytest.raises(ValueError, match="slots: must be at least 1"):
        sim_config_from_args(_parse(["--slots", "0"]))
    with pytest.raises(ValueError) as err:
        sim_config_from_args(_parse(["--fault-rate", "endless=0.1", "--fault-rate", "endless=0.2"]))
    assert str(err.value) == "--fault-rate: must be one rate per fault, got 'endless=0.2'"


NAME_P = "--fault-rate: must be NAME=P, a fault and a probability in [0, 1], got "


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("endless", NAME_P + "'endless'"),
        ("=0.1", NAME_P + "'=0.1'"),
        ("endless=x", NAME_P + "'endless=x'"),
        ("endless=1.5", NAME_P + "'endless=1.5'"),
        ("endless=nan", NAME_P + "'endless=nan'"),
        ("explode=0.1", "--fault-rate: unknown fault 'explode'; known: " + ", ".join(FaultKind)),
        ("status:99=0.1", "--fault-rate: fault 'status' argument must be in [400, 599], got 99"),
    ],
)
def test_a_bad_fault_rate_names_the_flag_and_the_value(value: str, problem: str) -> None:
    with pytest.raises(ValueError) as err:
        sim_config_from_args(_parse(["--fault-rate", value]))
    assert str(err.value) == problem


def test_a_bad_sim_flag_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["sim", "--fault-rate", "endless"]) == 2
    assert capsys.readouterr().err.splitlines() == ["sim: " + NAME_P + "'endless'"]
