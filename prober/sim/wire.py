"""Shared vocabulary of the generation endpoints: request spec, summary, encoder, helpers.

`GenSpec` is what an endpoint parsed from a request; `Final` summarises a finished generation;
an `Encoder` turns tokens and that summary into one API's bytes (OpenAI SSE, Ollama NDJSON),
so `stream.py` and `whole.py` apply every fault the same way on every wire format.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from prober.sim.engine import EngineRequest
from prober.sim.faults import Fault, FaultKind

# How often a silent handler looks for its client; only faulty requests ever poll.
_GONE_POLL_SECONDS = 0.1
# Status for a response nobody will read: the client is gone.
CLIENT_GONE = 499


@dataclass(frozen=True, slots=True)
class GenSpec:
    """What one generation request asks for, parsed and validated by its endpoint."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    reasoning_tokens: int
    include_usage: bool
    stream: bool
    fault: Fault | None
    t_start_ns: int


@dataclass(frozen=True, slots=True)
class Final:
    """Summary of a finished generation, for usage, timings and Ollama's durations."""

    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    prompt_ms: float
    predicted_ms: float
    finish_reason: str
    total_ns: int


class Encoder(Protocol):
    """Bytes of one wire format. `final` is set on the last token event only."""

    @property
    def content_type(self) -> str: ...
    def opening(self) -> bytes: ...
    def tokens(self, text: str, reasoning: bool, final: Final | None) -> bytes: ...
    def closing(self, final: Final, include_usage: bool) -> bytes: ...
    def keepalive(self) -> bytes | None: ...
    def bad_json(self) -> bytes: ...
    def malformed(self) -> bytes: ...
    def oversized(self, size: int) -> bytes: ...
    def whole(self, content: str, reasoning: str, final: Final) -> dict[str, object]: ...


def error_response(status: int, message: str) -> web.Response:
    """OpenAI-shaped JSON error; 429 carries Retry-After like rate-limited gateways do."""
    headers = {"Retry-After": "1"} if status == 429 else None
    body = {"error": {"message": message, "type": "sim_error", "code": status}}
    return web.json_response(body, status=status, headers=headers)


def client_gone(request: web.BaseRequest) -> Callable[[], bool]:
    """A cheap check the engine loop runs each step: has this request's client left?"""

    def gone() -> bool:
        transport = request.transport
        return transport is None or transport.is_closing()

    return gone


async def wait_gone(request: web.BaseRequest, at_most: float | None = None) -> bool:
    """Wait until the client leaves (True) or `at_most` seconds pass (False)."""
    gone = client_gone(request)
    deadline = None if at_most is None else time.monotonic() + at_most
    while not gone():
        left = _GONE_POLL_SECONDS if deadline is None else deadline - time.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(left, _GONE_POLL_SECONDS))
    return True


def final_of(spec: GenSpec, req: EngineRequest | None, completion: int) -> Final:
    """Summary after `completion` tokens were sent (req is None when the engine was skipped)."""
    prompt_ms = 0.0 if req is None else req.prefill_seconds * 1000.0
    predicted_ms = 0.0 if req is None else (req.t_last - req.t_first) * 1000.0
    return Final(
        prompt_tokens=spec.prompt_tokens,
        completion_tokens=completion,
        reasoning_tokens=min(completion, spec.reasoning_tokens),
        prompt_ms=prompt_ms,
        predicted_ms=predicted_ms,
        finish_reason="length",
        total_ns=time.perf_counter_ns() - spec.t_start_ns,
    )


def fault_kind(spec: GenSpec) -> FaultKind | None:
    """The kind of the request's fault, if any."""
    return spec.fault.kind if spec.fault else None


def abort(request: web.BaseRequest) -> None:
    """Drop the connection without a clean end, as a crashing server would."""
    transport = request.transport
    if transport is not None:
        transport.abort()
