"""The fleet under a real Prometheus (scraping every second), on loopback.

- The daemon is reloaded six times (SIGHUP), each reload adding, removing and changing other
  targets: the stable target's counters never reset (`resets(...[5m])` is 0) and its series is
  never absent from a scrape.
- Prometheus reads the same file_sd file as the daemon's `target_groups:` (two simulator
  processes): both see the same addresses, and again after the file drops one.

Runs where Prometheus is installed (scripts/setup-prometheus.sh); about a minute.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy import Prometheus, start_prometheus, stop
from tests.support.fleet_live import Daemon, running, targets, total, until
from tests.support.net import free_port
from tests.support.probes_alone_accuracy import sim_process

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(300)]


@dataclass
class Stack:
    prometheus: Prometheus
    daemon: Daemon
    replicas: Path
    sims: list[str]
    started: float


def _target(base: str, name: str, interval: float = 1) -> dict[str, Any]:
    return {"name": name, "url": f"{base}/v1", "model": "sim", "interval_seconds": interval,
            "warmup": 0}  # fmt: skip


def _config(stack_sims: list[str], replicas: Path, churn: list[dict[str, Any]]) -> dict[str, Any]:
    group = {
        "group": "replicas", "model": "sim", "interval_seconds": 1, "warmup": 0,
        "remove_after_seconds": 1, "url": "http://{address}/v1",
        "file_sd": {"files": [str(replicas)]},
    }  # fmt: skip
    return {"targets": [_target(stack_sims[0], "stable"), *churn], "target_groups": [group]}


def _addresses(sims: list[str]) -> list[str]:
    return [base.removeprefix("http://") for base in sims]


@pytest.fixture(scope="module")
def stack(prometheus_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("fleet-prometheus")
    with sim_process() as a, sim_process() as b:
        sims = [a, b]
        replicas = tmp / "replicas.json"
        replicas.write_text(json.dumps([{"targets": _addresses(sims)}]))
        with running(tmp, _config(sims, replicas, [])) as daemon:
            prom_port = free_port()
            prom_config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {"job_name": "llm-prober",
                     "static_configs": [{"targets": [f"127.0.0.1:{daemon.port}"]}]},
                    {"job_name": "replicas",
                     "file_sd_configs": [{"files": [str(replicas)], "refresh_interval": "1s"}]},
                ],
            }  # fmt: skip
            (tmp / "prometheus.yml").write_text(yaml.safe_dump(prom_config))
            started = time.time()
            prom = start_prometheus(prometheus_bin, tmp, prom_port)
            try:
                yield Stack(Prometheus(f"http://127.0.0.1:{prom_port}"), daemon, replicas,
                            sims, started)  # fmt: skip
            finally:
                stop([prom])


def _query_range(prom: Prometheus, expr: str, start: float, end: float) -> list[dict[str, Any]]:
    qs = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": "1s"})
    with urllib.request.urlopen(f"{prom.url}/api/v1/query_range?{qs}", timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _reloaded(daemon: Daemon, times: int) -> Callable[[], bool]:
    return lambda: len(daemon.events("reload_done")) >= times


def _holding(daemon: Daemon, names: set[str]) -> Callable[[], bool]:
    return lambda: names <= targets(daemon.samples())


def test_the_stable_target_never_resets_across_reloads(stack: Stack) -> None:
    daemon, prom = stack.daemon, stack.prometheus
    stable = 'llmprober_requests_total{target="stable",outcome="ok"}'
    until("Prometheus has the stable target", lambda: bool(prom.query(f"{stable} > 0")), 60)
    begin = time.time()
    for i in range(6):
        churn = [_target(stack.sims[1], f"churn-{i}"), _target(stack.sims[1], "slow", 1 + i)]
        daemon.write(_config(stack.sims, stack.replicas, churn))
        daemon.sighup()
        until(f"reload {i + 1} done", _reloaded(daemon, i + 1), 15)
        until(f"reload {i + 1} applied", _holding(daemon, {"stable", f"churn-{i}", "slow"}), 15)
        time.sleep(2)  # a few scrapes of this set
    assert total(daemon.samples(), "llmprober_config_last_reload_successful") == 1
    time.sleep(2)
    end = time.time()
    resets = prom.query('resets(llmprober_requests_total{target="stable"}[5m])')
    assert resets, "no stable series in Prometheus"
    assert [r["value"][1] for r in resets] == ["0"] * len(resets)
    assert _query_range(prom, f"absent({stable})", begin, end) == []
    seen = _query_range(prom, stable, begin, end)
    assert len(seen) == 1
    assert len(seen[0]["values"]) >= int(end - begin) - 2  # a sample at every step


def test_prometheus_and_the_daemon_read_the_same_file_sd_file(stack: Stack) -> None:
    prom, daemon = stack.prometheus, stack.daemon

    def same(addresses: list[str]) -> bool:
        scraped = {r["metric"]["instance"] for r in prom.query('up{job="replicas"} == 1')}
        probed = {
            dict(labels)["address"]
            for sample, labels in daemon.samples()
            if sample == "llmprober_target_info" and dict(labels).get("group") == "replicas"
        }
        return scraped == probed == set(addresses)

    both = _addresses(stack.sims)
    until("both see the two replicas", lambda: same(both), 60)
    stack.replicas.write_text(json.dumps([{"targets": both[:1]}]))
    until("both see the one left", lambda: same(both[:1]), 30)
