"""`llm-prober probe`: its target is built as a configured one is (`Target.from_config`), so
it gets the same URL check, timeouts and credentials, and a fault names the flag typed."""

from __future__ import annotations

import pytest

from prober.cli import build_parser, probe_target
from prober.request import DEFAULT_TIMEOUTS, Timeouts
from prober.settings import ConfigError


def parse(*argv: str) -> object:
    return build_parser().parse_args(["probe", "--model", "m", *argv])


def test_the_probe_target_is_a_configured_target() -> None:
    args = parse("--url", "https://127.0.0.1:1/v1", "--timeout", "7", "--max-tokens", "3")
    target = probe_target(args)  # type: ignore[arg-type]
    assert target.config.url == "https://127.0.0.1:1/v1"
    assert target.config.max_tokens == 3
    # One set of defaults: the connect and stall timeouts are the configuration's.
    assert target.spec.timeouts == Timeouts(DEFAULT_TIMEOUTS.connect_seconds, 7.0,
                                       DEFAULT_TIMEOUTS.idle_seconds, 7.0)  # fmt: skip
    assert target.spec.ssl is not False  # verified, as a configured https target is


@pytest.mark.parametrize(
    ("argv", "problem"),
    [
        (("--url", "ftp://h"), "--url: must be an http:// or https:// URL, got 'ftp://h'"),
        (("--url", "http://h/v1", "--timeout", "1e9"), "--timeout: must be at most"),
        (("--url", "http://h/v1", "--api-key-env", "LLMPROBER_TEST_SURELY_UNSET"),
         "--api-key-env: environment variable LLMPROBER_TEST_SURELY_UNSET is unset"),
    ],
)  # fmt: skip
def test_a_bad_flag_is_one_problem_naming_it(argv: tuple[str, ...], problem: str) -> None:
    with pytest.raises(ConfigError) as err:
        probe_target(parse(*argv))  # type: ignore[arg-type]
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith(problem), err.value.problems


def test_a_bad_key_in_the_variable_names_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    # The variable is set, but its key cannot go in a header: the fault is found where the key
    # is read (`register_secrets`, a `FieldError` naming `api_key_env`) and named as the flag.
    monkeypatch.setenv("LLMPROBER_TEST_TWO_LINES", "sk-one\nsk-two")
    with pytest.raises(ConfigError) as err:
        probe_target(parse("--url", "http://h/v1", "--api-key-env", "LLMPROBER_TEST_TWO_LINES"))  # type: ignore[arg-type]
    assert err.value.problems == [
        "--api-key-env: the key in environment variable LLMPROBER_TEST_TWO_LINES holds more"
        " than one line"
    ]
