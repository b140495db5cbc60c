"""`probe` and `bench` take `--header`, `--api-key-header` and `--ca-file` as a target's
`headers:`, `api_key_header:` and `tls.ca_file:` (prober/config/flags.py): the same checks,
a fault naming the flag, and what is sent as a configured target sends it."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pytest
from aiohttp import web

from prober.bench.cli import add_bench_parser, config_from_args
from prober.cli import build_parser, probe_target
from prober.request.wire import client_session
from prober.result import Outcome
from prober.settings import ConfigError
from prober.targets import Target
from tests.support.servers import serve_app, tls_simulator
from tests.support.sse import chunk, sse, streaming
from tests.support.tls import self_signed_cert

KEY = "sk-flags-0123456789abcdef"
VARIABLE = "LLMPROBER_TEST_FLAGS_KEY"
FLAGS = ("--header", "X-Team: search", "--header", "Api-Key: sk-in-a-header-0123456789",
         "--api-key-env", VARIABLE, "--api-key-header", "X-Goog-Api-Key")  # fmt: skip
SENT = {"X-Team": "search", "Api-Key": "sk-in-a-header-0123456789", "X-Goog-Api-Key": KEY}


def probe_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["probe", "--model", "m", *argv])


def bench_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    return parser.parse_args(["bench", "--model", "m", "--num-requests", "8", *argv])


def test_probe_sends_the_flags_headers_as_a_target_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, KEY)
    target = probe_target(probe_args("--url", "http://127.0.0.1:1/v1", *FLAGS))
    assert dict(target.spec.headers) == SENT


def test_bench_sends_them_too_and_records_header_names_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(VARIABLE, KEY)
    cfg = config_from_args(bench_args("--url", "http://127.0.0.1:1/v1", *FLAGS))
    assert dict(Target.from_config(cfg.target_config()).spec.headers) == SENT
    recorded = cfg.as_json()
    assert (recorded["headers"], recorded["api_key_header"]) == (["Api-Key", "X-Team"],
                                                               "X-Goog-Api-Key")  # fmt: skip
    assert "sk-in-a-header" not in json.dumps(recorded)


BAD = [
    (("--header", "X-Team search"),
     "--header: must be 'NAME: VALUE' (not shown: it may hold a key)"),
    (("--header", "X: a", "--header", "x: b"), "--header: 'x' is given twice"),
    (("--header", "Authorization: Bearer sk-x"),
     "--header: set the API key with api_key_env or api_key_file, not headers"),
    (("--header", "Bad Name: v"), "--header: invalid header name 'Bad Name'"),
    (("--ca-file", "/nonexistent/ca.pem"), "--ca-file: no such file: /nonexistent/ca.pem"),
    (("--api-key-header", "a b", "--api-key-env", VARIABLE),
     "--api-key-header: must be a header name"),
    (("--api-key-header", "api-key"),
     "--api-key-header: no key to send: set api_key_env or api_key_file too"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "problem"), BAD)
def test_a_bad_flag_is_one_line_naming_it_in_probe(
    argv: tuple[str, ...], problem: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, KEY)
    with pytest.raises(ConfigError) as err:
        probe_target(probe_args("--url", "https://127.0.0.1:1/v1", *argv))
    assert len(err.value.problems) == 1
    assert err.value.problems[0].startswith(problem), err.value.problems


@pytest.mark.parametrize(("argv", "problem"), BAD)
def test_and_in_bench(argv: tuple[str, ...], problem: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(VARIABLE, KEY)
    with pytest.raises(ValueError) as err:
        config_from_args(bench_args("--url", "https://127.0.0.1:1/v1", *argv))
    assert str(err.value).startswith(problem), err.value


async def test_ca_file_trusts_the_servers_own_certificate(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    async with tls_simulator(cert, key) as root:
        trusted = probe_target(probe_args("--url", f"{root}/v1", "--ca-file", str(cert)))
        untrusted = probe_target(probe_args("--url", f"{root}/v1"))
        async with client_session() as session:
            ok = await trusted.send(session, time.perf_counter_ns())
            refused = await untrusted.send(session, time.perf_counter_ns())
    assert ok.outcome is Outcome.OK, ok.error
    assert refused.outcome is Outcome.CONNECT_ERROR


async def test_the_server_receives_the_flags_headers(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, str]] = []
    answer = streaming([chunk({"content": "hi"}), chunk({}, "stop"), sse("[DONE]")])

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(dict(request.headers))
        return await answer(request)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    monkeypatch.setenv(VARIABLE, KEY)
    async with serve_app(app) as root:
        target = probe_target(probe_args("--url", f"{root}/v1", *FLAGS))
        async with client_session() as session:
            result = await target.send(session, time.perf_counter_ns())
    assert result.ok, result.error
    assert {name: seen[0].get(name) for name in SENT} == SENT
    assert "Authorization" not in seen[0]
