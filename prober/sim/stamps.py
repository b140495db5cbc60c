"""Server-side write stamps, kept so a benchmark can measure the client's timing accuracy.

For every streamed response the simulator notes `perf_counter_ns()` right after the first body
write and right after each token-bearing event is written to the transport. Only the most
recent requests are kept (a bounded, insertion-ordered dict), so memory stays flat under load.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

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


class StampStore:
    """The last `keep` records, keyed by response id."""

    def __init__(self, keep: int = DEFAULT_KEEP) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self._keep = keep
        self._records: OrderedDict[str, StampRecord] = OrderedDict()

    def open(self, request_id: str) -> StampRecord:
        """Start the record of a new response, evicting the oldest past the bound."""
        record = StampRecord(request_id)
        self._records[request_id] = record
        while len(self._records) > self._keep:
            self._records.popitem(last=False)
        return record

    def get(self, request_id: str) -> StampRecord | None:
        """The record of a response, if still kept."""
        return self._records.get(request_id)

    def __len__(self) -> int:
        return len(self._records)
