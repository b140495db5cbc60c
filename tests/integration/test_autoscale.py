"""The closed loop, short: one replica measured by bench, its emitted ScaledObject, and two
policies (GPU utilisation at 80 %, the shipped combination) on the same seeded trace, with
real simulator replicas and sidecar daemons as processes and a real Prometheus evaluating
the shipped rules (prober/autoscale, docs/autoscaling.md).

It asserts the shape the full run measured, never a time: the shipped policy holds the TTFT
SLO through the spike; GPU utilisation, which reads near 100 % whenever anything decodes,
holds it only by running close to maxReplicas, at clearly more replica-seconds.

Needs the Prometheus binaries (scripts/setup-prometheus.sh); about 3 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio

import pytest

from prober.autoscale.main import experiment
from tests.deploy.helpers import missing_tool, prometheus_bin_dir

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(900)]

SPIKE_GOODPUT = 0.95  # the SLO target the spike must be held to
MORE_COST = 1.2  # "clearly more" replica-seconds


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, object]]:
    folder = prometheus_bin_dir()
    if folder is None or not (folder / "prometheus").exists():
        missing_tool("prometheus not found: set PROMETHEUS_BIN or run scripts/setup-prometheus.sh")
    assert folder is not None
    out = tmp_path_factory.mktemp("autoscale")
    args = argparse.Namespace(policies="gpu-util,shipped", scale=0.4, no_metrics_url=False,
                              seed=16, out=out, prometheus_bin=folder / "prometheus")  # fmt: skip
    result = asyncio.run(experiment(args))
    assert (out / "summary.json").exists()
    return {str(r["policy"]): r for r in result}


def spike(row: dict[str, object]) -> float:
    phases = row["goodput_by_phase"]
    assert isinstance(phases, dict)
    value = phases["spike"]
    assert isinstance(value, float)
    return value


def cost(row: dict[str, object]) -> float:
    value = row["replica_seconds"]
    assert isinstance(value, float)
    return value


def test_every_request_was_sent_to_a_ready_replica(rows: dict[str, dict[str, object]]) -> None:
    for row in rows.values():
        assert row["no_endpoint"] == 0
        requests = row["requests"]
        assert isinstance(requests, int)
        assert requests > 1000


def test_shipped_policy_holds_the_slo_through_the_spike(
    rows: dict[str, dict[str, object]],
) -> None:
    assert spike(rows["shipped"]) >= SPIKE_GOODPUT


def test_gpu_utilisation_holds_the_spike_only_at_more_replica_seconds(
    rows: dict[str, dict[str, object]],
) -> None:
    gpu, shipped = rows["gpu-util"], rows["shipped"]
    if spike(gpu) >= SPIKE_GOODPUT:
        assert cost(gpu) >= MORE_COST * cost(shipped)
    assert gpu["peak_replicas"] == 8  # pinned at maxReplicaCount: it cannot tell 1 from 16
