"""docs/deploy.md's commands work on the shipped layouts: its overlay renders with the real
kustomize and changes what it says, its prometheus-adapter values command produces the
layout's rules, and the names its commands use are the layouts' names."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.kustomize import (
    adapter_rules,
    kubectl_path,
    layouts,
    misplaced_objects,
    missing_rules,
    of_kind,
    render,
)
from tests.support.deploy import (
    EXPORTED_SERIES,
    K8S_DIR,
    ROOT,
    alert_rules,
    load_yaml_docs,
    metric_names,
    missing_tool,
    recording_rules,
)

GUIDE = ROOT / "docs" / "deploy.md"
OVERLAY_HEAD = "# overlays/llm/kustomization.yaml\n"
ADAPTER_FILE = "prometheus-adapter-config.yaml"


@pytest.fixture(scope="module")
def kubectl() -> Path:
    tool = kubectl_path()
    if tool is None or not tool.exists():
        missing_tool("kubectl not found: set KUBECTL or run scripts/setup-kustomize.sh")
    assert tool is not None
    return tool


def guide() -> str:
    return GUIDE.read_text()


def overlay_text() -> str:
    blocks: list[str] = re.findall(r"```yaml\n(.*?)```", guide(), re.S)
    [block] = [b for b in blocks if b.startswith(OVERLAY_HEAD)]
    return block


def containers(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        c
        for d in docs
        if d["kind"] in {"Deployment", "StatefulSet"}
        for c in d["spec"]["template"]["spec"]["containers"]
    ]


def test_the_guide_names_every_layout_and_only_layouts() -> None:
    text = guide()
    for layout in layouts():
        assert f"| `{layout}` |" in text, layout
    for named in re.findall(r"deploy/kubernetes/([a-z-]+)", text):
        assert (K8S_DIR / named).is_dir(), named


def test_the_guide_names_only_series_rules_and_alerts_that_exist() -> None:
    text = guide()
    rules = set(re.findall(r"\bllmprober:[a-z0-9_]+:[a-z0-9_]+", text))
    assert rules, "the guide names no recording rule"
    assert rules <= set(recording_rules()), rules - set(recording_rules())
    # and the External metric names prometheus-adapter serves the HPA
    served = set(adapter_rules(load_yaml_docs(K8S_DIR / "autoscale-hpa" / ADAPTER_FILE)))
    unknown = metric_names(text) - EXPORTED_SERIES - served
    assert not unknown, unknown
    for alert in re.findall(r"\bLLMProber[A-Za-z]+\b", text):
        assert alert in alert_rules(), alert


def test_the_guides_overlay_renders_and_changes_the_image_and_the_label(
    kubectl: Path, tmp_path: Path
) -> None:
    shutil.copytree(K8S_DIR, tmp_path / "deploy" / "kubernetes")
    overlay = tmp_path / "overlays" / "llm"
    overlay.mkdir(parents=True)
    (overlay / "kustomization.yaml").write_text(overlay_text())
    docs = render(kubectl, overlay)
    probers = [c for c in containers(docs) if "llm-prober" in c["image"]]
    assert probers
    assert {c["image"] for c in probers} == {"registry.example.com/platform/llm-prober:0.1.0"}
    selected = of_kind(docs, "PrometheusRule") + of_kind(docs, "ServiceMonitor")
    assert len(selected) == 2
    assert {d["metadata"]["labels"]["release"] for d in selected} == {"prometheus"}
    assert not missing_rules(docs)
    assert not misplaced_objects(docs)
    assert of_kind(docs, "ScaledObject")


def test_the_guides_rule_deletion_patch_removes_only_the_rule(
    kubectl: Path, tmp_path: Path
) -> None:
    """For a second layout in one cluster: the overlay plus the guide's `$patch: delete`."""
    [extra] = [b for b in re.findall(r"```yaml\n(.*?)```", guide(), re.S) if "$patch: delete" in b]
    assert overlay_text().rstrip().splitlines()[-1].startswith("        value:")  # patches last
    shutil.copytree(K8S_DIR, tmp_path / "deploy" / "kubernetes")
    overlay = tmp_path / "overlays" / "llm"
    overlay.mkdir(parents=True)
    (overlay / "kustomization.yaml").write_text(overlay_text() + extra)
    docs = render(kubectl, overlay)
    assert not of_kind(docs, "PrometheusRule")
    assert of_kind(docs, "ScaledObject")
    assert of_kind(docs, "ServiceMonitor")


def test_the_guides_adapter_values_command_gives_the_layouts_rules(kubectl: Path) -> None:
    command = re.search(r"python3 -c '\n(.*?)' > adapter-values.yaml", guide(), re.S)
    assert command, "the adapter values command is gone from docs/deploy.md"
    rendered = subprocess.run(
        [str(kubectl), "kustomize", str(K8S_DIR / "autoscale-hpa")],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-c", command.group(1)],
        input=rendered.stdout, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    values = yaml.safe_load(out.stdout)
    docs = [d for d in yaml.safe_load_all(rendered.stdout) if d]
    assert values["rules"]["external"] == list(adapter_rules(docs).values())
    assert len(values["rules"]["external"]) == 3


def test_the_guides_sidecar_commands_name_the_sidecar_layout(kubectl: Path) -> None:
    """Step 8 restarts a container by name, in pods chosen by label, reading the mounted
    configuration by path: each must be what the sidecar layout renders."""
    docs = render(kubectl, K8S_DIR / "sidecar")
    [deployment] = of_kind(docs, "Deployment")
    namespace = deployment["metadata"]["namespace"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    [prober] = [c for c in containers(docs) if "llm-prober" in c["image"]]
    [mount] = [m for m in prober["volumeMounts"] if m["mountPath"] == "/etc/llm-prober"]
    text = guide()
    assert f"--namespace {namespace} deployment/{deployment['metadata']['name']}" in text
    assert f"-c {prober['name']} -- llm-prober check-config" in text
    assert f"{mount['mountPath']}/config.yml" in text
    assert prober["args"][-1] == f"{mount['mountPath']}/config.yml"
    [selector] = re.findall(r"-l (app\.kubernetes\.io/name=[a-z-]+) -o name", text)
    key, value = selector.split("=")
    assert labels[key] == value
