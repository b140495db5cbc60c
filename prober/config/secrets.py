"""The one place a target's credentials are read and registered with the log redactor.

`register_secrets` registers the secret headers' values, reads the API key from the variable
or file the target names, registers it before checking it (a rejected key must not be printed
either) and returns it. `proxy_route` does the same for the target's proxy: the credentials
of `proxy.auth_env` or `proxy.auth_file`, or those inside a `HTTPS_PROXY`/`HTTP_PROXY` URL.
`TargetConfig.read_secrets` calls both, once per target.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yarl

from prober.config.errors import FieldError
from prober.config.proxy import ProxyChoice, ProxyConfig, resolve
from prober.logs import register_secret
from prober.validation import show

_KEY = re.compile(r"[\x21-\x7e]+")  # one token of printable ASCII: what a header can carry
_PROXY_AUTH = re.compile(r"[^:\x00-\x1f\x7f]+:[^\x00-\x1f\x7f]+")  # user:password, one line
# Header names whose values are credentials wherever they appear (Azure's `api-key`, ...).
SECRET_HEADER_NAMES = frozenset(
    {
        "proxy-authorization",
        "api-key",
        "x-api-key",
        "x-goog-api-key",
        "x-auth-token",
        "ocp-apim-subscription-key",
        "cookie",
        "x-amz-security-token",
        "private-token",
    }
)


class Credentials(Protocol):
    """The fields of a target (`TargetConfig`) that name or hold its credentials."""

    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def secret_headers(self) -> Sequence[str]: ...
    @property
    def api_key_env(self) -> str | None: ...
    @property
    def api_key_file(self) -> Path | None: ...


def register_secrets(target: Credentials) -> str | None:
    """Register the target's credentials so no log line prints them, and return its API key,
    read from the environment variable or file it names (None without one).

    The one place secrets are registered: the secret headers' values, then the key, before
    it is checked (a rejected key must not be printed either). `TargetConfig.read_secrets`
    calls it, once per target. The key must be one token of printable ASCII (what an
    `Authorization` header can carry): a key file of two lines, or a binary one, is a
    configuration error, not a failing probe. Faults are `FieldError`s naming `api_key_env`
    or `api_key_file`.
    """
    for value in secret_header_values(target):
        register_secret(value)
    if target.api_key_env:
        where = f"environment variable {target.api_key_env}"
        field, key = "api_key_env", os.environ.get(target.api_key_env, "").strip()
        if not key:
            raise FieldError(field, f"{where} is unset")
    elif target.api_key_file:
        where = show(target.api_key_file)
        field, key = "api_key_file", _read_key_file(target.api_key_file)
    else:
        return None
    register_secret(key)
    _check_api_key(key, field, where)
    return key


@dataclass(frozen=True, slots=True)
class ProxyRoute:
    """The proxy a target's requests go through, and its credentials (user, password)."""

    proxy: ProxyChoice
    auth: tuple[str, str] | None = None


def proxy_route(cfg: ProxyConfig, target_url: str) -> ProxyRoute | None:
    """The target's proxy (None: direct), its credentials read and registered as secrets
    before they are checked: the "user:password" of `auth_env` or `auth_file`, or what a
    variable's URL holds. Faults are `FieldError`s naming `proxy.auth_env`,
    `proxy.auth_file`, or `proxy` for a variable's value."""
    try:
        found = resolve(cfg, target_url)
    except ValueError as exc:
        raise FieldError("proxy", str(exc)) from None
    if found is None:
        return None
    choice, given = found
    if cfg.auth_env is not None:
        where, field = f"environment variable {cfg.auth_env}", "proxy.auth_env"
        value = os.environ.get(cfg.auth_env, "").strip()
        if not value:
            raise FieldError(field, f"{where} is unset")
    elif cfg.auth_file is not None:
        where, field = show(cfg.auth_file), "proxy.auth_file"
        value = _read_secret_file(cfg.auth_file, field)
    else:
        url = yarl.URL(given)
        if url.user is None:
            return ProxyRoute(choice)
        register_secret(given)
        user, password = url.user, url.password or ""
        for secret in (f"{user}:{password}", password, url.raw_user or "", url.raw_password or ""):
            register_secret(secret)
        return ProxyRoute(choice, (user, password))
    register_secret(value)
    user, _, password = value.partition(":")
    register_secret(password)
    if not _PROXY_AUTH.fullmatch(value):  # never echo the value
        raise FieldError(field, f"the credentials in {where} are not one line of user:password")
    return ProxyRoute(choice, (user, password))


def _read_key_file(path: Path) -> str:
    return _read_secret_file(path, "api_key_file")


def _read_secret_file(path: Path, field: str) -> str:
    """A credential file's text, stripped; a `FieldError` naming `field` where it has none."""
    try:
        value = path.read_bytes().decode("utf-8").strip()
    except OSError as exc:
        raise FieldError(field, f"cannot read {show(path)}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise FieldError(field, f"{show(path)} is not text (binary file?)") from None
    if not value:
        raise FieldError(field, f"{show(path)} is empty")
    return value


def _check_api_key(value: str, field: str, where: str) -> None:
    """A `FieldError` naming `field` unless `value` fits a header."""
    if "\n" in value or "\r" in value:
        raise FieldError(field, f"the key in {where} holds more than one line")
    if not _KEY.fullmatch(value):  # never echo the value, nor which character is wrong
        problem = "is not one token of printable ASCII (a space or control character?)"
        raise FieldError(field, f"the key in {where} {problem}")


def secret_header_values(target: Credentials) -> list[str]:
    """Values of the target's headers that are credentials (declared, or by their name)."""
    declared = {name.lower() for name in target.secret_headers} | SECRET_HEADER_NAMES
    return [value for name, value in target.headers.items() if name.lower() in declared]
