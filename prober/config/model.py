"""The whole configuration: one validated `Settings`, built once by `load_settings`.

`load_settings` reads the YAML file and the `LLMPROBER_*` environment through pydantic-settings
sources (`prober.config.sources`), built per call by `Settings.sources(path, environ)` and
handed to pydantic-settings' own `_build_sources` argument (`Settings.from_sources`), so the
path and environment reach them without global state; a plain `Settings(...)` takes its
arguments alone. After validation it reads what the models hold no field for: the web config
file (`ServerConfig.read_web_config`) and each target's secrets (`TargetConfig.read_secrets`).
Every fault of every field is reported, one `field: message` line each, in one `ConfigError`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from prober.config.errors import ConfigError, FieldError
from prober.config.group import TargetGroupConfig
from prober.config.server import LoggingConfig, ServerConfig, ShardConfig
from prober.config.sources import EnvironmentSource, YamlSource, model_at
from prober.config.target import TargetConfig
from prober.validation import describe, field_error, field_path
from prober.webconfig import WebConfigError, load_web_config


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="LLMPROBER_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerConfig = ServerConfig()
    targets: list[TargetConfig] = Field(default_factory=list)
    # Discovered targets (`prober.discovery`): a source and a template each.
    target_groups: list[TargetGroupConfig] = Field(default_factory=list)
    logging: LoggingConfig = LoggingConfig()
    shard: ShardConfig = ShardConfig()

    @field_validator("targets")
    @classmethod
    def _unique_names(cls, targets: list[TargetConfig]) -> list[TargetConfig]:
        _unique("target", [t.name for t in targets])
        return targets

    @field_validator("target_groups")
    @classmethod
    def _unique_groups(cls, groups: list[TargetGroupConfig]) -> list[TargetGroupConfig]:
        _unique("group", [g.group for g in groups])
        return groups

    @model_validator(mode="after")
    def _gateways_are_static_targets(self) -> Self:
        """A group's `gateway` names a static target, the gateway of no other group: its one
        info series carries the group (docs/design.md §10)."""
        static = {t.name for t in self.targets}
        taken: dict[str, str] = {}
        for i, group in enumerate(self.target_groups):
            name = group.gateway
            if name is None:
                continue
            if name not in static:
                problem = f"names no target of targets: (a gateway is a static target): {name!r}"
                raise field_error(f"target_groups[{i}].gateway", problem, name)
            if name in taken:
                problem = f"{name!r} is already the gateway of group {taken[name]!r}"
                raise field_error(f"target_groups[{i}].gateway", problem, name)
            taken[name] = group.group
        return self

    @model_validator(mode="after")
    def _something_to_probe(self) -> Self:
        if not self.targets and not self.target_groups:
            problem = "at least one target is required (or a target_groups entry)"
            raise field_error("targets", problem, [])
        return self

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
    problems = [
        problem
        for key, items in (("targets", settings.targets), ("target_groups", settings.target_groups))
        for i, target in enumerate(items)
        if (problem := _secrets_problem(f"{key}[{i}]", target))
    ]
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


def _problems(exc: ValidationError) -> list[str]:
    return [f"{field_path(err['loc'])}: {describe(err, _shape(err))}" for err in exc.errors()]


def _shape(err: ErrorDetails) -> type[BaseModel] | None:
    """The section a fault's hint comes from: the one an unknown key was given in, or the one
    a value that is no mapping should have been (`validation.describe`)."""
    loc = err["loc"]
    return model_at(Settings, loc[:-1] if err["type"] == "extra_forbidden" else loc)


def _secrets_problem(where: str, target: TargetConfig) -> str:
    try:
        target.read_secrets()
    except FieldError as exc:
        return f"{where}.{exc.field}: {exc.message}"
    return ""


def _unique(what: str, names: list[str]) -> None:
    """ValueError naming the repeated ones where `names` are not unique."""
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"{what} names must be unique, repeated: {', '.join(dupes)}")
