"""A streaming chat server that records the truth: when each request arrived, when each token left.

    .venv/bin/python bench/truth_server.py --port P [--ttft 0.05] [--step 0.01] [--loop uvloop]
        [--arrival kernel|read]

The yardstick of `perf_bench.py` and `perf_load.py --server truth`. Keep-alive HTTP/1.1 on
bare non-blocking sockets (chunked SSE in OpenAI's chat shape, usage at the end), with as
little between the socket and the clock as possible:

- **arrival** (`kernel`, the default): the kernel's receive stamp of the request's last
  bytes (`SO_TIMESTAMPNS`, read with `recvmsg`, moved from CLOCK_REALTIME to the monotonic
  clock). It does not depend on when the server got round to reading: while it writes a
  step's burst to 200 streams, a request that arrives waits in the socket, and a stamp taken
  on reading it (`read`: when `recvmsg` returned; the previous yardstick stamped in
  `data_received`, the same instant) was late by the rest of the burst, which
  made every client look slower by that much (the raw floor's own TTFT error at c=200 was
  +1.5 ms with it);
- **token write**: `perf_counter_ns()` right after `send()` returned: on loopback the bytes
  are in the client's receive queue by then (`perf_writes.py` checks the same of the
  simulator's writes);
- the first token is written `--ttft` after the arrival (a timer of its own: the prefill),
  every later one on a shared `--step` clock, to every stream in one burst, as a continuously
  batched engine does. Answers are `max_tokens` tokens long.

TTFT truth = first token write − arrival. `GET /truth` returns `{request_id: [arrival_ns,
[write_ns, ...]]}` for the requests finished since the last call and forgets them (the id is
the client's `X-Request-Id`, or one of ours); `GET /health` answers 200. Stamps are
CLOCK_MONOTONIC, comparable with the client's `perf_counter_ns()` across processes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import time
import uuid

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 64 * 1024
_USAGE_PROMPT_TOKENS_PER_WORD = 1.3
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux
_RECV_BYTES = 256 * 1024
_ANCILLARY_BYTES = 64


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: dict[str, object]) -> bytes:
    # "object" as OpenAI sends it: some clients (aiperf) read nothing from a chunk without it.
    obj = {"object": "chat.completion.chunk", **obj}
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


class Stream:
    """One answer in progress: its stamps and what is left to write."""

    __slots__ = ("left", "prompt", "receive_ns", "rid", "sent", "token", "transport", "writes")

    def __init__(self, transport: Connection, rid: str, tokens: int, prompt: int) -> None:
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


class Connection:
    """Keep-alive HTTP/1.1 on a bare non-blocking socket: requests in, the engine's streams
    out. Not an asyncio transport: the receive needs `recvmsg`, for the kernel's stamp."""

    __slots__ = ("buf", "closed", "engine", "fd", "loop", "out", "sock")

    def __init__(self, sock: socket.socket, engine: Engine, arrival: str) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.engine = engine
        self.loop = asyncio.get_running_loop()
        self.buf = b""
        self.out: list[bytes] = []
        self.closed = False
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if arrival == "kernel":
            sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
        self.loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        try:
            data, ancillary, _, _ = self.sock.recvmsg(_RECV_BYTES, _ANCILLARY_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        now = time.perf_counter_ns()
        if not data:
            self.close()
            return
        for level, kind, stamp in ancillary:
            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                sec, nsec = struct.unpack("qq", stamp[:16])
                now = sec * 1_000_000_000 + nsec - realtime_offset_ns()
        self.buf += data
        while (request := self._next_request()) is not None:
            self._answer(*request, now)

    def write(self, data: bytes) -> None:
        if self.closed:
            return
        if self.out:
            self.out.append(data)
            return
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.close()
            return
        if sent < len(data):
            self.out.append(data[sent:])
            self.loop.add_writer(self.fd, self._writable)

    def _writable(self) -> None:
        data = b"".join(self.out)
        try:
            sent = self.sock.send(data)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        self.out = [data[sent:]] if sent < len(data) else []
        if not self.out:
            self.loop.remove_writer(self.fd)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.loop.remove_reader(self.fd)
            self.loop.remove_writer(self.fd)
            self.sock.close()

    def _next_request(self) -> tuple[bytes, dict[bytes, bytes], bytes] | None:
        end = self.buf.find(_HEAD_END)
        if end < 0:
            if len(self.buf) > _MAX_HEAD:
                self.close()
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
        path = line.split(b" ")[1] if b" " in line else b"/"
        if path == b"/truth":
            done, self.engine.finished = self.engine.finished, {}
            self._plain(json.dumps(done).encode())
            return
        if not path.endswith(b"/chat/completions"):
            self._plain(b"ok")
            return
        request = json.loads(body)
        words = sum(len(str(m.get("content", "")).split()) for m in request.get("messages", []))
        rid = headers.get(b"x-request-id", b"").decode() or uuid.uuid4().hex
        stream = Stream(self, rid, int(request.get("max_tokens") or 16),
                        max(1, round(words * _USAGE_PROMPT_TOKENS_PER_WORD)))  # fmt: skip
        stream.receive_ns = now
        self.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            + _event({"id": rid, "choices": [{"index": 0, "delta": {"role": "assistant"}}]})
        )
        self.engine.admit(stream)

    def _plain(self, body: bytes) -> None:
        self.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (len(body), body)
        )


def realtime_offset_ns() -> int:
    """CLOCK_REALTIME − CLOCK_MONOTONIC now, from the tightest of three brackets: the kernel
    stamps receives on the real-time clock, everything else here is monotonic."""
    best = (1 << 62, 0)
    for _ in range(3):
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        real = time.clock_gettime_ns(time.CLOCK_REALTIME)
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        best = min(best, (after - before, real - (before + after) // 2))
    return best[1]


async def serve(port: int, ttft: float, step: float, arrival: str) -> None:
    engine = Engine(ttft, step)
    engine.start()
    loop = asyncio.get_running_loop()
    listener = socket.create_server(("127.0.0.1", port), backlog=4096)
    listener.setblocking(False)
    connections: list[Connection] = []

    def accept() -> None:
        while True:
            try:
                sock, _ = listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            connections.append(Connection(sock, engine, arrival))

    loop.add_reader(listener.fileno(), accept)
    try:
        await asyncio.Event().wait()
    finally:
        loop.remove_reader(listener.fileno())
        for connection in connections:
            connection.close()
        listener.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ttft", type=float, default=0.05)
    parser.add_argument("--step", type=float, default=0.01)
    parser.add_argument("--loop", default="uvloop", choices=["uvloop", "asyncio"])
    parser.add_argument(
        "--arrival", default="kernel", choices=["kernel", "read"],
        help="a request's arrival: the kernel's receive stamp, or when the server read it",
    )  # fmt: skip
    ns = parser.parse_args()
    if ns.loop == "uvloop":
        import uvloop

        uvloop.install()
    asyncio.run(serve(ns.port, ns.ttft, ns.step, ns.arrival))


if __name__ == "__main__":
    main()
