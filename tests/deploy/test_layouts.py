"""Every layout under deploy/kubernetes is complete on its own, as the real kustomize renders it.

Each rendered layout defines, in its own PrometheusRule, every recording rule that its
autoscaler (KEDA ScaledObject, or HPA through prometheus-adapter) and the dashboards read;
places every object in a namespace beside what it scales; and, run through promtool with the
series two sidecars of a busy engine export, each autoscaler query reads a live value through
the layout's own rules, not its `or vector(0)` fallback. The controls run the same checks on
a copy of the layouts with the rules left out (the sidecar layout as it once shipped) and on
objects broken by hand, so each check is shown to fail.
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.kustomize import (
    Query,
    autoscaler_queries,
    kubectl_path,
    kustomize_files,
    layouts,
    misplaced_objects,
    missing_rules,
    of_kind,
    probed_targets,
    render,
    rule_groups,
)
from tests.support.deploy import K8S_DIR, load_yaml_docs, missing_tool, run

LAYOUTS = layouts()
SCALING = ("autoscale-hpa", "autoscale-keda")
AUTOSCALER_KINDS = ("ScaledObject", "HorizontalPodAutoscaler")
Rendered = dict[str, list[dict[str, Any]]]  # layout -> its objects


@pytest.fixture(scope="module")
def kubectl() -> Path:
    tool = kubectl_path()
    if tool is None or not tool.exists():
        missing_tool("kubectl not found: set KUBECTL or run scripts/setup-kustomize.sh")
    assert tool is not None
    return tool


@pytest.fixture(scope="module")
def rendered(kubectl: Path) -> Rendered:
    return {layout: render(kubectl, K8S_DIR / layout) for layout in LAYOUTS}


# --- promtool: the autoscaler queries through the layout's own rules ---------------------------
def busy_sidecar_series(targets: set[str]) -> list[dict[str, str]]:
    """What the sidecars of two engine pods export for each target over 15 minutes: 3 and 5
    requests waiting beside 32 running, and TTFTs mostly 1-2.5 s."""
    series = []
    for target in sorted(targets):
        for pod, waiting in (("s0", 3), ("s1", 5)):
            base = f'job="llm-prober",instance="{pod}:9470",target="{target}",model="m"'
            series += [
                {"series": f'llmprober_queue_depth{{{base},source="server",state="waiting"}}',
                 "values": f"{waiting}x15"},
                {"series": f'llmprober_queue_depth{{{base},source="server",state="running"}}',
                 "values": "32x15"},
            ]  # fmt: skip
            for le, per_minute in (("0.5", 0), ("1", 1), ("2.5", 5), ("+Inf", 6)):
                series.append(
                    {"series": f'llmprober_ttft_seconds_bucket{{{base},mode="probe",le="{le}"}}',
                     "values": f"0+{per_minute}x15"}
                )  # fmt: skip
    return series


def evaluate(
    promtool: Path, docs: list[dict[str, Any]], queries: list[Query], tmp: Path
) -> tuple[int, str]:
    """promtool's verdict on: every query, at minute 10 of busy sidecars, is above 0 through
    the rules of `docs` (none if the layout has none)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "rules.yml").write_text(yaml.safe_dump({"groups": rule_groups(docs)}))
    tests = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": busy_sidecar_series(probed_targets(docs)),
            "promql_expr_test": [
                {"expr": f"count(({q.expr}) > 0) > bool 0", "eval_time": "10m",
                 "exp_samples": [{"labels": "{}", "value": 1}]}
                for q in queries
            ],
        }],
    }  # fmt: skip
    (tmp / "test.yml").write_text(yaml.safe_dump(tests, width=1_000_000))
    out = run([promtool, "test", "rules", tmp / "test.yml"])
    return out.returncode, out.stdout + out.stderr


# --- the shipped layouts ------------------------------------------------------------------------
def test_layouts_are_found() -> None:
    assert {"sidecar", "standalone", "sharded", *SCALING} <= set(LAYOUTS)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_kustomize_builds_the_layout(rendered: Rendered, layout: str) -> None:
    built = {(d["kind"], d["metadata"]["name"]) for d in rendered[layout]}
    expected = {
        (d["kind"], d["metadata"]["name"])
        for path in kustomize_files(K8S_DIR / layout)
        for d in load_yaml_docs(path)
    }
    assert built == expected


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_defines_every_rule_it_reads(rendered: Rendered, layout: str) -> None:
    assert not missing_rules(rendered[layout])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_layout_places_every_object(rendered: Rendered, layout: str) -> None:
    assert not misplaced_objects(rendered[layout])


