"""TLS and basic auth for the daemon's own endpoints, from an exporter-toolkit web config file.

The file has the shape of Prometheus exporter-toolkit's `--web.config.file`, so one file can
serve every exporter of a deployment:

    tls_server_config:
      cert_file: server.crt        # relative paths are relative to this file
      key_file: server.key
      min_version: TLS12           # optional: TLS12 (default) | TLS13
    basic_auth_users:
      prometheus: $2b$12$...       # bcrypt hash (htpasswd -nBC 12 "" | tr -d ':')

Both sections are optional. The file is validated by pydantic models (`_WebFile`), every fault
one line naming its key. Keys that exporter-toolkit knows but llm-prober does not implement
(client certificates, cipher suites, HTTP headers) are rejected, so a file that asks for more
protection than it gets fails at start-up instead of silently serving less.

Basic auth covers every route except `/-/healthy` and `/-/ready` (fixed text, no data; kubelet
probes need them without credentials). Passwords are checked with `bcrypt.checkpw` off the
event loop, one at a time, so a flood of wrong guesses costs at most one core and never stalls
a probe's timestamps; a successful check is cached by a SHA-256 of user, password and hash,
as exporter-toolkit does, so a scrape every few seconds does not pay bcrypt's cost each time.
An unknown user is checked against a dummy hash of the highest configured cost, so response
time does not reveal which users exist. At most MAX_WAITING_CHECKS checks wait for the
worker; beyond that a request is answered 429 at once (a cached right password still passes).
An encrypted TLS key is refused at load time (OpenSSL would otherwise prompt on the terminal).
"""

from __future__ import annotations

import asyncio
import binascii
import hashlib
import re
import ssl
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Self

import bcrypt
import yaml
from aiohttp import BasicAuth, web
from aiohttp.typedefs import Handler, Middleware
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic_core import ErrorDetails

from prober.validation import STRICT, describe, field_error, field_path, one_of

OPEN_PATHS = frozenset({"/-/healthy", "/-/ready"})
REALM = "llm-prober"
_BCRYPT = re.compile(r"^\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$")
_UNSUPPORTED_TLS = {
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "cipher_suites",
    "curve_preferences",
    "max_version",
    "prefer_server_cipher_suites",
    "cert",
    "key",
}
_SHAPES = {
    "tls_server_config": "a mapping with cert_file and key_file",
    "basic_auth_users": "a mapping of user name to bcrypt hash",
}
_MIN_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_HASH_FORMS = "($2a$, $2b$ or $2y$, cost 4-31)"
_CACHE_SIZE = 256
# Checks waiting for the one bcrypt worker; beyond it a request is answered 429 at once, so
# a flood of guesses cannot hold a scrape with the right password for seconds.
MAX_WAITING_CHECKS = 4


def dummy_hash(users: Mapping[str, bytes]) -> bytes:
    """A well-formed hash at the highest cost in `users`: checking an unknown user against it
    costs what a known user's check costs, so timing does not tell which users exist."""
    cost = max((int(hashed[4:6]) for hashed in users.values()), default=10)
    return b"$2b$%02d$" % cost + b"." * 53


class AuthBusy(Exception):
    """More than MAX_WAITING_CHECKS password checks are waiting."""


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> bytes:
    raise _EncryptedKey


class WebConfigError(ValueError):
    """An invalid web config file; `problems` holds one line per fault, each naming its key."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class WebConfig:
    """The validated file: TLS files (both or neither) and bcrypt hashes by user name."""

    cert_file: Path | None = None
    key_file: Path | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    users: Mapping[str, bytes] = field(default_factory=dict)

    @property
    def tls(self) -> bool:
        return self.cert_file is not None

    def ssl_context(self) -> ssl.SSLContext | None:
        """A server-side context, or None when the file asks for plain HTTP."""
        if self.cert_file is None or self.key_file is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = self.min_version
        # Without a callback OpenSSL would prompt on the terminal for an encrypted key.
        context.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)
        return context

    def middlewares(self) -> list[Middleware]:
        return [BasicAuthMiddleware(self.users)] if self.users else []


def load_web_config(path: Path) -> WebConfig:
    """Read and validate `path`; raise `WebConfigError` listing every problem."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise WebConfigError([f"cannot read {_show(path)}: {exc.strerror}"]) from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        raise WebConfigError([f"{_show(path)} is not valid YAML{at}"]) from None
    if data is None:
        return WebConfig()
    if not isinstance(data, dict):
        raise WebConfigError([f"{_show(path)} must hold a mapping, not a {type(data).__name__}"])
    try:
        file = _WebFile.model_validate(data, context={"base": path.parent})
    except ValidationError as exc:
        # Unknown keys first, outermost first: a misspelt key explains the faults that follow.
        errors = sorted(exc.errors(), key=_unknown_keys_first)
        # A bad user name is the one fault of its entry, whatever its hash.
        bad_users = {err["loc"][:2] for err in errors if err["loc"][-1:] == ("[key]",)}
        kept = [
            err for err in errors if err["loc"][-1:] == ("[key]",) or err["loc"] not in bad_users
        ]
        raise WebConfigError([_problem(err) for err in kept]) from None
    return file.web_config()


