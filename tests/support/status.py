"""What the status page's tests share: a hostile engine whose every string is an attack on the
page, and the daemon configuration of a simulator target beside it.

`hostile_engine()` answers every completion with HTTP 500 and a body of markup, an event
handler, terminal escapes, control characters and the target's API key split by a zero-width
space; its `/metrics` fails the same way; `/sse/v1/chat/completions` streams a good answer
whose response headers (a cookie, an API key) and first event carry the key. The page, and
`/probe?debug=true`, must show all of it as inert, redacted text.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from prober.sim import bound_port

KEY_ENV = "LLMPROBER_STATUS_TEST_KEY"
KEY = "sk-status-page-test-0123456789abcdef"
SPLIT_KEY = KEY[:12] + "\u200b" + KEY[12:]  # a zero-width space inside the key
HOSTILE_TEXT = (
    '<script>alert(1)</script><img src=x onerror="alert(2)">'
    f"\x1b[31mred\x07\x00 bell <b>bold</b> key={SPLIT_KEY} & done"
)


async def _fail(_: web.Request) -> web.Response:
    return web.Response(status=500, text=HOSTILE_TEXT, content_type="text/html")


async def _sse(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Set-Cookie": f"session={KEY}",
            "X-Api-Key": KEY,
            "X-Note": f"<script>alert(4)</script> {SPLIT_KEY}",  # no control character:
            # aiohttp refuses to send one in a header
        }
    )
    await response.prepare(request)
    for i, word in enumerate(["<script>alert(3)</script>", SPLIT_KEY, "end"]):
        chunk = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": word}}]}
        if i == 2:
            chunk["choices"][0]["finish_reason"] = "stop"  # type: ignore[index]
        await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    usage = {"id": "c1", "choices": [], "usage": {"prompt_tokens": 8, "completion_tokens": 3}}
    await response.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())
    return response


@asynccontextmanager
async def hostile_engine() -> AsyncIterator[str]:
    """The hostile engine; yields its base URL (without /v1)."""
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _fail)
    app.router.add_get("/metrics", _fail)
    app.router.add_post("/sse/v1/chat/completions", _sse)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        await runner.cleanup()


def targets(sim: str, hostile: str, interval: float = 0.5) -> list[dict[str, Any]]:
    """A simulator target with load and an engine scrape, and the hostile one (its URL with a
    query, which the page keeps)."""
    common = {"model": "m", "interval_seconds": interval, "jitter_seconds": 0, "warmup": 0}
    return [
        {
            **common,
            "name": "sim",
            "url": f"{sim}/v1",
            "metrics_url": f"{sim}/metrics",
            "load": {"rate": 2.0, "max_in_flight": 4, "seed": 1},
        },
        {
            **common,
            "name": "hostile",
            "url": f"{hostile}/v1?api-version=1",
            "metrics_url": f"{hostile}/metrics",
            "api_key_env": KEY_ENV,
        },
    ]
