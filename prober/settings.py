"""Configuration: one validated `Settings`, from a YAML file and `LLMPROBER_*` environment.

Environment overrides the file (nested keys with `__`, e.g. `LLMPROBER_SERVER__LISTEN`; a list
item by its index, `LLMPROBER_TARGETS__0__MODEL`). Unknown keys are errors, in the file and in
the environment alike, so a typo never silently falls back to a default. `load_settings`
raises `ConfigError`, whose `problems` are one line per fault, each naming its field
(`targets[0].url: ...`). A target's API key is read from the named variable or file once,
after validation, by `TargetConfig.read_secrets`, and held in a private attribute, never a
field: it is never dumped or printed with `Settings`. A target's `load:` section is
`loadconfig.LoadConfig`; every section is built on `section.Section`.

The file and the environment are pydantic-settings sources (`YamlSource`, `EnvironmentSource`,
the latter using `model_config`'s `env_prefix` and `env_nested_delimiter`). They are built per
call by `Settings.sources(path, environ)` and handed to pydantic-settings' own `_build_sources`
argument (`Settings.from_sources`), so the path and environment reach them without global
state; a plain `Settings(...)` takes its arguments alone. The web config file is read after
validation (`ServerConfig.read_web_config`); `register_secrets` is the one place that
registers a target's credentials (its API key, its secret headers' values), once.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import ssl
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Self

import yaml
import yarl
from pydantic import (
    BaseModel,
    Field,
    PrivateAttr,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from prober.kinds import Api, Connection, Engine, EventLoopChoice, LogFormat, LogLevel
from prober.loadconfig import LoadConfig as LoadConfig  # re-exported
from prober.logs import register_secret
from prober.request import DEFAULT_TIMEOUTS, Timeouts
from prober.section import MAX_SECONDS as MAX_SECONDS  # re-exported
from prober.section import PositiveSeconds
from prober.section import Section as _Strict
from prober.section import unwrap as _unwrap
from prober.validation import bound, describe, field_error, wrong
from prober.validation import field_path as field_path  # re-exported
from prober.webconfig import WebConfig, WebConfigError, load_web_config

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
_KEY = re.compile(r"[\x21-\x7e]+")  # one token of printable ASCII: what a header can carry
# Set by the prober itself on every request; a configured one would be sent twice or win.
_RESERVED_HEADERS = frozenset(
    {"x-request-id", "accept-encoding", "content-length", "content-type", "transfer-encoding"}
)
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


class ConfigError(Exception):
    """Invalid configuration; `problems` holds one `field: message` line per fault."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class FieldError(ConfigError):
    """One fault of one field, kept apart so that a caller can name the field its own way
    (`targets[2].api_key_env`, or the `--api-key-env` flag of `probe`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__([f"{field}: {message}"])
        self.field = field
        self.message = message


class SloConfig(_Strict):
    ttft_seconds: PositiveSeconds = 2.0
    tpot_seconds: PositiveSeconds = 0.2
    e2e_seconds: PositiveSeconds | None = None
    ttfo_seconds: PositiveSeconds | None = None  # time to the first answer token


class TimeoutsConfig(_Strict):
    connect_seconds: PositiveSeconds = DEFAULT_TIMEOUTS.connect_seconds
    first_token_seconds: PositiveSeconds = DEFAULT_TIMEOUTS.first_token_seconds
    idle_seconds: PositiveSeconds = DEFAULT_TIMEOUTS.idle_seconds
    total_seconds: PositiveSeconds = DEFAULT_TIMEOUTS.total_seconds

    def timeouts(self) -> Timeouts:
        """What a request is held to (`request.Timeouts`)."""
        return Timeouts(
            self.connect_seconds, self.first_token_seconds, self.idle_seconds, self.total_seconds
        )


class TlsConfig(_Strict):
    verify: bool = True
    ca_file: Path | None = None

    @field_validator("ca_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is None:
            return None
        if not value.is_file():
            raise ValueError(f"no such file: {_show(value)}")
        try:
            ssl.create_default_context(cafile=str(value))
        except (ssl.SSLError, OSError, ValueError) as exc:
            problem = f"{_show(value)} holds no PEM certificate ({_one_line(exc)})"
            raise ValueError(problem) from None
        return value


class TrafficConfig(_Strict):
    """The shape of the engine's other requests, for the queue estimate (the probes' if unset)."""

    prompt_tokens: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None
    output_tokens: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None


class TargetConfig(_Strict):
    name: str
    url: str
    model: str
    api: Api = Api.CHAT
    interval_seconds: Annotated[float, Field(ge=0.1, le=MAX_SECONDS)] = 15.0
    jitter_seconds: Annotated[float, Field(ge=0, le=MAX_SECONDS)] = 1.0
    prompt_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 64
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 16
    warmup: Annotated[int, Field(ge=0, le=100)] = 1
    cache_bust: bool = True
    timeouts: TimeoutsConfig = TimeoutsConfig()
    headers: dict[str, str] = Field(default_factory=dict)
    # Names of `headers` whose values are credentials, redacted like the API key (names in
    # SECRET_HEADER_NAMES always are).
    secret_headers: list[str] = Field(default_factory=list)
    api_key_env: str | None = None
    api_key_file: Path | None = None
    slo: SloConfig = SloConfig()
    tls: TlsConfig = TlsConfig()
    extra_body: dict[str, Any] = Field(default_factory=dict)
    metrics_url: str | None = None
    engine: Engine | None = None
    metrics_interval_seconds: Annotated[float, Field(ge=0.5, le=MAX_SECONDS)] = 5.0
    load: LoadConfig | None = None
    # pooled: keep-alive connections are reused; fresh: every request opens its own (what a
    # new user meets: resolve, connect and TLS in every probe's phases).
    connection: Connection = "pooled"
    # The engine's parallel slots (vLLM --max-num-seqs, llama-server -np, OLLAMA_NUM_PARALLEL):
    # a hint for the queue estimate, which learns them when unset.
    slots: Annotated[StrictInt, Field(ge=1, le=100_000)] | None = None
    traffic: TrafficConfig = TrafficConfig()
    # Share of probes sent with a companion probe that joins while the first decodes: the
    # first probe's gaps before and after tell the decode slowdown of one more sequence.
    pair_share: Annotated[float, Field(ge=0, le=1)] = 0.5
    # Probes of this target in flight at once; a run due beyond it is skipped and counted.
    probes_in_flight: Annotated[StrictInt, Field(ge=1, le=16)] = 1
    _api_key: str | None = PrivateAttr(default=None)
    _secrets_read: bool = PrivateAttr(default=False)

    def read_secrets(self) -> str | None:
        """The API key, read once with the target's secrets registered (`register_secrets`).

        `load_settings` reads them after validation, so `run` sends with the key it checked;
        a target built without a file (bench, probe) is read by `Target.from_config`. A
        `FieldError` names `api_key_env` or `api_key_file`.
        """
        if not self._secrets_read:
            self._api_key = register_secrets(self)
            self._secrets_read = True
        return self._api_key

    @field_validator("slots", mode="before")
    @classmethod
    def _slots_from_env(cls, value: Any) -> Any:
        # The environment gives text: accept "4", still refuse "4.5", 4.0 and true.
        return int(value) if isinstance(value, str) and value.strip().isdigit() else value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.fullmatch(value):
            raise ValueError(wrong("1-64 of letters, digits, '_', '.', ':', '-'", value))
        return value

    @field_validator("url", "metrics_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None:
            check_url(value)
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError(wrong("a non-empty string", value))
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for key, text in value.items():
            if not _HEADER_NAME.fullmatch(key):
                raise ValueError(f"invalid header name {key!r}")
            if key.lower() == "authorization":
                # Keys come only from a variable or a file, where they are read and redacted.
                raise ValueError("set the API key with api_key_env or api_key_file, not headers")
            if key.lower() in _RESERVED_HEADERS:
                raise ValueError(f"{key} is set by the prober itself")
            if _CONTROL.search(text):  # never echo the value: it may be a credential
                raise ValueError(f"value of {key} holds a line break or control character")
        return value

    @field_validator("secret_headers")
    @classmethod
    def _secret_headers(cls, value: list[str], info: ValidationInfo) -> list[str]:
        names = {name.lower() for name in info.data.get("headers", {})}
        for name in value:
            if name.lower() not in names:
                raise ValueError(f"{_show(name)} is not one of headers")
        return value

    @field_validator("jitter_seconds")
    @classmethod
    def _jitter(cls, value: float, info: ValidationInfo) -> float:
        interval = info.data.get("interval_seconds")
        if interval is not None and value > interval:
            raise ValueError(bound("at most", f"interval_seconds ({interval:g})", value))
        return value

    @field_validator("api_key_file")
    @classmethod
    def _one_key_source(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("api_key_env"):
            raise ValueError("set api_key_env or api_key_file, not both")
        return value


class ServerConfig(_Strict):
    listen: str = "0.0.0.0:9470"
    grace_seconds: Annotated[float, Field(gt=0, le=3600)] = 10.0
    web_config_file: Path | None = None  # exporter-toolkit shape: TLS, basic auth
    event_loop: EventLoopChoice = "auto"  # auto: uvloop when installed (prober/runtime.py)
    _web: WebConfig = PrivateAttr(default_factory=WebConfig)
    _web_read: bool = PrivateAttr(default=False)

    @field_validator("event_loop")
    @classmethod
    def _event_loop(cls, value: EventLoopChoice) -> EventLoopChoice:
        if value == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError("uvloop is not installed (pip install 'llm-prober[fast]')")
        return value

    def read_web_config(self) -> None:
        """Read `web_config_file` once, after validation: the app serves what was read here."""
        if self.web_config_file is not None and not self._web_read:
            self._web = load_web_config(self.web_config_file)  # WebConfigError names the key
        self._web_read = True

    @property
    def web_config(self) -> WebConfig:
        """The validated `web_config_file` (plain HTTP, no auth when unset). Settings made
        without `load_settings` read it here, at first use: a configured file is never
        served as plain HTTP for having been skipped."""
        if not self._web_read:
            self.read_web_config()
        return self._web

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        host, sep, port = value.rpartition(":")
        if not sep or not re.fullmatch(r"[0-9]{1,5}", port) or int(port) > 65535:
            raise ValueError(wrong("HOST:PORT", value))
        if _CONTROL.search(host) or " " in host:
            raise ValueError(f"invalid host in {value!r}")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class LoggingConfig(_Strict):
    level: LogLevel = "info"
    format: LogFormat = "auto"
    log_prompts: bool = False


class ShardConfig(_Strict):
    index: Annotated[int, Field(ge=0)] = 0
    count: Annotated[int, Field(ge=1)] = 1

    @model_validator(mode="after")
    def _in_range(self) -> Self:
        if self.index >= self.count:
            problem = bound("less than", f"count ({self.count})", self.index)
            raise field_error("index", problem, self.index)
        return self


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LLMPROBER_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerConfig = ServerConfig()
    targets: list[TargetConfig]
    logging: LoggingConfig = LoggingConfig()
    shard: ShardConfig = ShardConfig()

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, targets: list[TargetConfig]) -> list[TargetConfig]:
        if not targets:
            raise ValueError("at least one target is required")
        names = [t.name for t in targets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"target names must be unique, repeated: {', '.join(dupes)}")
        return targets

    @classmethod
    def sources(
        cls, path: Path | None, environ: Mapping[str, str]
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """The file and the environment as sources, the environment first (it wins)."""
        file = YamlSource(cls, path)
        return (EnvironmentSource(cls, environ, file), file)

    @classmethod
    def from_sources(cls, sources: tuple[PydanticBaseSettingsSource, ...]) -> Self:
        """Settings from `sources` alone, in their order (the first wins)."""
        # pydantic-settings' documented `_build_sources`; pydantic's mypy plugin types
        # `__init__` by the fields alone, hence the ignore.
        return cls(_build_sources=(sources, {}))  # type: ignore[call-arg]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # A plain `Settings(...)` (the demo, tests) takes its arguments alone; `load_settings`
        # passes `Settings.sources(...)` in place of these.
        return (init_settings,)


def load_settings(path: Path | None, environ: Mapping[str, str] | None = None) -> Settings:
    """Validated settings from `path` (YAML, optional) and the environment, or `ConfigError`."""
    sources = Settings.sources(path, os.environ if environ is None else environ)
    try:
        settings = Settings.from_sources(sources)
    except ValidationError as exc:
        raise ConfigError(_with_web_problem(_problems(exc), sources[0]())) from None
    except ValueError as exc:  # YAML syntax and env JSON errors surface as ValueError
        raise ConfigError([f"config: {' '.join(str(exc).split())}"]) from None
    try:
        settings.server.read_web_config()
    except WebConfigError as exc:
        raise ConfigError([f"server.web_config_file: {exc}"]) from None
    problems = [p for i, t in enumerate(settings.targets) if (p := _secrets_problem(i, t))]
    if problems:
        raise ConfigError(problems)
    return settings


def _with_web_problem(problems: list[str], data: dict[str, Any]) -> list[str]:
    """`problems` and, in its place after the server's first fields, the web config file's.

    The file is read after validation; when validation failed its faults are still reported
    beside the others, so one run names them all.
    """
    server = data.get("server")
    value = server.get("web_config_file") if isinstance(server, dict) else None
    if not isinstance(value, str | Path) or any(
        p.startswith(("server.web_config_file:", "server:")) for p in problems
    ):
        return problems
    try:
        load_web_config(Path(value))
    except WebConfigError as exc:
        before = ("server.listen:", "server.grace_seconds:")
        at = next((i for i, p in enumerate(problems) if not p.startswith(before)), len(problems))
        return [*problems[:at], f"server.web_config_file: {exc}", *problems[at:]]
    return problems


class YamlSource(PydanticBaseSettingsSource):
    """The YAML file's mapping (empty without a file), each fault one problem line."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path | None) -> None:
        super().__init__(settings_cls)
        self.path = path
        self._data: dict[str, Any] | None = None

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, False  # unused: __call__ gives the whole

    def __call__(self) -> dict[str, Any]:
        if self._data is None:  # read once: the environment source asks for it too
            self._data = _check_yaml(self.path) if self.path is not None else {}
        return copy.deepcopy(self._data)


