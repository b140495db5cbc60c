"""A target's answer checks (`expect:`), each checked when the configuration loads.

The regex is compiled and the JSON Schema checked against its metaschema here, so a probe
never meets a pattern or schema that cannot work; `ExpectConfig.checks()` builds what the
probes judge with (`prober.checks.AnswerChecks`). A schema is held to `MAX_SCHEMA_BYTES` of
JSON, and its `$ref`s to the schema itself (`#...`): the prober never fetches a schema.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterator
from typing import Annotated, Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from jsonschema.validators import validator_for
from pydantic import Field, StrictInt, field_validator
from referencing import Registry

from prober.checks import AnswerChecks
from prober.section import Section
from prober.validation import wrong

MAX_REGEX_CHARS = 1000
MAX_SCHEMA_BYTES = 64 * 1024
MAX_MODEL_CHARS = 256
_REF_KEYS = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})

with warnings.catch_warnings():
    # `json` is the key an operator writes; the model's deprecated `.json()` is never called.
    warnings.filterwarnings("ignore", 'Field name "json"', UserWarning)

    class ExpectConfig(Section):
        """What every probe's answer must be; a failed check makes the probe not good."""

        regex: str | None = None
        json: bool = False  # type: ignore[assignment]  # shadows BaseModel.json (above)
        json_schema: dict[str, Any] | None = None
        min_answer_tokens: Annotated[StrictInt, Field(ge=1, le=1_000_000)] | None = None
        model: str | None = None

        @field_validator("regex")
        @classmethod
        def _regex(cls, value: str | None) -> str | None:
            if value is None:
                return None
            if not value or len(value) > MAX_REGEX_CHARS:
                raise ValueError(wrong(f"a pattern of 1-{MAX_REGEX_CHARS} characters", value))
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
            return value

        @field_validator("json_schema")
        @classmethod
        def _schema(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
            if value is not None:
                check_schema(value)
            return value

        @field_validator("min_answer_tokens", mode="before")
        @classmethod
        def _from_env(cls, value: Any) -> Any:
            # The environment gives text: accept "4", still refuse "4.5", 4.0 and true.
            return int(value) if isinstance(value, str) and value.strip().isdigit() else value

        @field_validator("model")
        @classmethod
        def _model(cls, value: str | None) -> str | None:
            if value is not None and not (
                0 < len(value) <= MAX_MODEL_CHARS and value.isprintable() and value.strip()
            ):
                raise ValueError(wrong(f"a model name of 1-{MAX_MODEL_CHARS} characters", value))
            return value

        def checks(self) -> AnswerChecks:
            """What the probes judge their answers with."""
            schema = None
            if self.json_schema is not None:
                kind = validator_for(self.json_schema, default=Draft202012Validator)
                # An empty registry: a reference outside the schema resolves to nothing,
                # never to a download (`check_schema` refused those already).
                schema = kind(self.json_schema, registry=Registry())
            return AnswerChecks(
                regex=re.compile(self.regex) if self.regex is not None else None,
                json=self.json,
                schema=schema,
                min_answer_tokens=self.min_answer_tokens,
                model=self.model,
            )


def check_schema(schema: dict[str, Any]) -> None:
    """A ValueError (one line) unless `schema` is a JSON Schema of bounded size whose
    references all point into itself."""
    try:
        size = len(json.dumps(schema).encode())
    except (TypeError, ValueError, RecursionError):
        raise ValueError("not a JSON Schema: nested too deep, or not JSON") from None
    if size > MAX_SCHEMA_BYTES:
        raise ValueError(f"must be at most {MAX_SCHEMA_BYTES} bytes of JSON, got {size}")
    for ref in _refs(schema):
        if not ref.startswith("#"):
            raise ValueError(f"$ref {ref[:80]!r} points outside the schema: only '#...' refs")
    kind = validator_for(schema, default=Draft202012Validator)
    try:
        kind.check_schema(schema)
    except SchemaError as exc:
        path = "/".join(str(part) for part in exc.absolute_path) or "(top)"
        raise ValueError(f"not a valid JSON Schema: {exc.message[:200]} at {path}") from None


def _refs(node: Any) -> Iterator[str]:
    """Every reference in a schema (`$ref` and its dynamic kinds), at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in _REF_KEYS and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)