def _unknown_keys_first(err: ErrorDetails) -> tuple[int, int]:
    unknown = err["type"] in ("extra_forbidden", "invalid_key")
    return (0, len(err["loc"])) if unknown else (1, 0)


def _problem(err: ErrorDetails) -> str:
    loc, kind = err["loc"], err["type"]
    if loc[-1:] == ("[key]",):  # a user name of basic_auth_users
        return f"{field_path(loc[:1])}: user names must be non-empty strings without ':'"
    where = field_path(loc)
    if (
        kind == "extra_forbidden"
        and loc[:1] == ("tls_server_config",)
        and loc[-1] in _UNSUPPORTED_TLS
    ):
        return f"{where}: not supported by llm-prober"
    if kind in ("extra_forbidden", "invalid_key"):  # a key of any type, by its text
        return f"{field_path(tuple(map(str, loc)))}: unknown key"
    if kind == "missing":  # only the TLS files are required
        return f"{where}: required (a file path)"
    if kind in ("model_type", "dict_type") and where in _SHAPES:
        return f"{where}: must be {_SHAPES[where]}"
    return f"{where}: {describe(err)}"


def _file(value: Any, info: ValidationInfo) -> Path:
    """A TLS file, relative to the web config file, that exists."""
    if not isinstance(value, str) or not value:
        raise ValueError("required (a file path)")
    base: Path = (info.context or {}).get("base", Path())  # load_web_config passes the folder
    file = base / value
    if not file.is_file():
        raise ValueError(f"no such file: {_show(file)}")
    return file


def _min_version(value: Any) -> ssl.TLSVersion:
    if not isinstance(value, str) or value not in _MIN_VERSIONS:
        raise ValueError(one_of(_MIN_VERSIONS, value))
    return _MIN_VERSIONS[value]


def _user(name: str) -> str:
    if not name or ":" in name:
        raise ValueError("user names must be non-empty strings without ':'")
    return name


def _bcrypt_hash(value: Any) -> str:
    # Never echo the value: a plain password pasted here by mistake must not be logged.
    if not isinstance(value, str) or not _BCRYPT.match(value):
        raise ValueError(f"not a bcrypt hash {_HASH_FORMS}")
    return value


class _Tls(BaseModel):
    """`tls_server_config` as written: both files, relative to the web config file."""

    model_config = STRICT

    cert_file: Annotated[Path, BeforeValidator(_file)]
    key_file: Annotated[Path, BeforeValidator(_file)]
    min_version: Annotated[ssl.TLSVersion, BeforeValidator(_min_version)] = ssl.TLSVersion.TLSv1_2

    @model_validator(mode="after")
    def _loads(self) -> Self:
        try:
            WebConfig(self.cert_file, self.key_file, self.min_version).ssl_context()
        except _EncryptedKey:
            reason = "passphrase-protected keys are not supported"
            raise field_error("key_file", reason, self.key_file) from None
        except (ssl.SSLError, OSError, ValueError) as exc:
            reason = " ".join(str(exc).split())
            raise ValueError(f"cannot load cert_file/key_file: {reason}") from None
        return self


