"""A hostile OpenAI-compatible server on 127.0.0.1: one behaviour per path, for the tests.

`hostile_server()` serves every behaviour of `BEHAVIOURS` at `/{name}/v1/chat/completions`
(and `/{name}/api/chat` for Ollama's NDJSON), so one server and one daemon can carry a target
per behaviour. Each behaviour is a variant of a class from the hostile-endpoint issue:
compressed bodies, redirects, nonsense numbers, endless streams, an end followed by junk or a
held connection, a connection closed after the request, an id that echoes the credentials,
error texts that split the key or aim at a terminal or a log (round two).
Every loop is bounded in count and in time; every redirect points back at this server's
`/sink/...`, which counts what reaches it. `Hostile.requests` counts requests per behaviour
and keeps each request's prompt size and headers.
"""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import socket
import struct
import time
import urllib.parse
import zlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from tests.support.servers import raw_server, read_request
from tests.support.sse import sse

Behaviour = Callable[["Hostile", web.Request], Awaitable[web.StreamResponse]]
MAX_WRITES = 1_000_000  # an endless stream stops here, or after MAX_SECONDS, if nobody stops it
MAX_SECONDS = 10.0
YIELD_BYTES = 64 * 1024  # an endless stream lets the loop run after writing this much
HOLD_SECONDS = 5.0  # how long a connection is held open after the end


@dataclass
class Hostile:
    """What the server saw: requests per behaviour, sink hits, words and headers sent."""

    requests: Counter[str] = field(default_factory=Counter)
    sink_hits: int = 0
    prompt_words: dict[str, list[int]] = field(default_factory=dict)
    headers: dict[str, list[CIMultiDict[str]]] = field(default_factory=dict)
    disconnects: Counter[str] = field(default_factory=Counter)
    base: str = ""

    def url(self, behaviour: str) -> str:
        return f"{self.base}/{behaviour}/v1"


def content_chunk(content: str | None = "x", **extra: Any) -> bytes:
    """A bare chunk event: an answer's `content` (none: an empty delta), no finish_reason and
    no object, `extra` at the top (an `id` replaces this server's own)."""
    delta = {} if content is None else {"content": content}
    return sse({"id": "chatcmpl-hostile", "choices": [{"index": 0, "delta": delta}], **extra})


STOP = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}\n\n'
DONE = b"data: [DONE]\n\n"
NORMAL = content_chunk("Hel") + content_chunk("lo") + STOP + DONE


async def start(request: web.Request, ctype: str = "text/event-stream", **headers: str) -> Any:
    resp = web.StreamResponse(headers={"Content-Type": ctype, **headers})
    await resp.prepare(request)
    return resp


async def stream(request: web.Request, body: bytes, **headers: str) -> web.StreamResponse:
    resp = await start(request, **headers)
    await resp.write(body)
    await resp.write_eof()
    return resp


@contextmanager
def gone(state: Hostile, request: web.Request) -> Iterator[None]:
    """Count it when the client goes away: a failed write, or the handler cancelled."""
    try:
        yield
    except ConnectionError:
        state.disconnects[request.match_info["name"]] += 1
    except asyncio.CancelledError:
        state.disconnects[request.match_info["name"]] += 1
        raise


# -- compressed bodies (item 3) ------------------------------------------------------------


def compressed(coding: str, status: int = 200) -> Behaviour:
    data = {"gzip": gzip.compress, "x-gzip": gzip.compress, "deflate": zlib.compress}
    body = data.get(coding.lower(), lambda b: b"\x8b\x0b\x80" + b)(NORMAL * 64)

    async def handler(_: Hostile, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=status, headers={"Content-Encoding": coding})
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        await resp.write(body)
        return resp

    return handler


# -- redirects (item 6) --------------------------------------------------------------------


def redirect(status: int, path: str = "/sink/v1/chat/completions") -> Behaviour:
    async def handler(_: Hostile, request: web.Request) -> web.StreamResponse:
        return web.Response(status=status, headers={"Location": f"http://{request.host}{path}"})

    return handler


# -- numbers (item 4) ----------------------------------------------------------------------


def usage_block(raw: str) -> Behaviour:
    """A normal stream whose usage (or timings) chunk is `raw` JSON text, numbers as written."""

    async def handler(_: Hostile, request: web.Request) -> web.StreamResponse:
        extra = b'data: {"choices": [], ' + raw.encode() + b"}\n\n"
        return await stream(
            request, content_chunk("Hel") + content_chunk("lo") + STOP + extra + DONE
        )

    return handler


