"""The only logging configuration: structlog events, JSON (or pretty on a TTY).

The standard library's loggers (aiohttp, apscheduler) are routed through the same renderer,
so every line of the process has one shape. Context such as `target=` is bound per target by
the callers; secrets and prompt bodies are never passed to a logger by default. API keys are
registered here when they are read (`register_secret`) and replaced by `[REDACTED]` in every
rendered line, because a server may echo the key back in an error body that becomes a
result's `error`.
"""

from __future__ import annotations

import logging
import re
import sys
from typing import Any

import structlog

from prober.kinds import LogFormat

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
REDACTED = "[REDACTED]"
# Errors are cut to a length (request.py), so one may end in the first part of a key; a tail
# this long is redacted too. Shorter tails would hide ordinary text such as "sk-".
_MIN_TAIL = 8
_MIN_SECRET = 4
_SECRETS: set[str] = set()


def register_secret(value: str) -> None:
    """Never print `value`: every log line, and `redact()`, replace it with `[REDACTED]`."""
    if len(value) >= _MIN_SECRET:
        _SECRETS.add(value)


def redact(text: str) -> str:
    """`text` with every registered secret, and a secret's cut-off start at its end, replaced.

    Found also when the server mangled it: JSON-escaped (`\\/`, `\\u0041`), percent-encoded,
    or broken by line breaks or spaces (an error body cut into lines, then joined).
    """
    if not _SECRETS:
        return text
    for secret in sorted(_SECRETS, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    if len(text) < _MIN_TAIL:
        return text
    skeleton, starts, ends = _skeleton(text)
    spans: list[tuple[int, int]] = []
    for secret in _SECRETS:
        if len(secret) < _MIN_TAIL:  # too short to find among mangled text without garbling
            continue
        at = skeleton.find(secret)
        while at >= 0:
            spans.append((starts[at], ends[at + len(secret) - 1]))
            at = skeleton.find(secret, at + len(secret))
        for n in range(len(secret) - 1, _MIN_TAIL - 1, -1):
            if skeleton.endswith(secret[:n]):
                spans.append((starts[len(skeleton) - n], len(text)))
                break
    return _replace(text, spans)


# One decoded character of text, or a separator: a JSON escape, a percent-escape, a space.
# A backslash right before `\uXXXX` is read as itself, not as half of an escape `\\`: text the
# server cut or joined can put a stray backslash before an escaped key, and reading the pair
# as one escape would hide the key's first character. Over-redaction, not a leak, where the
# two really were an escaped backslash.
_TOKEN = re.compile(
    r'\\u([0-9a-fA-F]{4})|\\(["/bfnrt]|\\(?!u[0-9a-fA-F]{4}))|%([0-9a-fA-F]{2})|(.)', re.S
)
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _skeleton(text: str) -> tuple[str, list[int], list[int]]:
    """`text` decoded and without white space; where each of its characters came from."""
    chars: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    for match in _TOKEN.finditer(text):
        code, escape, percent, plain = match.groups()
        if plain is not None:
            char = plain
        elif code is not None:
            char = chr(int(code, 16))
        elif percent is not None:
            char = chr(int(percent, 16))
        else:
            char = _ESCAPES.get(escape, escape)
        if not char.isspace():
            chars.append(char)
            starts.append(match.start())
            ends.append(match.end())
    return "".join(chars), starts, ends


def _replace(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` with each (merged) span replaced by `[REDACTED]`."""
    out: list[str] = []
    last = 0
    for start, end in sorted(spans):
        if start < last:  # overlaps the previous span: extend it
            out[-1] = REDACTED
            last = max(last, end)
            continue
        out += [text[last:start], REDACTED]
        last = end
    return "".join(out) + text[last:]


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redact_value(v) for v in value)
    text = repr(value)  # what the JSON renderer would print for it
    cleaned = redact(text)
    return cleaned if cleaned != text else value


def _redact_secrets(_: Any, __: str, event_dict: Any) -> Any:
    if not _SECRETS:
        return event_dict
    # exc_info is left to the renderer (JSON has it as text in `exception` by now).
    return {k: v if k == "exc_info" else _redact_value(v) for k, v in event_dict.items()}


def setup_logging(fmt: LogFormat = "auto", level: str = "info", stream: object = None) -> None:
    """Configure structlog and the stdlib root logger once, for the whole process."""
    out = stream if stream is not None else sys.stdout
    pretty = fmt == "console" or (fmt == "auto" and hasattr(out, "isatty") and out.isatty())
    shared: list[structlog.types.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: structlog.types.Processor = (
        structlog.dev.ConsoleRenderer() if pretty else structlog.processors.JSONRenderer()
    )
    if not pretty:
        shared.append(structlog.processors.format_exc_info)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = logging.StreamHandler(out)  # type: ignore[arg-type]
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                _redact_secrets,  # last before rendering: sees structlog and stdlib events
                renderer,
            ],
            foreign_pre_chain=shared,
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(level, logging.ERROR))
    # One line per scrape would drown the probe events.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    logging.getLogger("apscheduler.executors").setLevel(logging.WARNING)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