class _WebFile(BaseModel):
    """The file as written; `web_config()` is what the daemon serves with."""

    model_config = STRICT

    tls_server_config: _Tls | None = None
    basic_auth_users: (
        dict[Annotated[str, AfterValidator(_user)], Annotated[str, BeforeValidator(_bcrypt_hash)]]
        | None
    ) = None

    def web_config(self) -> WebConfig:
        tls = self.tls_server_config
        users = {user: hashed.encode() for user, hashed in (self.basic_auth_users or {}).items()}
        if tls is None:
            return WebConfig(users=users)
        return WebConfig(tls.cert_file, tls.key_file, tls.min_version, users)


def _show(value: object) -> str:
    """A path or key as text for a one-line message: quoted when it holds a line break."""
    text = str(value)
    return text if text.isprintable() else repr(text)


class BasicAuthMiddleware:
    """aiohttp middleware: HTTP basic auth against bcrypt hashes (see the module docstring)."""

    __middleware_version__ = 1  # what `@web.middleware` marks: a new-style middleware

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self._users = dict(users)
        self._dummy = dummy_hash(self._users)
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._lock = asyncio.Lock()
        self._waiting = 0

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            allowed = request.path in OPEN_PATHS or await self._allowed(request)
        except AuthBusy:
            raise web.HTTPTooManyRequests(
                text="429 Too Many Requests: password checks queued\n",
                headers={"Retry-After": "1"},
            ) from None
        if allowed:
            return await handler(request)
        raise web.HTTPUnauthorized(
            text="401 Unauthorized\n",
            headers={"WWW-Authenticate": f'Basic realm="{REALM}", charset="UTF-8"'},
        )

    async def _allowed(self, request: web.Request) -> bool:
        header = request.headers.get("Authorization", "")
        try:
            auth = BasicAuth.decode(header, encoding="utf-8")
        except (ValueError, binascii.Error):
            return False
        return await self.check(auth.login, auth.password)

    async def check(self, user: str, password: str) -> bool:
        """True when `password` matches `user`'s hash; every miss costs one bcrypt check.

        Raises `AuthBusy` instead of queueing behind MAX_WAITING_CHECKS others.
        """
        hashed = self._users.get(user)
        known = hashed is not None
        hashed = hashed if hashed is not None else self._dummy
        secret = password.encode()
        key = hashlib.sha256(b"\0".join((user.encode(), secret, hashed))).digest()
        if key in self._verified:
            self._verified.move_to_end(key)
            return True
        # One check at a time: guesses queue here instead of taking every core.
        if self._waiting >= MAX_WAITING_CHECKS:
            raise AuthBusy
        self._waiting += 1
        try:
            async with self._lock:
                ok = await asyncio.to_thread(_checkpw, secret, hashed)
        finally:
            self._waiting -= 1
        if ok and known:
            self._verified[key] = None
            if len(self._verified) > _CACHE_SIZE:
                self._verified.popitem(last=False)
        return ok and known


def _checkpw(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # a password over bcrypt's 72 bytes can never have been hashed
        return False


class LiveWebConfig:
    """The web config served now, swapped by a reload: the users for the next request, the
    TLS files and minimum version for the next connection (loaded into the one server-side
    context the listener holds). Turning TLS on or off needs a restart (`restart_needed`).

    It is the app's one middleware, always installed, so a reload can add basic auth to a
    daemon that started without it."""

    __middleware_version__ = 1  # what `@web.middleware` marks: a new-style middleware

    def __init__(self, config: WebConfig) -> None:
        self.config = config
        self.ssl_context = config.ssl_context()
        self._auth = BasicAuthMiddleware(config.users) if config.users else None

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        auth = self._auth
        if auth is None:
            return await handler(request)
        return await auth(request, handler)

    def restart_needed(self, new: WebConfig) -> str | None:
        """Why `new` cannot be served without a restart, or None."""
        if new.tls != self.config.tls:
            turned = "on" if new.tls else "off"
            return f"server.web_config_file: TLS turned {turned}"
        return None

    def swap(self, new: WebConfig) -> None:
        """Serve `new` from now (checked by `restart_needed` and validated when loaded)."""
        if self.ssl_context is not None and new.cert_file and new.key_file:
            self.ssl_context.load_cert_chain(new.cert_file, new.key_file, password=_no_passphrase)
            self.ssl_context.minimum_version = new.min_version
        if dict(new.users) != dict(self.config.users):
            self._auth = BasicAuthMiddleware(new.users) if new.users else None
        self.config = new
