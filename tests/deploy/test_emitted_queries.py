"""What `bench --emit-keda` writes for another system carries hostile names inert.

The ScaledObject's trigger queries name the target in a PromQL string; a name that closed the
string could add to the query (`a"} or vector(1000) or x{y="` made every trigger read 1000).
Each hostile name below goes through the emitted query, the YAML the command writes and back,
and the real promtool: the query must select the one series whose label holds exactly that
name (written in the test's series with JSON's escapes, not the prober's) and nothing else.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from prober.bench.keda import Budgets, kube_name, promql_string, triggers
from tests.support.deploy import ROOT, run

HOSTILE = [
    'a"} or vector(1000) or x{y="',
    "back\\slash",
    'quote"',
    "new\nline",
    "tab\tand\rreturn",
    "\x1b[31mred",
    "ünïcödé/target[0]",
]
BUDGETS = Budgets(
    capacity_level={"concurrency": 4}, capacity_rps=2.0, capacity_in_system=4.0,
    service_seconds=2.0, drain_rps=2.0, slots=4, ttft_floor_p95_seconds=0.1, slo_ttft_seconds=1.0,
    queue_waiting=2, in_system=3, ttft_p95_seconds=1.0, saturation=0.75,
)  # fmt: skip


@pytest.mark.parametrize("name", HOSTILE, ids=range(len(HOSTILE)))
def test_a_hostile_target_name_selects_only_its_own_series(
    name: str, promtool: Path, tmp_path: Path
) -> None:
    queries = [t["metadata"]["query"] for t in triggers(BUDGETS, name)]
    # Through the YAML the command writes, and back.
    queries = yaml.safe_load(yaml.safe_dump(queries))
    rules = {"groups": [{"name": "emitted", "rules": [
        {"record": f"emitted_{i}", "expr": q} for i, q in enumerate(queries)
    ]}]}  # fmt: skip
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    label = json.dumps(name)  # an escaper that is not the one under test
    series = [
        {"series": f"llmprober:queue_waiting:sum{{target={label}}}", "values": "3"},
        {"series": 'llmprober:queue_waiting:sum{target="other"}', "values": "1000"},
        {"series": f"llmprober:ttft_seconds:p95_5m{{target={label}}}", "values": "0.25"},
        {"series": 'llmprober:ttft_seconds:p95_5m{target="other"}', "values": "9"},
        {"series": f"llmprober:requests_in_system:sum{{target={label}}}", "values": "5"},
        {"series": 'llmprober:requests_in_system:sum{target="other"}', "values": "1000"},
    ]
    expected = [3, 0.25, 5]
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": series,
            "promql_expr_test": [
                {"expr": f"emitted_{i}", "eval_time": "0m",
                 "exp_samples": [{"labels": f"emitted_{i}", "value": v}]}
                for i, v in enumerate(expected)
            ],
        }],
    }  # fmt: skip
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests))
    out = run([promtool, "test", "rules", tmp_path / "tests.yml"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_promql_string_escapes_what_ends_a_literal() -> None:
    assert promql_string('a"b') == '"a\\"b"'
    assert promql_string("a\\b") == '"a\\\\b"'
    assert promql_string("a\nb\x1b") == '"a\\nb\\x1b"'
    assert promql_string("plain-name_1") == '"plain-name_1"'


@pytest.mark.parametrize("name", ["vllm", "a", "my-model-7b", "x" * 63])
def test_kubernetes_names_pass(name: str) -> None:
    assert kube_name(name) == name


@pytest.mark.parametrize("name", [*HOSTILE, "", "-lead", "trail-", "Upper", "x" * 64, "a.b"])
def test_other_names_are_refused_in_one_line(name: str) -> None:
    with pytest.raises(ValueError, match="must be a Kubernetes name") as info:
        kube_name(name)
    assert "\n" not in str(info.value)
    assert "\x1b" not in str(info.value)


def test_bench_refuses_a_hostile_scale_name_before_it_runs(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "prober.cli", "bench", "--url", "http://127.0.0.1:9/v1",
           "--model", "m", "--emit-keda", str(tmp_path / "keda.yaml"),
           "--scale-name", HOSTILE[0]]  # fmt: skip
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert lines[-1].endswith(f"got {HOSTILE[0]!r}"), out.stderr
    assert "--scale-name" in lines[-1]
    assert not (tmp_path / "keda.yaml").exists()
