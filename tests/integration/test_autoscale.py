"""The closed loop, short: one replica measured by bench, its emitted ScaledObject, and two
policies (GPU utilisation at 80 %, the shipped combination) on the same seeded trace, with
real simulator replicas and sidecar daemons as processes and a real Prometheus evaluating
the shipped rules (bench/autoscaling, docs/autoscaling.md).

The trace is the full run's first 12 real minutes (baseline, ramp, the start of the step).
It asserts the shape the full run measured, never a time: GPU utilisation, which reads near
100 % whenever anything decodes, scales the fleet to three times what the load needs while
the load is at most 2 replicas' capacity, and holds more replicas than the shipped policy.
The issue expected the utilisation policy to lose goodput on the spike; measured, it does
not (it never leaves the maximum): it loses on cost, which is what this asserts
(docs/autoscaling.md, "Measured in a closed loop").

Needs the Prometheus binaries (scripts/setup-prometheus.sh); about 4 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import pytest

from bench.autoscaling.main import experiment
from tests.support.deploy import missing_tool, prometheus_bin_dir
from tests.support.margins import holds

pytestmark = [pytest.mark.prometheus, pytest.mark.timeout(900)]
# The utilisation policy's mean replicas through the ramp over the shipped policy's, at least.
RAMP_COST = 1.2


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    folder = prometheus_bin_dir()
    if folder is None or not (folder / "prometheus").exists():
        missing_tool("prometheus not found: set PROMETHEUS_BIN or run scripts/setup-prometheus.sh")
    assert folder is not None
    out = tmp_path_factory.mktemp("autoscale")
    args = argparse.Namespace(policies="gpu-util,shipped", trace="short", scale=1.0,
                              no_metrics_url=False, seed=16, out=out,
                              prometheus_bin=folder / "prometheus")  # fmt: skip
    result = asyncio.run(experiment(args))
    assert (out / "summary.json").exists()
    assert (out / "table.md").read_text().count("|") > 20
    return {str(r["policy"]): r for r in result}


def test_every_request_was_sent_to_a_ready_replica(rows: dict[str, dict[str, Any]]) -> None:
    for row in rows.values():
        assert row["no_endpoint"] == 0
        assert row["requests"] > 1000


def test_gpu_utilisation_cannot_tell_one_stream_from_sixteen(
    rows: dict[str, dict[str, Any]],
) -> None:
    """Before the step the load never exceeds 2 replicas' capacity; utilisation near 100 %
    scales the fleet to at least three times that during the ramp (and to maxReplicaCount in
    the step), and keeps more replicas than the shipped policy there on average.

    Not its peak against the shipped policy's: utilisation's ramp peak was 7 in five runs of
    five (it reads 100 % throughout, so the scale-up policy all but sets the pace), while
    the shipped policy's is one sync's count that moved from 4 to 6 between runs
    (2026-12-06 to 12-07), so their difference, 1 in four runs in a row, sat at a bound of 1
    with nothing to spare. The mean over the ramp is the claim's robust form, and its ratio
    moves too: 1.43 to 1.66 in five runs (mean 1.54, sd 0.087; utilisation 4.71 to 5.04
    replicas, the shipped policy 3.04 to 3.29), so the bound of 1.3 stood 2.8 sd below it;
    `RAMP_COST` is 3.9 sd below, and still says utilisation pays a fifth more replicas
    through the ramp. (The shipped policy's ramp goodput is reported, not asserted: 100 %
    and 98 % in the full runs, 80 to 95 % in short ones on this shared machine.)"""
    gpu, shipped = rows["gpu-util"], rows["shipped"]
    assert gpu["peak_replicas"] == 8
    ramp_peak = gpu["peak_replicas_by_phase"]["ramp"]
    assert holds("ramp peak: gpu-util", ramp_peak, at_least=3 * 2), (gpu, shipped)
    ratio = gpu["mean_replicas_by_phase"]["ramp"] / shipped["mean_replicas_by_phase"]["ramp"]
    more = holds("ramp mean replicas: gpu-util / shipped", ratio, at_least=RAMP_COST)
    assert more, (gpu, shipped)
