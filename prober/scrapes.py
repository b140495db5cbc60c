"""`/metrics` as served: one render for all the scrapes of an instant, made off the loop.

Fifty concurrent scrapes of a daemon with 32 targets (~780 KB of exposition each) once held
`/-/healthy` at 1.15 s: each scrape rendered on the event loop, one after another, and each
was compressed apart. Here:

- **one render per instant**: a scrape that arrives while a render of its format is in
  progress waits for that render and serves its bytes (`SharedRenders`); the next render
  starts with the first scrape after it ended, so a scrape is never older than the render
  in progress when it came;
- **off the loop**: the render's loop step (`FastExposition.plan`: the registry's lists,
  custom collectors) runs on the loop, its formatting (`assemble`) in one worker thread of
  the endpoint's own, never the loop's default executor (name resolution for probes runs
  there); one worker: at most one render is formatted at a time, and at most one per
  format (4) waits;
- **each content coding made once per render**, in the same worker (zlib gives up the GIL
  while it compresses), and chosen as aiohttp's `enable_compression` chooses it (the first
  of its codings named in `Accept-Encoding`), so a client gets what `make_aiohttp_handler`
  gives it; a coding this module does not make goes to aiohttp's own compression.

Content negotiation (`exposition.negotiate`), `name[]` filters and every fallback go to
`make_aiohttp_handler` as before.
"""

from __future__ import annotations

import asyncio
import zlib
from concurrent.futures import Executor, ThreadPoolExecutor

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from aiohttp.web_response import CONTENT_CODINGS
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.registry import CollectorRegistry

from prober.exposition import FastExposition, fallback_counter, negotiate

# zlib's window bits for each content coding aiohttp makes with zlib (as its ZLibCompressor).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def content_coding(accept_encoding: str) -> str:
    """The coding aiohttp's `enable_compression` would pick for this `Accept-Encoding`."""
    accept = accept_encoding.lower()
    return next((value for value in CONTENT_CODINGS if value in accept), "identity")


def _compress(body: bytes, coding: str) -> bytes:
    compressor = zlib.compressobj(wbits=_WBITS[coding])
    return compressor.compress(body) + compressor.flush()


class Rendered:
    """One render's bytes, and each content coding of them, made once and shared."""

    def __init__(self, body: bytes, executor: Executor) -> None:
        self.body = body
        self._executor = executor
        self._encoded: dict[str, asyncio.Future[bytes]] = {}

    async def encoded(self, coding: str) -> bytes:
        if coding == "identity":
            return self.body
        future = self._encoded.get(coding)
        if future is None:
            loop = asyncio.get_running_loop()
            future = loop.run_in_executor(self._executor, _compress, self.body, coding)
            self._encoded[coding] = future
        return await asyncio.shield(future)


class SharedRenders:
    """Renders of `fast`, one in progress per (format, escaping), shared by every scrape that
    asks while it is; `renders` counts the renders made (tests/unit/test_scrapes.py)."""

    def __init__(self, fast: FastExposition, executor: Executor) -> None:
        self._fast = fast
        self._executor = executor
        self._pending: dict[tuple[str, str], asyncio.Future[Rendered | None]] = {}
        self.renders = 0

    async def render(self, form: str, escaping: str) -> Rendered | None:
        """The render in progress for (form, escaping), or a new one; None: ask the library."""
        key = (form, escaping)
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._render(key))
            self._pending[key] = pending
        # A scrape that goes away (its client closed) leaves the render to the others.
        return await asyncio.shield(pending)

    async def _render(self, key: tuple[str, str]) -> Rendered | None:
        form, escaping = key
        self.renders += 1
        try:
            plan = self._fast.plan(form, escaping)
            if plan is None:
                return None
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(self._executor, self._fast.assemble, plan, form)
            return None if body is None else Rendered(body, self._executor)
        finally:
            del self._pending[key]  # ended: the next scrape starts a fresh render


class MetricsEndpoint:
    """The `/metrics` handler on `registry`: `make_aiohttp_handler`'s answers, rendered by
    `FastExposition` where it can vouch, one render shared by concurrent scrapes.

    Declares `llmprober_exposition_fallback_total` on `registry`: one endpoint per registry.
    `executor` formats renders and compresses them (default: one thread of its own).
    """

    def __init__(self, registry: CollectorRegistry, executor: Executor | None = None) -> None:
        self._library = make_aiohttp_handler(registry)
        fast = FastExposition(registry, fallback_counter(registry))
        worker = executor or ThreadPoolExecutor(1, thread_name_prefix="llmprober-metrics")
        self.shared = SharedRenders(fast, worker)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if "name[]" in request.query:
            return await self._library(request)
        form, escaping, content_type = negotiate(",".join(request.headers.getall(hdrs.ACCEPT, [])))
        rendered = await self.shared.render(form, escaping) if form is not None else None
        if rendered is None:
            return await self._library(request)
        coding = content_coding(request.headers.get(hdrs.ACCEPT_ENCODING, ""))
        headers = {hdrs.CONTENT_TYPE: content_type}
        if coding != "identity" and coding not in _WBITS:  # a coding of a newer aiohttp's
            response = web.Response(body=rendered.body, headers=headers)
            response.enable_compression()
            return response
        if coding != "identity":
            headers[hdrs.CONTENT_ENCODING] = coding
        return web.Response(body=await rendered.encoded(coding), headers=headers)


def metrics_handler(registry: CollectorRegistry) -> Handler:
    """The daemon's `/metrics` handler on `registry` (`MetricsEndpoint.handle`)."""
    return MetricsEndpoint(registry).handle
