"""The base of every configuration section: frozen, unknown keys refused, no bool as a number.

`Section` is what `settings` and `load.config` build their models on; `unwrap` reads through
`Annotated` and `| None` to a field's own type (the environment source uses it too).
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

# Every duration is finite and at most a week: an `.inf` or 1e300 would pass a plain `gt=0`
# and then overflow every timer and timedelta built from it.
MAX_SECONDS = 7 * 86_400.0
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS)]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # pydantic's lax mode reads `true` as 1 (strict mode would refuse the environment's "4"):
    # a bool is refused in every int or float field, of every section, present or future.
    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None:
            kind = unwrap(cls.model_fields[info.field_name].annotation)
            if kind is int:  # a strict field's fault, `validation.describe` words it
                raise PydanticCustomError("int_type", "Input should be a valid integer")
            if kind is float:
                raise PydanticCustomError("float_type", "Input should be a valid number")
        return value


def unwrap(annotation: Any) -> Any:
    """`X` of `Annotated[X, ...]` and of `X | None`."""
    while True:
        origin = typing.get_origin(annotation)
        if origin is Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation
