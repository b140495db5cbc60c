"""The configuration's faults: one `field: message` line each."""

from __future__ import annotations


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
