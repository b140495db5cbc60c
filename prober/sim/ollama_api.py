"""Ollama's native chat endpoint, POST /api/chat, in Ollama's documented NDJSON format.

One JSON object per line: `message.content` carries tokens (`message.thinking` carries the
reasoning channel, as Ollama does for thinking models); the last object has `done: true`,
`done_reason`, `prompt_eval_count`, `eval_count` and the durations `load_duration`,
`prompt_eval_duration`, `eval_duration`, `total_duration` in nanoseconds. `stream` defaults to
true; `options.num_predict` is the output length (negative means the configured default).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

from aiohttp import web

from prober.sim.faults import FAULT_HEADER
from prober.sim.generation import generate
from prober.sim.openai_api import json_body
from prober.sim.state import STATE
from prober.sim.tokens import count_chat_tokens
from prober.sim.wire import Final, GenSpec, error_response


def _line(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _created_at() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class OllamaEncoder:
    """NDJSON bytes of one Ollama chat answer."""

    model: str
    content_type: str = "application/x-ndjson"

    def _object(self, content: str, thinking: str, done: bool) -> dict[str, object]:
        message = {"role": "assistant", "content": content}
        if thinking:
            message["thinking"] = thinking
        return {"model": self.model, "created_at": _created_at(), "message": message, "done": done}

    def _done_fields(self, final: Final) -> dict[str, object]:
        return {
            "done_reason": final.finish_reason,
            "total_duration": final.total_ns,
            "load_duration": 0,  # the simulated model is always loaded
            "prompt_eval_count": final.prompt_tokens,
            "prompt_eval_duration": round(final.prompt_ms * 1e6),
            "eval_count": final.completion_tokens,
            "eval_duration": round(final.predicted_ms * 1e6),
        }

    def opening(self) -> bytes:
        return b""

    def tokens(self, text: str, reasoning: bool, final: Final | None) -> bytes:
        if reasoning:
            return _line(self._object("", text, False))
        return _line(self._object(text, "", False))

    def closing(self, final: Final, include_usage: bool) -> bytes:
        # Ollama always reports its counts on the done object; include_usage is OpenAI's.
        return _line(self._object("", "", True) | self._done_fields(final))

    def keepalive(self) -> bytes | None:
        return None  # NDJSON has no comment lines: a stuck Ollama is simply silent.

    def bad_json(self) -> bytes:
        return b"{not json\n"

    def malformed(self) -> bytes:
        # Two objects glued on one line, then a line of bytes that are not UTF-8.
        glued = _line(self._object("", "", False))[:-1] * 2
        return glued + b"\n\xff\xfe\xfa garbage \x00\x01\n"

    def oversized(self, size: int) -> bytes:
        line = _line(self._object("", "", False) | {"pad": ""})[:-1]
        pad = max(size - len(line), 0)
        return _line(self._object("", "", False) | {"pad": "x" * pad})

    def whole(self, content: str, reasoning: str, final: Final) -> dict[str, object]:
        return self._object(content, reasoning, True) | self._done_fields(final)


def _num_predict(body: dict[str, object], default: int) -> int:
    options = body.get("options")
    if options is None:
        return default
    if not isinstance(options, dict):
        raise ValueError("'options' must be an object")
    value = options.get("num_predict")
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value == 0:
        raise ValueError(f"'options.num_predict' must be a non-zero integer, got {value!r}")
    # Ollama reads -1 as "until the model stops"; the simulator's model stops at the default.
    return value if value > 0 else default


async def chat(request: web.Request) -> web.StreamResponse:
    """POST /api/chat"""
    cfg = request.app[STATE].cfg
    t_start = time.perf_counter_ns()
    try:
        body = await json_body(request)
        fault = request.app[STATE].faults.pick(request.headers.get(FAULT_HEADER))
        prompt = count_chat_tokens(body.get("messages"))
        max_tokens = _num_predict(body, cfg.default_max_tokens)
    except ValueError as exc:
        return error_response(400, str(exc))
    reasoning = min(cfg.reasoning_tokens, max_tokens)
    spec = GenSpec(
        request_id="ollama-" + uuid.uuid4().hex,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        reasoning_tokens=reasoning,
        include_usage=True,
        stream=body.get("stream", True) is not False,
        fault=fault,
        t_start_ns=t_start,
    )
    return await generate(request, spec, OllamaEncoder(cfg.model))
