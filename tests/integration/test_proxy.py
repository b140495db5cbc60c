"""Probes through a real forward proxy (tinyproxy on loopback, tests/support/proxy.py).

Plain HTTP to the simulator goes through it as an absolute-URI request, TLS to a local TLS
simulator through a CONNECT tunnel, with the connect phase covering the proxy's connection
and the tunnel and the TLS phase the handshake through it. The environment's `HTTP_PROXY` is
honoured, `NO_PROXY` and `from_env: false` bypass it. Credentials from `auth_env` pass a proxy
that asks for them and never show in an error; a proxy that is down, refuses the tunnel or
the credentials is `connect_error` naming the proxy.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from prober.request.wire import client_session
from prober.result import Outcome, RequestResult
from prober.settings import TargetConfig
from prober.targets import Target
from prober.timings import phases
from tests.support.daemon import simulator
from tests.support.net import closed_port
from tests.support.proxy import tinyproxy
from tests.support.servers import SIM, serve, tls_simulator
from tests.support.tls import self_signed_cert

pytestmark = pytest.mark.usefixtures("clean_proxy_env")
PASSWORD = "s3cret-proxy-pass"


@pytest.fixture
def clean_proxy_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
async def sim() -> AsyncIterator[str]:
    async with simulator(**SIM) as base:
        yield f"{base}/v1"


async def probe(cfg: dict[str, Any]) -> RequestResult:
    config = {"name": "t", "model": "m", "max_tokens": 4, "prompt_tokens": 16, **cfg}
    target = Target.from_config(TargetConfig.model_validate(config))
    async with client_session() as session:
        return await target.send(session, time.perf_counter_ns())


async def test_plain_http_goes_through_the_proxy(tmp_path: Path, sim: str) -> None:
    with tinyproxy(tmp_path) as proxy:
        result = await probe({"url": sim, "proxy": {"url": proxy.url}})
        seen = proxy.requests()
    assert result.outcome is Outcome.OK, result.error
    assert seen == [f"POST {sim}/chat/completions HTTP/1.1"]
    names = [name for name, _ in phases(result)]
    assert names[:2] == ["connect", "request_written"]


async def test_tls_goes_through_a_connect_tunnel(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    async with tls_simulator(cert, key) as base:
        port = int(base.rsplit(":", 1)[1])
        with tinyproxy(tmp_path, connect_ports=[port]) as proxy:
            cfg = {"url": f"{base}/v1", "tls": {"ca_file": str(cert)}, "proxy": {"url": proxy.url}}
            result = await probe(cfg)
            seen = proxy.requests()
    assert result.outcome is Outcome.OK, result.error
    assert seen == [f"CONNECT 127.0.0.1:{port} HTTP/1.1"]
    # connect: the proxy's TCP connection and the CONNECT exchange; tls: the handshake
    # through the tunnel (the protocol that stamps it is made once the tunnel is open).
    spans = dict(phases(result))
    assert list(spans)[:3] == ["connect", "tls", "request_written"]
    assert spans["connect"] > 0
    assert spans["tls"] > 0


async def test_the_environment_is_honoured_unless_bypassed(
    tmp_path: Path, sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with tinyproxy(tmp_path) as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        through = await probe({"url": sim})
        direct = await probe({"url": sim, "proxy": {"from_env": False}})
        monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.0/8")
        bypassed = await probe({"url": sim})
        seen = proxy.requests()
    for result in (through, direct, bypassed):
        assert result.outcome is Outcome.OK, result.error
    assert len(seen) == 1  # the first alone went through it


async def test_credentials_pass_and_never_show(
    tmp_path: Path, sim: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOD_AUTH", f"alice:{PASSWORD}")
    monkeypatch.setenv("BAD_AUTH", "alice:wrong-password")
    cert, key = self_signed_cert(tmp_path)
    async with tls_simulator(cert, key) as base:
        port = int(base.rsplit(":", 1)[1])
        with tinyproxy(tmp_path, connect_ports=[port], auth=("alice", PASSWORD)) as proxy:
            tls = {"url": f"{base}/v1", "tls": {"ca_file": str(cert)}}
            good = await probe({"url": sim, "proxy": {"url": proxy.url, "auth_env": "GOOD_AUTH"}})
            good_tls = await probe({**tls, "proxy": {"url": proxy.url, "auth_env": "GOOD_AUTH"}})
            none = await probe({"url": sim, "proxy": {"url": proxy.url}})
            bad = await probe({"url": sim, "proxy": {"url": proxy.url, "auth_env": "BAD_AUTH"}})
            bad_tls = await probe({**tls, "proxy": {"url": proxy.url, "auth_env": "BAD_AUTH"}})
    assert good.outcome is Outcome.OK, good.error
    assert good_tls.outcome is Outcome.OK, good_tls.error
    assert none.outcome is Outcome.CONNECT_ERROR, none.error
    assert none.error.startswith(f"proxy {proxy.url} refused: HTTP 407"), none.error
    # tinyproxy 1.11 answers wrong credentials with a 401 and WWW-Authenticate, which a
    # server behind it could send as well: an http_4xx, named as having come through it.
    assert bad.outcome is Outcome.HTTP_4XX, bad.error
    assert bad.error.startswith("HTTP 401")
    assert bad.error.endswith(f"(via proxy {proxy.url})")
    assert bad_tls.outcome is Outcome.CONNECT_ERROR  # a tunnel refused, whatever the status
    assert bad_tls.error.startswith(f"proxy {proxy.url} refused the tunnel: HTTP 401")
    for result in (good, good_tls, none, bad, bad_tls):
        assert PASSWORD not in result.error
        assert "wrong-password" not in result.error


async def test_a_proxy_down_or_refusing_the_tunnel_is_connect_error(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    async with tls_simulator(cert, key) as base:
        tls = {"url": f"{base}/v1", "tls": {"ca_file": str(cert)}}
        down = f"http://127.0.0.1:{closed_port()}"
        gone = await probe({**tls, "proxy": {"url": down}})
        with tinyproxy(tmp_path, connect_ports=[closed_port()]) as proxy:  # not the server's
            refused = await probe({**tls, "proxy": {"url": proxy.url}})
    assert gone.outcome is Outcome.CONNECT_ERROR
    assert gone.error.startswith(f"cannot connect to proxy {down}: "), gone.error
    assert refused.outcome is Outcome.CONNECT_ERROR
    assert refused.error.startswith(f"proxy {proxy.url} refused the tunnel: HTTP 403"), (
        refused.error
    )


async def test_the_target_never_sees_the_proxys_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOD_AUTH", f"alice:{PASSWORD}")
    received: list[dict[str, str]] = []

    async def answer(request: web.Request) -> web.Response:
        received.append(dict(request.headers))
        return web.Response(status=503, text="busy")

    async with serve(answer) as url:
        with tinyproxy(tmp_path, auth=("alice", PASSWORD)) as proxy:
            result = await probe({"url": url, "proxy": {"url": proxy.url, "auth_env": "GOOD_AUTH"}})
    assert result.outcome is Outcome.HTTP_5XX
    assert result.error == f"HTTP 503: busy (via proxy {proxy.url})"
    (headers,) = received
    assert not any(name.lower().startswith("proxy-") for name in headers)
