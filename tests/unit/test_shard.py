"""Rendezvous sharding (prober/fleet/shard.py): one owner per target, minimal moves."""

from __future__ import annotations

import pytest

from prober.fleet.shard import owner, owns

NAMES = [f"target-{i}" for i in range(3000)]


@pytest.mark.parametrize("count", [1, 2, 3, 5, 8])
def test_every_target_has_exactly_one_owner(count: int) -> None:
    for name in NAMES[:500]:
        owners = [index for index in range(count) if owns(name, index, count)]
        assert owners == [owner(name, count)]


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7])
def test_one_more_shard_moves_about_its_share_and_only_to_itself(count: int) -> None:
    moved = [n for n in NAMES if owner(n, count) != owner(n, count + 1)]
    assert all(owner(n, count + 1) == count for n in moved)  # only to the new shard
    share = len(moved) / len(NAMES)
    expected = 1 / (count + 1)
    # Binomial: 3000 names, a standard deviation under 0.01; 4 of them as the bound.
    assert abs(share - expected) < 0.04, (share, expected)


def test_the_split_is_balanced_and_stable() -> None:
    counts = [sum(owner(n, 4) == i for n in NAMES) for i in range(4)]
    assert min(counts) > 0.2 * len(NAMES)
    # The same in every process and release: a fixed hash (BLAKE2b), not Python's salted one;
    # a change here moves targets between replicas that run different versions.
    assert [owner(f"t{i}", 3) for i in range(8)] == [0, 1, 2, 2, 1, 1, 1, 2]


def test_a_count_below_one_is_refused() -> None:
    with pytest.raises(ValueError):
        owner("t", 0)