class EnvironmentSource(PydanticBaseSettingsSource):
    """The file's data with every variable of `env_prefix` applied over it.

    pydantic-settings merges sources key by key but replaces a list whole, so a variable that
    sets one target's field (`LLMPROBER_TARGETS__0__MODEL`) is applied here, over the file's
    data, and this source returns the merged whole (it comes first: it wins).
    """

    def __init__(
        self, settings_cls: type[BaseSettings], environ: Mapping[str, str], file: YamlSource
    ) -> None:
        super().__init__(settings_cls)
        self.environ = environ
        self.file = file
        self._data: dict[str, Any] | None = None

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return self().get(field_name), field_name, False  # unused: __call__ gives the whole

    def __call__(self) -> dict[str, Any]:
        if self._data is None:
            prefix = str(self.config.get("env_prefix", ""))
            delimiter = str(self.config.get("env_nested_delimiter") or "__")
            self._data = apply_environment(self.file(), self.environ, prefix, delimiter)
        return copy.deepcopy(self._data)


def _check_yaml(path: Path) -> dict[str, Any]:
    """The file's mapping: it exists, parses, and holds one; else one clear problem line."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError([f"config: cannot read {path}: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"config: {path} is not UTF-8 text (byte {exc.start})"]) from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError([f"config: {path} is not valid YAML{at}: {problem}"]) from None
    if data is not None and not isinstance(data, dict):
        kind = type(data).__name__
        raise ConfigError([f"config: {path} must hold a mapping (server:, targets:), not a {kind}"])
    odd = [repr(key) for key in data or {} if not isinstance(key, str)]
    if odd:  # they could not be passed on as settings
        raise ConfigError([f"config: top-level keys must be names, not {', '.join(odd)}"])
    return dict(data or {})


# Variables of the project that are not settings (the test scripts' cache folder).
NOT_SETTINGS = frozenset({"LLMPROBER_CACHE"})


def apply_environment(
    data: dict[str, Any], environ: Mapping[str, str], prefix: str, delimiter: str
) -> dict[str, Any]:
    """`data` (the file's) with every variable of `prefix` applied over it.

    `delimiter` separates keys, a number picks a list item (one past the end appends one), and a
    value for a section or a list is JSON. A variable that matches no setting is an error
    naming it, unless a target names it as its `api_key_env`.
    """
    names = sorted(
        (name for name in environ if name.upper().startswith(prefix.upper())),
        key=lambda name: (name.count(delimiter), name),
    )
    problems: list[str] = []
    unknown: list[tuple[str, str]] = []
    for name in names:
        if name.upper() in NOT_SETTINGS:
            continue
        parts = name[len(prefix) :].lower().split(delimiter)
        try:
            leaf = _env_field(parts)
        except _NoField as exc:
            unknown.append(
                (name, f"{field_path(exc.loc)}: unknown key (environment variable {name})")
            )
            continue
        try:
            _env_set(data, parts, _env_value(environ[name], leaf, name))
        except ConfigError as exc:
            problems += [f"{field_path(_loc(parts))}: {p}" for p in exc.problems]
    keys = _api_key_variables(data)
    problems += [problem for name, problem in unknown if name not in keys]
    if problems:
        raise ConfigError(problems)
    return data


class _NoField(Exception):
    def __init__(self, loc: tuple[int | str, ...]) -> None:
        self.loc = loc


def _loc(parts: list[str]) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdecimal() else p for p in parts)


def _env_field(parts: list[str]) -> Any:
    """The annotation `parts` lead to from `Settings`; `_NoField` where one matches nothing."""
    annotation: Any = Settings
    for i, part in enumerate(parts):
        annotation = _unwrap(annotation)
        origin = typing.get_origin(annotation)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(part)
            if not part or field is None:
                raise _NoField(_loc(parts[: i + 1]))
            annotation = field.annotation
        elif origin is list:
            if not part.isdecimal():
                raise _NoField(_loc(parts[: i + 1]))
            annotation = typing.get_args(annotation)[0]
        elif origin is dict:
            if not part:
                raise _NoField(_loc(parts[: i + 1]))
            annotation = typing.get_args(annotation)[1]
        elif annotation is not Any:
            raise _NoField(_loc(parts[: i + 1]))
    return _unwrap(annotation)


def _env_value(text: str, leaf: Any, name: str) -> Any:
    """A section, list or mapping as JSON; anything else as the text pydantic will parse."""
    complex_leaf = typing.get_origin(leaf) in (list, dict) or (
        isinstance(leaf, type) and issubclass(leaf, BaseModel)
    )
    if not complex_leaf:
        return text
    try:
        return json.loads(text)
    except ValueError as exc:
        raise ConfigError([f"environment variable {name} is not valid JSON ({exc})"]) from None


def _env_set(data: dict[str, Any], parts: list[str], value: Any) -> None:
    node: Any = data
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            index = int(part)
            if index > len(node):
                raise ConfigError([f"index {index} leaves a gap: there are {len(node)} items"])
            if index == len(node):
                node.append({})
            if last:
                node[index] = value
            elif not isinstance(node[index], dict | list):
                node[index] = {}
            node = node[index]
            continue
        if last:
            node[part] = value
            return
        following_is_index = parts[i + 1].isdecimal()
        kind = list if following_is_index else dict
        if not isinstance(node.get(part), kind):
            node[part] = kind()
        node = node[part]


def _api_key_variables(data: dict[str, Any]) -> set[str]:
    """Variables the configured targets read their API key from (not settings)."""
    targets = data.get("targets")
    if not isinstance(targets, list):
        return set()
    return {
        t["api_key_env"]
        for t in targets
        if isinstance(t, dict) and isinstance(t.get("api_key_env"), str)
    }


def _problems(exc: ValidationError) -> list[str]:
    return [f"{field_path(err['loc'])}: {describe(err)}" for err in exc.errors()]


def _secrets_problem(index: int, target: TargetConfig) -> str:
    try:
        target.read_secrets()
    except FieldError as exc:
        return f"targets[{index}].{exc.field}: {exc.message}"
    return ""


def register_secrets(target: TargetConfig) -> str | None:
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
        where = _show(target.api_key_file)
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
        raise FieldError("api_key_file", f"cannot read {_show(path)}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise FieldError("api_key_file", f"{_show(path)} is not text (binary file?)") from None
    if not value:
        raise FieldError("api_key_file", f"{_show(path)} is empty")
    return value


def _check_api_key(value: str, field: str, where: str) -> None:
    """A `FieldError` naming `field` unless `value` fits a header."""
    if "\n" in value or "\r" in value:
        raise FieldError(field, f"the key in {where} holds more than one line")
    if not _KEY.fullmatch(value):  # never echo the value, nor which character is wrong
        problem = "is not one token of printable ASCII (a space or control character?)"
        raise FieldError(field, f"the key in {where} {problem}")


def secret_header_values(target: TargetConfig) -> list[str]:
    """Values of the target's headers that are credentials (declared, or by their name)."""
    declared = {name.lower() for name in target.secret_headers} | SECRET_HEADER_NAMES
    return [value for name, value in target.headers.items() if name.lower() in declared]


def check_url(value: str) -> None:
    """An http(s) URL with a host, a valid port and no credentials; else ValueError."""
    if not re.match(r"https?://[^/\s]+", value) or not value.isprintable() or " " in value:
        raise ValueError(wrong("an http:// or https:// URL", value))
    try:
        url = yarl.URL(value)
        port = url.port
    except ValueError as exc:
        raise ValueError(f"invalid URL {value!r}: {exc}") from None
    if not url.host or port == 0:
        raise ValueError(f"invalid URL {value!r}: no host or port 0")
    if url.user is not None or url.password is not None:
        raise ValueError("credentials in the URL: use api_key_env, api_key_file or headers")


def _show(value: object) -> str:
    """A path or name as text for a one-line message: quoted when it holds a line break."""
    text = str(value)
    return text if text.isprintable() else repr(text)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
