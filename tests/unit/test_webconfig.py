"""The web config file (exporter-toolkit shape): every problem named, hashes checked, auth rules.

Also the settings wiring (`server.web_config_file`), the rule that API keys never sit in
`headers`, and the log redaction of registered secrets.
"""

from __future__ import annotations

import asyncio
import io
import logging
from pathlib import Path

import bcrypt
import pytest
import structlog

from prober import webconfig
from prober.logs import REDACTED, get_logger, redact, register_secret, setup_logging
from prober.settings import ConfigError, Settings, load_settings
from prober.webconfig import BasicAuthMiddleware, WebConfigError, load_web_config
from tests.support.tls import self_signed_cert

HASH = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path_factory.mktemp("certs"))


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(text)
    return path


def problems(path: Path) -> list[str]:
    with pytest.raises(WebConfigError) as info:
        load_web_config(path)
    return info.value.problems


def test_full_file_with_relative_paths(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    cert, key = pair
    (tmp_path / "tls").mkdir()
    for f in pair:
        (tmp_path / "tls" / f.name).write_bytes(f.read_bytes())
    path = write(
        tmp_path,
        f"tls_server_config:\n  cert_file: tls/{cert.name}\n  key_file: tls/{key.name}\n"
        f"  min_version: TLS13\nbasic_auth_users:\n  alice: '{HASH}'\n"
        f"  bob: '{HASH.replace('$2b$', '$2y$')}'\n",
    )
    cfg = load_web_config(path)
    assert cfg.tls
    assert cfg.cert_file == tmp_path / "tls" / cert.name
    assert set(cfg.users) == {"alice", "bob"}
    context = cfg.ssl_context()
    assert context is not None
    assert context.minimum_version.name == "TLSv1_3"
    assert len(cfg.middlewares()) == 1


@pytest.mark.parametrize("text", ["", "# nothing\n", "{}\n"])
def test_empty_file_means_plain_http_without_auth(tmp_path: Path, text: str) -> None:
    cfg = load_web_config(write(tmp_path, text))
    assert cfg.ssl_context() is None
    assert cfg.middlewares() == []


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("- a\n", ["web.yml must hold a mapping, not a list"]),
        ("tls_server_config: [\n", ["web.yml is not valid YAML at line 2, column 1"]),
        ("http_server_config: {http2: true}\n", ["http_server_config: unknown key"]),
        ("tls_server_config: yes\n",
         ["tls_server_config: must be a mapping with cert_file and key_file"]),
        ("tls_server_config: {key_file: k}\n",
         ["tls_server_config.cert_file: required (a file path)",
          "tls_server_config.key_file: no such file: {dir}/k"]),
        ("tls_server_config: {cert_file: c, key_file: k, client_ca_file: ca}\n",
         ["tls_server_config.client_ca_file: not supported by llm-prober",
          "tls_server_config.cert_file: no such file: {dir}/c",
          "tls_server_config.key_file: no such file: {dir}/k"]),
        ("tls_server_config: {cert_file: c, key_file: k, min_version: TLS10, x: 1}\n",
         ["tls_server_config.x: unknown key",
          "tls_server_config.cert_file: no such file: {dir}/c",
          "tls_server_config.key_file: no such file: {dir}/k",
          "tls_server_config.min_version: must be one of 'TLS12' or 'TLS13', got 'TLS10'"]),
        ("basic_auth_users: [alice]\n",
         ["basic_auth_users: must be a mapping of user name to bcrypt hash"]),
        ("basic_auth_users: {alice: hunter2}\n",
         ["basic_auth_users.alice: not a bcrypt hash ($2a$, $2b$ or $2y$, cost 4-31)"]),
        ("basic_auth_users: {alice: '$2b$99$" + "a" * 53 + "'}\n",
         ["basic_auth_users.alice: not a bcrypt hash ($2a$, $2b$ or $2y$, cost 4-31)"]),
        ("basic_auth_users: {alice: '" + HASH[:-1] + "'}\n",
         ["basic_auth_users.alice: not a bcrypt hash ($2a$, $2b$ or $2y$, cost 4-31)"]),
        ("basic_auth_users: {'a:b': '" + HASH + "'}\n",
         ["basic_auth_users: user names must be non-empty strings without ':'"]),
        ("basic_auth_users: {alice: 12}\n",
         ["basic_auth_users.alice: not a bcrypt hash ($2a$, $2b$ or $2y$, cost 4-31)"]),
    ],
)  # fmt: skip
def test_problems(tmp_path: Path, text: str, expected: list[str]) -> None:
    path = write(tmp_path, text)
    expected = [e.replace("{dir}", str(tmp_path)).replace("web.yml", str(path)) for e in expected]
    assert problems(path) == expected


