"""Secrets and prompts stay out of logs, metrics, `/probe` output and the `probe` command.

A distinctive API key is planted in an environment variable (`api_key_env`) and sent to the
simulator, to a server that answers 401 and echoes the Authorization header in its error body
(once whole, once cut by the error's length limit), and to a server whose answer aiohttp
cannot parse (its exception's repr carries the request headers). Everything the daemon prints
at debug level, every scrape and every `/probe` page must be free of it.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web

from prober.logs import setup_logging
from prober.request import Api, RequestSpec, Timeouts, stream_request
from tests.support.daemon import daemon, simulator, wait_for
from tests.support.hostile import hostile_server
from tests.support.servers import bad_http_server, serve_app

KEY_ENV = "LLMPROBER_TEST_CANARY_KEY"
ERROR_CUT = 200  # request/classify.py's `printable` keeps this many characters of an error body
COMPLETION = "quokka-completion-canary"


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    value = f"sk-canary-{secrets.token_hex(16)}"
    monkeypatch.setenv(KEY_ENV, value)
    return value


def fragments(key: str, size: int = 12) -> set[str]:
    """Every 12-character piece of the key: finding any of them means part of it leaked."""
    return {key[i : i + size] for i in range(len(key) - size + 1)}


def leaked(key: str, text: str) -> list[str]:
    return sorted(f for f in fragments(key) if f in text)


@pytest.fixture
def logs() -> Iterator[io.StringIO]:
    """Every log line of the process, as the daemon writes it (JSON, debug level)."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level, structlog.get_config())
    stream = io.StringIO()
    setup_logging("json", "debug", stream=stream)
    try:
        yield stream
    finally:
        root.handlers[:], level, config = saved
        root.setLevel(level)
        structlog.configure(**config)


@asynccontextmanager
async def echo_401() -> AsyncIterator[str]:
    """401 whose body repeats the Authorization header, after `X-Pad` characters of padding."""

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        pad = "p" * int(request.headers.get("X-Pad", "0"))
        message = f"{pad}Incorrect API key provided: {request.headers.get('Authorization')}"
        return web.json_response({"error": {"message": message}}, status=401)

    async with _serve(handler) as url:
        yield url


@asynccontextmanager
async def canary_llm(prompts: list[str]) -> AsyncIterator[str]:
    """A streaming chat server that records each prompt and answers with COMPLETION."""

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompts.append(body["messages"][0]["content"])
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for text in (COMPLETION, " and more"):
            chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async with _serve(handler) as url:
        yield url


@asynccontextmanager
async def _serve(handler: Any) -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    async with serve_app(app) as url:
        yield url


