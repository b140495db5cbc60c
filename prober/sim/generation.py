"""Entry point of every generation request: early faults, KV admission check, then stream or not.

All three generation endpoints (OpenAI chat, OpenAI completions, Ollama chat) come through
`generate`. Wire behaviour of each fault, streaming (`stream.py`):

- `status:CODE`: that status with a JSON error body (`Retry-After: 1` on 429), no engine work;
- `no_first_byte`: accept, then send nothing at all until the client gives up;
- `no_first_token`: 200 headers, then only keep-alive comments (SSE) or silence (NDJSON);
- `stall_after:N`: N tokens, then silence with the connection open;
- `truncate_after:N`: N tokens, then a clean end of body without the closing event;
- `close_mid_body`: 2 tokens, then half an event and an abrupt transport abort;
- `malformed` / `bad_json` / `oversized:BYTES`: after the first token event, one broken
  event (see the encoders), then the normal rest of the stream;
- `endless`: tokens until the client leaves, ignoring max_tokens;
- `no_tokens`: only the usage summary and the end marker, no token-bearing event.

Cut faults (stall, truncate, close) act at the end of the stream when it has fewer tokens.
Non-streaming requests: status as above; no_first_byte, no_first_token, stall_after and
endless hang before headers; truncate_after and close_mid_body send half the body and abort;
bad_json and malformed answer a body that is not JSON; no_tokens answers zero tokens.
"Forever" always ends when the client disconnects or the app shuts down.
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from prober.sim.faults import FaultKind
from prober.sim.state import STATE, SimState
from prober.sim.stream import stream
from prober.sim.whole import whole
from prober.sim.wire import CLIENT_GONE, Encoder, GenSpec, error_response, fault_kind, wait_gone

_HANG_BEFORE_HEADERS = {
    FaultKind.NO_FIRST_BYTE,
    FaultKind.NO_FIRST_TOKEN,
    FaultKind.STALL_AFTER,
    FaultKind.ENDLESS,
}


async def generate(request: web.Request, spec: GenSpec, enc: Encoder) -> web.StreamResponse:
    """Answer one generation request; the only caller of the engine for real requests."""
    state = request.app[STATE]
    task = asyncio.current_task()
    if task is not None:
        state.streams.add(task)
    try:
        return await _generate(request, state, spec, enc)
    finally:
        if task is not None:
            state.streams.discard(task)


async def _generate(
    request: web.Request, state: SimState, spec: GenSpec, enc: Encoder
) -> web.StreamResponse:
    kind = fault_kind(spec)
    if spec.fault is not None and kind is FaultKind.STATUS:
        return error_response(spec.fault.arg, f"injected fault {kind}:{spec.fault.arg}")
    try:
        state.engine.check_fits(spec.prompt_tokens, spec.max_tokens)
    except ValueError as exc:
        return error_response(400, str(exc))
    if kind is FaultKind.NO_FIRST_BYTE or (not spec.stream and kind in _HANG_BEFORE_HEADERS):
        await wait_gone(request)
        return web.Response(status=CLIENT_GONE)
    if spec.stream:
        return await stream(request, state, spec, enc)
    return await whole(request, state, spec, enc)