def test_a_plain_password_in_place_of_a_hash_is_never_echoed(tmp_path: Path) -> None:
    got = problems(write(tmp_path, "basic_auth_users: {alice: my-plain-password}\n"))
    assert "my-plain-password" not in "\n".join(got)


def test_unreadable_file(tmp_path: Path) -> None:
    assert problems(tmp_path / "nope.yml") == [
        f"cannot read {tmp_path / 'nope.yml'}: No such file or directory"
    ]


def test_key_that_does_not_match_the_certificate(tmp_path: Path, pair: tuple[Path, Path]) -> None:
    other_cert, _ = self_signed_cert(tmp_path, "other")
    path = write(tmp_path, f"tls_server_config: {{cert_file: {other_cert}, key_file: {pair[1]}}}\n")
    [problem] = problems(path)
    assert problem.startswith("tls_server_config: cannot load cert_file/key_file: ")


@pytest.mark.usefixtures("clean_env")
def test_settings_name_the_web_config_file(tmp_path: Path) -> None:
    write(tmp_path, "basic_auth_users: {alice: hunter2}\n")
    config = tmp_path / "config.yml"
    config.write_text(
        f"server: {{web_config_file: {tmp_path / 'web.yml'}}}\n"
        "targets: [{name: a, url: 'http://127.0.0.1:1/v1', model: m}]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    assert info.value.problems == [
        "server.web_config_file: basic_auth_users.alice: not a bcrypt hash "
        "($2a$, $2b$ or $2y$, cost 4-31)"
    ]
    write(tmp_path, f"basic_auth_users: {{alice: '{HASH}'}}\n")
    assert load_settings(config).server.web_config_file == tmp_path / "web.yml"


def test_api_keys_are_not_accepted_in_headers(tmp_path: Path) -> None:
    config = tmp_path / "config.yml"
    config.write_text(
        "targets: [{name: a, url: 'http://127.0.0.1:1/v1', model: m,"
        " headers: {authorization: Bearer sk-x}}]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_settings(config)
    assert info.value.problems == [
        "targets[0].headers: set the API key with api_key_env or api_key_file, not headers"
    ]


async def test_checks_hit_the_cache_only_after_a_success(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bytes] = []
    real = webconfig._checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        calls.append(password)
        return real(password, hashed)

    monkeypatch.setattr(webconfig, "_checkpw", counting)
    auth = BasicAuthMiddleware({"alice": HASH.encode()})
    assert not await auth.check("alice", "wrong")
    assert not await auth.check("alice", "wrong")
    assert not await auth.check("mallory", "pw")  # unknown user: still one bcrypt check
    assert not await auth.check("alice", "p" * 100)  # longer than bcrypt's 72 bytes
    assert len(calls) == 4
    assert await auth.check("alice", "pw")
    assert await auth.check("alice", "pw")
    assert len(calls) == 5
    results = await asyncio.gather(*(auth.check("alice", f"x{i}") for i in range(3)))
    assert results == [False] * 3


def test_redact_replaces_secrets_and_their_cut_off_start() -> None:
    secret = "sk-redact-test-0123456789abcdef"
    register_secret(secret)
    assert redact(f"HTTP 401: bad key Bearer {secret}.") == f"HTTP 401: bad key Bearer {REDACTED}."
    assert redact(f"HTTP 401: key {secret[:12]}") == f"HTTP 401: key {REDACTED}"
    assert redact("HTTP 401: key sk-re") == "HTTP 401: key sk-re"  # too short to say
    register_secret("abc")  # too short to redact without garbling every line
    assert redact("abc") == "abc"


def test_log_lines_are_redacted_whatever_their_source() -> None:
    secret = "sk-log-line-test-fedcba9876543210"
    register_secret(secret)
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, structlog.get_config())
    stream = io.StringIO()
    setup_logging("json", "info", stream=stream)
    try:
        get_logger("test").warning("probe_failed", error=f"HTTP 401: {secret}", n=[secret])
        logging.getLogger("aiohttp.client").warning("echo %s", secret)  # a stdlib logger
        try:
            raise RuntimeError(f"boom {secret}")
        except RuntimeError:
            get_logger("test").exception("crashed")
    finally:
        root.handlers[:], level, config = saved
        root.setLevel(level)
        structlog.configure(**config)
    text = stream.getvalue()
    assert secret not in text
    assert text.count(REDACTED) >= 4


def test_settings_made_without_load_settings_still_read_the_file(tmp_path: Path) -> None:
    """A configured web config is never served as plain HTTP without auth for having been
    skipped: `Settings(...)` (the demo, tests) reads it at first use."""
    path = write(tmp_path, f"basic_auth_users:\n  alice: '{HASH}'\n")
    target = {"name": "t", "url": "http://127.0.0.1:1/v1", "model": "m"}
    settings = Settings.model_validate(
        {"server": {"web_config_file": str(path)}, "targets": [target]}
    )
    assert set(settings.server.web_config.users) == {"alice"}
