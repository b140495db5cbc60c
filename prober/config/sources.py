"""The YAML file and the `LLMPROBER_*` environment as pydantic-settings sources.

`YamlSource` reads the file once (each fault one problem line); `EnvironmentSource` applies
every variable of the model's `env_prefix` over the file's data (nested keys with
`env_nested_delimiter`, a list item by its index) and returns the merged whole: it comes
first, so it wins. pydantic-settings' own `EnvSettingsSource` takes no list index in a
variable's name, hence this source. A variable that matches no setting is an error naming it.

Both are bounded before they are parsed, and again after, wherever they come from: the file
is read only if it is a regular file of at most `MAX_FILE_BYTES` (a FIFO or a device is
refused, never opened for a blocking read), a variable holds at most `MAX_VARIABLE_CHARS`,
and what either parses to holds at most `MAX_VALUES` values nested at most `MAX_DEPTH` deep
(YAML aliases counted as expanded: a document of a few aliases can stand for a billion values).
List indices in variables' names are ordered as numbers (`TARGETS__10` after `TARGETS__9`).
"""

from __future__ import annotations

import copy
import json
import os
import stat
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

from prober.config.errors import ConfigError
from prober.section import unwrap as _unwrap
from prober.validation import field_path, show, unknown_key

# A configuration of 500 static targets is about 150 kB; the bounds leave room past that and
# refuse, before any parsing, what no configuration needs (a 27 MB schedule took 3.7 GB).
MAX_FILE_BYTES = 4 << 20
MAX_VARIABLE_CHARS = 64 << 10
MAX_VALUES = 200_000
MAX_DEPTH = 32
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's where built with it


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
            self._data = apply_environment(
                self.settings_cls, self.file(), self.environ, prefix, delimiter
            )
        return copy.deepcopy(self._data)


