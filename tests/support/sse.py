"""Building OpenAI-style server-sent event streams for hand-made handlers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from tests.support.servers import Handler


def sse(obj: Any) -> bytes:
    """One `data:` event: a string as is, anything else as JSON."""
    return b"data: " + (obj if isinstance(obj, str) else json.dumps(obj)).encode() + b"\n\n"


def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    """One chat-completion chunk event carrying `delta`."""
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse({"id": "chatcmpl-local", "object": "chat.completion.chunk", "choices": [choice]})


async def start_stream(
    request: web.Request, content_type: str = "text/event-stream"
) -> web.StreamResponse:
    """Read the request body, then send the 200 headers of a stream."""
    await request.read()
    resp = web.StreamResponse(headers={"Content-Type": content_type})
    await resp.prepare(request)
    return resp


def streaming(events: list[bytes], *, bytewise: bool = False, eof: bool = True) -> Handler:
    """A handler that writes `events` (one byte per write when `bytewise`), then ends."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = await start_stream(request)
        for data in events:
            pieces = [data[i : i + 1] for i in range(len(data))] if bytewise else [data]
            for piece in pieces:
                await resp.write(piece)
                if bytewise:
                    await asyncio.sleep(0)
        if eof:
            await resp.write_eof()
        return resp

    return handler