def usage(prompt: Any, completion: Any = 2, reasoning: Any = 0) -> str:
    return (
        f'"usage": {{"prompt_tokens": {prompt}, "completion_tokens": {completion}, '
        f'"completion_tokens_details": {{"reasoning_tokens": {reasoning}}}}}'
    )


def ollama_numbers(count: str, duration: str) -> Behaviour:
    async def handler(_: Hostile, request: web.Request) -> web.StreamResponse:
        resp = await start(request, "application/x-ndjson")
        await resp.write(b'{"message": {"content": "hi"}, "done": false}\n')
        await resp.write(
            b'{"message": {"content": ""}, "done": true, "done_reason": "stop", '
            b'"prompt_eval_count": ' + count.encode() + b', "eval_count": ' + count.encode()
            + b', "prompt_eval_duration": ' + duration.encode()
            + b', "eval_duration": ' + duration.encode() + b"}\n"
        )  # fmt: skip
        await resp.write_eof()
        return resp

    return handler


# -- endless streams (item 5) --------------------------------------------------------------


def endless(piece: bytes, ctype: str = "text/event-stream", per_write: int = 1) -> Behaviour:
    """`piece` written again and again at full speed, until the client leaves (bounded).

    The loop runs again after each `YIELD_BYTES` written. This server shares the test's loop
    with the client under test, and loopback's socket buffers take megabytes without making
    a write wait: a handler that never yielded would write for a tenth of a second and more
    before the client could read, and every other target's latency would measure this
    server, not the client. A real endless server is another process; yielding makes this
    one behave more like one (small pieces still reach a client's event bound in one turn)."""
    data = piece * per_write

    async def handler(state: Hostile, request: web.Request) -> web.StreamResponse:
        resp = await start(request, ctype)
        deadline = time.monotonic() + MAX_SECONDS
        unyielded = 0
        with gone(state, request):
            for _ in range(MAX_WRITES):
                await resp.write(data)
                unyielded += len(data)
                if unyielded >= YIELD_BYTES:
                    unyielded = 0
                    await asyncio.sleep(0)
                if time.monotonic() > deadline:
                    break
        return resp

    return handler


# -- the end, then more (item 7) -----------------------------------------------------------


def after_end(tail: bytes, *, hold: bool, end: bytes = DONE, ctype: str = "") -> Behaviour:
    """A complete stream up to `end`, then `tail`, then the connection held open (or not)."""
    body = (
        (content_chunk("Hel") + content_chunk("lo") + STOP)
        if not ctype
        else b'{"message":{"content":"hi"}}\n'
    )

    async def handler(state: Hostile, request: web.Request) -> web.StreamResponse:
        resp = await start(request, ctype or "text/event-stream")
        await resp.write(body + end + tail)
        if hold:
            with gone(state, request):
                for _ in range(int(HOLD_SECONDS * 10)):
                    await asyncio.sleep(0.1)
                    await resp.write(b": still here\n\n" if not ctype else b"\n")
        return resp

    return handler


# -- connection closed or reset after the request (item 12) --------------------------------


def hang_up(*, reset: bool) -> Behaviour:
    async def handler(_: Hostile, request: web.Request) -> web.StreamResponse:
        transport = request.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        if reset and sock is not None:  # RST instead of FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.close()
        return web.Response()  # written to a closed transport: nothing is sent

    return handler


# -- ids and prompt sizes (items 1 and 2) --------------------------------------------------


async def echo_key_id(_: Hostile, request: web.Request) -> web.StreamResponse:
    """Everything it can carry names the credentials: the id, a header, the text."""
    auth = request.headers.get("Authorization", "")
    key = auth.removeprefix("Bearer ")
    body = content_chunk("Hel", id=key) + content_chunk(auth) + STOP + DONE
    return await stream(request, body, **{"X-Request-Id": key})


def prompt_tokens_constant(count: int) -> Behaviour:
    """A normal stream that always reports `count` prompt tokens, whatever was sent."""
    return usage_block(usage(count))


# -- error texts aimed at the key's redaction and at terminals (round two, items 3 and 4) --


def _key(request: web.Request) -> str:
    return request.headers.get("Authorization", "").removeprefix("Bearer ")


def in_stream_error(message: Callable[[str], str]) -> Behaviour:
    """A token, then an in-stream error whose message is `message(key)` (JSON-escaped, so a
    lone surrogate arrives as `\\ud800` and decodes to one)."""

    async def handler(_: Hostile, request: web.Request) -> web.StreamResponse:
        error = json.dumps({"error": {"message": message(_key(request))}}).encode()
        return await stream(request, content_chunk("Hel") + b"data: " + error + b"\n\n")

    return handler


