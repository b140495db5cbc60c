"""Protocol-level floods (`tests/support/floods.py`): every byte a server sends counts against a
bound of the request, and past it the request ends as `protocol_error` at once.

Each flood runs against a session of its own, as each target has a pool of its own, while
another target's requests run beside it: those must all succeed, every one counted by its
server. What arrived is the result's `response_bytes`, the connection's own count; nothing
here times anything.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from prober.request import Api, RequestSpec, Timeouts, stream_request
from prober.request.body import stream_bounds
from prober.request.exchange import HEAD_BYTES, INTERIM_RESPONSES
from prober.request.sse import DEFAULT_MAX_LINE_BYTES
from prober.request.stream import max_events
from prober.request.wire import client_session
from prober.result import Outcome, RequestResult
from tests.support.floods import ANSWERS, FLOODS, Flooded, flood_server

MAX_TOKENS = 4
TIMEOUTS = Timeouts(connect_seconds=2, first_token_seconds=3, idle_seconds=1.0, total_seconds=4)
BOUNDS = stream_bounds(max_events(MAX_TOKENS), DEFAULT_MAX_LINE_BYTES)
# Where each bound cuts, at the least (`Flood.bound`); the shortest 1xx response is 25 bytes.
AT_LEAST = {
    "interim": (INTERIM_RESPONSES + 1) * 25,
    "head": HEAD_BYTES,
    "line": 8190,
    "framing": BOUNDS.framing,
}
# What may arrive past a bound before it is checked: a read being parsed, what was kept
# for the read pump (256 KiB), and a read that arrived meanwhile (256 KiB each at most).
PAST_THE_BOUND = 1 << 20
FLOOD_REQUESTS, OTHER_REQUESTS = 3, 8


@pytest.fixture
async def floods() -> AsyncIterator[Flooded]:
    async with flood_server() as state:
        yield state


async def send_many(state: Flooded, name: str, count: int) -> list[RequestResult]:
    """`count` requests to `name` one after another, on a pool of their own."""
    spec = RequestSpec(state.url(name), Api.CHAT, "m", "hi", MAX_TOKENS, TIMEOUTS)
    async with client_session() as session:
        return [await stream_request(session, spec, time.perf_counter_ns()) for _ in range(count)]


@pytest.mark.parametrize("name", sorted(FLOODS))
async def test_each_flood_is_cut_at_its_bound(floods: Flooded, name: str) -> None:
    flooded, others = await asyncio.gather(
        send_many(floods, name, FLOOD_REQUESTS),
        send_many(floods, "answer_chunked", OTHER_REQUESTS),
    )
    flood = FLOODS[name]
    least = AT_LEAST[flood.bound]
    for result in flooded:
        assert result.outcome is Outcome.PROTOCOL_ERROR, result.error
        assert flood.error in result.error, result.error
        assert result.response_bytes is not None
        assert least <= result.response_bytes <= least + PAST_THE_BOUND, result.response_bytes
    # The flood was really cut: its server's writes failed once the client had gone.
    for _ in range(100):
        if floods.disconnects[name] >= FLOOD_REQUESTS:
            break
        await asyncio.sleep(0.05)
    assert floods.disconnects[name] == FLOOD_REQUESTS
    assert floods.requests[name] == FLOOD_REQUESTS  # no retry: the cut is the server's fault
    # The other target: every request answered, every one counted by its server.
    assert [r.outcome for r in others] == [Outcome.OK] * OTHER_REQUESTS, [r.error for r in others]
    assert all(r.output_tokens == 3 for r in others)
    assert floods.requests["answer_chunked"] == OTHER_REQUESTS


@pytest.mark.parametrize("name", sorted(ANSWERS))
async def test_a_whole_answer_is_counted_byte_for_byte(floods: Flooded, name: str) -> None:
    """A 103, chunk extensions and trailers within their bounds are an ordinary answer, and
    the count is every byte the server sent, no more."""
    (result,) = await send_many(floods, name, 1)
    assert result.outcome is Outcome.OK, result.error
    assert result.output_tokens == 3
    assert result.response_bytes == len(ANSWERS[name])