def _read_bounded(path: Path) -> str:
    """The file's text, where it is a regular file within `MAX_FILE_BYTES`; else one line."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError([f"config: {show(path)} is not a regular file"])
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigError([
                f"config: {show(path)} is {info.st_size} bytes, over the {MAX_FILE_BYTES} a "
                "configuration may hold"
            ])  # fmt: skip
        data = os.read(fd, MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:  # it grew while read
        raise ConfigError([f"config: {show(path)} is over the {MAX_FILE_BYTES} bytes allowed"])
    return data.decode("utf-8")


def bounded(value: Any, where: str) -> None:
    """ConfigError in one line where `value` holds more than `MAX_VALUES` values or nests
    deeper than `MAX_DEPTH`, each shared (aliased) value counted every time it appears."""
    count = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError([f"{where} holds more than {MAX_VALUES} values"])
        if isinstance(node, dict | list):
            if depth > MAX_DEPTH:
                raise ConfigError([f"{where} nests deeper than {MAX_DEPTH} levels"])
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)


def _check_yaml(path: Path) -> dict[str, Any]:
    """The file's mapping: it exists, parses, and holds one; else one clear problem line."""
    try:
        data = yaml.load(_read_bounded(path), Loader=_Loader)  # a safe loader
    except RecursionError:
        raise ConfigError([f"config: {show(path)} nests deeper than {MAX_DEPTH} levels"]) from None
    except OSError as exc:
        raise ConfigError([f"config: cannot read {path}: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"config: {path} is not UTF-8 text (byte {exc.start})"]) from None
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ConfigError([f"config: {path} is not valid YAML{at}: {problem}"]) from None
    bounded(data, f"config: {show(path)}")
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
    root: type[BaseModel],
    data: dict[str, Any],
    environ: Mapping[str, str],
    prefix: str,
    delimiter: str,
) -> dict[str, Any]:
    """`data` (the file's) with every variable of `prefix` applied over it, the variables'
    names read as the fields of `root` (the settings' model).

    `delimiter` separates keys, a number picks a list item (one past the end appends one), and a
    value for a section or a list is JSON. A variable that matches no setting is an error
    naming it, unless a target names it as its `api_key_env`.
    """
    names = sorted(
        (name for name in environ if name.upper().startswith(prefix.upper())),
        key=lambda name: _order(name, delimiter),
    )
    problems: list[str] = []
    unknown: list[tuple[str, str]] = []
    for name in names:
        if name.upper() in NOT_SETTINGS:
            continue
        parts = name[len(prefix) :].lower().split(delimiter)
        try:
            leaf = annotation_at(root, _loc(parts))
        except _NoField as exc:
            problem = unknown_key(str(exc.loc[-1]), exc.known)
            unknown.append(
                (name, f"{field_path(exc.loc)}: {problem} (environment variable {show(name)})")
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


def _order(name: str, delimiter: str) -> tuple[int, tuple[tuple[int, int, str], ...]]:
    """Shallow names first, list indices as numbers: `__2__` before `__10__`."""
    parts = name.split(delimiter)
    return len(parts), tuple((0, int(p), "") if p.isdecimal() else (1, 0, p) for p in parts)


class _NoField(Exception):
    """`loc` leads nowhere; `known`: the keys its last part could have been."""

    def __init__(self, loc: tuple[int | str, ...], known: Iterable[str] = ()) -> None:
        self.loc = loc
        self.known = list(known)


def _loc(parts: list[str]) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdecimal() else p for p in parts)


def annotation_at(root: type[BaseModel], loc: Sequence[int | str]) -> Any:
    """The annotation `loc` leads to from `root` (a field by its name, a list item by its
    index, a mapping's value by its key); `_NoField` where a part matches nothing."""
    annotation: Any = root
    for i, part in enumerate(loc):
        annotation = _unwrap(annotation)
        origin = typing.get_origin(annotation)
        model = _model(annotation)
        if model is not None:
            field = model.model_fields.get(str(part))
            if part == "" or field is None:
                raise _NoField(tuple(loc[: i + 1]), model.model_fields)
            annotation = field.annotation
        elif origin is list:
            if not str(part).isdecimal():
                raise _NoField(tuple(loc[: i + 1]))
            annotation = typing.get_args(annotation)[0]
        elif origin is dict:
            if part == "":
                raise _NoField(tuple(loc[: i + 1]))
            annotation = typing.get_args(annotation)[1]
        elif annotation is not Any:
            raise _NoField(tuple(loc[: i + 1]))
    return _unwrap(annotation)


def model_at(root: type[BaseModel], loc: Sequence[int | str]) -> type[BaseModel] | None:
    """The section `loc` leads to from `root`, if it leads to one."""
    try:
        return _model(annotation_at(root, loc))
    except _NoField:
        return None


def _model(annotation: Any) -> type[BaseModel] | None:
    """The section an annotation holds: itself, or the one section of a union (`traffic`)."""
    members = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    models = [m for m in members if isinstance(m, type) and issubclass(m, BaseModel)]
    return models[0] if len(models) == 1 else None


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _env_value(text: str, leaf: Any, name: str) -> Any:
    """A section, list or mapping as JSON; anything else as the text pydantic will parse."""
    complex_leaf = typing.get_origin(leaf) in (list, dict) or (
        isinstance(leaf, type) and issubclass(leaf, BaseModel)
    )
    where = f"environment variable {show(name)}"
    if len(text) > MAX_VARIABLE_CHARS:
        raise ConfigError([f"{where} holds {len(text)} characters, over {MAX_VARIABLE_CHARS}"])
    if not complex_leaf:
        return text
    try:
        value = json.loads(text)
    except RecursionError:
        raise ConfigError([f"{where} nests deeper than {MAX_DEPTH} levels"]) from None
    except ValueError as exc:
        raise ConfigError([f"{where} is not valid JSON ({exc})"]) from None
    bounded(value, where)
    return value


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
    """Variables the configured targets and groups read a credential from (not settings):
    an API key, and a group's `http_sd` password or bearer token."""
    items = [
        item
        for key in ("targets", "target_groups")
        if isinstance(data.get(key), list)
        for item in data[key]
        if isinstance(item, dict)
    ]
    sections = [*items, *(i["http_sd"] for i in items if isinstance(i.get("http_sd"), dict))]
    sections += [s["basic_auth"] for s in sections if isinstance(s.get("basic_auth"), dict)]
    keys = ("api_key_env", "bearer_token_env", "password_env")
    return {s[k] for s in sections for k in keys if isinstance(s.get(k), str)}
