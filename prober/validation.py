"""How every configuration model reports a fault: one line, naming the field at fault.

Settings, the bench's flags, the simulator's config and the web config file are all pydantic
models. `OneLineModel` turns pydantic's multi-line `ValidationError` into a `ValueError` of
one line, its first fault worded by `describe` ("slots: must be at least 1, got 0"); each
model says how a field is named in it (`problem`: a setting, a flag). Every configuration
fault of the daemon, `sim`, `bench` and `probe` is worded here: `describe` for a model's
fault; `bound`, `within`, `one_of` and `wrong` for a flag or value checked by hand, so a
fault reads the same everywhere. `field_path` names a nested field the way the YAML reads
(`targets[0].url`).
Imports nothing from `prober` but what it names.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from enum import Enum
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import ErrorDetails, InitErrorDetails, PydanticCustomError

# Plain numbers, bools and text: `slots: true` or `"4"` is a typo, not a value to coerce.
STRICT = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

# A line break or control character (tab aside): never in a header value, a host or a name.
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")

_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}
_KINDS = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "a bool",
    "bool_parsing": "a bool",
    "string_type": "a string",
    "dict_type": "a mapping",
    "mapping_type": "a mapping",
    "tuple_type": "a list",
    "list_type": "a list",
}


def describe(err: ErrorDetails, shape: type[BaseModel] | None = None) -> str:
    """The fault without its field: 'must be greater than 0, got 0', or a validator's own
    words. `shape`, where the caller knows it, is the section the fault is about: the one an
    unknown key was given in (to say which key was meant), or the one a value should have
    been (to show one)."""
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return unknown_key(
            str(err["loc"][-1]) if err["loc"] else "", shape.model_fields if shape else ()
        )
    if kind in ("model_type", "model_attributes_type"):  # pydantic: "a valid dictionary or ..."
        such = f" such as {mapping_example(shape)}" if shape is not None else ""
        return wrong(f"a mapping{such}", value, shown=80)
    if kind == "value_error":  # a validator's ValueError: its text is the message
        return str(ctx.get("error", err["msg"]))
    if kind in _BOUNDS:
        key, relation = _BOUNDS[kind]
        return bound(relation, ctx[key], value)
    if kind == "finite_number":
        return wrong("finite", value)
    if kind in _KINDS:
        return wrong(_KINDS[kind], value)
    if kind in ("literal_error", "enum"):  # pydantic lists the choices as `one_of` does
        return wrong(f"one of {ctx['expected']}", value)
    return str(err["msg"])


def unknown_key(name: str, known: Iterable[str]) -> str:
    """'unknown key', and the known key meant where one is close enough: difflib's closest at
    a ratio of 0.6 (`modle`), else the one key `name` begins (`ttft` for `ttft_seconds`):
    "unknown key, did you mean model?"."""
    keys = list(known)
    close = difflib.get_close_matches(name, keys, n=1)
    begun = [key for key in keys if len(name) >= 3 and key.startswith(name)]
    meant = close or (begun if len(begun) == 1 else [])
    return f"unknown key, did you mean {meant[0]}?" if meant else "unknown key"


def mapping_example(shape: type[BaseModel]) -> str:
    """One key of `shape` as a YAML mapping: its first field, with its default where that is a
    plain value ('{ttft_seconds: 2.0}'), else a placeholder ('{rate: ...}')."""
    name, field = next(iter(shape.model_fields.items()))
    default = field.default.value if isinstance(field.default, Enum) else field.default
    if default is None or not isinstance(default, bool | int | float | str):
        return f"{{{name}: ...}}"
    return yaml.safe_dump({name: default}, default_flow_style=True, width=1000).strip()


def bound(relation: str, limit: object, value: object) -> str:
    """A value out of its bound: 'must be at least 1, got 0' (`relation`: 'at least',
    'greater than', 'at most', 'less than')."""
    return wrong(f"{relation} {_number(limit)}", value)


def within(low: object, high: object, value: object, *, open_low: bool = False) -> str:
    """A value out of its range, both ends named: 'must be in [1, 100], got 0'; with
    `open_low`, the low end excluded: 'must be in (0, 1], got 0'."""
    return wrong(f"in {'(' if open_low else '['}{_number(low)}, {_number(high)}]", value)


def one_of(choices: Iterable[str], value: object) -> str:
    """A value outside a closed set, the choices listed as pydantic lists a Literal's:
    "must be one of 'a', 'b' or 'c', got 'd'"."""
    quoted = [repr(choice) for choice in choices]
    listed = " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
    return wrong(f"one of {listed}", value)


def wrong(what: str, value: object, *, shown: int | None = None) -> str:
    """A value of the wrong kind: 'must be an integer, got 'x''; `shown` cuts the value's
    repr to that many characters (a whole section or list given where a number was meant)."""
    return f"must be {what}, got {repr(value)[:shown]}"


def show(value: object) -> str:
    """A path or name as text for a one-line message: quoted when it holds a line break."""
    text = str(value)
    return text if text.isprintable() else repr(text)


def one_line(exc: BaseException, limit: int = 200) -> str:
    """An exception's text on one line, cut to `limit` characters."""
    return " ".join(str(exc).split())[:limit]


def _number(limit: object) -> str:
    return f"{limit:g}" if isinstance(limit, float) and math.isfinite(limit) else str(limit)


def field_path(loc: tuple[int | str, ...]) -> str:
    """('targets', 0, 'url') → 'targets[0].url'."""
    out = ""
    for part in loc:
        name = str(part) if str(part).isprintable() else repr(part)  # keep one problem one line
        out += f"[{part}]" if isinstance(part, int) else (f".{name}" if out else name)
    return out or "config"


def field_error(field: str, reason: str, value: object) -> ValidationError:
    """A model validator's error attributed to one of its fields, as a field validator's is."""
    error = PydanticCustomError("value_error", "{reason}", {"reason": reason})
    details = InitErrorDetails(type=error, loc=(field,), input=value)
    return ValidationError.from_exception_data("config", [details])


class OneLineModel(BaseModel):
    """A frozen, strict model whose construction fails with one line naming the field.

    The `__init__` here only converts the error: type checkers still see each model's own
    field-by-field signature.
    """

    model_config = STRICT

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ValueError(self.problem(exc.errors()[0])) from None

    @classmethod
    def problem(cls, err: ErrorDetails) -> str:
        """`err` as one line: the field's path, a colon, the fault."""
        return f"{field_path(err['loc'])}: {describe(err)}"
