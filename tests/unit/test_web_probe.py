"""`/probe?target=` for no configured target: 404 and one line listing the configured names,
at most `LISTED_TARGETS` of them and how many more; the daemon runs in-process, its targets
on a closed loopback port."""

from __future__ import annotations

import aiohttp

from prober.web import LISTED_TARGETS, unknown_target
from tests.support.daemon import daemon
from tests.support.net import closed_port


def test_the_line_lists_the_names_then_how_many_more() -> None:
    assert unknown_target("nope", ["a", "b"]) == (
        "unknown target 'nope': the configured targets are a, b"
    )
    names = [f"t{i}" for i in range(LISTED_TARGETS + 5)]
    line = unknown_target("x" * 100, names)
    assert line.startswith(f"unknown target '{'x' * 64}': the configured targets are t0, t1, ")
    assert line.endswith(f"t{LISTED_TARGETS - 1} and 5 more")
    assert f"t{LISTED_TARGETS}," not in line


async def test_an_unknown_target_is_404_naming_the_configured_ones() -> None:
    port = closed_port()
    targets = [
        {"name": f"t{i:02}", "url": f"http://127.0.0.1:{port}/v1", "model": "m",
         "interval_seconds": 3600, "warmup": 0}
        for i in range(LISTED_TARGETS + 3)
    ]  # fmt: skip
    async with (
        daemon({"targets": targets}) as (url, _),
        aiohttp.ClientSession() as session,
        session.get(f"{url}/probe", params={"target": "nope"}) as resp,
    ):
        status, text = resp.status, await resp.text()
    assert status == 404
    listed = ", ".join(f"t{i:02}" for i in range(LISTED_TARGETS))
    assert text == f"unknown target 'nope': the configured targets are {listed} and 3 more\n"
