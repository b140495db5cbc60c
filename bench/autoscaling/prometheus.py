"""A real Prometheus for the experiment: the shipped recording rules, time scaled.

The rules file is the shipped one with every range selector (`[5m]`, `[2m]`, ...) divided by
the compression factor, so `llmprober:ttft_seconds:p95_5m` keeps its name and covers what 5
minutes cover in the compressed world. Scrape and evaluation intervals (15 s in a typical
deployment) are divided the same way. Targets come from file_sd files that the fleet
rewrites as replicas become ready.
"""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path
from typing import Any

import aiohttp
import yaml

_RANGE = re.compile(r"\[(\d+)([smh])\]")
_UNIT = {"s": 1, "m": 60, "h": 3600}
REAL_INTERVAL_SECONDS = 15.0


def scale_ranges(text: str, factor: float) -> str:
    """Every `[Nu]` range selector divided by `factor`, in milliseconds."""

    def one(m: re.Match[str]) -> str:
        ms = max(1, round(int(m.group(1)) * _UNIT[m.group(2)] * 1000 / factor))
        return f"[{ms}ms]"

    return _RANGE.sub(one, text)


def config(work: Path, rules: Path, factor: float, sd: dict[str, Path]) -> Path:
    """Write the scaled rules and prometheus.yml into `work`; return the config's path."""
    scaled = work / "rules.yml"
    scaled.write_text(scale_ranges(rules.read_text(), factor))
    interval = f"{round(REAL_INTERVAL_SECONDS * 1000 / factor)}ms"
    every = {"scrape_interval": interval, "evaluation_interval": interval}
    doc = {
        "global": every | {"scrape_timeout": interval},
        "rule_files": [str(scaled)],
        "scrape_configs": [
            {"job_name": job, "file_sd_configs": [{"files": [str(path)], "refresh_interval": "1s"}]}
            for job, path in sd.items()
        ],
    }
    path = work / "prometheus.yml"
    path.write_text(yaml.safe_dump(doc))
    return path


async def start(binary: Path, cfg: Path, work: Path, port: int) -> asyncio.subprocess.Process:
    log = (work / "prometheus.log").open("ab")
    proc = await asyncio.create_subprocess_exec(
        str(binary),
        f"--config.file={cfg}",
        f"--storage.tsdb.path={work / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        stdout=log,
        stderr=log,
    )
    log.close()
    return proc


class Client:
    """Instant queries, as KEDA's Prometheus scaler sends them."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self._session, self._url = session, url

    async def ready(self, seconds: float) -> bool:
        for _ in range(max(1, int(seconds / 0.2))):
            try:
                async with self._session.get(f"{self._url}/-/ready") as r:
                    if r.status == 200:
                        return True
            except (aiohttp.ClientError, OSError):
                pass
            await asyncio.sleep(0.2)
        return False

    async def rule_errors(self) -> list[str]:
        """Rules Prometheus reports unhealthy (a bad scaled file would show here)."""
        async with self._session.get(f"{self._url}/api/v1/rules") as r:
            body = await r.json()
        groups: list[dict[str, Any]] = body["data"]["groups"]
        return [
            f"{rule['name']}: {rule.get('lastError')}"
            for g in groups
            for rule in g["rules"]
            if rule.get("health") == "err"
        ]

    async def scalar(self, query: str) -> float | None:
        """The query's first value (KEDA reads the first sample); None on error or no data."""
        try:
            async with self._session.get(
                f"{self._url}/api/v1/query",
                params={"query": query},
                timeout=aiohttp.ClientTimeout(total=2),
            ) as r:
                body = await r.json()
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None
        result = body.get("data", {}).get("result", []) if body.get("status") == "success" else []
        if not result:
            return None
        value = float(result[0]["value"][1])
        return value if math.isfinite(value) else None
