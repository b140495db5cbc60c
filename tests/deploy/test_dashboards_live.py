"""End to end: the simulator, the real daemon and the real Prometheus (scraping every second,
loading the shipped rules). Every dashboard query and every recording rule must return data.

The daemon probes two targets on one simulator: `sim` (probes every second plus 2 req/s of
Poisson load) and `strained`, which exists so that the event-driven series exist too (an E2E
SLO, an unreachable metrics_url, load that its in-flight cap must drop).

Runs only where the daemon exists (`prober.cli`) and Prometheus is installed
(scripts/setup-prometheus.sh); takes about a minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.helpers import (
    DASHBOARDS_DIR,
    RULES_DIR,
    recording_rules,
)
from tests.deploy.helpers import substitute as helpers_substitute
from tests.support.net import free_port, wait_http

pytestmark = pytest.mark.prometheus

WARMUP_SECONDS = 40
DEADLINE_SECONDS = 150


def substitute(expr: str) -> str:
    return helpers_substitute(expr, interval="1s", range_="5m")


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and query variable of every dashboard."""
    queries = []
    for path in sorted(DASHBOARDS_DIR.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                where = f"{path.name} / {panel['title']} / {target['refId']}"
                queries.append((where, substitute(target["expr"])))
        for var in dashboard["templating"]["list"]:
            if var["type"] == "query":
                inner = var["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]
                queries.append((f"{path.name} / variable {var['name']}", substitute(inner)))
    return queries


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        qs = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{qs}", timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def stack(prometheus_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    pytest.importorskip("prober.cli", reason="the daemon (prober.cli) does not exist yet")
    tmp = tmp_path_factory.mktemp("live")
    sim_port, daemon_port, prom_port, dead_port = (free_port() for _ in range(4))
    sim = f"http://127.0.0.1:{sim_port}"
    config = {
        "server": {"listen": f"127.0.0.1:{daemon_port}"},
        "targets": [
            {
                "name": "sim",
                "url": f"{sim}/v1",
                "model": "sim",
                "interval_seconds": 1,
                "metrics_url": f"{sim}/metrics",
                "load": {"rate": 2.0, "max_in_flight": 16},
            },
            # Makes the event-driven series exist as well: an E2E SLO, engine metrics that
            # cannot be scraped (nothing listens there) and load that its cap must drop.
            {
                "name": "strained",
                "url": f"{sim}/v1",
                "model": "sim",
                "interval_seconds": 1,
                "metrics_url": f"http://127.0.0.1:{dead_port}/metrics",
                "slo": {"e2e_seconds": 30},
                "load": {"rate": 5.0, "max_in_flight": 1},
            },
        ],
    }
    (tmp / "prober.yml").write_text(yaml.safe_dump(config))
    prom_config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in sorted(RULES_DIR.glob("*.yml"))],
        "scrape_configs": [
            {
                "job_name": "llm-prober",
                "static_configs": [{"targets": [f"127.0.0.1:{daemon_port}"]}],
            }
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(
            start(
                [sys.executable, "-m", "prober.cli", "sim", "--port", str(sim_port)],
                tmp / "sim.log",
            )
        )
        wait_http(f"http://127.0.0.1:{sim_port}/metrics", timeout=30)
        procs.append(
            start(
                [sys.executable, "-m", "prober.cli", "run", "--config", str(tmp / "prober.yml")],
                tmp / "daemon.log",
            )
        )
        wait_http(f"http://127.0.0.1:{daemon_port}/-/healthy", timeout=30)
        procs.append(start_prometheus(prometheus_bin, tmp, prom_port))
        time.sleep(WARMUP_SECONDS)
        yield Prometheus(f"http://127.0.0.1:{prom_port}")
    finally:
        stop(procs)


def start_prometheus(prometheus_bin: Path, tmp: Path, port: int) -> subprocess.Popen[bytes]:
    """Prometheus on `tmp/prometheus.yml`, its data and log in `tmp`; returns once ready
    (stopped again if it never is)."""
    cmd = [
        str(prometheus_bin / "prometheus"),
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = start(cmd, tmp / "prometheus.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=30)
    except BaseException:
        stop([proc])
        raise
    return proc


def empty_until_deadline(prom: Prometheus, queries: list[tuple[str, str]]) -> list[str]:
    """Queries still empty at the deadline (slow rules get time, failures fail fast)."""
    pending = list(queries)
    deadline = time.monotonic() + DEADLINE_SECONDS - WARMUP_SECONDS
    while True:
        pending = [(where, expr) for where, expr in pending if not prom.query(expr)]
        if not pending or time.monotonic() > deadline:
            return [f"{where}: {expr}" for where, expr in pending]
        time.sleep(2)


def test_every_dashboard_query_returns_data(stack: Prometheus) -> None:
    # vLLM's own series: this stack scrapes no vLLM (tests/vllm/test_vllm_prometheus.py does).
    queries = [(where, expr) for where, expr in dashboard_queries() if "vllm:" not in expr]
    assert len(queries) > 40
    empty = empty_until_deadline(stack, queries)
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_every_recording_rule_produces_series(stack: Prometheus) -> None:
    rules = [(name, name) for name in recording_rules()]
    empty = empty_until_deadline(stack, rules)
    assert not empty, "recording rules without series:\n" + "\n".join(empty)


def test_recorded_latencies_are_finite_and_plausible(stack: Prometheus) -> None:
    for rule in (
        "llmprober:ttft_seconds:p95_5m",
        "llmprober:tpot_seconds:p95_5m",
        "llmprober:e2e_seconds:p95_5m",
    ):
        [sample] = stack.query(f'{rule}{{target="sim"}}')
        value = float(sample["value"][1])
        assert 0 < value < 60, f"{rule} = {value}"
    [goodput] = stack.query('llmprober:goodput:ratio_rate5m{target="sim"}')
    assert 0 <= float(goodput["value"][1]) <= 1
