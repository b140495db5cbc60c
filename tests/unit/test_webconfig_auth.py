"""Basic auth under attack: no timing difference between users, no unbounded hashing queue.

bcrypt is replaced by a recorder (which hash was checked) or by a gate the test opens, so
nothing here depends on how fast this machine hashes: the assertions are about which cost an
unknown user pays and how many checks may wait, not about seconds.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import bcrypt
import pytest
from aiohttp import encode_basic_auth, web
from aiohttp.test_utils import TestClient, TestServer

from prober import webconfig
from prober.webconfig import MAX_WAITING_CHECKS, AuthBusy, BasicAuthMiddleware, dummy_hash

FAST, SLOW = bcrypt.hashpw(b"pw-a", bcrypt.gensalt(4)), bcrypt.hashpw(b"pw-b", bcrypt.gensalt(6))


def test_the_dummy_hash_costs_what_the_dearest_user_costs() -> None:
    assert dummy_hash({"a": FAST, "b": SLOW})[:7] == b"$2b$06$"
    assert dummy_hash({"a": FAST})[:7] == b"$2b$04$"
    assert bcrypt.checkpw(b"anything", dummy_hash({"a": SLOW})) is False  # well-formed


async def test_an_unknown_user_is_checked_at_the_highest_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    checked: list[bytes] = []
    monkeypatch.setattr(webconfig, "_checkpw", lambda pw, hashed: checked.append(hashed) or False)
    auth = BasicAuthMiddleware({"a": FAST, "b": SLOW})
    assert not await auth.check("nobody", "guess")
    assert not await auth.check("a", "wrong")
    assert checked[0][:7] == SLOW[:7]  # the unknown user paid cost 6, not a cheap dummy
    assert checked[1] == FAST


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """bcrypt blocks until the test sets the event, then answers as bcrypt would."""
    opened = threading.Event()

    def slow_check(password: bytes, hashed: bytes) -> bool:
        opened.wait(timeout=10)
        return bcrypt.checkpw(password, hashed)

    monkeypatch.setattr(webconfig, "_checkpw", slow_check)
    yield opened
    opened.set()


async def test_checks_beyond_the_bound_are_refused_at_once(gate: threading.Event) -> None:
    auth = BasicAuthMiddleware({"a": FAST})
    guesses = [asyncio.create_task(auth.check("a", f"guess-{i}")) for i in range(12)]
    await asyncio.sleep(0.05)  # let every guess reach the queue or the refusal
    refused = [t for t in guesses if t.done() and isinstance(t.exception(), AuthBusy)]
    assert len(refused) == 12 - MAX_WAITING_CHECKS
    gate.set()
    waited = await asyncio.gather(*(t for t in guesses if t not in refused))
    assert waited == [False] * MAX_WAITING_CHECKS


async def test_a_flood_answers_429_and_a_known_good_password_still_passes(
    gate: threading.Event,
) -> None:
    gate.set()
    middleware = BasicAuthMiddleware({"a": FAST})
    app = web.Application(middlewares=[middleware])

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/metrics", metrics)
    async with TestClient(TestServer(app)) as client:
        good = encode_basic_auth("a", "pw-a")
        assert (await client.get("/metrics", headers={"Authorization": good})).status == 200
        gate.clear()
        bad = encode_basic_auth("a", "nope")
        flood = [
            asyncio.create_task(client.get("/metrics", headers={"Authorization": bad}))
            for _ in range(MAX_WAITING_CHECKS + 6)
        ]
        await asyncio.sleep(0.2)
        resp = await client.get("/metrics", headers={"Authorization": good})
        assert resp.status == 200  # remembered: it never waits behind the guesses
        gate.set()
        statuses = sorted([(await f).status for f in flood])
    assert statuses.count(429) >= 6
    assert set(statuses) <= {401, 429}
