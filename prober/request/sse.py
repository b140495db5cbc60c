"""Incremental stream framing: bytes in, lines out (`LineSplitter`), SSE events out (`SSEParser`).

Handles LF, CRLF and lone CR line ends, a CRLF split across reads, comments (keep-alives),
multi-line `data:` fields and events split anywhere. Malformed input raises `StreamError`,
the only exception these parsers raise: an over-long line, invalid UTF-8, or a line that is
no SSE field. OpenAI-compatible servers send only `data`, `event`, `id`, `retry` and comments,
so an unknown field is a framing error worth counting rather than ignoring as the SSE spec
would. Pending data without a closing blank line is still dispatched at end of stream: some
servers end on `data: [DONE]\n`. An event is bounded like a line: at most
`MAX_EVENT_LINES` data lines and `max_line_bytes` of data. A stream is bounded in lines too
(`max_lines`, comments and blank lines included): a flood of `: keep-alive` lines carries no
event, and 3 MiB of them once cost 110 ms of parsing per request.

`data: [DONE]` ends the stream: it is dispatched at once (without waiting for the blank line)
and nothing after it is parsed, so junk a server sends after its end is never an error. An
over-long line that follows complete lines in the same read is reported on the next call, so
the lines before it (an end among them) are seen first.
"""

from __future__ import annotations

from typing import NamedTuple

DEFAULT_MAX_LINE_BYTES = 1 << 20
# Data lines in one event. Servers send one; a JSON object split over lines has dozens. A
# pending event's lines are kept until its blank line: 500,000 empty `data:` lines (3 MB of
# body) once grew a list of ~45 MB and stalled the loop 314 ms joining it.
MAX_EVENT_LINES = 1024
_FIELDS = frozenset({b"data", b"event", b"id", b"retry"})
_UNBOUNDED = 1 << 62


class StreamError(ValueError):
    """The stream's framing is broken; the message says how."""


class LineSplitter:
    """Split a byte stream into lines without their terminators."""

    __slots__ = ("_buf", "_error", "_max")

    def __init__(self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES) -> None:
        self._buf = b""
        self._max = max_line_bytes
        self._error = ""

    def feed(self, data: bytes) -> list[bytes]:
        if self._error:
            raise StreamError(self._error)
        buf = self._buf + data if self._buf else data
        # A trailing CR may be the first half of a CRLF: hold it until the next read.
        tail = b""
        if buf.endswith(b"\r"):
            buf, tail = buf[:-1], b"\r"
        if b"\r" in buf:
            buf = buf.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = buf.split(b"\n")
        rest = lines.pop()
        # Only the first line can hold bytes from earlier reads; the others come from this read
        # alone and need a look only when the read itself is longer than the limit.
        if len(rest) > self._max or (
            lines
            and (
                len(lines[0]) > self._max
                or (len(data) > self._max and any(len(line) > self._max for line in lines))
            )
        ):
            return self._over_long(lines)
        self._buf = rest + tail
        return lines

    def _over_long(self, lines: list[bytes]) -> list[bytes]:
        """The complete lines before the first over-long one; the error comes next call."""
        self._error = f"line longer than {self._max} bytes"
        self._buf = b""
        good = next((i for i, line in enumerate(lines) if len(line) > self._max), len(lines))
        if not good:
            raise StreamError(self._error)
        return lines[:good]

    def close(self) -> list[bytes]:
        if self._error:
            raise StreamError(self._error)
        rest, self._buf = self._buf.rstrip(b"\r"), b""
        return [rest] if rest else []


class SSEEvent(NamedTuple):
    data: str
    event: str = ""


_LF = ord("\n")
_DONE = b"[DONE]"
_DONE_BLOCK = b"data: [DONE]"

# Builds an SSEEvent without the generated Python-level __new__ (a third of the fast path).
_new = tuple.__new__


