"""End to end with vLLM: a real Prometheus scrapes the daemon and vLLM, loading the shipped rules.

The daemon probes vLLM every second, with its `metrics_url`, and sends 2 req/s of background
load (an in-flight cap of 2, so that the drop series exist too); and a target group,
`replicas`, found in a file_sd file that names the same vLLM by its address, with `vllm` as its
gateway, so the group rules have a group to aggregate. Every dashboard query that names one of
vLLM's own series (every query of its panel) and every recording rule must return data.
"""

from __future__ import annotations

import json
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
from tests.support.vllm import MODEL_NAME

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus]


def _configs(
    vllm: str, daemon_port: int, replicas: Path
) -> tuple[dict[str, object], dict[str, object]]:
    target = {
        "name": "vllm", "url": f"{vllm}/v1", "model": MODEL_NAME, "interval_seconds": 1,
        "max_tokens": 8, "metrics_url": f"{vllm}/metrics", "metrics_interval_seconds": 1,
        "slo": {"e2e_seconds": 30},
        "load": {"rate": 2.0, "max_in_flight": 2, "max_tokens": 8},
    }  # fmt: skip
    vllm_host = vllm.removeprefix("http://")
    replicas.write_text(json.dumps([{"targets": [vllm_host]}]))
    group = {
        "group": "replicas", "model": MODEL_NAME, "interval_seconds": 2, "max_tokens": 8,
        "file_sd": {"files": [str(replicas)]}, "gateway": "vllm",
    }  # fmt: skip
    daemon = {
        "server": {"listen": f"127.0.0.1:{daemon_port}"},
        "targets": [target],
        "target_groups": [group],
    }
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
    daemon, prometheus = _configs(vllm, daemon_port, tmp / "replicas.json")
    with live_stack(prometheus_bin, tmp, daemon, prometheus, prom_port) as stack:
        yield stack


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
    empty = rules_without_series(stack)
    assert not empty, "recording rules without series:\n" + "\n".join(empty)
    # The server's own count reaches the queue rules: the target's server series exist.
    [kv] = stack.query('llmprober:kv_cache_usage:max{target="vllm"}')
    assert 0 <= float(kv["value"][1]) <= 1
    [waiting] = stack.query(
        'llmprober_queue_depth{target="vllm", source="server", state="waiting"}'
    )
    assert float(waiting["value"][1]) >= 0
