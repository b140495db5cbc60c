"""The three discovery sources against real parts: files in a temporary folder (half written,
garbled, unreadable, a FIFO), a local aiohttp HTTP SD server (500, not JSON, slow, huge) and
a real DNS server (dnsmasq on a loopback port, its hosts file rewritten). Every address a
source returns here is loopback (127.0.0.1 or ::1)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from aiohttp import web

from prober.config.discovery import DnsConfig, FileSdConfig, HttpSdConfig
from prober.discovery import Fetched, Reason
from prober.discovery.dns import DnsSd
from prober.discovery.files import FileSd
from prober.discovery.http import HttpSd
from prober.discovery.source import MAX_BYTES
from prober.fleet.compose import Discovery
from prober.settings import Settings
from tests.support.dnsmasq import Dnsmasq, dnsmasq
from tests.support.fleets import Recording
from tests.support.servers import serve_app


def addresses(fetched: Fetched) -> list[str] | None:
    return None if fetched.found is None else sorted(d.address for d in fetched.found)


def reasons(fetched: Fetched) -> list[Reason]:
    return [fault.reason for fault in fetched.faults]


def entry(*ports: int, **labels: str) -> list[dict[str, object]]:
    return [{"targets": [f"127.0.0.1:{p}" for p in ports], "labels": labels}]


# --- file_sd ---------------------------------------------------------------------------------
def write(path: Path, data: object) -> None:
    path.write_text(json.dumps(data))
    os.utime(path, ns=(time.time_ns(), time.time_ns()))


async def test_file_sd_reads_globs_and_keeps_each_files_last_good_list(tmp_path: Path) -> None:
    write(tmp_path / "a.json", entry(8000, zone="a", other="x"))
    (tmp_path / "b.yml").write_text("- targets: ['[::1]:8001']\n  labels: {zone: b}\n")
    source = FileSd(FileSdConfig(files=[str(tmp_path / "*.json"), str(tmp_path / "*.yml")]),
                    ["zone"])  # fmt: skip
    first = await source.fetch()
    assert addresses(first) == ["127.0.0.1:8000", "[::1]:8001"]
    assert first.found is not None
    assert {d.address: d.labels for d in first.found}["127.0.0.1:8000"] == (("zone", "a"),)
    (tmp_path / "a.json").write_text('[{"targets": ["127.0.0.1:8002"')  # half written
    (tmp_path / "b.yml").write_text("- targets: [\n")  # garbled
    cut = await source.fetch()
    assert addresses(cut) == ["127.0.0.1:8000", "[::1]:8001"]
    assert reasons(cut) == [Reason.MALFORMED, Reason.MALFORMED]
    (tmp_path / "a.json").chmod(0)
    write(tmp_path / "b.yml", entry(8003))
    if os.geteuid() != 0:  # root reads a file of mode 0 all the same
        assert reasons(await source.fetch()) == [Reason.UNREADABLE]
    (tmp_path / "a.json").chmod(0o600)
    write(tmp_path / "a.json", entry(8002))
    assert addresses(await source.fetch()) == ["127.0.0.1:8002", "127.0.0.1:8003"]
    (tmp_path / "a.json").unlink()  # a file gone: its targets go with it
    assert addresses(await source.fetch()) == ["127.0.0.1:8003"]


async def test_file_sd_refuses_a_fifo_and_a_huge_file_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.json")  # no writer: an open without O_NONBLOCK would block
    (tmp_path / "huge.json").write_bytes(b" " * (MAX_BYTES + 1))
    write(tmp_path / "ok.json", entry(8000))
    source = FileSd(FileSdConfig(files=[str(tmp_path / "*.json")]), [])
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.001)

    ticker = asyncio.create_task(ticking())
    fetched = await asyncio.wait_for(source.fetch(), timeout=5)
    ticker.cancel()
    assert addresses(fetched) == ["127.0.0.1:8000"]
    assert sorted(reasons(fetched)) == [Reason.TOO_LARGE, Reason.UNREADABLE]
    assert "not a regular file" in str(fetched.faults)
    assert ticks > 0


async def test_file_sd_sees_a_changed_file_before_its_interval(tmp_path: Path) -> None:
    write(tmp_path / "a.json", entry(8000))
    source = FileSd(FileSdConfig(files=[str(tmp_path / "a.json")]), [])
    assert addresses(await source.fetch()) == ["127.0.0.1:8000"]
    write(tmp_path / "a.json", entry(8000, 8001))
    assert addresses(await source.fetch()) == ["127.0.0.1:8000", "127.0.0.1:8001"]


# --- http_sd ---------------------------------------------------------------------------------
@pytest.fixture
async def sd_server() -> AsyncIterator[tuple[str, list[str]]]:
    """An HTTP SD server whose answer the test picks: `mode[0]`."""
    mode = ["ok"]
    seen: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        seen.append(request.headers.get("Authorization", ""))
        kind = mode[0]
        if kind == "500":
            return web.Response(status=500, text="boom")
        if kind == "text":
            return web.Response(text="not json", content_type="application/json")
        if kind == "html":
            return web.Response(text="[]", content_type="text/html")
        if kind == "slow":
            await asyncio.sleep(5)
        if kind == "huge":
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
            for _ in range(MAX_BYTES // 65536 + 4):
                await response.write(b" " * 65536)
            return response
        if kind == "redirect":
            raise web.HTTPFound("/elsewhere")
        return web.json_response(entry(8000, 8001, zone="z"))

    app = web.Application()
    app.router.add_get("/sd", handler)
    async with serve_app(app) as root:
        yield root, mode
        assert all(value in ("", "Bearer sd-token-123") for value in seen)


async def test_http_sd_keeps_the_last_good_list_on_every_failure(
    sd_server: tuple[str, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, mode = sd_server
    monkeypatch.setenv("LLMPROBER_TEST_SD_TOKEN", "sd-token-123")
    config = HttpSdConfig(url=f"{root}/sd", timeout_seconds=0.5,
                          bearer_token_env="LLMPROBER_TEST_SD_TOKEN")  # fmt: skip
    config.read_secrets()
    source = HttpSd(config, ["zone"])
    try:
        good = await source.fetch()
        assert addresses(good) == ["127.0.0.1:8000", "127.0.0.1:8001"]
        expected = {
            "500": Reason.HTTP_STATUS, "text": Reason.MALFORMED, "html": Reason.MALFORMED,
            "slow": Reason.TIMEOUT, "huge": Reason.TOO_LARGE, "redirect": Reason.HTTP_STATUS,
        }  # fmt: skip
        for kind, reason in expected.items():
            mode[0] = kind
            failed = await asyncio.wait_for(source.fetch(), timeout=5)
            assert (failed.found, reasons(failed)) == (None, [reason]), kind
        mode[0] = "ok"
        assert addresses(await source.fetch()) == ["127.0.0.1:8000", "127.0.0.1:8001"]
    finally:
        await source.close()


# --- dns ---------------------------------------------------------------------------------------
@pytest.fixture
def dns_server(tmp_path: Path) -> Iterator[Dnsmasq]:
    srv = ["_llm._tcp.llm.test,127.0.0.1,8000", "_llm._tcp.llm.test,127.0.0.1,8001"]
    with dnsmasq(tmp_path, ["127.0.0.1 llm.test", "::1 llm.test"], srv) as server:
        yield server


async def test_dns_a_aaaa_and_srv_from_a_real_server(dns_server: Dnsmasq) -> None:
    server = dns_server.server
    a = DnsSd(DnsConfig(name="llm.test", type="A", port=8000, server=server), ["dns_name"])
    aaaa = DnsSd(DnsConfig(name="llm.test", type="AAAA", port=8000, server=server), [])
    srv = DnsSd(DnsConfig(name="_llm._tcp.llm.test", type="SRV", server=server), [])
    fetched = await a.fetch()
    assert addresses(fetched) == ["127.0.0.1:8000"]
    assert fetched.found is not None
    assert fetched.found[0].labels == (("dns_name", "llm.test"),)
    assert addresses(await aaaa.fetch()) == ["[::1]:8000"]
    assert addresses(await srv.fetch()) == ["127.0.0.1:8000", "127.0.0.1:8001"]


async def test_dns_failures_keep_the_list_and_nxdomain_empties_it(dns_server: Dnsmasq) -> None:
    server = dns_server.server
    dns_server.hosts(["127.0.0.1 solo.test"])  # llm.test is an SRV name's parent: never NXDOMAIN
    source = DnsSd(DnsConfig(name="solo.test", type="A", port=8000, server=server,
                             timeout_seconds=0.5), [])  # fmt: skip
    assert addresses(await source.fetch()) == ["127.0.0.1:8000"]
    refused = DnsSd(DnsConfig(name="llm.example", type="A", port=1, server=server), [])
    assert reasons(fetched := await refused.fetch()) == [Reason.DNS]  # outside the zone
    assert fetched.found is None
    dns_server.hosts(["::1 solo.test"])  # no A record left: NODATA, an empty answer
    empty = await source.fetch()
    assert (empty.found, empty.faults, empty.empty_because) == ((), (), "no records of the type")
    dns_server.hosts([])  # the name is gone: NXDOMAIN, an empty answer too
    gone = await source.fetch()
    assert (gone.found, gone.empty_because) == ((), "NXDOMAIN")
    dns_server.hosts(["127.0.0.1 solo.test"])
    assert addresses(await source.fetch()) == ["127.0.0.1:8000"]
    dns_server.stop()
    timed_out = await source.fetch()
    assert (timed_out.found, reasons(timed_out)) == (None, [Reason.TIMEOUT])


async def test_a_dns_group_through_the_runner(dns_server: Dnsmasq) -> None:
    """A removed record leaves only after remove_after_seconds; a dead server keeps it."""
    group = {
        "group": "llm", "model": "m", "remove_after_seconds": 0.3, "labels": ["dns_name"],
        "dns": {"name": "llm.test", "type": "A", "port": 8000, "server": dns_server.server,
                "refresh_interval_seconds": 0.1, "timeout_seconds": 0.3},
    }  # fmt: skip
    static = {"name": "static", "url": "http://127.0.0.1:1/v1", "model": "m"}
    settings = Settings.model_validate({"targets": [static], "target_groups": [group]})
    fleet = Recording()
    applied = fleet.applied
    discovery = Discovery(settings, fleet, debounce_seconds=0.05)
    await discovery.start()
    try:
        assert applied == [["llm/127.0.0.1:8000", "static"]]
        dns_server.hosts(["::1 llm.test"])
        await asyncio.sleep(0.15)
        assert sorted(discovery.desired_set()) == ["llm/127.0.0.1:8000", "static"]  # waiting
        for _ in range(40):
            await asyncio.sleep(0.05)
            if applied[-1] == ["static"]:
                break
        assert applied[-1] == ["static"]
        dns_server.hosts(["127.0.0.1 llm.test"])
        for _ in range(40):
            await asyncio.sleep(0.05)
            if applied[-1] == ["llm/127.0.0.1:8000", "static"]:
                break
        assert applied[-1] == ["llm/127.0.0.1:8000", "static"]
        dns_server.stop()
        await asyncio.sleep(1.0)  # timeouts: the last good list stays
        assert applied[-1] == ["llm/127.0.0.1:8000", "static"]
    finally:
        await discovery.stop()
