"""A failed request leaves no reference cycle behind: what it held is freed when it ends, not
by a full collection.

A fleet of failing targets ends thousands of streams a minute; each fault kept with its
traceback (aiohttp keeps it on the connection's reader, whose frames refer back to it) was ~30
objects that only a full collection frees, and the full collection took longer for them
(docs/performance.md §9).
"""

from __future__ import annotations

import asyncio
import gc
import types
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from aiohttp import web

from prober.kinds import Api
from prober.request import RequestSpec, stream_request
from prober.request.timeouts import Timeouts
from prober.request.wire import ArrivalStampingHandler, client_session
from prober.result import Outcome
from tests.support.servers import serve
from tests.support.sse import chunk, sse, start_stream

QUICK = Timeouts(connect_seconds=2, first_token_seconds=0.3, idle_seconds=0.3, total_seconds=2)


async def cut_after_a_token(request: web.Request) -> web.StreamResponse:
    resp = await start_stream(request)
    await resp.write(chunk({"content": "a"}))
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.close()  # mid-body, no end of stream
    return resp


async def never_a_token(request: web.Request) -> web.StreamResponse:
    resp = await start_stream(request)
    await asyncio.sleep(5)  # past the first-token deadline
    return resp


@contextmanager
def saved_garbage() -> Iterator[list[object]]:
    """What the collector finds unreachable from here to the end of the block, kept."""
    found: list[object] = []
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def ours(garbage: list[object]) -> list[str]:
    """The client's part of `garbage`: its connections' protocols and the prober's frames (the
    test's server, in the same process, may leave cycles of its own)."""
    found = []
    for obj in garbage:
        if isinstance(obj, ArrivalStampingHandler):
            found.append("ArrivalStampingHandler")
        elif isinstance(obj, types.FrameType) and "/prober/" in obj.f_code.co_filename:
            found.append(f"frame {obj.f_code.co_name}")
    return found


async def test_a_retried_stale_connection_leaves_no_cycle() -> None:
    """The server closes a kept-alive connection as the next request is sent on it (llama-server
    does after every stream): the request is retried, and the stale attempt's fault is let go."""
    body = chunk({"content": "a"}) + sse("[DONE]")
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    answer += b"Content-Length: %d\r\n\r\n" % len(body) + body

    async def answer_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await reader.read(4096)  # the short body came with the head, or comes now
        writer.write(answer)
        await reader.readuntil(b"\r\n\r\n")  # the next request, on the kept-alive connection
        writer.close()

    server = await asyncio.start_server(answer_once, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    async with server, client_session() as session:
        spec = RequestSpec(url, Api.CHAT, "m", "hi", 4, timeouts=QUICK)
        results = [await stream_request(session, spec, 0)]
        with saved_garbage() as garbage:
            results += [await stream_request(session, spec, 0) for _ in range(3)]
    assert [r.outcome for r in results] == [Outcome.OK] * 4, [r.error for r in results]
    assert ours(garbage) == []


@pytest.mark.parametrize(
    ("handler", "outcome"),
    [(cut_after_a_token, Outcome.PROTOCOL_ERROR), (never_a_token, Outcome.TIMEOUT_FIRST_TOKEN)],
    ids=["cut-mid-body", "first-token-timeout"],
)
async def test_a_failed_request_leaves_no_cycle(handler: object, outcome: Outcome) -> None:
    async with serve(handler) as url, client_session() as session:  # type: ignore[arg-type]
        spec = RequestSpec(url, Api.CHAT, "m", "hi", 4, timeouts=QUICK)
        with saved_garbage() as garbage:
            results = [await stream_request(session, spec, 0) for _ in range(3)]
    assert [r.outcome for r in results] == [outcome] * 3, [r.error for r in results]
    assert ours(garbage) == []
