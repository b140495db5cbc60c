"""The pre-flight (`prober/preflight.py`): one streamed one-token request per target against
real local servers, and one line each saying what to fix; bench's pre-flight words a 404
the same way. Every server is on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web

from prober.bench.config import BenchConfig
from prober.bench.runner import BenchRunner, PreflightError
from prober.cli import main
from prober.preflight import check_targets
from prober.request.wire import client_session
from prober.settings import TargetConfig
from tests.support.net import closed_port
from tests.support.servers import serve_app, tls_simulator
from tests.support.sse import chunk, sse, streaming
from tests.support.tls import self_signed_cert

KEY = "sk-preflight-0123456789abcdef"
VARIABLE = "LLMPROBER_TEST_PREFLIGHT_KEY"
HINT = "is the base URL the one that ends in /v1?"

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/unit/conftest.py


def status(code: int) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({"error": f"no: {request.headers.get('api-key')}"}, status=code)

    return handler


async def test_one_line_per_target_saying_what_to_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(VARIABLE, KEY)
    app = web.Application()
    app.router.add_post(
        "/v1/chat/completions",
        streaming([chunk({"content": "a"}), chunk({}, "stop"), sse("[DONE]")]),
    )
    app.router.add_post("/denied/chat/completions", status(401))
    app.router.add_post("/forbidden/chat/completions", status(403))
    cert, key = self_signed_cert(tmp_path)
    port = closed_port()
    async with serve_app(app) as root, tls_simulator(cert, key) as tls:
        configs = [
            TargetConfig(name="fine", url=f"{root}/v1", model="m"),
            TargetConfig(name="no-v1", url=f"{root}?api-version=1", model="m"),
            TargetConfig(name="denied", url=f"{root}/denied", model="m", api_key_env=VARIABLE,
                         api_key_header="api-key"),
            TargetConfig(name="keyless", url=f"{root}/forbidden", model="m"),
            TargetConfig(name="closed", url=f"http://127.0.0.1:{port}/v1", model="m"),
            TargetConfig(name="self-signed", url=f"{tls}/v1", model="m"),
            TargetConfig(name="trusted", url=f"{tls}/v1", model="m", tls={"ca_file": cert}),
        ]  # fmt: skip
        found = await check_targets(configs)
    host = tls.removeprefix("https://")
    assert [ok for ok, _ in found] == [True, False, False, False, False, False, True]
    lines = [line for _, line in found]
    assert lines[0] == f"targets[0] (fine): ok ({root}/v1)"
    assert lines[1] == (f"targets[1] (no-v1): http_4xx: HTTP 404 from "
                        f"{root}/chat/completions?api-version=1: {HINT}")  # fmt: skip
    assert lines[2] == ("targets[2] (denied): http_4xx: HTTP 401: the key sent in the api-key "
                        f"header was refused (api_key_env {VARIABLE})")  # fmt: skip
    assert lines[3] == ("targets[3] (keyless): http_4xx: HTTP 403: no API key was sent: set "
                        "api_key_env or api_key_file")  # fmt: skip
    assert lines[4].startswith(f"targets[4] (closed): connect_error: cannot connect to "
                               f"127.0.0.1:{port}: ")  # fmt: skip
    assert lines[5] == (f"targets[5] (self-signed): connect_error: {host}: TLS certificate not "
                        "verified: set tls.ca_file to its CA")  # fmt: skip
    assert lines[6] == f"targets[6] (trusted): ok ({tls}/v1)"
    assert all(KEY not in line for line in lines)


async def test_bench_preflight_gives_the_same_hint() -> None:
    app = web.Application()  # no route: every path is a 404
    async with serve_app(app) as root:
        cfg = BenchConfig(url=root, model="m", levels=(1,), num_requests=1, warmup=0)
        async with client_session() as session:
            with pytest.raises(PreflightError) as err:
                await BenchRunner(cfg).preflight(session)
    assert str(err.value) == (
        f"pre-flight request to {root} failed (http_4xx): HTTP 404 from "
        f"{root}/chat/completions: {HINT}"
    )


async def test_bench_names_the_flag_to_set(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    async with tls_simulator(cert, key) as tls:
        cfg = BenchConfig(url=f"{tls}/v1", model="m", levels=(1,), num_requests=1, warmup=0)
        async with client_session() as session:
            with pytest.raises(PreflightError) as err:
                await BenchRunner(cfg).preflight(session)
    assert str(err.value).endswith("TLS certificate not verified: set --ca-file to its CA")


def test_check_config_probe_prints_a_line_per_target_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    port = closed_port()
    path = tmp_path / "config.yml"
    path.write_text(f"targets:\n  - name: gone\n    url: http://127.0.0.1:{port}/v1\n"
                    "    model: m\n")  # fmt: skip
    assert main(["check-config", str(path), "--probe"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{path}: ok (1 targets)"
    assert out[1].startswith(
        f"targets[0] (gone): connect_error: cannot connect to 127.0.0.1:{port}"
    )
    assert len(out) == 2
