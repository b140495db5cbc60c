"""The only logging configuration: structlog events, JSON (or pretty on a TTY).

The standard library's loggers (aiohttp, apscheduler) are routed through the same renderer,
so every line of the process has one shape. Context such as `target=` is bound per target by
the callers; secrets and prompt bodies are never passed to a logger by default. API keys are
registered here when they are read (`register_secret`) and replaced by `[REDACTED]` in every
rendered line, because a server may echo the key back in an error body that becomes a
result's `error`. Every error text, and every string of every log line, also passes one
filter, `printable_line`, so a server's text never reaches a terminal or a log as control
characters, escape sequences, lone surrogates or a second (forged) line.
"""

from __future__ import annotations

import base64
import functools
import logging
import re
import sys
import unicodedata
from typing import Any, NamedTuple

import structlog
from aiohttp.http_exceptions import HttpProcessingError

from prober.kinds import LogFormat

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}
REDACTED = "[REDACTED]"
# Errors are cut to a length (request/send.py), so one may end in the first part of a key; a tail
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
    base64-encoded (standard or URL-safe, at any offset of a larger encoded text), or broken
    by line breaks, spaces, control, format or zero-width characters and terminal escape
    sequences (`\\x1b[0m`), raw or JSON-escaped.
    """
    if not _SECRETS:
        return text
    forms = sorted({f for secret in _SECRETS for f in _forms(secret)}, key=len, reverse=True)
    for form in forms:
        text = text.replace(form, REDACTED)
    if len(text) < _MIN_TAIL:
        return text
    skeleton = _skeleton(_decoded(text))
    spans: list[tuple[int, int]] = []
    for form in forms:
        if len(form) >= _MIN_TAIL:  # shorter: not findable in mangled text without garbling
            spans += _found(skeleton, form, len(text))
    return _replace(text, spans)


class _Skeleton(NamedTuple):
    """The visible characters of a text, where each came from, and which belong to an escape
    sequence: those may or may not be the key's (a sequence's final byte can be its next
    character, `\\x1b[s` + `k-…`), so a match may take or skip each of them."""

    chars: str
    starts: list[int]
    ends: list[int]
    optional: list[bool]


def _found(skeleton: _Skeleton, form: str, size: int) -> list[tuple[int, int]]:
    """Spans of the text (of length `size`) that spell `form`, or a start of it at the end."""
    chars, starts, ends, optional = skeleton
    spans: list[tuple[int, int]] = []
    active: dict[int, int] = {}  # characters of `form` matched so far → where the match began
    for i, char in enumerate(chars):
        following = dict(active) if optional[i] else {}
        for matched, begin in [*active.items(), (0, i)]:
            if form[matched] != char:
                continue
            if matched + 1 == len(form):
                spans.append((starts[begin], ends[i]))
            else:
                following[matched + 1] = min(following.get(matched + 1, begin), begin)
        active = following
    tails = [begin for matched, begin in active.items() if matched >= _MIN_TAIL]
    if tails:  # a key cut off at the end of the text
        spans.append((starts[min(tails)], size))
    return spans


@functools.lru_cache(maxsize=256)
def _forms(secret: str) -> tuple[str, ...]:
    """`secret` as written, and the base64 text of it (standard and URL-safe) at each of the
    three offsets it can have inside a larger encoded text, without the characters it shares
    with its neighbours."""
    raw = secret.encode()
    forms = [secret]
    for shift in range(3):
        encoded = base64.b64encode(b"\0" * shift + raw).decode()
        core = encoded[(shift * 8 + 5) // 6 : (shift + len(raw)) * 8 // 6]
        forms += [core, core.replace("+", "-").replace("/", "_")]
    return tuple(dict.fromkeys(forms))


# One decoded character of text, or a separator: a JSON escape, a Python one (`\x1b`, as a
# repr of the server's error object shows a control character), a percent-escape, a space.
# A backslash right before `\uXXXX` is read as itself, not as half of an escape `\\`: text the
# server cut or joined can put a stray backslash before an escaped key, and reading the pair
# as one escape would hide the key's first character. Over-redaction, not a leak, where the
# two really were an escaped backslash.
_TOKEN = re.compile(
    r"\\u([0-9a-fA-F]{4})|\\x([0-9a-fA-F]{2})"
    r"|\\([\"'/bfnrt]|\\(?!u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2}))|%([0-9a-fA-F]{2})|(.)",
    re.S,
)
_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


# A terminal escape sequence, once decoded: CSI (`ESC [ ... m`), OSC (`ESC ] ... BEL`), or
# ESC and one character. Bounded, so a stray ESC never hides more than a few characters.
_ESCAPE_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]{0,32}[ -/]{0,8}[@-~]?|\x1b\][^\x07\x1b]{0,256}(?:\x07|\x1b\\)?"
    r"|\x1b[@-Z\\-_]?"
)
_Decoded = list[tuple[str, int, int]]  # (character, start, end in the text)


def _decoded(text: str) -> _Decoded:
    """Each character of `text` with JSON and percent escapes decoded, and where it came from."""
    out: _Decoded = []
    for match in _TOKEN.finditer(text):
        code, byte, escape, percent, plain = match.groups()
        if plain is not None:
            char = plain
        elif code is not None or byte is not None:
            char = chr(int(code or byte, 16))
        elif percent is not None:
            char = chr(int(percent, 16))
        else:
            char = _ESCAPES.get(escape, escape)
        out.append((char, match.start(), match.end()))
    return out


def _skeleton(decoded: _Decoded) -> _Skeleton:
    """The visible characters of `decoded` (no white space, control, format or zero-width
    character), where each one came from, and whether it is part of an escape sequence."""
    chars = "".join(char for char, _, _ in decoded)
    in_escape = [False] * len(chars)
    for match in _ESCAPE_SEQUENCE.finditer(chars):
        in_escape[match.start() : match.end()] = [True] * (match.end() - match.start())
    picked = [i for i, char in enumerate(chars) if _visible(char)]
    return _Skeleton(
        "".join(chars[i] for i in picked),
        [decoded[i][1] for i in picked],
        [decoded[i][2] for i in picked],
        [in_escape[i] for i in picked],
    )


def _visible(char: str) -> bool:
    """Whether `char` shows as a character: not a space, control, format, mark or unassigned."""
    if " " < char < "\x7f":
        return True
    return char.isprintable() and unicodedata.category(char) not in _ZERO_WIDTH


_ZERO_WIDTH = frozenset({"Mn", "Me", "Zs"})  # combining marks; spaces other than " "


def printable_line(text: str, limit: int | None = None) -> str:
    """`text` as one printable line of at most `limit` characters: the one filter every error
    text and log string passes. Escape sequences go whole, white space runs become one
    space, and every other character that does not print (controls, format characters, lone
    surrogates, line and paragraph separators) is dropped."""
    text = _ESCAPE_SEQUENCE.sub("", text)
    if not text.isprintable():
        text = "".join(c for c in text if c.isprintable() or c.isspace())
    text = " ".join(text.split())
    return text[:limit].rstrip() if limit is not None else text


def safe_line(text: str, limit: int | None = None) -> str:
    """`text` redacted, then made one printable line: redaction first, because the filter
    joins what a key was split by, and again after, for a key cut off by `limit`."""
    return redact(printable_line(redact(text), limit))


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
        return safe_line(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        return {k: _redact_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redact_value(v) for v in value)
    text = repr(value)  # what the JSON renderer would print for it
    cleaned = redact(text)
    return cleaned if cleaned != text else value


def _redact_lines(value: Any) -> Any:
    return redact(value) if isinstance(value, str) else _redact_value(value)


# A traceback's lines are the process's own, not a server's: kept as they are (redacted).
_MULTI_LINE = frozenset({"exception", "stack"})


def _redact_secrets(_: Any, __: str, event_dict: Any) -> Any:
    # exc_info is left to the renderer (JSON has it as text in `exception` by now).
    return {
        k: v if k == "exc_info" else _redact_lines(v) if k in _MULTI_LINE else _redact_value(v)
        for k, v in event_dict.items()
    }


class _OneLineBadRequests(logging.Filter):
    """aiohttp's server logs a request it cannot parse (a header past its limit, too many
    headers, a malformed line) with the parser's whole traceback: anyone who reaches the port
    can make one. Such a record becomes one warning line, `bad_request`, with the parser's
    message (printable and bounded); any other error keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            cause = getattr(exc, "message", "") or type(exc).__name__
            record.msg, record.args = "bad_request", None
            record.levelno, record.levelname = logging.WARNING, "WARNING"  # the client's fault
            record.error = printable_line(f"{exc.code} {type(exc).__name__}: {cause}", 200)
            record.exc_info, record.exc_text = None, None
        return True


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
    # A stdlib record's `error` (set by `_OneLineBadRequests`) joins its event.
    foreign: list[structlog.types.Processor] = [
        *shared,
        structlog.stdlib.ExtraAdder(allow=("error",)),
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
            foreign_pre_chain=foreign,
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(_LEVELS.get(level, logging.ERROR))
    # One line per scrape would drown the probe events.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    server = logging.getLogger("aiohttp.server")
    server.filters[:] = [f for f in server.filters if not isinstance(f, _OneLineBadRequests)]
    server.addFilter(_OneLineBadRequests())
    logging.getLogger("apscheduler.executors").setLevel(logging.WARNING)
    # apscheduler says "Adding job tentatively", "Added job" and "Scheduler started" at info on
    # every start: noise but at debug, where the logger follows the root's level again.
    quiet = level != "debug"
    logging.getLogger("apscheduler").setLevel(logging.WARNING if quiet else logging.NOTSET)


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
