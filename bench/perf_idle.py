"""Idle footprint: the daemon's CPU share and memory with one target probed every 15 s.

    .venv/bin/python bench/perf_idle.py [--seconds 300] [--instances 3] [--scrape-every 15]
        [--loop default|asyncio|uvloop]

Starts the simulator, then `--instances` daemons side by side (`llm-prober run --config`, one
process each, each with one target probed every 15 s and its /metrics scraped every
`--scrape-every` s as Prometheus would; 0 turns scraping off). After a 20 s settling period
(start-up, the warm-up probe) it measures for `--seconds`: CPU seconds from /proc (user +
system) over wall time, as a share of one core, and resident memory (VmRSS, sampled every
5 s). Running the daemons side by side gives several samples in one period; each is idle
enough not to disturb the others. Figures: median over instances, goal < 0.5 % of a core
and < 80 MB.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

from perf_common import (
    Sim,
    exit_on_sigterm,
    free_port,
    proc_cpu_seconds,
    proc_rss_bytes,
    spawn_cli,
    wait_http,
)

SETTLE_SECONDS = 20.0
SAMPLE_SECONDS = 5.0


def config(sim_url: str, port: int) -> str:
    return (
        f'server:\n  listen: "127.0.0.1:{port}"\n'
        f"targets:\n  - name: local\n    url: {sim_url}\n    model: sim\n"
        "    interval_seconds: 15\n"
        "logging: {level: warning}\n"
    )


def probes_done(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("llmprober_requests_total{") and 'mode="probe"' in line
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--scrape-every", type=float, default=15.0)
    parser.add_argument("--loop", default="default", choices=["default", "asyncio", "uvloop"])
    ns = parser.parse_args()
    exit_on_sigterm()
    loop = "asyncio" if ns.loop == "default" else ns.loop
    with Sim(("--slots", "4"), "asyncio") as sim, tempfile.TemporaryDirectory() as tmp:
        daemons: list[tuple[subprocess.Popen[bytes], int]] = []
        try:
            for i in range(ns.instances):
                port = free_port()
                path = Path(tmp) / f"config-{i}.yml"
                path.write_text(config(sim.url, port))
                daemons.append((spawn_cli(["run", "--config", str(path)], loop), port))
            for _, port in daemons:
                wait_http(f"http://127.0.0.1:{port}/-/healthy")
            time.sleep(SETTLE_SECONDS)
            measure(daemons, ns.seconds, ns.scrape_every)
        finally:
            for proc, _ in daemons:
                proc.terminate()
            for proc, _ in daemons:
                proc.wait(30)


def measure(
    daemons: list[tuple[subprocess.Popen[bytes], int]], seconds: float, scrape_every: float
) -> None:
    pids = [proc.pid for proc, _ in daemons]
    cpu0 = [proc_cpu_seconds(pid) for pid in pids]
    probes0 = [probes_done(port) for _, port in daemons]
    rss: list[list[int]] = [[proc_rss_bytes(pid)] for pid in pids]
    t0 = time.monotonic()
    next_scrape = t0 + scrape_every if scrape_every > 0 else float("inf")
    while (now := time.monotonic()) < t0 + seconds:
        if now >= next_scrape:
            for _, port in daemons:
                probes_done(port)  # a full scrape, as Prometheus does
            next_scrape += scrape_every
        time.sleep(min(SAMPLE_SECONDS, max(0.0, t0 + seconds - now), next_scrape - now))
        for i, pid in enumerate(pids):
            rss[i].append(proc_rss_bytes(pid))
    wall = time.monotonic() - t0
    shares = [(proc_cpu_seconds(pid) - c0) / wall for pid, c0 in zip(pids, cpu0, strict=True)]
    probes = [probes_done(port) - p0 for (_, port), p0 in zip(daemons, probes0, strict=True)]
    print(f"{len(pids)} daemons side by side, {wall:.0f} s each, one target every 15 s")
    heads = ("CPU % of a core", 16), ("RSS max MB", 11), ("RSS end MB", 11), ("probes", 7)
    print(f"{'daemon':>6} " + " ".join(f"{h:>{w}}" for h, w in heads))
    for i, share in enumerate(shares):
        print(
            f"{i:>6} {100 * share:>16.3f} {max(rss[i]) / 2**20:>11.1f} "
            f"{rss[i][-1] / 2**20:>11.1f} {probes[i]:>7.0f}"
        )
    print(
        f"median: {100 * statistics.median(shares):.3f} % of a core (goal < 0.5 %), RSS max "
        f"{statistics.median(max(r) for r in rss) / 2**20:.1f} MB (goal < 80 MB)"
    )


if __name__ == "__main__":
    main()
