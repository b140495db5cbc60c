"""Configuration: one validated `Settings`, from a YAML file and `LLMPROBER_*` environment.

Environment overrides the file (nested keys with `__`, e.g. `LLMPROBER_SERVER__LISTEN`).
Unknown keys are errors, so a typo never silently falls back to a default. `load_settings`
raises `ConfigError`, whose `problems` are one line per fault, each naming its field
(`targets[0].url: ...`). API keys are read from the named variable or file only when needed,
by `resolve_api_key`, and never stored in `Settings`.
"""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, Self

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from prober.logs import register_secret
from prober.request import Api
from prober.runtime import EventLoopChoice
from prober.webconfig import load_web_config

PositiveSeconds = Annotated[float, Field(gt=0)]
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")


class ConfigError(Exception):
    """Invalid configuration; `problems` holds one `field: message` line per fault."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SloConfig(_Strict):
    ttft_seconds: PositiveSeconds = 2.0
    tpot_seconds: PositiveSeconds = 0.2
    e2e_seconds: PositiveSeconds | None = None


class TimeoutsConfig(_Strict):
    connect_seconds: PositiveSeconds = 5.0
    first_token_seconds: PositiveSeconds = 60.0
    idle_seconds: PositiveSeconds = 30.0
    total_seconds: PositiveSeconds = 300.0


class TlsConfig(_Strict):
    verify: bool = True
    ca_file: Path | None = None

    @field_validator("ca_file")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value


class LoadConfig(_Strict):
    """Open-loop background load: arrivals on an absolute schedule, capped in flight."""

    rate: Annotated[float, Field(gt=0, le=10_000)]
    arrival: Literal["poisson", "constant"] = "poisson"
    max_in_flight: Annotated[int, Field(ge=1, le=100_000)] = 64
    prompt_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    prompt_tokens_spread: Annotated[float, Field(ge=0, lt=1)] = 0.0
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    max_tokens_spread: Annotated[float, Field(ge=0, lt=1)] = 0.0
    seed: int | None = None


class TrafficConfig(_Strict):
    """The shape of the engine's other requests, for the queue estimate (the probes' if unset)."""

    prompt_tokens: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None
    output_tokens: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None


class TargetConfig(_Strict):
    name: str
    url: str
    model: str
    api: Api = Api.CHAT
    interval_seconds: Annotated[float, Field(ge=0.1)] = 15.0
    jitter_seconds: Annotated[float, Field(ge=0)] = 1.0
    prompt_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 64
    max_tokens: Annotated[int, Field(ge=1, le=1_000_000)] = 16
    warmup: Annotated[int, Field(ge=0, le=100)] = 1
    cache_bust: bool = True
    timeouts: TimeoutsConfig = TimeoutsConfig()
    headers: dict[str, str] = {}
    api_key_env: str | None = None
    api_key_file: Path | None = None
    slo: SloConfig = SloConfig()
    tls: TlsConfig = TlsConfig()
    extra_body: dict[str, Any] = {}
    metrics_url: str | None = None
    engine: Literal["vllm", "llamacpp", "sglang", "tgi"] | None = None
    metrics_interval_seconds: Annotated[float, Field(ge=0.5)] = 5.0
    load: LoadConfig | None = None
    # The engine's parallel slots (vLLM --max-num-seqs, llama-server -np, OLLAMA_NUM_PARALLEL):
    # a hint for the queue estimate, which learns them when unset.
    slots: Annotated[StrictInt, Field(ge=1, le=100_000)] | None = None
    traffic: TrafficConfig = TrafficConfig()
    # Share of probes sent with a companion probe that joins while the first decodes: the
    # first probe's gaps before and after tell the decode slowdown of one more sequence.
    pair_share: Annotated[float, Field(ge=0, le=1)] = 0.5
    # Probes of this target in flight at once; a run due beyond it is skipped and counted.
    probes_in_flight: Annotated[StrictInt, Field(ge=1, le=16)] = 1

    @field_validator("slots", mode="before")
    @classmethod
    def _slots_from_env(cls, value: Any) -> Any:
        # The environment gives text: accept "4", still refuse "4.5", 4.0 and true.
        return int(value) if isinstance(value, str) and value.strip().isdigit() else value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError("must be 1-64 of letters, digits, '_', '.', ':', '-'")
        return value

    @field_validator("url", "metrics_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^/\s]+", value):
            raise ValueError(f"must be an http:// or https:// URL, got {value!r}")
        return value

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.match(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$", key):
                raise ValueError(f"invalid header name {key!r}")
            if key.lower() == "authorization":
                # Keys come only from a variable or a file, where they are read and redacted.
                raise ValueError("set the API key with api_key_env or api_key_file, not headers")
        return value

    @field_validator("jitter_seconds")
    @classmethod
    def _jitter(cls, value: float, info: ValidationInfo) -> float:
        interval = info.data.get("interval_seconds")
        if interval is not None and value > interval:
            raise ValueError(f"must not exceed interval_seconds ({interval:g})")
        return value

    @field_validator("api_key_file")
    @classmethod
    def _one_key_source(cls, value: Path | None, info: ValidationInfo) -> Path | None:
        if value is not None and info.data.get("api_key_env"):
            raise ValueError("set api_key_env or api_key_file, not both")
        return value


class ServerConfig(_Strict):
    listen: str = "0.0.0.0:9470"
    grace_seconds: PositiveSeconds = 10.0
    web_config_file: Path | None = None  # exporter-toolkit shape: TLS, basic auth
    event_loop: EventLoopChoice = "auto"  # auto: uvloop when installed (prober/runtime.py)

    @field_validator("event_loop")
    @classmethod
    def _event_loop(cls, value: EventLoopChoice) -> EventLoopChoice:
        if value == "uvloop" and importlib.util.find_spec("uvloop") is None:
            raise ValueError("uvloop is not installed (pip install 'llm-prober[fast]')")
        return value

    @field_validator("web_config_file")
    @classmethod
    def _web_config(cls, value: Path | None) -> Path | None:
        if value is not None:
            load_web_config(value)  # WebConfigError is a ValueError naming the key at fault
        return value

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        _, sep, port = value.rpartition(":")
        if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"must be HOST:PORT, got {value!r}")
        return value

    @property
    def host(self) -> str:
        return self.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"

    @property
    def port(self) -> int:
        return int(self.listen.rpartition(":")[2])


class LoggingConfig(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["auto", "json", "console"] = "auto"
    log_prompts: bool = False


class ShardConfig(_Strict):
    index: Annotated[int, Field(ge=0)] = 0
    count: Annotated[int, Field(ge=1)] = 1

    @model_validator(mode="after")
    def _in_range(self) -> Self:
        if self.index >= self.count:
            raise ValueError(f"index {self.index} must be below count {self.count}")
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
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Earlier sources win: explicit arguments, then the environment, then the YAML file.
        return init_settings, env_settings, YamlConfigSettingsSource(settings_cls)


def load_settings(path: Path | None) -> Settings:
    """Validated settings from `path` (YAML, optional) and the environment, or `ConfigError`."""
    if path is not None:
        _check_yaml(path)

    class _FromFile(Settings):
        model_config = SettingsConfigDict(yaml_file=path)

    try:
        settings = _FromFile()  # type: ignore[call-arg]
    except ValidationError as exc:
        raise ConfigError(_problems(exc)) from None
    except ValueError as exc:  # YAML syntax and env JSON errors surface as ValueError
        raise ConfigError([f"config: {' '.join(str(exc).split())}"]) from None
    problems = [p for i, t in enumerate(settings.targets) if (p := _api_key_problem(i, t))]
    if problems:
        raise ConfigError(problems)
    return settings


def _check_yaml(path: Path) -> None:
    """The file exists, parses, and holds a mapping; else one clear problem line."""
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
    if odd:  # pydantic-settings would fail on them with an AttributeError
        raise ConfigError([f"config: top-level keys must be names, not {', '.join(odd)}"])


def _problems(exc: ValidationError) -> list[str]:
    return [f"{field_path(err['loc'])}: {_message(err)}" for err in exc.errors()]


def _message(err: Any) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "missing":
        return "required"
    if err["type"] == "extra_forbidden":
        return "unknown key"
    return msg


def field_path(loc: tuple[int | str, ...]) -> str:
    """('targets', 0, 'url') → 'targets[0].url'."""
    out = ""
    for part in loc:
        name = str(part) if str(part).isprintable() else repr(part)  # keep one problem one line
        out += f"[{part}]" if isinstance(part, int) else (f".{name}" if out else name)
    return out or "config"


def _api_key_problem(index: int, target: TargetConfig) -> str:
    try:
        resolve_api_key(target)
    except ConfigError as exc:
        return f"targets[{index}].{exc.problems[0]}"
    return ""


def resolve_api_key(target: TargetConfig) -> str | None:
    """The API key's value, from the environment variable or file the target names."""
    if target.api_key_env:
        value = os.environ.get(target.api_key_env)
        if not value:
            raise ConfigError([f"api_key_env: environment variable {target.api_key_env} is unset"])
        register_secret(value.strip())
        return value.strip()
    if target.api_key_file:
        try:
            value = target.api_key_file.read_text().strip()
        except OSError as exc:
            problem = f"api_key_file: cannot read {target.api_key_file}: {exc.strerror}"
            raise ConfigError([problem]) from None
        if not value:
            raise ConfigError([f"api_key_file: {target.api_key_file} is empty"])
        register_secret(value)
        return value
    return None