def test_only_the_autoscale_layouts_scale_and_each_with_one_autoscaler(
    rendered: Rendered,
) -> None:
    scalers = {
        layout: [d["kind"] for kind in AUTOSCALER_KINDS for d in of_kind(docs, kind)]
        for layout, docs in rendered.items()
    }
    assert {layout: kinds for layout, kinds in scalers.items() if kinds} == {
        "autoscale-keda": ["ScaledObject"],
        "autoscale-hpa": ["HorizontalPodAutoscaler"],
    }
    for layout in SCALING:
        queries, unserved = autoscaler_queries(rendered[layout])
        assert queries, layout
        assert not unserved, unserved


@pytest.mark.prometheus
@pytest.mark.parametrize("layout", SCALING)
def test_autoscaler_queries_read_live_values_through_the_layouts_rules(
    rendered: Rendered, promtool: Path, tmp_path: Path, layout: str
) -> None:
    docs = rendered[layout]
    queries, _ = autoscaler_queries(docs)
    code, output = evaluate(promtool, docs, queries, tmp_path)
    assert code == 0, output


# --- controls: each check fails where it should --------------------------------------------------
def without_rules(tmp_path: Path) -> Path:
    """A copy of deploy/kubernetes whose sidecar layout leaves ../prometheus-rule out, as it
    did when `kubectl apply -k sidecar` shipped a ScaledObject that never scaled."""
    copied = tmp_path / "kubernetes"
    shutil.copytree(K8S_DIR, copied)
    kustomization = copied / "sidecar" / "kustomization.yaml"
    text = kustomization.read_text()
    assert "  - ../prometheus-rule\n" in text
    kustomization.write_text(text.replace("  - ../prometheus-rule\n", ""))
    return copied


@pytest.mark.prometheus
def test_checks_catch_an_autoscaler_without_its_rules(
    kubectl: Path, promtool: Path, tmp_path: Path
) -> None:
    copied = without_rules(tmp_path)
    for layout in SCALING:
        docs = render(kubectl, copied / layout)
        problems = missing_rules(docs)
        for rule in ("queue_waiting:sum", "ttft_seconds:p95_5m", "requests_in_system:sum"):
            assert any(f"llmprober:{rule}," in p for p in problems), (layout, rule, problems)
        # The queries still parse and answer, 0 (`or vector(0)`) or nothing: promtool names
        # every one of them as failed.
        queries, _ = autoscaler_queries(docs)
        code, output = evaluate(promtool, docs, queries, tmp_path / layout)
        assert code != 0, output
        failed = output.split("FAILED:", 1)[1]
        for query in queries:
            assert query.expr.replace('"', '\\"') in failed, (query, output)


def test_checks_catch_dashboards_without_their_rules(
    rendered: Rendered,
) -> None:
    docs = [d for d in rendered["standalone"] if d["kind"] != "PrometheusRule"]
    assert any(p.startswith("dashboard ") for p in missing_rules(docs))


def test_checks_catch_a_misspelt_rule_name(rendered: Rendered) -> None:
    docs = copy.deepcopy(rendered["autoscale-keda"])
    [scaled] = of_kind(docs, "ScaledObject")
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    scaled["spec"]["triggers"][0]["metadata"]["query"] = query.replace(
        "llmprober:queue_waiting:sum", "llmprober:queue_waiting_sum"
    )
    assert [p for p in missing_rules(docs) if "llmprober:queue_waiting_sum," in p]


def test_checks_catch_misplaced_objects(rendered: Rendered) -> None:
    docs = copy.deepcopy(rendered["autoscale-hpa"])
    [hpa] = of_kind(docs, "HorizontalPodAutoscaler")
    del hpa["metadata"]["namespace"]
    problems = misplaced_objects(docs)
    assert "HorizontalPodAutoscaler vllm has no namespace" in problems
    assert any("not a Deployment beside it" in p for p in problems)
    docs = copy.deepcopy(rendered["autoscale-keda"])
    [deployment] = of_kind(docs, "Deployment")
    deployment["spec"]["replicas"] = 1
    assert any("sets replicas" in p for p in misplaced_objects(docs))
    example = load_yaml_docs(K8S_DIR / "api-key-secret" / "secret.example.yaml")
    problems = misplaced_objects([*copy.deepcopy(rendered["sidecar"]), *example])
    assert "Secret llm-api-key would overwrite the one created out of band" in problems
