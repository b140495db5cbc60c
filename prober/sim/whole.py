"""Non-streaming answers: wait for the whole generation, then one JSON body (or a broken one).

Faults that hang are handled before this module (`generation.py`); here truncate_after and
close_mid_body send half the body and abort, bad_json and malformed send a body that is not
JSON, no_tokens answers zero tokens without engine work.
"""

from __future__ import annotations

from aiohttp import web

from prober.sim.engine import EngineRequest
from prober.sim.faults import FaultKind
from prober.sim.state import SimState
from prober.sim.tokens import output_text
from prober.sim.wire import CLIENT_GONE, Encoder, GenSpec, abort, client_gone, fault_kind, final_of


async def whole(
    request: web.Request, state: SimState, spec: GenSpec, enc: Encoder
) -> web.StreamResponse:
    """Run the generation to its end and answer it in one body."""
    kind = fault_kind(spec)
    req: EngineRequest | None = None
    completion = 0
    try:
        if kind is not FaultKind.NO_TOKENS:
            req = state.engine.submit(
                spec.prompt_tokens,
                spec.max_tokens,
                reasoning_tokens=spec.reasoning_tokens,
                is_gone=client_gone(request),
            )
            while True:
                em = await req.out.get()
                if em.dropped:
                    return web.Response(status=CLIENT_GONE)
                completion += em.tokens
                if em.last:
                    break
    finally:
        if req is not None:
            state.engine.cancel(req)
    final = final_of(spec, req, completion)
    reasoning = min(completion, spec.reasoning_tokens)
    content = output_text(reasoning, completion - reasoning)
    body = enc.whole(content, output_text(0, reasoning), final)
    return await _whole_fault(request, kind, body)


async def _whole_fault(
    request: web.Request, kind: FaultKind | None, body: dict[str, object]
) -> web.StreamResponse:
    if kind in (FaultKind.BAD_JSON, FaultKind.MALFORMED):
        return web.Response(text="{not json", content_type="application/json")
    resp = web.json_response(body)
    if kind not in (FaultKind.TRUNCATE_AFTER, FaultKind.CLOSE_MID_BODY):
        return resp
    # Announce the full length, send half, and drop the connection.
    payload = resp.body if isinstance(resp.body, bytes) else b"{}"
    broken = web.StreamResponse(headers={"Content-Type": "application/json"})
    broken.content_length = len(payload)
    try:
        await broken.prepare(request)
        await broken.write(payload[: len(payload) // 2])
        abort(request)
    except ConnectionError:
        pass
    return broken