async def fetch(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        return await resp.text()


async def ready(url: str) -> bool:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/-/ready") as resp:
        return resp.status == 200


async def test_api_key_appears_in_no_log_metric_or_probe_output(
    key: str, logs: io.StringIO
) -> None:
    async with simulator() as sim, echo_401() as echo, bad_http_server() as bad:
        # Pad so the error's 200-character cut falls 14 characters into the key.
        prefix = len('{"error": {"message": "') + len("Incorrect API key provided: Bearer ")
        pad = ERROR_CUT - prefix - 14
        common = {"model": "m", "warmup": 1, "interval_seconds": 0.5, "jitter_seconds": 0,
                  "api_key_env": KEY_ENV}  # fmt: skip
        targets = [
            {**common, "name": "sim", "url": f"{sim}/v1", "load": {"rate": 4.0, "seed": 1}},
            {**common, "name": "echo", "url": f"{echo}/v1", "load": {"rate": 4.0, "seed": 1}},
            {**common, "name": "echo_cut", "url": f"{echo}/v1", "headers": {"X-Pad": str(pad)}},
            {**common, "name": "bad_http", "url": f"{bad}/v1"},
        ]
        async with daemon({"targets": targets}) as (url, _app):
            await wait_for(lambda: ready(url), timeout=20)
            await asyncio.sleep(1.0)  # a few more probes and load requests
            pages = {t["name"]: await fetch(f"{url}/probe?target={t['name']}") for t in targets}
            pages["/metrics"] = await fetch(f"{url}/metrics")
            pages["/"] = await fetch(url)
    text = logs.getvalue()
    # The leak paths were exercised: the echo's error body, whole and cut inside the key, and
    # the unparsable response (whose exception carries the request headers) were all logged.
    errors = [json.loads(line) for line in text.splitlines() if "probe_failed" in line]
    by_target = {e["target"]: e["error"] for e in errors}
    assert by_target["echo"].endswith('Incorrect API key provided: Bearer [REDACTED]"}}')
    assert by_target["echo_cut"].endswith("pIncorrect API key provided: Bearer [REDACTED]")
    assert by_target["bad_http"].startswith("invalid HTTP response")
    assert "Authorization" not in by_target["bad_http"]  # the request's headers are never echoed
    assert 'outcome="http_4xx"' in pages["echo"]
    assert not leaked(key, text), "API key in the logs"
    for name, page in pages.items():
        assert not leaked(key, page), f"API key in {name}"


async def test_probe_command_output_never_shows_the_key(key: str) -> None:
    async with echo_401() as echo:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "prober.cli", "probe", "--url", f"{echo}/v1", "--model", "m",
            "--api-key-env", KEY_ENV, "--timeout", "5", "--json",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["outcome"] == "http_4xx"
    assert summary["error"].endswith('Incorrect API key provided: Bearer [REDACTED]"}}')
    assert not leaked(key, out.decode())


async def test_request_error_never_holds_the_request_headers(key: str) -> None:
    async with bad_http_server() as url, aiohttp.ClientSession() as session:
        spec = RequestSpec(f"{url}/v1", Api.CHAT, "m", "hi", 4, Timeouts(2, 2, 2, 3),
                           headers={"Authorization": f"Bearer {key}"})  # fmt: skip
        result = await stream_request(session, spec, 0)
    assert not leaked(key, result.error), result.error


async def test_prompts_and_completions_are_not_logged_by_default(logs: io.StringIO) -> None:
    prompts: list[str] = []
    async with canary_llm(prompts) as llm:
        target = {"name": "llm", "url": f"{llm}/v1", "model": "m", "warmup": 1,
                  "interval_seconds": 0.3, "jitter_seconds": 0, "prompt_tokens": 40,
                  "load": {"rate": 5.0, "seed": 1}}  # fmt: skip
        async with daemon({"targets": [target]}) as (url, _app):
            await wait_for(lambda: ready(url), timeout=20)
            await asyncio.sleep(1.0)
    text = logs.getvalue()
    assert '"event": "probe_ok"' in text  # debug level was on and probes were logged
    assert len(prompts) >= 4
    assert COMPLETION not in text
    assert "Write a long, detailed story" not in text  # every prompt's instruction
    for prompt in prompts:
        assert prompt not in text
        assert prompt.split(":", 1)[1][:40] not in text  # its random cache-busting words


async def test_log_prompts_option_logs_prompt_and_completion(logs: io.StringIO) -> None:
    prompts: list[str] = []
    async with canary_llm(prompts) as llm:
        target = {"name": "llm", "url": f"{llm}/v1", "model": "m", "warmup": 0,
                  "interval_seconds": 3600, "prompt_tokens": 40}  # fmt: skip
        config = {"targets": [target], "logging": {"log_prompts": True}}
        async with daemon(config) as (url, _app):
            await wait_for(lambda: ready(url), timeout=20)
    events = [json.loads(line) for line in logs.getvalue().splitlines() if "request_text" in line]
    assert len(events) == 1
    assert events[0]["prompt"] == prompts[0]
    assert COMPLETION in events[0]["completion"]


async def openmetrics(url: str) -> str:
    headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics", headers=headers) as resp:
        return await resp.text()


async def test_a_server_echoing_the_key_as_its_id_never_reaches_exemplars(
    key: str, logs: io.StringIO
) -> None:
    # The id, a response header and the text all carry the key (tests/support/hostile.py).
    async with hostile_server() as hostile:
        target = {"name": "echo_id", "url": hostile.url("echo_key_id"), "model": "m",
                  "warmup": 0, "interval_seconds": 0.3, "jitter_seconds": 0,
                  "api_key_env": KEY_ENV, "load": {"rate": 5.0, "seed": 1}}  # fmt: skip
        async with daemon({"targets": [target]}) as (url, _app):
            await wait_for(lambda: ready(url), timeout=20)
            await asyncio.sleep(1.0)
            page = await openmetrics(url)
            probe_page = await fetch(f"{url}/probe?target=echo_id")
        sent_ids = {h["X-Request-Id"] for h in hostile.headers["echo_key_id"]}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "prober.cli", "probe", "--url", hostile.url("echo_key_id"),
            "--model", "m", "--api-key-env", KEY_ENV, "--json", stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=60)
    exemplar_ids = set(re.findall(r'# \{request_id="([^"]*)"\}', page))
    assert exemplar_ids, "no exemplar: the leak path was not exercised"
    assert exemplar_ids <= sent_ids  # only the ids the prober itself sent
    summary = json.loads(out.decode().strip().splitlines()[-1])
    assert summary["outcome"] == "ok"
    assert re.fullmatch(r"[0-9a-f]{32}", summary["request_id"])
    for name, text in {"/metrics": page, "/probe": probe_page, "probe --json": out.decode(),
                       "logs": logs.getvalue()}.items():  # fmt: skip
        assert not leaked(key, text), f"API key in {name}"


SECRET_HEADERS = {"api-key": "azure", "X-Api-Key": "xapi", "X-Custom-Token": "custom"}


@asynccontextmanager
async def echo_headers_401() -> AsyncIterator[str]:
    """401 whose body repeats every secret-looking header, whole, JSON-escaped and wrapped."""

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        parts = []
        for name in SECRET_HEADERS:
            value = request.headers.get(name, "")
            parts += [value, value.replace("/", "\\/"), value[:10] + "\n" + value[10:]]
        return web.Response(status=401, text="bad credentials: " + " | ".join(parts))

    async with _serve(handler) as url:
        yield url


async def test_secrets_in_custom_headers_are_redacted_when_echoed(logs: io.StringIO) -> None:
    values = {name: f"{tag}/{secrets.token_hex(12)}" for name, tag in SECRET_HEADERS.items()}
    async with echo_headers_401() as echo:
        target = {"name": "azure", "url": f"{echo}/v1", "model": "m", "warmup": 0,
                  "interval_seconds": 0.3, "jitter_seconds": 0, "headers": values,
                  "secret_headers": ["X-Custom-Token"]}  # fmt: skip
        async with daemon({"targets": [target]}) as (url, _app):
            await wait_for(lambda: ready(url), timeout=20)
            page = await fetch(f"{url}/probe?target=azure")
    text = logs.getvalue()
    assert "bad credentials: [REDACTED]" in text  # the echo was logged, redacted
    assert 'outcome="http_4xx"' in page
    for name, value in values.items():
        assert not leaked(value, text), f"{name} in the logs"