async def echo_key_401_base64(_: Hostile, request: web.Request) -> web.StreamResponse:
    """401 whose body holds the Authorization header base64-encoded, plain and URL-quoted."""
    auth = request.headers.get("Authorization", "").encode()
    seen = base64.b64encode(auth).decode()
    safe = urllib.parse.quote(base64.urlsafe_b64encode(b"u:" + auth).decode())
    return web.json_response({"error": "unauthorized", "seen": seen, "also": safe}, status=401)


# -- memory and numbers (round two, items 7 and 8) -----------------------------------------

HUGE_INT = "9" * 100_000  # past Python's 4,300-digit limit for int()


def many_data_lines(count: int) -> Behaviour:
    """A token, then one event of `count` empty `data:` lines (6 bytes each), then its end."""

    async def handler(_: Hostile, request: web.Request) -> web.StreamResponse:
        resp = await start(request)
        await resp.write(content_chunk("Hel"))
        for _ in range(count // 10_000):  # 60 KB writes, so the loop runs between them
            await resp.write(b"data:\n" * 10_000)
            await asyncio.sleep(0)
        await resp.write(b"\n" + STOP + DONE)
        return resp

    return handler


FORGED_LOG_LINE = '{"event": "probe_ok", "level": "info", "target": "forged"}'
ERROR_TEXTS: dict[str, Callable[[str], str]] = {
    "error_key_ansi": lambda key: f"bad key {key[:9]}\x1b[0m{key[9:]} given",
    "error_key_zero_width": lambda key: f"bad key {key[:9]}\u200b{key[9:]} given",
    "error_surrogate": lambda _: "broken \ud800 text",
    "error_controls": lambda _: f"x\n\x1b[2J\x1b[H\x07\x00 cleared\n{FORGED_LOG_LINE}",
}


def leaked_pieces(key: str, text: str, width: int = 12) -> list[str]:
    """Pieces of `key`, or of its base64 text at any offset, that `text` shows (its printable
    characters, URL-unquoted): any of them means part of the key leaked."""
    forms = [key]
    for pad in (b"", b"a", b"ab"):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            full = encode(pad + key.encode()).decode()
            forms.append(full[(len(pad) * 8 + 5) // 6 : (len(pad) + len(key)) * 8 // 6])
    shown = "".join(c for c in urllib.parse.unquote(text) if c.isprintable() and c != " ")
    pieces = {f[i : i + width] for f in forms for i in range(len(f) - width + 1)}
    return sorted(p for p in pieces if p in shown)


BEHAVIOURS: dict[str, tuple[Behaviour, str]] = {
    # name: (behaviour, the outcome a probe of it must count)
    "gzip": (compressed("gzip"), "protocol_error"),
    "x_gzip": (compressed("x-gzip"), "protocol_error"),
    "deflate": (compressed("deflate"), "protocol_error"),
    "br": (compressed("br"), "protocol_error"),
    "gzip_upper": (compressed("GZIP"), "protocol_error"),
    "gzip_500": (compressed("gzip", status=500), "http_5xx"),
    **{f"redirect_{s}": (redirect(s), "protocol_error") for s in (301, 302, 303, 307, 308)},
    "redirect_long": (redirect(302, "/sink/" + "a" * 4000), "protocol_error"),
    "usage_negative": (usage_block(usage(-5, -3, -1)), "ok"),
    "usage_1e400": (usage_block(usage("1e400", "1e400", "1e400")), "ok"),
    "usage_2_64": (usage_block(usage(2**64, 2**64 + 1, 2**70)), "ok"),
    "usage_nan": (usage_block(usage("NaN", "Infinity", "-Infinity")), "ok"),
    "usage_strings": (usage_block(usage('"12"', "true", "1.5")), "ok"),
    "timings_bad": (
        usage_block('"timings": {"prompt_ms": 1e400, "predicted_per_token_ms": -4}'),
        "ok",
    ),
    "timings_nan": (
        usage_block('"timings": {"prompt_ms": NaN, "predicted_per_token_ms": Infinity}'),
        "ok",
    ),
    "prompt_tokens_1": (prompt_tokens_constant(1), "ok"),
    "prompt_tokens_10": (prompt_tokens_constant(10), "ok"),
    "prompt_tokens_huge": (prompt_tokens_constant(10**15), "ok"),
    "endless_tokens": (endless(content_chunk("x")), "protocol_error"),
    "endless_batched": (endless(content_chunk("x"), per_write=500), "protocol_error"),
    "endless_empty": (endless(content_chunk(None)), "protocol_error"),
    "endless_comments": (endless(b": keep-alive\n" * 65536), "protocol_error"),
    "done_hold": (after_end(b"", hold=True), "ok"),
    "done_junk_field": (after_end(b"garbage here\n\n", hold=False), "ok"),
    "done_junk_json": (after_end(b"data: {not json\n\n", hold=True), "ok"),
    "done_junk_long": (after_end(b"x" * (3 << 20), hold=False), "ok"),
    "done_no_blank_junk": (after_end(b"\xff\xfe\n", hold=False, end=b"data: [DONE]\n"), "ok"),
    "close_after_request": (hang_up(reset=False), "protocol_error"),
    "reset_after_request": (hang_up(reset=True), "protocol_error"),
    "echo_key_id": (echo_key_id, "ok"),
    **{name: (in_stream_error(text), "http_5xx") for name, text in ERROR_TEXTS.items()},
    "echo_key_401_base64": (echo_key_401_base64, "http_4xx"),
    "event_many_lines": (many_data_lines(500_000), "protocol_error"),
    "huge_int_ignored": (usage_block(f'"x_pad": {HUGE_INT}, ' + usage(5)), "ok"),
    "huge_int_usage": (usage_block(usage(HUGE_INT, HUGE_INT, HUGE_INT)), "ok"),
}
OLLAMA_BEHAVIOURS: dict[str, tuple[Behaviour, str]] = {
    "ollama_numbers_bad": (ollama_numbers("-7", "1e400"), "ok"),
    "ollama_numbers_nan": (ollama_numbers("1e400", "NaN"), "ok"),
    "ollama_endless": (
        endless(b'{"message": {"content": "x"}}\n', "application/x-ndjson"),
        "protocol_error",
    ),
    "ollama_done_hold": (
        after_end(b"", hold=True, end=b'{"done": true}\n', ctype="application/x-ndjson"),
        "ok",
    ),
    "ollama_done_junk": (
        after_end(
            b"{junk\n" + b"y" * (3 << 20),
            hold=False,
            end=b'{"done": true}\n',
            ctype="application/x-ndjson",
        ),
        "ok",
    ),
}


def _note(state: Hostile, name: str, request: web.Request, body: Any) -> None:
    state.requests[name] += 1
    if isinstance(body, dict):
        messages = body.get("messages") or [{}]
        words = len(str(messages[0].get("content", "")).split())
        state.prompt_words.setdefault(name, []).append(words)
    state.headers.setdefault(name, []).append(request.headers.copy())


@asynccontextmanager
async def hostile_server() -> AsyncIterator[Hostile]:
    """Serve every behaviour on a free loopback port; yield the recorder."""
    state = Hostile()
    table = {**BEHAVIOURS, **OLLAMA_BEHAVIOURS}

    async def sink(request: web.Request) -> web.StreamResponse:
        state.sink_hits += 1
        return await stream(request, NORMAL)

    async def dispatch(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        try:
            body = await request.json()
        except ValueError:
            body = None
        _note(state, name, request, body)
        return await table[name][0](state, request)

    app = web.Application()
    app.router.add_route("*", "/sink/{tail:.*}", sink)
    app.router.add_route("*", "/{name}/v1/chat/completions", dispatch)
    app.router.add_route("*", "/{name}/api/chat", dispatch)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.2, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    state.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield state
    finally:
        await runner.cleanup()


def api_of(name: str) -> str:
    return "ollama" if name in OLLAMA_BEHAVIOURS else "chat"


# -- a forged answer left in a pooled connection (round two, item 2) ------------------------


def whole_answer(completion_tokens: int) -> bytes:
    """A whole HTTP/1.1 answer with a Content-Length: a stream of two chunks, usage, [DONE]."""
    body = content_chunk("Hel") + content_chunk("lo") + STOP
    body += b'data: {"choices": [], ' + usage(5, completion_tokens).encode() + b"}\n\n" + DONE
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


@asynccontextmanager
async def forging_server(answers: list[int]) -> AsyncIterator[str]:
    """Answers each request (5 completion tokens), then 0.1 s later sends a second,
    unsolicited response (777 tokens) down the same connection. Counts connections in
    `answers`; at most 4 requests a connection."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        answers.append(0)
        for _ in range(4):
            if not await read_request(reader, timeout=5):
                break
            writer.write(whole_answer(5))
            await asyncio.sleep(0.1)
            writer.write(whole_answer(777))  # the forgery
            await writer.drain()

    async with raw_server(serve) as url:
        yield url
