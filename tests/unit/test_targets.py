"""prober.targets: `target_spec` is a pure function of its inputs; `Target.from_config` does
the I/O its spec needs (the key read, the target's secrets registered once, TLS built)."""

from __future__ import annotations

import pytest

from prober.config import secrets
from prober.settings import TargetConfig
from prober.targets import Target, target_spec

HEADER = "x-api-key-value-0123456789"
KEY = "sk-from-the-environment-0123"
VARIABLE = "LLMPROBER_TEST_TARGET_KEY"


@pytest.fixture
def registered(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every secret registered, in order, instead of the process-wide registry."""
    found: list[str] = []
    monkeypatch.setattr(secrets, "register_secret", found.append)
    return found


def config() -> TargetConfig:
    return TargetConfig(
        name="a",
        url="https://127.0.0.1:1/v1",
        model="m",
        headers={"X-Api-Key": HEADER},
        api_key_env=VARIABLE,
    )


def test_target_spec_is_pure(monkeypatch: pytest.MonkeyPatch, registered: list[str]) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)  # the key is given: no variable is read
    cfg = config()
    first = target_spec(cfg, api_key="sk-given", tls=False, keep_text=True)
    assert first == target_spec(cfg, api_key="sk-given", tls=False, keep_text=True)
    assert first.headers == {"X-Api-Key": HEADER, "Authorization": "Bearer sk-given"}
    assert first.ssl is False  # as given, though the URL is https
    assert target_spec(cfg, api_key=None, tls=True).headers == {"X-Api-Key": HEADER}
    assert registered == []


def test_from_config_reads_and_registers_once(
    monkeypatch: pytest.MonkeyPatch, registered: list[str]
) -> None:
    monkeypatch.setenv(VARIABLE, KEY)
    cfg = config()
    target = Target.from_config(cfg)
    assert target.spec.headers["Authorization"] == f"Bearer {KEY}"
    assert target.spec.ssl is not False  # built from the config: verified
    monkeypatch.delenv(VARIABLE)
    assert Target.from_config(cfg).spec.headers == target.spec.headers  # read once, kept
    assert registered == [HEADER, KEY]
