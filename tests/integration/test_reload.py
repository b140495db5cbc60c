"""Reload (docs/design.md §11) of an in-process daemon against the simulator, by POST /-/reload:
unchanged targets keep their state and counters, a removed one's series leave, an added one
appears, a bad or restart-only configuration changes nothing, and a burst of reloads while
probes are in flight leaks nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web

from prober.fleet.reload import ConfigSource
from prober.settings import load_settings
from prober.sim import bound_port
from prober.web import FLEET, build_app
from tests.support.daemon import scrape, simulator, value, wait_for


def target(sim: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "url": f"{sim}/v1", "model": "sim", "interval_seconds": 0.3,
            "jitter_seconds": 0, "warmup": 0, "max_tokens": 8, **extra}  # fmt: skip


def write(path: Path, targets: list[dict[str, Any]], **server: Any) -> None:
    config = {"server": {"listen": "127.0.0.1:0", "grace_seconds": 1.0, **server},
              "targets": targets}  # fmt: skip
    path.write_text(yaml.safe_dump(config))


@asynccontextmanager
async def running(path: Path) -> AsyncIterator[tuple[str, web.Application]]:
    app = build_app(load_settings(path, {}), source=ConfigSource(path, {}))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}", app
    finally:
        await runner.cleanup()


async def reload(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as s, s.post(f"{url}/-/reload") as resp:
        return resp.status, await resp.text()


def requests(samples: dict[Any, float], name: str) -> float:
    return value(samples, "llmprober_requests_total", target=name)


async def test_reload_keeps_the_unchanged_and_changes_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    async with simulator(decode_step_seconds=0.01) as sim:
        write(path, [target(sim, "keep"), target(sim, "gone")])
        async with running(path) as (url, app):
            fleet = app[FLEET]

            async def probed() -> bool:
                s = await scrape(url)
                return min(requests(s, "keep"), requests(s, "gone")) >= 2

            await wait_for(probed, timeout=20)
            keep = fleet.members["keep"]
            keep_capacity = fleet.capacity["keep"]
            before = requests(await scrape(url), "keep")
            async with aiohttp.ClientSession() as s, s.get(f"{url}/-/reload") as resp:
                assert resp.status == 405
            write(path, [target(sim, "keep"), target(sim, "new", interval_seconds=0.4)])
            status, text = await reload(url)
            assert status == 200, text
            assert "1 added, 1 removed, 0 changed, 1 unchanged" in text

            async def settled() -> bool:
                s = await scrape(url)
                gone = [k for k in s if ("target", "gone") in k[1]]
                return requests(s, "new") >= 1 and not gone

            await wait_for(settled, timeout=20)
            assert fleet.members["keep"] is keep  # the same state object: nothing reset
            assert fleet.capacity["keep"] is keep_capacity
            assert requests(await scrape(url), "keep") >= before  # counters go on

            # A bad configuration: 400 with check-config's line, nothing applied, gauge 0.
            text = path.read_text()
            path.write_text(text.replace("interval_seconds: 0.3", "interval_seconds: 0"))
            status, text = await reload(url)
            assert status == 400
            assert "interval_seconds" in text
            s = await scrape(url)
            assert value(s, "llmprober_config_last_reload_successful") == 0
            assert set(fleet.members) == {"keep", "new"}
            probes = requests(s, "keep")
            await wait_for(lambda: _more(url, "keep", probes), timeout=10)  # still probing

            # A change that needs a restart is refused in one line, and nothing is applied.
            write(path, [target(sim, "keep")], listen="127.0.0.1:1")
            status, text = await reload(url)
            assert status == 400
            assert "server.listen" in text
            assert "needs a restart" in text
            assert set(fleet.members) == {"keep", "new"}

            # A good one again: the gauge is back to 1.
            write(path, [target(sim, "keep"), target(sim, "new", interval_seconds=0.4)])
            assert (await reload(url))[0] == 200
            assert value(await scrape(url), "llmprober_config_last_reload_successful") == 1


async def _more(url: str, name: str, than: float) -> bool:
    return requests(await scrape(url), name) > than


async def test_twenty_reloads_while_probes_are_in_flight(tmp_path: Path) -> None:
    """Every reload flips one target's interval and adds or removes another; the unchanged
    target's state survives all of them and its requests never decrease; nothing leaks."""
    path = tmp_path / "config.yml"
    async with simulator(decode_step_seconds=0.05) as sim:
        stable = target(sim, "stable", max_tokens=16, load={"rate": 5.0, "seed": 1})
        configs = [
            [stable, target(sim, "flip", interval_seconds=0.3)],
            [stable, target(sim, "flip", interval_seconds=0.5), target(sim, "extra")],
        ]
        write(path, configs[0])
        async with running(path) as (url, app):
            fleet = app[FLEET]
            await wait_for(lambda: _more(url, "stable", 1), timeout=20)
            member, capacity = fleet.members["stable"], fleet.capacity["stable"]
            load = member.load
            seen = [requests(await scrape(url), "stable")]
            for i in range(20):
                write(path, configs[(i + 1) % 2])
                status, text = await reload(url)
                assert status == 200, text
                seen.append(requests(await scrape(url), "stable"))
                await asyncio.sleep(0.3)
            assert seen == sorted(seen), seen  # never decreased: no reset
            assert fleet.members["stable"] is member
            assert fleet.capacity["stable"] is capacity
            assert member.load is load
            assert set(fleet.members) == {"stable", "flip"}
            await fleet.drain(1.0)  # what the reloads retired has ended
            assert set(fleet.sessions) == set(fleet.members)
            open_sessions = [m.session for m in fleet.members.values() if not m.session.closed]
            assert len(open_sessions) == 2
