"""A target's proxy (`proxy:`): the configuration's faults, NO_PROXY as curl reads it, the
environment's proxies, and credentials registered as secrets wherever they come from."""

from __future__ import annotations

from pathlib import Path

import pytest

from prober.config.proxy import ProxyConfig, bypassed, resolve
from prober.logs import redact
from prober.settings import TargetConfig
from prober.targets import Target, proxy_authorization
from tests.support.config_faults import file_problems

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/unit/conftest.py
TARGET = "targets:\n  - name: a\n    url: http://x/v1\n    model: m\n"
VARIABLES = ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY")


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def problems(tmp_path: Path, extra: str) -> list[str]:
    return file_problems(tmp_path, TARGET + extra)


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (
            "    proxy: {url: 'socks5://127.0.0.1:1080'}\n",
            "targets[0].proxy.url: must be an http://HOST:PORT forward proxy, got"
            " 'socks5://127.0.0.1:1080'",
        ),
        (
            "    proxy: {url: 'http://bob:pw@127.0.0.1:3128'}\n",
            "targets[0].proxy.url: credentials in the URL: set proxy.auth_env or proxy.auth_file",
        ),
        (
            "    proxy: {url: 'http://127.0.0.1:3128/x'}\n",
            "targets[0].proxy.url: must be a proxy URL without a path or query",
        ),
        (
            "    proxy: {auth_env: PROXY_AUTH}\n",
            "targets[0].proxy.auth_env: no proxy to send it to: set proxy.url too",
        ),
        (
            "    proxy: {url: 'http://127.0.0.1:3128', auth_env: A, auth_file: /x}\n",
            "targets[0].proxy.auth_file: set auth_env or auth_file, not both",
        ),
        (
            "    proxy: {url: 'http://127.0.0.1:3128', auth_env: UNSET_PROXY_AUTH}\n",
            "targets[0].proxy.auth_env: environment variable UNSET_PROXY_AUTH is unset",
        ),
    ],
)
def test_a_bad_proxy_is_one_line_naming_the_field(tmp_path: Path, extra: str, problem: str) -> None:
    found = problems(tmp_path, extra)
    assert len(found) == 1, found
    assert found[0].startswith(problem), found


def test_credentials_not_of_user_password_are_refused_and_never_echoed(tmp_path: Path) -> None:
    secret = tmp_path / "auth"
    secret.write_text("no-colon-here-secret\n")
    extra = f"    proxy: {{url: 'http://127.0.0.1:3128', auth_file: {secret}}}\n"
    (found,) = problems(tmp_path, extra)
    assert found == (
        f"targets[0].proxy.auth_file: the credentials in {secret} are not one line of user:password"
    )
    assert "no-colon-here-secret" not in found
    assert redact("leak no-colon-here-secret") == "leak [REDACTED]"


def test_a_bad_variable_names_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", "https://proxy.example:3128")
    (found,) = problems(tmp_path, "")
    assert found.startswith(
        "targets[0].proxy: environment variable HTTP_PROXY: must be an http://HOST:PORT"
    )


@pytest.mark.parametrize(
    ("host", "port", "no_proxy", "bypass"),
    [
        ("api.example.com", 443, "*", True),
        ("api.example.com", 443, "example.com", True),
        ("api.example.com", 443, ".example.com", True),
        ("example.com", 443, ".example.com", True),
        ("badexample.com", 443, "example.com", False),
        ("api.example.com", 443, "example.com:8443", False),
        ("api.example.com", 8443, "example.com:8443", True),
        ("10.1.2.3", 80, "10.0.0.0/8", True),
        ("11.1.2.3", 80, "10.0.0.0/8", False),
        ("127.0.0.1", 8080, "localhost, 127.0.0.1", True),
        ("::1", 8080, "[::1]", True),
        ("::1", 8080, "::1", True),
        ("other", 80, "", False),
    ],
)
def test_no_proxy_as_curl_reads_it(host: str, port: int, no_proxy: str, bypass: bool) -> None:
    assert bypassed(host, port, no_proxy) is bypass


def test_the_environment_decides_unless_told_not_to() -> None:
    env = {"HTTPS_PROXY": "proxy.internal:3128", "http_proxy": "http://plain:3128"}
    tls = resolve(ProxyConfig(), "https://api.example.com/v1", env)
    plain = resolve(ProxyConfig(), "http://10.0.0.1:8000/v1", env)
    assert tls is not None
    assert (tls[0].url, tls[0].source) == ("http://proxy.internal:3128", "HTTPS_PROXY")
    assert plain is not None
    assert (plain[0].url, plain[0].source) == ("http://plain:3128", "http_proxy")
    assert resolve(ProxyConfig(from_env=False), "https://api.example.com/v1", env) is None
    bypass = {**env, "NO_PROXY": "example.com"}
    assert resolve(ProxyConfig(), "https://api.example.com/v1", bypass) is None
    chosen = resolve(ProxyConfig(url="http://127.0.0.1:9"), "https://api.example.com/v1", env)
    assert chosen is not None
    assert (chosen[0].url, chosen[0].source) == ("http://127.0.0.1:9", "proxy.url")


def test_credentials_from_a_variable_or_a_file_go_in_one_header_and_are_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://carol:env-pass-123@proxy.internal:3128")
    target = Target.from_config(TargetConfig(name="t", url="https://api.example.com/v1", model="m"))
    assert target.spec.proxy == "http://proxy.internal:3128"  # what errors name
    header = target.spec.proxy_headers["Proxy-Authorization"]
    assert header == "Basic Y2Fyb2w6ZW52LXBhc3MtMTIz"
    assert "env-pass-123" not in redact("HTTPS_PROXY=http://carol:env-pass-123@proxy.internal")
    assert "Y2Fyb2w6ZW52LXBhc3MtMTIz" not in redact(f"echoed {header}")
    secret = tmp_path / "auth"
    secret.write_text("dave:file-pass-456\n")
    cfg = TargetConfig.model_validate(
        {"name": "u", "url": "http://h/v1", "model": "m",
         "proxy": {"url": "http://127.0.0.1:3128", "auth_file": str(secret)}}
    )  # fmt: skip
    route = cfg.read_proxy()
    assert route is not None
    assert route.auth == ("dave", "file-pass-456")
    assert proxy_authorization(route) == {"Proxy-Authorization": "Basic ZGF2ZTpmaWxlLXBhc3MtNDU2"}
    assert redact("dave:file-pass-456 and file-pass-456") == "[REDACTED] and [REDACTED]"
