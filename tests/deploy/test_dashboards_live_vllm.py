"""End to end with vLLM: a real Prometheus scrapes the daemon and vLLM, loading the shipped rules.

The daemon probes vLLM every second, with its `metrics_url`, and sends 2 req/s of background
load (an in-flight cap of 2, so that the drop series exist too). Every dashboard query that
names one of vLLM's own series (every query of its panel) and every recording rule must
return data.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.deploy.helpers import RULES_DIR, recording_rules
from tests.deploy.test_dashboards_live import (
    Prometheus,
    dashboard_queries,
    empty_until_deadline,
    start,
    start_prometheus,
    stop,
)
from tests.support.net import free_port, wait_http
from tests.support.vllm import MODEL_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus]
WARMUP_SECONDS = 40


def _configs(vllm: str, daemon_port: int) -> tuple[dict[str, object], dict[str, object]]:
    target = {
        "name": "vllm", "url": f"{vllm}/v1", "model": MODEL_NAME, "interval_seconds": 1,
        "max_tokens": 8, "metrics_url": f"{vllm}/metrics", "metrics_interval_seconds": 1,
        "slo": {"e2e_seconds": 30},
        "load": {"rate": 2.0, "max_in_flight": 2, "max_tokens": 8},
    }  # fmt: skip
    daemon = {"server": {"listen": f"127.0.0.1:{daemon_port}"}, "targets": [target]}
    vllm_host = vllm.removeprefix("http://")
    prometheus = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(p) for p in sorted(RULES_DIR.glob("*.yml"))],
        "scrape_configs": [
            {
                "job_name": "llm-prober",
                "static_configs": [{"targets": [f"127.0.0.1:{daemon_port}"]}],
            },
            {"job_name": "vllm", "static_configs": [{"targets": [vllm_host]}]},
        ],
    }
    return daemon, prometheus


@pytest.fixture(scope="module")
def stack(
    vllm: str, prometheus_bin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("vllm-live")
    daemon_port, prom_port = free_port(), free_port()
    daemon, prometheus = _configs(vllm, daemon_port)
    (tmp / "prober.yml").write_text(yaml.safe_dump(daemon))
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(prometheus))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        cmd = [sys.executable, "-m", "prober.cli", "run", "--config", str(tmp / "prober.yml")]
        procs.append(start(cmd, tmp / "daemon.log"))
        wait_http(f"http://127.0.0.1:{daemon_port}/-/healthy", timeout=30)
        procs.append(start_prometheus(prometheus_bin, tmp, prom_port))
        time.sleep(WARMUP_SECONDS)
        yield Prometheus(f"http://127.0.0.1:{prom_port}")
    finally:
        stop(procs)


def test_every_vllm_panel_returns_data(stack: Prometheus) -> None:
    # Every query of a panel that names a vLLM series (the probes' beside vLLM's too).
    every = dashboard_queries()
    panels = {where.rsplit(" / ", 1)[0] for where, expr in every if "vllm:" in expr}
    queries = [(where, expr) for where, expr in every if where.rsplit(" / ", 1)[0] in panels]
    assert len(panels) >= 3
    assert len(queries) >= 6
    empty = empty_until_deadline(stack, queries)
    assert not empty, "vLLM panels without data:\n" + "\n".join(empty)


def test_every_recording_rule_produces_series_from_vllm(stack: Prometheus) -> None:
    rules = [(name, name) for name in recording_rules()]
    empty = empty_until_deadline(stack, rules)
    assert not empty, "recording rules without series:\n" + "\n".join(empty)
    # The server's own count reaches the queue rules: the target's server series exist.
    [kv] = stack.query('llmprober:kv_cache_usage:max{target="vllm"}')
    assert 0 <= float(kv["value"][1]) <= 1
    [waiting] = stack.query(
        'llmprober_queue_depth{target="vllm", source="server", state="waiting"}'
    )
    assert float(waiting["value"][1]) >= 0
