"""Server-side write stamps, kept so a benchmark can measure the client's timing accuracy.

For every streamed response the simulator notes `perf_counter_ns()` right after the first body
write and right after each token-bearing event is written to the transport. Only the most
recent requests are kept (a bounded, insertion-ordered dict), so memory stays flat under load.
A record is found by the response id and by the client's `X-Request-Id` (the prober sends its
own and keeps it as the result's `request_id`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from prober.validation import bound

DEFAULT_KEEP = 10_000


@dataclass(eq=False)
class StampRecord:
    """Stamps of one response, in `time.perf_counter_ns()` units."""

    request_id: str
    first_byte_ns: int | None = None
    token_write_ns: list[int] = field(default_factory=list)

    def as_json(self) -> dict[str, object]:
        """The `/sim/requests/{id}` answer."""
        return {
            "id": self.request_id,
            "first_byte_ns": self.first_byte_ns,
            "token_write_ns": self.token_write_ns,
        }


MAX_ALIAS_CHARS = 128  # a client's X-Request-Id longer than this is not kept


class StampStore:
    """The last `keep` records, keyed by response id and by the client's request id."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep: {bound('at least', 1, keep)}")
        self._keep = keep
        self._records: OrderedDict[str, StampRecord] = OrderedDict()
        self._aliases: OrderedDict[str, StampRecord] = OrderedDict()

    def open(self, request_id: str, client_id: str | None = None) -> StampRecord:
        """Start the record of a new response (also found by `client_id`, the request's
        X-Request-Id, when given), evicting the oldest past the bound."""
        record = StampRecord(request_id)
        self._records[request_id] = record
        while len(self._records) > self._keep:
            self._records.popitem(last=False)
        if client_id and len(client_id) <= MAX_ALIAS_CHARS:
            self._aliases[client_id] = record
            self._aliases.move_to_end(client_id)
            while len(self._aliases) > self._keep:
                self._aliases.popitem(last=False)
        return record

    def get(self, request_id: str) -> StampRecord | None:
        """The record of a response by its id or the client's, if still kept."""
        return self._records.get(request_id) or self._aliases.get(request_id)

    def __len__(self) -> int:
        return len(self._records)
