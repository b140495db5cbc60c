"""`/metrics` and `/probe` over TLS with basic auth, from an exporter-toolkit web config file.

In-process daemons check the auth rules; one real `llm-prober run` checks that the command
serves TLS from `server.web_config_file`. Certificates are self-signed, made with the
`openssl` command for each module, and valid for 127.0.0.1 only.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import bcrypt
import pytest
from aiohttp import web

from prober.settings import Settings
from prober.web import WEB, build_app
from tests.support.daemon import bound_port_of
from tests.support.net import closed_port, free_port, wait_http
from tests.support.process import process
from tests.support.tls import self_signed_cert

USER, PASSWORD = "prometheus", "correct horse battery staple"


@pytest.fixture(scope="module")
def web_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """cert, key and a web config file with TLS and one user (cost 4 keeps tests quick)."""
    directory = tmp_path_factory.mktemp("web")
    cert, key = self_signed_cert(directory)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
    config = directory / "web.yml"
    # Relative file names: exporter-toolkit resolves them against the config file's folder.
    config.write_text(
        f"tls_server_config:\n  cert_file: {cert.name}\n  key_file: {key.name}\n"
        f"basic_auth_users:\n  {USER}: '{hashed}'\n"
    )
    return {"cert": cert, "key": key, "config": config}


def settings(web_config: Path, listen: str = "127.0.0.1:0") -> dict[str, Any]:
    target = {
        "name": "t", "url": f"http://127.0.0.1:{closed_port()}/v1", "model": "m",
        "warmup": 0, "interval_seconds": 3600,
    }  # fmt: skip
    return {"server": {"listen": listen, "web_config_file": str(web_config)}, "targets": [target]}


@asynccontextmanager
async def tls_daemon(web_config: Path) -> AsyncIterator[str]:
    """The daemon served as `llm-prober run` serves it: TLS context from the web config."""
    app = build_app(Settings.model_validate(settings(web_config)))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=app[WEB].ssl_context)
    await site.start()
    try:
        yield f"https://127.0.0.1:{bound_port_of(runner)}"
    finally:
        await runner.cleanup()


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


async def get(url: str, cafile: Path, headers: dict[str, str] | None = None) -> tuple[int, Any]:
    context = ssl.create_default_context(cafile=str(cafile))
    async with aiohttp.ClientSession() as s, s.get(url, ssl=context, headers=headers) as resp:
        await resp.read()
        return resp.status, resp.headers


async def test_basic_auth_rules(web_files: dict[str, Path]) -> None:
    cert = web_files["cert"]
    async with tls_daemon(web_files["config"]) as url:
        for path in ("/metrics", "/probe?target=t", "/", "/targets/t"):
            status, headers = await get(url + path, cert)
            assert status == 401, f"{path} without credentials"
            assert headers["WWW-Authenticate"].startswith('Basic realm="llm-prober"')
        cases = {
            "wrong password": basic(USER, "wrong"),
            "unknown user": basic("nobody", PASSWORD),
            "empty password": basic(USER, ""),
            "not basic": {"Authorization": "Bearer abc"},
            "bad base64": {"Authorization": "Basic !!!"},
            "password over 72 bytes": basic(USER, PASSWORD + "x" * 80),
        }
        for name, headers in cases.items():
            status, _ = await get(f"{url}/metrics", cert, headers)
            assert status == 401, name
        for _ in range(2):  # the second answer comes from the cache of verified credentials
            status, _ = await get(f"{url}/metrics", cert, basic(USER, PASSWORD))
            assert status == 200
        for path in ("/probe?target=t", "/", "/targets/t", "/probe?target=t&debug=true"):
            status, _ = await get(url + path, cert, basic(USER, PASSWORD))
            assert status == 200, path
        # Health checks stay open: kubelet probes carry no credentials, and they hold no data.
        for path in ("/-/healthy", "/-/ready"):
            status, _ = await get(url + path, cert)
            assert status in (200, 503), path


async def test_https_needs_the_ca_and_plain_http_fails(web_files: dict[str, Path]) -> None:
    async with tls_daemon(web_files["config"]) as url:
        status, _ = await get(f"{url}/-/healthy", web_files["cert"])
        assert status == 200
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientConnectorCertificateError):
                await s.get(f"{url}/-/healthy")  # system CAs do not know the test certificate
            with pytest.raises(aiohttp.ClientError):
                await s.get(url.replace("https://", "http://") + "/metrics")


def test_the_command_serves_tls_from_server_web_config_file(
    web_files: dict[str, Path], tmp_path: Path
) -> None:
    port = free_port()
    config = tmp_path / "config.yml"
    data = settings(web_files["config"], listen=f"127.0.0.1:{port}")
    config.write_text(_yaml(data))
    context = ssl.create_default_context(cafile=str(web_files["cert"]))
    with process("run", "--config", str(config)) as proc:
        assert wait_http(f"https://127.0.0.1:{port}/-/healthy", context=context) == "OK\n"
        request = urllib.request.Request(f"https://127.0.0.1:{port}/metrics")
        request.add_header(*basic(USER, PASSWORD).popitem())
        with urllib.request.urlopen(request, timeout=5, context=context) as resp:
            assert b"llmprober_" in resp.read()
        with pytest.raises((OSError, http.client.HTTPException)):  # plain HTTP to the TLS port
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0, out
    assert '"tls": true' in out
    assert '"basic_auth": true' in out


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data)
