"""What one HTTP exchange may receive: its bounds, and the error that ends it past one.

Everything a server sends on a connection, from the first byte of its answer to the last,
is counted by the connection's protocol (`wire.ArrivalStampingHandler`) as it arrives and
as aiohttp parses it, against four bounds:

- **head**: the bytes before the final response's body (status lines, headers and every
  1xx response) at most `HEAD_BYTES`, and at most `INTERIM_RESPONSES` 1xx responses (an
  endless run of `103 Early Hints` once held the loop at 100 % until the first-token
  deadline: aiohttp reads 1xx responses in a loop and parses each one);
- **framing**: the bytes that are neither head nor body (chunk-size lines, chunk
  extensions, the CRLFs around chunks, trailers): 1 MiB of extension after each chunk size
  was once parsed for 2 GB and 6.6 s of CPU; 1-byte chunks cost aiohttp a Python call each
  (2 s of CPU for 1 MB of body);
- **body**: the payload after de-chunking (the stream's own bound, `body.stream_bounds`);
- **total**: head + framing + body, checked as each read arrives, before any of it is
  parsed.

The head is parsed `HEAD_SLICE_BYTES` at a time and the rest `SLICE_BYTES` at a time, each
slice checked before the next is parsed, so past a bound the exchange ends within one slice
(a few hundred microseconds of parsing), whatever the size of the read that carried it.
The end is `ResponseTooLarge`, a `protocol_error` in `classify.py`.

The bounds are a request's: `send.py` opens a meter with them (`bounded`) around the
call that sends it, and the protocol takes that meter when aiohttp begins the exchange on
the connection (`set_response_params`, called in the request's own task). aiohttp hands its
protocol no per-request value of ours, and a connection serves many requests, so the meter
travels in a context variable; the request keeps it, and reads what arrived from it
whatever happened to the connection since. A request that opens none (an engine
`/metrics` scrape) is held to `DEFAULT_BOUNDS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import aiohttp

HEAD_BYTES = 64 * 1024  # nginx's default for a request's headers is 32 KiB (4 × 8 KiB)
INTERIM_RESPONSES = 8  # servers send one or two (100 Continue, 103 Early Hints)
HEAD_SLICE_BYTES = 1024  # ~20 interim responses: one slice past the bound parses little
SLICE_BYTES = 4096  # 1-byte chunks: ~700 of aiohttp's calls, ~1 ms, between two checks


@dataclass(frozen=True, slots=True)
class ExchangeBounds:
    """Bytes one exchange may receive, by part; `total` is their sum."""

    body: int
    framing: int
    head: int = HEAD_BYTES
    interim: int = INTERIM_RESPONSES

    @property
    def total(self) -> int:
        return self.head + self.framing + self.body


# An exchange that states no bounds: an engine's /metrics (tens of KB to a few MB, in few
# chunks) fits with room to spare.
DEFAULT_BOUNDS = ExchangeBounds(body=16 * 1024 * 1024, framing=64 * 1024)


class ResponseTooLarge(aiohttp.ClientError):
    """A response went past one of its exchange's bounds."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ExchangeMeter:
    """One exchange's count, part by part, against its bounds.

    `arrived` counts every byte as the loop hands it over (checked against `total` there, on
    the connection's hot path); `fed` what was given to aiohttp's parser; `head` the part of
    `fed` up to the final response's headers (to the slice); `interim` the 1xx responses.
    Framing is what was fed past the head that did not become body, `fed - head - body`, so
    `framing_line` (`head + bounds.framing`) is compared with `fed - body`: one subtraction
    per slice.
    """

    __slots__ = (
        "arrived",
        "bounds",
        "engaged",
        "fed",
        "framing_line",
        "head",
        "head_done",
        "interim",
        "total",
    )

    def __init__(self, bounds: ExchangeBounds = DEFAULT_BOUNDS) -> None:
        self.bounds = bounds
        self.total = bounds.total
        self.engaged = False  # a connection's protocol counts for it
        self.begin()
        self.engaged = False

    def begin(self) -> None:
        """The protocol's call as the exchange begins on a connection (again, on another,
        if aiohttp retried it)."""
        self.engaged = True
        self.arrived = 0
        self.fed = 0
        self.head = 0
        self.interim = 0
        self.head_done = False
        self.framing_line = 0

    def total_problem(self) -> str:
        return f"response larger than {self.total} bytes in all"

    def head_room(self, available: int) -> int:
        """How much of `available` bytes the next head slice may take (0: the head is full)."""
        return min(available, HEAD_SLICE_BYTES, self.bounds.head - self.head)

    def headed(self, size: int, codes: Iterable[int]) -> str:
        """Count a head slice of `size` bytes that yielded responses with these status
        codes; the problem, if the head went past a bound."""
        self.fed += size
        self.head += size
        for code in codes:
            if 100 <= code < 200 and code != 101:
                self.interim += 1
            else:
                self.head_done = True
                self.framing_line = self.head + self.bounds.framing
        if self.interim > self.bounds.interim:
            return f"more than {self.bounds.interim} interim (1xx) responses"
        if not self.head_done and self.head >= self.bounds.head:
            return (
                f"response head larger than {self.bounds.head} bytes"
                " (status lines, headers, 1xx responses)"
            )
        return ""

    def framing_problem(self) -> str:
        return (
            f"chunk framing larger than {self.bounds.framing} bytes"
            " (chunk sizes, extensions, trailers)"
        )


_METER: ContextVar[ExchangeMeter] = ContextVar("llmprober_exchange_meter")


@contextmanager
def bounded(bounds: ExchangeBounds) -> Iterator[ExchangeMeter]:
    """The meter of the exchange this task begins inside the block, held to `bounds`."""
    meter = ExchangeMeter(bounds)
    token = _METER.set(meter)
    try:
        yield meter
    finally:
        _METER.reset(token)


def exchange_meter() -> ExchangeMeter:
    """The meter for an exchange begun now in this task: its request's, or a default one."""
    meter = _METER.get(None)
    return ExchangeMeter() if meter is None else meter
