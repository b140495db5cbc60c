"""End to end: the simulator, the real daemon and the real Prometheus (scraping every second,
loading the shipped rules). Every dashboard query and every recording rule must return data.

The daemon probes two targets on one simulator: `sim` (probes every second plus 2 req/s of
Poisson load) and `strained`, which exists so that the event-driven series exist too (an E2E
SLO, an unreachable metrics_url, load that its in-flight cap must drop); and a target group,
`replicas`, found in a file_sd file that names the same simulator by two addresses, with
`sim` as its gateway, so the Replicas row and the group rules have a group to show.

Runs only where the daemon exists (`prober.cli`) and Prometheus is installed
(scripts/setup-prometheus.sh); takes about a minute.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.deploy import (
    RULES_DIR,
    Prometheus,
    dashboard_queries,
    empty_until_deadline,
    live_stack,
    rules_without_series,
)
from tests.support.net import free_port

pytestmark = pytest.mark.prometheus


@pytest.fixture(scope="module")
def stack(prometheus_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    tmp = tmp_path_factory.mktemp("live")
    sim_port, daemon_port, prom_port, dead_port = (free_port() for _ in range(4))
    sim = f"http://127.0.0.1:{sim_port}"
    replicas = tmp / "replicas.json"
    addresses = [f"127.0.0.1:{sim_port}", f"localhost:{sim_port}"]
    replicas.write_text(json.dumps([{"targets": addresses}]))
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
                # The Answers row: answer checks on every probe, and the cache probe.
                "expect": {"regex": ".", "min_answer_tokens": 1},
                "cache_probe": {"prefix_tokens": 64, "interval_seconds": 2},
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
        "target_groups": [
            {
                "group": "replicas",
                "model": "sim",
                "interval_seconds": 1,
                "metrics_url": "http://{address}/metrics",
                "file_sd": {"files": [str(replicas)]},
                "gateway": "sim",
            }
        ],
    }
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
    sim_cmd = [sys.executable, "-m", "prober.cli", "sim", "--port", str(sim_port)]
    engines = [(sim_cmd, f"{sim}/metrics")]
    with live_stack(prometheus_bin, tmp, config, prom_config, prom_port, engines) as prometheus:
        yield prometheus


def test_every_dashboard_query_returns_data(stack: Prometheus) -> None:
    # vLLM's own series: this stack scrapes no vLLM (test_dashboards_live_vllm.py does).
    queries = [(where, expr) for where, expr in dashboard_queries() if "vllm:" not in expr]
    assert len(queries) > 40
    empty = empty_until_deadline(stack, queries)
    assert not empty, "queries without data:\n" + "\n".join(empty)


def test_every_recording_rule_produces_series(stack: Prometheus) -> None:
    empty = rules_without_series(stack)
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
