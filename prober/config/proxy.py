"""A target's forward proxy (`proxy:`): which one its requests go through, if any.

`proxy.url` names one (an `http://host:port` forward proxy; TLS targets go through it with
CONNECT), with credentials from `auth_env` or `auth_file` ("user:password"), never in the URL.
Without it, and unless `from_env: false`, the standard variables decide as curl's do:
`HTTPS_PROXY` for an https target, `HTTP_PROXY` for an http one (either case), none for a
host `NO_PROXY` lists. They are read once, when the target is built (`Target.from_config`):
`resolve` here, the credentials read and registered in `config.secrets` (the one place).

Resolution is explicit, per target, not aiohttp's `trust_env`: that also reads `~/.netrc`
and would send its credentials to the probed hosts, and it cannot be turned off per target.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import yarl
from pydantic import ValidationInfo, field_validator

from prober.section import Section
from prober.validation import wrong


class ProxyConfig(Section):
    """Which proxy a target's requests go through; by default the environment's."""

    url: str | None = None
    from_env: bool = True
    auth_env: str | None = None
    auth_file: Path | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, value: str | None) -> str | None:
        if value is not None:
            check_proxy_url(value)
        return value

    @field_validator("auth_env", "auth_file")
    @classmethod
    def _auth(cls, value: str | Path | None, info: ValidationInfo) -> str | Path | None:
        if value is None:
            return None
        if info.data.get("url") is None:
            raise ValueError("no proxy to send it to: set proxy.url too")
        if info.field_name == "auth_file" and info.data.get("auth_env"):
            raise ValueError("set auth_env or auth_file, not both")
        return value


def check_proxy_url(value: str) -> None:
    """An `http://host:port` URL without credentials, path or query; else ValueError."""
    try:
        url = yarl.URL(value)
        port = url.port
    except ValueError as exc:
        raise ValueError(f"invalid URL {value[:80]!r}: {exc}") from None
    if url.scheme != "http" or not url.host or not port or not value.isprintable():
        raise ValueError(wrong("an http://HOST:PORT forward proxy", value, shown=80))
    if url.user is not None or url.password is not None:
        raise ValueError("credentials in the URL: set proxy.auth_env or proxy.auth_file")
    if url.path not in ("", "/") or url.query_string or url.fragment:
        raise ValueError(wrong("a proxy URL without a path or query", value, shown=80))


@dataclass(frozen=True, slots=True)
class ProxyChoice:
    """The proxy a target's requests go through: its URL without credentials (what errors
    and logs name), and where it was set (`proxy.url`, or the variable's name)."""

    url: str
    source: str


def resolve(
    cfg: ProxyConfig, target_url: str, environ: Mapping[str, str] | None = None
) -> tuple[ProxyChoice, str] | None:
    """The proxy for requests to `target_url`, and the URL as given (credentials and all,
    for `config.secrets` to take apart); None to go direct. A ValueError names what is wrong
    with a variable's value."""
    if cfg.url is not None:
        return ProxyChoice(str(yarl.URL(cfg.url).origin()), "proxy.url"), cfg.url
    if not cfg.from_env:
        return None
    env = os.environ if environ is None else environ
    found = _from_environment(target_url, env)
    if found is None:
        return None
    name, given = found
    raw = given if "://" in given else f"http://{given}"  # `proxy:3128`, as curl reads it
    try:
        url = yarl.URL(raw)
        check_proxy_url(str(url.with_user(None)))
    except ValueError as exc:
        raise ValueError(f"environment variable {name}: {exc}") from None
    return ProxyChoice(str(url.origin()), name), raw


def _from_environment(target_url: str, env: Mapping[str, str]) -> tuple[str, str] | None:
    """(variable, value) of the proxy the environment gives `target_url`, or None: lower
    case first, as curl and urllib read them; none for a host `NO_PROXY` lists."""
    url = yarl.URL(target_url)
    scheme = "https" if url.scheme == "https" else "http"
    for name in (f"{scheme}_proxy", f"{scheme.upper()}_PROXY"):
        if value := env.get(name, "").strip():
            break
    else:
        return None
    no_proxy = env.get("no_proxy") or env.get("NO_PROXY") or ""
    if bypassed(url.host or "", url.port, no_proxy):
        return None
    return name, value


def bypassed(host: str, port: int | None, no_proxy: str) -> bool:
    """Whether `NO_PROXY` (comma-separated) lists `host`, as curl reads it: `*` for every
    host; a name for itself and its subdomains (a leading dot or not); an address or a CIDR
    block (`10.0.0.0/8`); any of them with `:PORT` for that port only."""
    host = host.strip("[]").lower().rstrip(".")
    for entry in (e.strip().lower() for e in no_proxy.split(",")):
        if entry == "*":
            return True
        name, _, only = entry.rpartition(":") if _has_port(entry) else (entry, "", "")
        if only and str(port) != only:
            continue
        name = name.strip("[]").lstrip(".").rstrip(".")
        if name and (host == name or host.endswith("." + name) or _in_block(host, name)):
            return True
    return False


def _has_port(entry: str) -> bool:
    """`host:port` or `[v6]:port`, not a bare IPv6 address."""
    head, sep, tail = entry.rpartition(":")
    return bool(sep) and tail.isdigit() and (head.endswith("]") or ":" not in head)


def _in_block(host: str, block: str) -> bool:
    try:
        return ipaddress.ip_address(host) in ipaddress.ip_network(block, strict=False)
    except ValueError:
        return False