class SSEParser:
    """Server-sent events parser; feed it reads, it returns the events those reads completed."""

    __slots__ = ("_data", "_data_bytes", "_ended", "_event", "_lines", "_lines_left", "_max_lines")

    def __init__(
        self, max_line_bytes: int = DEFAULT_MAX_LINE_BYTES, max_lines: int | None = None
    ) -> None:
        self._lines = LineSplitter(max_line_bytes)
        self._max_lines = max_lines
        self._lines_left = _UNBOUNDED if max_lines is None else max_lines
        self._data: list[bytes] = []
        self._data_bytes = 0  # of the pending event: bounded by max_line_bytes as a line is
        self._event = b""
        self._ended = False  # `data: [DONE]` seen: nothing after it is parsed

    def feed(self, data: bytes) -> list[SSEEvent]:
        if self._ended:
            return []
        lines = self._lines
        # Fast path for what OpenAI-compatible servers send: reads of whole events of one
        # `data: ` line each, nothing pending. It yields exactly what the general path would,
        # at a fraction of the cost; anything else (CR, other fields, a partial event) and
        # every error case take the general path.
        if (
            data.startswith(b"data: ")
            and not lines._buf
            and not self._data
            and not self._event
            and len(data) <= lines._max
            and b"\r" not in data
        ):
            size = len(data)
            try:
                if data.find(b"\n") == size - 2 and data[-1] == _LF:
                    value = data[6:-2]
                    self._ended = value == _DONE
                    self._count(2)
                    return [_new(SSEEvent, (value.decode(), ""))]
                if data.endswith(b"\n\n"):
                    blocks = data[:-2].split(b"\n\n")
                    if data.count(b"\n") == 2 * len(blocks) and all(
                        block.startswith(b"data: ") for block in blocks
                    ):
                        if _DONE_BLOCK in blocks:
                            blocks = blocks[: blocks.index(_DONE_BLOCK) + 1]
                            self._ended = True
                        self._count(2 * len(blocks))
                        return [_new(SSEEvent, (block[6:].decode(), "")) for block in blocks]
            except UnicodeDecodeError as exc:
                raise StreamError(f"event is not UTF-8: {exc.reason}") from None
        return self._process(lines.feed(data))

    def close(self) -> list[SSEEvent]:
        if self._ended:
            return []
        events = self._process(self._lines.close())
        if self._data:
            events.append(self._dispatch())
        return events

    def _count(self, lines: int) -> None:
        self._lines_left -= lines
        if self._lines_left < 0:
            raise StreamError(f"more than {self._max_lines} lines in one stream")

    def _process(self, lines: list[bytes]) -> list[SSEEvent]:
        if len(lines) > self._lines_left:  # what the bound allows first: an end among it
            allowed = self._process(lines[: max(0, self._lines_left)])
            if self._ended:
                return allowed
            self._count(len(lines))
        self._lines_left -= len(lines)
        events: list[SSEEvent] = []
        for line in lines:
            if line.startswith(b"data:"):
                value = line[5:]
                value = value[1:] if value.startswith(b" ") else value
                if value == _DONE and not self._data:
                    self._ended = True
                    events.append(SSEEvent("[DONE]", self._event.decode(errors="replace")))
                    return events
                self._append(value)
            elif not line:
                if self._data:
                    events.append(self._dispatch())
                self._event = b""
            elif not line.startswith(b":"):
                self._field(line)
        return events

    def _field(self, line: bytes) -> None:
        name, colon, value = line.partition(b":")
        if name not in _FIELDS:
            raise StreamError(f"not an SSE field: {line[:40]!r}")
        if name == b"event":
            self._event = value[1:] if value.startswith(b" ") else value
        elif name == b"data" and not colon:
            self._append(b"")

    def _append(self, value: bytes) -> None:
        """One more data line of the pending event, within the event's bounds."""
        self._data.append(value)
        self._data_bytes += len(value) + 1
        if len(self._data) > MAX_EVENT_LINES:
            raise StreamError(f"more than {MAX_EVENT_LINES} data lines in one event")
        if self._data_bytes > self._lines._max:
            raise StreamError(f"event larger than {self._lines._max} bytes")

    def _dispatch(self) -> SSEEvent:
        raw, self._data, self._data_bytes = b"\n".join(self._data), [], 0
        try:
            return SSEEvent(raw.decode(), self._event.decode())
        except UnicodeDecodeError as exc:
            raise StreamError(f"event is not UTF-8: {exc.reason}") from None
