"""The write-stamp store keeps only the most recent responses."""

from __future__ import annotations

import pytest

from prober.sim.stamps import StampStore


def test_store_evicts_oldest_past_its_bound() -> None:
    store = StampStore(keep=3)
    for i in range(5):
        store.open(f"r{i}").token_write_ns.append(i)
    assert len(store) == 3
    assert store.get("r0") is None
    assert store.get("r1") is None
    record = store.get("r4")
    assert record is not None
    assert record.as_json() == {"id": "r4", "first_byte_ns": None, "token_write_ns": [4]}


def test_store_needs_room() -> None:
    with pytest.raises(ValueError, match="keep: must be at least 1"):
        StampStore(keep=0)
