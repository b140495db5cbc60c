"""A target group's source sections: `file_sd:`, `http_sd:` and `dns:`, and what an address is.

Each section holds what its source needs and checks it alone; `prober.discovery` runs them.
`http_sd`'s credentials (basic auth's password, a bearer token) come from a variable or a
file, never the file's text: `HttpSdConfig.read_secrets` reads them once, registers them with
the log redactor (`prober.logs.register_secret`) and keeps them in private attributes, as a
target's API key is kept. `split_address` is the one check of a discovered `host:port`.
"""

from __future__ import annotations

import base64
import ipaddress
import os
import re
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, PrivateAttr, StrictInt, field_validator, model_validator

from prober.config.errors import FieldError
from prober.config.target import TlsConfig
from prober.config.urls import check_url
from prober.logs import register_secret
from prober.section import PositiveSeconds
from prober.section import Section as _Strict
from prober.validation import CONTROL, field_error, show, wrong

# A DNS name as a host: labels of letters, digits, '-' and '_' (SRV's own names), at most 253.
_HOSTNAME = re.compile(
    r"(?=.{1,253}\.?$)[A-Za-z0-9_][A-Za-z0-9_-]{0,62}(\.[A-Za-z0-9_-]{1,63})*\.?"
)
ADDRESS_SHAPE = "host:port (an IPv4 address, [IPv6] or a DNS name, and a port in 1-65535)"


def split_address(text: str) -> tuple[str, str]:
    """`(host, port)` of a discovered `host:port`, the host as a URL holds it ([::1]); else
    ValueError. Whatever a source sends is hostile: bounded, no space, no path, no user."""
    host, sep, port = text.rpartition(":")
    if not sep or len(text) > 262 or not port.isdecimal() or not 1 <= int(port) <= 65535:
        raise ValueError(wrong(ADDRESS_SHAPE, text, shown=80))
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise ValueError(wrong(ADDRESS_SHAPE, text, shown=80)) from None
    elif not _HOSTNAME.fullmatch(host):  # an IPv4 address is a DNS name's shape too
        raise ValueError(wrong(ADDRESS_SHAPE, text, shown=80))
    return host, str(int(port))


def _nameserver(text: str) -> tuple[str, int]:
    """`server:` as (IP, port): `127.0.0.1:5353`, `[::1]:53`, or an IP alone (port 53)."""
    try:
        return str(ipaddress.ip_address(text)), 53
    except ValueError:
        pass
    host, _, port = text.rpartition(":")
    try:
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        raise ValueError(wrong("an IP address, with :port or without (53)", text)) from None
    if not port.isdecimal() or not 1 <= int(port) <= 65535:
        raise ValueError(wrong("a port in 1-65535 after the address", text))
    return str(ip), int(port)


class FileSdConfig(_Strict):
    """Prometheus's file_sd files: JSON or YAML lists of `{targets: [...], labels: {...}}`."""

    files: Annotated[list[str], Field(min_length=1, max_length=64)]
    refresh_interval_seconds: PositiveSeconds = 60.0

    @field_validator("files")
    @classmethod
    def _patterns(cls, value: list[str]) -> list[str]:
        for pattern in value:
            if not pattern.strip() or CONTROL.search(pattern):
                raise ValueError(wrong("a path or glob pattern", pattern))
        return value


class BasicAuthConfig(_Strict):
    username: Annotated[str, Field(min_length=1, max_length=256)]
    password_env: str | None = None
    password_file: Path | None = None

    @model_validator(mode="after")
    def _one_password(self) -> Self:
        if (self.password_env is None) == (self.password_file is None):
            problem = "set one of password_env and password_file"
            raise field_error("password_env", problem, self.password_env)
        return self


class HttpSdConfig(_Strict):
    """Prometheus's HTTP SD: a GET answered 200 with the file_sd JSON list."""

    url: str
    refresh_interval_seconds: PositiveSeconds = 60.0
    timeout_seconds: PositiveSeconds = 10.0
    tls: TlsConfig = TlsConfig()
    basic_auth: BasicAuthConfig | None = None
    bearer_token_env: str | None = None
    bearer_token_file: Path | None = None
    _authorization: str | None = PrivateAttr(default=None)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        check_url(value)
        return value

    @model_validator(mode="after")
    def _one_credential(self) -> Self:
        bearers = (self.bearer_token_env is not None) + (self.bearer_token_file is not None)
        if bearers + (self.basic_auth is not None) > 1:
            raise ValueError("set one of basic_auth, bearer_token_env and bearer_token_file")
        return self

    def read_secrets(self) -> None:
        """Read the credential once and register it; `FieldError` names its field."""
        if self.basic_auth is not None:
            auth = self.basic_auth
            password = _secret("basic_auth.password", auth.password_env, auth.password_file)
            register_secret(password)
            self._authorization = _basic(auth.username, password)
        elif self.bearer_token_env is not None or self.bearer_token_file is not None:
            token = _secret("bearer_token", self.bearer_token_env, self.bearer_token_file)
            register_secret(token)
            self._authorization = f"Bearer {token}"
        if self._authorization is not None:
            register_secret(self._authorization)

    @property
    def authorization(self) -> str | None:
        """The `Authorization` header's value (after `read_secrets`), or None."""
        return self._authorization


def _basic(username: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()


def _secret(field: str, env: str | None, file: Path | None) -> str:
    """A credential from the variable or file named; `FieldError` naming `{field}_env|_file`."""
    if env is not None:
        value = os.environ.get(env, "").strip()
        if not value:
            raise FieldError(f"{field}_env", f"environment variable {env} is unset")
        where, name = f"environment variable {env}", f"{field}_env"
    else:
        assert file is not None
        name = f"{field}_file"
        try:
            value = file.read_bytes().decode("utf-8").strip()
        except OSError as exc:
            raise FieldError(name, f"cannot read {show(file)}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise FieldError(name, f"{show(file)} is not text (binary file?)") from None
        where = show(file)
    if not value or not value.isprintable() or len(value) > 4096:
        raise FieldError(name, f"the value in {where} is not one line of printable text")
    return value


class DnsConfig(_Strict):
    """A/AAAA (each address with `port`) or SRV (each record's target and port) records."""

    name: str
    type: Literal["A", "AAAA", "SRV"] = "SRV"
    port: Annotated[StrictInt, Field(ge=1, le=65535)] | None = None
    # An IP with an optional :port; unset, the system's resolver (/etc/resolv.conf).
    server: str | None = None
    refresh_interval_seconds: PositiveSeconds = 30.0
    timeout_seconds: PositiveSeconds = 5.0

    @field_validator("port", mode="before")
    @classmethod
    def _port_from_env(cls, value: object) -> object:
        return int(value) if isinstance(value, str) and value.strip().isdecimal() else value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _HOSTNAME.fullmatch(value):
            raise ValueError(wrong("a DNS name", value, shown=80))
        return value

    @field_validator("server")
    @classmethod
    def _server(cls, value: str | None) -> str | None:
        if value is not None:
            _nameserver(value)
        return value

    @model_validator(mode="after")
    def _port_for_addresses(self) -> Self:
        if self.type == "SRV" and self.port is not None:
            problem = "SRV records carry their own port: set it for type A or AAAA only"
            raise field_error("port", problem, self.port)
        if self.type != "SRV" and self.port is None:
            problem = f"required with type {self.type} (its records hold no port)"
            raise field_error("port", problem, self.port)
        return self

    @property
    def nameserver(self) -> tuple[str, int] | None:
        """`server` as (IP, port), or None for the system's resolver."""
        return _nameserver(self.server) if self.server is not None else None
