"""Where a send really happens: are bytes on the wire when a write returns, on each loop?

    .venv/bin/python bench/perf_writes.py [--streams 200] [--events 32]

Both accuracy figures rest on a stamp taken right after a write: the simulator stamps a token
after `await resp.write()`, the client takes `t_send` before aiohttp writes the request. A
loop that kept small writes in a buffer until the end of its iteration (an old uvloop
behaviour) would make those stamps early by up to a whole iteration, and worst in a burst.
This checks it directly, on the standard loop and on uvloop:

- server side: an aiohttp handler (the simulator's code path) writes `--events` SSE events to
  each of `--streams` connections, all in one burst per step like the simulator's engine;
  right after each `resp.write()` returns, the peer socket (in this process) is read without
  blocking. The bytes are there, or they were not sent yet.
- client side: `stream_request` sends one request, then `--streams` at once (a second wave
  each, on pooled connections), to a plain HTTP server in another process, which stamps the
  arrival of each request's first byte. Arrival − `t_send` is how long after the client's stamp the
  request really left: small and flat on a loop that writes at once, growing with the
  burst on one that holds writes back.

Server side prints the share of writes whose bytes had reached the peer when the write
returned (1.000: every stamp taken after a write is a true send time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import selectors
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from perf_common import serve_app

EVENT = b'data: {"choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'


def _drain(sock: socket.socket) -> int:
    got = 0
    while True:
        try:
            data = sock.recv(1 << 20, socket.MSG_DONTWAIT)
        except BlockingIOError:
            return got
        if not data:
            return got
        got += len(data)


async def server_side(streams: int, events: int) -> tuple[int, int]:
    """(writes whose bytes had arrived, writes) for an aiohttp streaming handler."""
    peers: dict[str, socket.socket] = {}
    ready = asyncio.Event()
    step = asyncio.Condition()
    arrived = total = 0
    prepared = 0

    async def handler(request: web.Request) -> web.StreamResponse:
        nonlocal arrived, total, prepared
        peer = peers[request.headers["X-Peer"]]
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(EVENT)
        await asyncio.sleep(0.05)
        _drain(peer)  # the headers and the first event
        prepared += 1
        if prepared == streams:
            ready.set()
        for _ in range(events):
            async with step:
                await step.wait()
            await resp.write(EVENT)
            total += 1
            arrived += _drain(peer) >= len(EVENT)
        return resp

    app = web.Application()
    app.router.add_get("/", handler)
    loop = asyncio.get_running_loop()
    async with serve_app(app) as port:
        try:
            for i in range(streams):
                sock = socket.socket()
                sock.setblocking(False)
                await loop.sock_connect(sock, ("127.0.0.1", port))
                peers[str(i)] = sock
                request = f"GET / HTTP/1.1\r\nHost: x\r\nX-Peer: {i}\r\n\r\n".encode()
                await loop.sock_sendall(sock, request)
            await ready.wait()
            for _ in range(events):
                async with step:
                    step.notify_all()  # every handler writes in the same loop iteration
                await asyncio.sleep(0.01)
        finally:
            for sock in peers.values():
                sock.close()
    return arrived, total


def stamping_server(port_file: str) -> None:
    """A plain HTTP server (its own process, so no GIL is shared with the client): stamps when
    each request's first byte arrives, keyed by X-Request-Id, answers a two-event SSE stream,
    and returns every stamp as JSON on `GET /stamps`."""
    body = b'data: {"choices":[{"index":0,"delta":{"content":"x"}}]}\n\ndata: [DONE]\n\n'
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    Path(port_file).write_text(str(listener.getsockname()[1]))
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    pending: dict[socket.socket, tuple[int, bytes]] = {}
    first_byte: dict[str, int] = {}
    while True:
        for key, _ in sel.select():
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            if sock is listener:
                sel.register(listener.accept()[0], selectors.EVENT_READ)
                continue
            data = sock.recv(65536)
            t_ns = time.perf_counter_ns()
            if not data:
                sel.unregister(sock)
                sock.close()
                continue
            first, buf = pending.pop(sock, (t_ns, b""))
            buf += data
            head, sep, rest = buf.partition(b"\r\n\r\n")
            lines = head.lower().split(b"\r\n")
            fields = dict(line.split(b":", 1) for line in lines[1:] if b":" in line)
            if not sep or len(rest) < int(fields.get(b"content-length", b"0")):
                pending[sock] = (first, buf)
            elif lines[0].startswith(b"get /stamps"):
                out = json.dumps(first_byte).encode()
                sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(out) + out)
            else:
                first_byte[fields[b"x-request-id"].strip().decode()] = first
                sock.sendall(answer)


async def client_side(port: int, streams: int) -> list[float]:
    """Request bytes at the server − `t_send` of `stream_request`, ms, for each request of
    the second of two waves of `streams` at once (its connections come from the pool)."""
    from prober.request import Api, RequestSpec, stream_request
    from prober.web import client_session

    spec = RequestSpec(f"http://127.0.0.1:{port}/v1", Api.CHAT, "m", "hello", 1)
    async with client_session() as session:
        for _ in range(2):
            results = await asyncio.gather(
                *(stream_request(session, spec, time.perf_counter_ns()) for _ in range(streams))
            )
        async with session.get(f"http://127.0.0.1:{port}/stamps") as resp:
            first_byte = json.loads(await resp.read())
    return sorted((first_byte[r.request_id] - r.t_send_ns) / 1e6 for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--events", type=int, default=32)
    parser.add_argument("--stamping-server", metavar="PORT_FILE", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.stamping_server:
        stamping_server(ns.stamping_server)
        return
    loops: list[tuple[str, Callable[[], asyncio.AbstractEventLoop]]] = [
        ("asyncio", asyncio.new_event_loop)
    ]
    try:
        import uvloop

        loops.append((f"uvloop {uvloop.__version__}", uvloop.new_event_loop))
    except ImportError:
        print("uvloop not installed: standard loop only")
    server_rows, client_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        port_file = Path(tmp) / "port"
        server = subprocess.Popen([sys.executable, __file__, "--stamping-server", str(port_file)])
        try:
            while not port_file.exists() or not port_file.read_text():
                time.sleep(0.05)
            port = int(port_file.read_text())
            for name, factory in loops:
                with asyncio.Runner(loop_factory=factory) as runner:
                    ok, n = runner.run(server_side(ns.streams, ns.events))
                    server_rows.append(f"{name:<16} {n:>8} {ok / n:>12.3f}")
                    for burst in (1, ns.streams):
                        d = runner.run(client_side(port, burst))
                        p50, p99 = d[len(d) // 2], d[int(len(d) * 0.99)]
                        client_rows.append(
                            f"{name:<16} {burst:>6} {p50:>8.3f} {p99:>8.3f} {d[-1]:>8.3f}"
                        )
        finally:
            server.terminate()
            server.wait()
    print("server side: share of `resp.write()` calls whose bytes were at the peer on return")
    print(f"{'loop':<16} {'writes':>8} {'on the wire':>12}")
    print("\n".join(server_rows))
    print("\nclient side: a request's first byte at the server − its t_send, ms")
    print(f"{'loop':<16} {'burst':>6} {'p50':>8} {'p99':>8} {'max':>8}")
    print("\n".join(client_rows))


if __name__ == "__main__":
    main()
