"""Grafana dashboards and provisioning: static checks, plus promtool parsing every panel query
(variables substituted) so that a PromQL typo fails here and not in front of a user."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.deploy import (
    DASHBOARDS_DIR,
    DEPLOY,
    EXPORTED_SERIES,
    GRAFANA_DIR,
    VLLM_SERIES,
    metric_names,
    recorded_names,
    recording_rules,
    run,
    substitute,
    vllm_names,
)

DASHBOARD_FILES = sorted(DASHBOARDS_DIR.glob("*.json"))
DS_REF = {"type": "prometheus", "uid": "${datasource}"}


def load(path: Path) -> dict[str, Any]:
    dashboard: dict[str, Any] = json.loads(path.read_text())
    return dashboard


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def by_uid(uid: str) -> dict[str, Any]:
    return next(load(p) for p in DASHBOARD_FILES if load(p)["uid"] == uid)


@pytest.fixture(params=DASHBOARD_FILES, ids=[p.name for p in DASHBOARD_FILES])
def dashboard(request: pytest.FixtureRequest) -> dict[str, Any]:
    return load(request.param)


def test_both_dashboards_exist() -> None:
    uids = {load(p)["uid"] for p in DASHBOARD_FILES}
    assert uids == {"llm-prober-overview", "llm-prober-capacity"}


def test_dashboards_are_generated_and_up_to_date() -> None:
    out = run([sys.executable, GRAFANA_DIR / "generate.py", "--check"])
    assert out.returncode == 0, out.stderr


def test_dashboard_is_provisionable(dashboard: dict[str, Any]) -> None:
    assert "__inputs" not in dashboard
    assert "__requires" not in dashboard
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dashboard["uid"])
    assert dashboard["title"]
    assert dashboard["schemaVersion"] >= 39
    assert dashboard.get("id") is None


def test_datasource_and_label_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    ds = variables["datasource"]
    assert ds["type"] == "datasource"
    assert ds["query"] == "prometheus"
    for name in ("target", "model"):
        var = variables[name]
        assert var["type"] == "query"
        assert var["datasource"] == DS_REF
        query = var["query"]["query"] if isinstance(var["query"], dict) else var["query"]
        assert query.startswith("label_values(llmprober_requests_total")
        assert query.endswith(f", {name})")


def test_every_panel_queries_prometheus_through_the_variable(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in panels(dashboard):
        assert panel["datasource"] == DS_REF, panel["title"]
        assert panel["targets"], panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DS_REF, panel["title"]
            assert target["expr"].strip(), panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_queries_use_only_contract_metrics_and_defined_rules(dashboard: dict[str, Any]) -> None:
    defined = set(recording_rules())
    for panel in panels(dashboard):
        for target in panel["targets"]:
            expr = target["expr"]
            unknown = metric_names(expr) - EXPORTED_SERIES
            assert not unknown, f"{panel['title']}: {unknown}"
            undefined = recorded_names(expr) - defined
            assert not undefined, f"{panel['title']}: {undefined}"
            not_vllms = vllm_names(expr) - VLLM_SERIES
            assert not not_vllms, f"{panel['title']}: {not_vllms}"
            named = metric_names(expr) | recorded_names(expr) | vllm_names(expr)
            assert named, f"{panel['title']}: {expr}"


def test_raw_queries_filter_by_variables_and_rate_interval(dashboard: dict[str, Any]) -> None:
    for panel in panels(dashboard):
        for target in panel["targets"]:
            expr = target["expr"]
            for selector in re.findall(r"llmprober_[a-z0-9_]+\{([^}]*)\}", expr):
                assert 'target=~"$target"' in selector, f"{panel['title']}: {expr}"
            for selector in re.findall(r"vllm:[a-z_]+\{([^}]*)\}", expr):
                assert 'model_name=~"$model"' in selector, f"{panel['title']}: {expr}"
            for window in re.findall(r"\[([^\]]+)\]", expr):
                assert window == "$__rate_interval", f"{panel['title']}: [{window}]"
            if "histogram_quantile" in expr:
                assert "_bucket" in expr, expr
                assert " le)" in expr, expr


def test_latency_panels_quantiles_and_heatmaps() -> None:
    overview = by_uid("llm-prober-overview")
    exprs = " ".join(t["expr"] for p in panels(overview) for t in p["targets"])
    for metric in ("ttft", "ttfo", "tpot", "itl"):
        assert (
            f"histogram_quantile(0.95, sum by (target, model, le) (rate(llmprober_{metric}" in exprs
        ), metric
    heatmaps = [p for p in panels(overview) if p["type"] == "heatmap"]
    assert {
        re.search(r"llmprober_(\w+)_seconds", p["targets"][0]["expr"]).group(1)  # type: ignore[union-attr]
        for p in heatmaps
    } == {"ttft", "ttfo", "tpot", "itl"}
    for panel in heatmaps:
        assert panel["targets"][0]["format"] == "heatmap"
        assert panel["options"]["calculate"] is False
    for slo in (
        "llmprober_slo_ttft_seconds",
        "llmprober_slo_tpot_seconds",
        "llmprober_slo_e2e_seconds",
    ):
        assert slo in exprs
    for needed in (
        "llmprober_requests_good_total",
        "llmprober_queue_depth{",
        "source",
        "llmprober_dispatch_lag_seconds",
        "llmprober_load_dropped_total",
        "llmprober_tokens_total",
        "sum by (outcome)",
    ):
        assert needed in exprs, needed


def test_capacity_thresholds_are_the_autoscaler_thresholds() -> None:
    keda = yaml.safe_load(
        (DEPLOY / "kubernetes" / "autoscale-keda" / "keda-scaledobject.yaml").read_text()
    )
    thresholds = {t["name"]: float(t["metadata"]["threshold"]) for t in keda["spec"]["triggers"]}
    capacity = by_uid("llm-prober-capacity")
    drawn = {}
    for panel in panels(capacity):
        steps = panel["fieldConfig"]["defaults"].get("thresholds", {}).get("steps", [])
        values = [s["value"] for s in steps if s["value"] is not None]
        match = re.search(r"\(trigger ([a-z0-9-]+)\)", panel["title"])
        if match:
            assert values, panel["title"]
            drawn[match.group(1)] = values[0]
    assert drawn == thresholds
    signals = " ".join(t["expr"] for p in panels(capacity) for t in p["targets"])
    for trigger in keda["spec"]["triggers"]:
        [rule] = recorded_names(trigger["metadata"]["query"])
        assert rule in signals, f"Capacity does not show {rule}"


def test_every_query_parses_with_promtool(promtool: Path, tmp_path: Path) -> None:
    """promtool check rules parses each query (variables substituted) as a recording rule."""
    rules: list[dict[str, str]] = []
    for path in DASHBOARD_FILES:
        for panel in panels(load(path)):
            for target in panel["targets"]:
                rules.append(
                    {"record": f"dashboard:query:{len(rules)}", "expr": substitute(target["expr"])}
                )
    for path in DASHBOARD_FILES:
        for var in load(path)["templating"]["list"]:
            if var["type"] == "query":
                query = var["query"]["query"]
                inner = re.fullmatch(r"label_values\((.*), \w+\)", query)
                assert inner, query
                rules.append(
                    {
                        "record": f"dashboard:variable:{len(rules)}",
                        "expr": substitute(inner.group(1)),
                    }
                )
    file = tmp_path / "dashboard-queries.yml"
    file.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    out = run([promtool, "check", "rules", file])
    assert out.returncode == 0, out.stdout + out.stderr


def test_promtool_parse_catches_a_broken_query(promtool: Path, tmp_path: Path) -> None:
    """Control for the test above."""
    file = tmp_path / "bad.yml"
    file.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "x",
                        "rules": [
                            {
                                "record": "x:y:z",
                                "expr": "sum by (target (rate(llmprober_requests_total[1m]))",
                            }
                        ],
                    }
                ]
            }
        )
    )
    assert run([promtool, "check", "rules", file]).returncode != 0


def test_provisioning_matches_compose_mounts() -> None:
    datasources = yaml.safe_load(
        (GRAFANA_DIR / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    [ds] = datasources["datasources"]
    assert ds["type"] == "prometheus"
    assert ds["url"] == "http://prometheus:9090"
    providers = yaml.safe_load(
        (GRAFANA_DIR / "provisioning" / "dashboards" / "llm-prober.yml").read_text()
    )
    [provider] = providers["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load((DEPLOY / "compose" / "compose.yml").read_text())
    mounts = {m.split(":")[1]: m.split(":")[0] for m in compose["services"]["grafana"]["volumes"]}
    source = mounts[provider["options"]["path"]]
    assert (DEPLOY / "compose" / source).resolve() == DASHBOARDS_DIR.resolve()
    assert (DEPLOY / "compose" / mounts["/etc/grafana/provisioning"]).resolve() == (
        GRAFANA_DIR / "provisioning"
    ).resolve()
