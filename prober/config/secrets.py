"""The one place a target's credentials are read and registered with the log redactor.

`register_secrets` registers the secret headers' values, reads the API key from the variable
or file the target names, registers it before checking it (a rejected key must not be printed
either) and returns it. `TargetConfig.read_secrets` calls it, once per target.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from prober.config.errors import FieldError
from prober.logs import register_secret
from prober.validation import show

_KEY = re.compile(r"[\x21-\x7e]+")  # one token of printable ASCII: what a header can carry
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


def _read_key_file(path: Path) -> str:
    try:
        value = path.read_bytes().decode("utf-8").strip()
    except OSError as exc:
        raise FieldError("api_key_file", f"cannot read {show(path)}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise FieldError("api_key_file", f"{show(path)} is not text (binary file?)") from None
    if not value:
        raise FieldError("api_key_file", f"{show(path)} is empty")
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
