"""OpenAI-compatible generation endpoints: /v1/chat/completions and /v1/completions.

Chunks are shaped like vLLM's: `chat.completion.chunk` with `delta.content` (or the reasoning
field), `text_completion` with `text`; the chat stream opens with a role-only chunk, the last
token chunk carries `finish_reason` (and llama-server's `timings` when enabled), a usage chunk
with `choices: []` follows when `stream_options.include_usage` is set, then `data: [DONE]`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from aiohttp import web

from prober.sim.faults import FAULT_HEADER
from prober.sim.generation import generate
from prober.sim.state import STATE
from prober.sim.tokens import count_chat_tokens, count_prompt_tokens
from prober.sim.wire import Final, GenSpec, error_response

DONE = b"data: [DONE]\n\n"


def _sse(obj: object) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _usage(final: Final) -> dict[str, object]:
    return {
        "prompt_tokens": final.prompt_tokens,
        "completion_tokens": final.completion_tokens,
        "total_tokens": final.prompt_tokens + final.completion_tokens,
        "completion_tokens_details": {"reasoning_tokens": final.reasoning_tokens},
    }


def _timings(final: Final) -> dict[str, object]:
    # llama-server's fields; predicted_ms runs from the first to the last token.
    n = final.completion_tokens
    return {
        "prompt_n": final.prompt_tokens,
        "prompt_ms": final.prompt_ms,
        "predicted_n": n,
        "predicted_ms": final.predicted_ms,
        "predicted_per_token_ms": final.predicted_ms / n if n else 0.0,
        "cache_n": 0,
    }


@dataclass(frozen=True, slots=True)
class OpenAIEncoder:
    """SSE bytes of one chat (chat=True) or completions stream."""

    request_id: str
    model: str
    created: int
    chat: bool
    reasoning_field: str
    timings: bool
    content_type: str = "text/event-stream"

    def _chunk(self, choices: list[dict[str, object]], **extra: object) -> dict[str, object]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        head = {"id": self.request_id, "object": kind, "created": self.created}
        return head | {"model": self.model, "choices": choices} | extra

    def _choice(self, text: str, reasoning: bool, finish: str | None) -> dict[str, object]:
        if not self.chat:
            return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        delta = {self.reasoning_field if reasoning else "content": text}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

    def opening(self) -> bytes:
        if not self.chat:
            return b""
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return _sse(self._chunk([choice]))

    def tokens(self, text: str, reasoning: bool, final: Final | None) -> bytes:
        finish = final.finish_reason if final else None
        chunk = self._chunk([self._choice(text, reasoning, finish)])
        if final is not None and self.timings:
            chunk["timings"] = _timings(final)
        return _sse(chunk)

    def closing(self, final: Final, include_usage: bool) -> bytes:
        if not include_usage:
            return DONE
        return _sse(self._chunk([], usage=_usage(final))) + DONE

    def keepalive(self) -> bytes | None:
        return b": ping\n\n"

    def bad_json(self) -> bytes:
        return b"data: {not json\n\n"

    def malformed(self) -> bytes:
        # A chunk without its `data:` prefix, then a line of bytes that are not UTF-8.
        bare = json.dumps(self._chunk([self._choice("", False, None)])).encode()
        return bare + b"\n\n\xff\xfe\xfa garbage \x00\x01\n\n"

    def oversized(self, size: int) -> bytes:
        # A valid, token-less chunk padded so its `data:` line is exactly `size` bytes.
        line = _sse(self._chunk([self._choice("", False, None)], pad=""))[:-2]
        pad = max(size - len(line), 0)
        return _sse(self._chunk([self._choice("", False, None)], pad="x" * pad))

    def whole(self, content: str, reasoning: str, final: Final) -> dict[str, object]:
        if self.chat:
            message: dict[str, object] = {"role": "assistant", "content": content}
            if reasoning:
                message[self.reasoning_field] = reasoning
            choice: dict[str, object] = {"index": 0, "message": message}
        else:
            choice = {"index": 0, "text": content, "logprobs": None}
        choice["finish_reason"] = final.finish_reason
        kind = "chat.completion" if self.chat else "text_completion"
        head = {"id": self.request_id, "object": kind, "created": self.created}
        return head | {"model": self.model, "choices": [choice], "usage": _usage(final)}


def _max_tokens(body: dict[str, object], default: int) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"'{key}' must be an integer >= 1, got {value!r}")
        return value
    return default


async def json_body(request: web.Request) -> dict[str, object]:
    """The request's JSON object; ValueError (a 400) when it is not one."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError("request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ValueError("request body must be a JSON object")
    return body


async def _handle(request: web.Request, chat: bool) -> web.StreamResponse:
    cfg = request.app[STATE].cfg
    t_start = time.perf_counter_ns()
    try:
        body = await json_body(request)
        fault = request.app[STATE].faults.pick(request.headers.get(FAULT_HEADER))
        if chat:
            prompt = count_chat_tokens(body.get("messages"))
        else:
            prompt = count_prompt_tokens(body.get("prompt"))
        max_tokens = _max_tokens(body, cfg.default_max_tokens)
    except ValueError as exc:
        return error_response(400, str(exc))
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    # Completions have no reasoning channel; chat reasons first, within max_tokens.
    reasoning = min(cfg.reasoning_tokens, max_tokens) if chat else 0
    prefix = "chatcmpl-" if chat else "cmpl-"
    request_id = prefix + uuid.uuid4().hex
    spec = GenSpec(
        request_id=request_id,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        reasoning_tokens=reasoning,
        include_usage=include_usage,
        stream=body.get("stream") is True,
        fault=fault,
        t_start_ns=t_start,
    )
    enc = OpenAIEncoder(
        request_id=request_id,
        model=cfg.model,
        created=int(time.time()),
        chat=chat,
        reasoning_field=cfg.reasoning_field,
        timings=cfg.timings,
    )
    return await generate(request, spec, enc)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions"""
    return await _handle(request, chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions"""
    return await _handle(request, chat=False)


async def models(request: web.Request) -> web.Response:
    """GET /v1/models: the one model this simulator serves."""
    cfg = request.app[STATE].cfg
    entry = {"id": cfg.model, "object": "model", "created": 0, "owned_by": "llm-prober-sim"}
    return web.json_response({"object": "list", "data": [entry]})
