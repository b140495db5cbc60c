"""What `/probe?debug=true` shows beyond the result: the response's status and headers and the
first bytes of its body, taken where the one request path reads them.

The account travels in a context variable (`tracing`), set by `/probe` around the one request
it sends: no other request (scheduled probes, load, bench) carries one, and the request path
keeps the signature every caller uses. `send.py` reads it once, in the request's own task, and
hands the body reader `ProbeTrace.chunk` (reads are parsed in callbacks outside any task,
where the variable is not the request's). Everything kept is bounded here and raw: the page
that shows it redacts and cuts (`prober.status.debug`), as a server's text is hostile.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

MAX_BODY_BYTES = 4096  # of the body's start
MAX_HEADERS = 64
MAX_HEADER_CHARS = 512  # of each header's name and of its value, as kept


class ProbeTrace:
    """One probe's response as it came: status, headers and the body's first bytes."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.headers: list[tuple[str, str]] = []
        self.more_headers = 0  # past `MAX_HEADERS`
        self.body = bytearray()
        self.body_bytes = 0  # all the body bytes read, kept or not
        self.attempts = 0  # responses seen: 2 after a stale pooled connection was retried

    def response(self, status: int, headers: Mapping[str, str]) -> None:
        """A response's head (a retry's replaces the first attempt's)."""
        self.attempts += 1
        self.status = status
        self.headers = []
        self.more_headers = 0
        self.body = bytearray()
        self.body_bytes = 0
        for i, (name, value) in enumerate(headers.items()):
            if i >= MAX_HEADERS:
                self.more_headers = len(headers) - MAX_HEADERS
                break
            self.headers.append((name[:MAX_HEADER_CHARS], value[:MAX_HEADER_CHARS]))

    def chunk(self, data: bytes) -> None:
        """One read of the body, as the stream parser takes it."""
        self.body_bytes += len(data)
        room = MAX_BODY_BYTES - len(self.body)
        if room > 0:
            self.body += data[:room]


_CURRENT: ContextVar[ProbeTrace | None] = ContextVar("probe_trace", default=None)


@contextmanager
def tracing(trace: ProbeTrace) -> Iterator[ProbeTrace]:
    """Tasks created inside the block carry `trace` to the request they send."""
    token = _CURRENT.set(trace)
    try:
        yield trace
    finally:
        _CURRENT.reset(token)


def current() -> ProbeTrace | None:
    """The trace of the request this task sends, if `/probe?debug=true` asked for one."""
    return _CURRENT.get()
