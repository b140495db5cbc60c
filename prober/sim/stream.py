"""Streamed answers: engine tokens written to the client as they come, faults applied in-line.

The handler task of each request reads its engine queue and writes; the engine loop never
writes. Every body write is stamped right after the transport took it (`stamps.py`).
"""

from __future__ import annotations

import time

from aiohttp import web

from prober.sim.engine import EngineRequest
from prober.sim.faults import Fault, FaultKind
from prober.sim.stamps import StampRecord
from prober.sim.state import SimState
from prober.sim.tokens import output_text
from prober.sim.wire import (
    Encoder,
    GenSpec,
    abort,
    client_gone,
    fault_kind,
    final_of,
    wait_gone,
)

CLOSE_MID_BODY_TOKENS = 2


class _Out:
    """Writes body bytes and stamps them right after the transport took them."""

    def __init__(self, resp: web.StreamResponse, record: StampRecord) -> None:
        self.resp = resp
        self._record = record

    async def write(self, data: bytes, *, token: bool = False) -> None:
        if not data:
            return  # An empty write sends nothing; stamping it would fake a first byte.
        await self.resp.write(data)
        now = time.perf_counter_ns()
        if self._record.first_byte_ns is None:
            self._record.first_byte_ns = now
        if token:
            self._record.token_write_ns.append(now)


async def stream(
    request: web.Request, state: SimState, spec: GenSpec, enc: Encoder
) -> web.StreamResponse:
    """Write the streamed answer; returns when done, cut, or the client left."""
    headers = {"Content-Type": enc.content_type, "Cache-Control": "no-cache"}
    resp = web.StreamResponse(headers=headers | {"X-Request-Id": spec.request_id})
    # Found by the client's X-Request-Id too: the prober's results carry that one.
    out = _Out(resp, state.stamps.open(spec.request_id, request.headers.get("X-Request-Id")))
    kind = fault_kind(spec)
    req: EngineRequest | None = None
    try:
        await resp.prepare(request)
        if kind is FaultKind.NO_TOKENS:
            await out.write(enc.closing(final_of(spec, None, 0), True))
            await resp.write_eof()
            return resp
        await out.write(enc.opening())
        if kind is FaultKind.NO_FIRST_TOKEN:
            await _keep_alive(request, out, enc, state.cfg.keepalive_seconds)
            return resp
        req = state.engine.submit(
            spec.prompt_tokens,
            spec.max_tokens,
            reasoning_tokens=spec.reasoning_tokens,
            endless=kind is FaultKind.ENDLESS,
            is_gone=client_gone(request),
        )
        await _pump(request, out, enc, spec, req)
    except ConnectionError:
        pass  # The client left mid-write: there is nobody to answer.
    finally:
        if req is not None:
            state.engine.cancel(req)
    return resp


async def _keep_alive(request: web.Request, out: _Out, enc: Encoder, every: float) -> None:
    ping = enc.keepalive()
    if ping is None:
        await wait_gone(request)
        return
    while True:
        await out.write(ping)
        if await wait_gone(request, every):
            return


def _cut_limit(fault: Fault | None) -> int | None:
    if fault is None:
        return None
    if fault.kind in (FaultKind.STALL_AFTER, FaultKind.TRUNCATE_AFTER):
        return fault.arg
    if fault.kind is FaultKind.CLOSE_MID_BODY:
        return CLOSE_MID_BODY_TOKENS
    return None


def _injection(enc: Encoder, fault: Fault | None) -> bytes | None:
    if fault is None:
        return None
    if fault.kind is FaultKind.MALFORMED:
        return enc.malformed()
    if fault.kind is FaultKind.BAD_JSON:
        return enc.bad_json()
    if fault.kind is FaultKind.OVERSIZED:
        return enc.oversized(fault.arg)
    return None


async def _pump(
    request: web.Request, out: _Out, enc: Encoder, spec: GenSpec, req: EngineRequest
) -> None:
    limit = _cut_limit(spec.fault)
    inject = _injection(enc, spec.fault)
    sent = 0
    while True:
        em = await req.out.get()
        if em.dropped:
            return
        take = em.tokens if limit is None else min(em.tokens, limit - sent)
        cut = limit is not None and (sent + take >= limit or em.last)
        final = final_of(spec, req, sent + take) if em.last and not cut else None
        if take > 0:
            text = output_text(sent, take)
            await out.write(enc.tokens(text, sent < spec.reasoning_tokens, final), token=True)
            sent += take
        if inject is not None:
            await out.write(inject)
            inject = None
        if cut:
            await _cut(request, out, enc, spec, sent)
            return
        if final is not None:
            await out.write(enc.closing(final, spec.include_usage))
            await out.resp.write_eof()
            return


async def _cut(request: web.Request, out: _Out, enc: Encoder, spec: GenSpec, sent: int) -> None:
    kind = fault_kind(spec)
    if kind is FaultKind.STALL_AFTER:
        await wait_gone(request)
    elif kind is FaultKind.TRUNCATE_AFTER:
        await out.resp.write_eof()
    else:
        event = enc.tokens(output_text(sent, 1), sent < spec.reasoning_tokens, None)
        await out.write(event[: len(event) // 2])
        abort(request)
