"""Which replica owns a target: rendezvous (highest-random-weight) hashing of its name.

Each of `count` shards gives every name a weight, a hash of the shard's index and the name;
the shard with the highest weight owns it. Every replica computes the same owner without
coordination, every name has exactly one, and going from `count` to `count + 1` shards moves
a name only where the new shard's weight beats every old one's: about 1/(count + 1) of the
names, and each of them to the new shard (a modulus would move most of them).
"""

from __future__ import annotations

import hashlib


def weight(name: str, index: int) -> int:
    """Shard `index`'s weight for `name`: 64 bits of BLAKE2b, the same in every process
    (Python's own `hash` of a string is salted per process)."""
    digest = hashlib.blake2b(f"{index}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner(name: str, count: int) -> int:
    """The shard of `count` that owns `name` (ties, never seen in 64 bits, go to the lower)."""
    if count < 1:
        raise ValueError(f"count must be at least 1, got {count}")
    return max(range(count), key=lambda index: (weight(name, index), -index))


def owns(name: str, index: int, count: int) -> bool:
    """Whether shard `index` of `count` owns `name`."""
    return count == 1 or owner(name, count) == index
