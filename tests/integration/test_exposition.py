"""A real scrape of the daemon passes `promtool check metrics` and carries exemplars."""

from __future__ import annotations

import subprocess

import aiohttp

from tests.support.daemon import daemon, scrape, simulator, value, wait_for
from tests.support.deploy import missing_tool, prometheus_bin_dir


async def test_promtool_finds_nothing_to_complain_about() -> None:
    folder = prometheus_bin_dir()
    if folder is None or not (folder / "promtool").exists():
        missing_tool("promtool not found: run scripts/setup-prometheus.sh")
    assert folder is not None
    async with simulator(reasoning_tokens=2) as sim:
        target = {
            "name": "sim", "url": f"{sim}/v1", "model": "sim", "interval_seconds": 0.5,
            "jitter_seconds": 0, "warmup": 0, "metrics_url": f"{sim}/metrics",
            "load": {"rate": 4.0, "max_in_flight": 8},
        }  # fmt: skip
        async with daemon({"targets": [target]}) as (url, _app):

            async def some() -> bool:
                return value(await scrape(url), "llmprober_requests_total", outcome="ok") >= 3

            await wait_for(some, timeout=20)
            async with aiohttp.ClientSession() as s:
                async with s.get(f"{url}/metrics") as r:
                    text = await r.text()
                headers = {"Accept": "application/openmetrics-text; version=1.0.0"}
                async with s.get(f"{url}/metrics", headers=headers) as r:
                    openmetrics = await r.text()
    check = subprocess.run(
        [str(folder / "promtool"), "check", "metrics"], input=text, capture_output=True,
        text=True, timeout=30,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.strip() == "", check.stdout
    # Latency buckets lead to one concrete request: `# {request_id="chatcmpl-..."} value ts`.
    exemplars = [
        line for line in openmetrics.splitlines()
        if line.startswith("llmprober_ttft_seconds_bucket") and ' # {request_id="' in line
    ]  # fmt: skip
    assert exemplars, "no exemplar on the TTFT histogram"


async def test_the_daemon_says_which_private_paths_are_live() -> None:
    """Arrival stamping by the protocol on the pinned aiohttp, and no exposition fallback."""
    async with simulator() as sim:
        target = {"name": "sim", "url": f"{sim}/v1", "model": "sim", "interval_seconds": 3600,
                  "warmup": 0}  # fmt: skip
        async with daemon({"targets": [target]}) as (url, _app):
            samples = await scrape(url)
    assert value(samples, "llmprober_stamping_info", method="protocol") == 1
    assert ("llmprober_stamping_info", (("method", "fallback"),)) not in samples
    assert ("llmprober_exposition_fallback_total", ()) in samples
    assert value(samples, "llmprober_exposition_fallback_total") == 0
