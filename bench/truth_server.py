"""A streaming chat server that records the truth: when each request arrived, when each token left.

    .venv/bin/python bench/truth_server.py --port P [--ttft 0.05] [--step 0.01] [--loop uvloop]

The yardstick of `perf_bench.py` and `perf_load.py --server truth`. A bare asyncio.Protocol
HTTP/1.1 server (keep-alive, chunked SSE in OpenAI's chat shape, usage at the end), with as
little between the socket and the clock as possible:

- **receive**: `perf_counter_ns()` in `data_received` when the request's last byte arrived,
  the answer deferred to the loop's queue so a burst of arrivals is stamped before any is
  answered;
- **token write**: `perf_counter_ns()` right after `transport.write()` returned (uvloop and
  asyncio both write at once when the socket's buffer is empty; `perf_writes.py` checks);
- the first token is written `--ttft` after the receive (a timer of its own: the prefill),
  every later one on a shared `--step` clock, to every stream in one burst, as a continuously
  batched engine does. Answers are `max_tokens` tokens long.

TTFT truth = first token write − receive. `GET /truth` returns `{request_id: [receive_ns,
[write_ns, ...]]}` for the requests finished since the last call and forgets them (the id is
the client's `X-Request-Id`, or one of ours); `GET /health` answers 200. Stamps are
CLOCK_MONOTONIC, comparable with the client's across processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import Callable
from typing import cast

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 64 * 1024
_USAGE_PROMPT_TOKENS_PER_WORD = 1.3


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: object) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


class Stream:
    """One answer in progress: its stamps and what is left to write."""

    __slots__ = ("left", "prompt", "receive_ns", "rid", "sent", "token", "transport", "writes")

    def __init__(self, transport: asyncio.Transport, rid: str, tokens: int, prompt: int) -> None:
        self.transport = transport
        self.rid = rid
        # Built once: a step's burst of writes should cost the server as little as possible,
        # so its own lateness (a request read late behind the burst) stays small.
        self.token = _event({"choices": [{"index": 0, "delta": {"content": " tok"}}], "id": rid})
        self.left = tokens
        self.sent = 0
        self.prompt = prompt
        self.receive_ns = 0
        self.writes: list[int] = []


class Engine:
    """The shared decode clock: one token to every stream each step."""

    def __init__(self, ttft: float, step: float) -> None:
        self.ttft = ttft
        self.step = step
        self.active: list[Stream] = []
        self.finished: dict[str, list[object]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.call_at(self._loop.time() + self.step, self._tick)

    def admit(self, stream: Stream) -> None:
        assert self._loop is not None
        self._loop.call_at(self._loop.time() + self.ttft, self._first, stream)

    def _first(self, stream: Stream) -> None:
        if self._token(stream):
            self.active.append(stream)

    def _tick(self) -> None:
        assert self._loop is not None
        self._loop.call_at(self._loop.time() + self.step, self._tick)
        self.active = [s for s in self.active if self._token(s)]

    def _token(self, s: Stream) -> bool:
        """Write one token; True while the stream goes on."""
        if s.transport.is_closing():
            return False
        s.transport.write(s.token)
        s.writes.append(time.perf_counter_ns())
        s.left -= 1
        if s.left > 0:
            return True
        usage = {"prompt_tokens": s.prompt, "completion_tokens": len(s.writes),
                 "total_tokens": s.prompt + len(s.writes)}  # fmt: skip
        done = {"id": s.rid, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
        s.transport.write(
            _event(done) + _event({"id": s.rid, "choices": [], "usage": usage})
            + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
        )  # fmt: skip
        self.finished[s.rid] = [s.receive_ns, s.writes]
        return False


class HttpProtocol(asyncio.Protocol):
    """Keep-alive HTTP/1.1: requests in, the engine's streams out."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.buf = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        # Stamp now, answer later: when 200 requests arrive together, the loop reads all 200
        # sockets first and only then runs the answers, so the 200th is not stamped late by
        # the 199 answers before it (the truth must not include the server's own queueing).
        now = time.perf_counter_ns()
        self.buf += data
        asyncio.get_running_loop().call_soon(self._drain, now)

    def _drain(self, now: int) -> None:
        while (request := self._next_request()) is not None:
            self._answer(*request, now)

    def _next_request(self) -> tuple[bytes, dict[bytes, bytes], bytes] | None:
        end = self.buf.find(_HEAD_END)
        if end < 0:
            if len(self.buf) > _MAX_HEAD and self.transport is not None:
                self.transport.close()
            return None
        lines = self.buf[:end].split(b"\r\n")
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get(b"content-length", b"0"))
        if len(self.buf) < end + 4 + length:
            return None
        body = self.buf[end + 4 : end + 4 + length]
        self.buf = self.buf[end + 4 + length :]
        return lines[0], headers, body

    def _answer(self, line: bytes, headers: dict[bytes, bytes], body: bytes, now: int) -> None:
        transport = self.transport
        assert transport is not None
        path = line.split(b" ")[1] if b" " in line else b"/"
        if path == b"/truth":
            done, self.engine.finished = self.engine.finished, {}
            _plain(transport, json.dumps(done).encode())
            return
        if not path.endswith(b"/chat/completions"):
            _plain(transport, b"ok")
            return
        request = json.loads(body)
        words = sum(len(str(m.get("content", "")).split()) for m in request.get("messages", []))
        rid = headers.get(b"x-request-id", b"").decode() or uuid.uuid4().hex
        stream = Stream(transport, rid, int(request.get("max_tokens") or 16),
                        max(1, round(words * _USAGE_PROMPT_TOKENS_PER_WORD)))  # fmt: skip
        stream.receive_ns = now
        transport.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            + _event({"id": rid, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        )
        self.engine.admit(stream)


def _plain(transport: asyncio.Transport, body: bytes) -> None:
    transport.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
        % (len(body), body)
    )


async def serve(port: int, ttft: float, step: float) -> None:
    engine = Engine(ttft, step)
    engine.start()
    factory: Callable[[], asyncio.Protocol] = lambda: HttpProtocol(engine)  # noqa: E731
    server = await asyncio.get_running_loop().create_server(
        factory, "127.0.0.1", port, backlog=4096
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft", type=float, default=0.05)
    parser.add_argument("--step", type=float, default=0.01)
    parser.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    ns = parser.parse_args()
    if ns.loop == "uvloop":
        import uvloop

        uvloop.install()
    asyncio.run(serve(ns.port, ns.ttft, ns.step))


if __name__ == "__main__":
    main()
