"""Kubernetes manifests: built-in kinds through kubernetes-validate --strict, custom resources
(ServiceMonitor, PrometheusRule, ScaledObject) through their CRD schemas with jsonschema, and
the cross-file contract (rules, autoscaling thresholds, security, secrets, sharding)."""

from __future__ import annotations

import copy
import os
import re
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.deploy.kustomize import FRAGMENTS, kustomize_files, layouts
from tests.support.deploy import (
    K8S_DIR,
    ROOT,
    SCHEMAS_DIR,
    k8s_manifest_files,
    k8s_objects,
    load_yaml,
    load_yaml_docs,
    recorded_names,
    recording_rules,
    rule_groups,
    run,
)

# Oldest version the manifests target (apps.kubernetes.io/pod-index is GA since 1.32) and
# the newest that kubernetes-validate ships (its --help names the default).
OLDEST_K8S = "1.32.0"
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.monitoring.coreos.com_v1.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.monitoring.coreos.com_v1.yaml",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.keda.sh_v1alpha1.yaml",
}
PROBER_IMAGE = "llm-prober"
KEDA_FILE = K8S_DIR / "autoscale-keda" / "keda-scaledobject.yaml"


def newest_k8s(kubernetes_validate: Path) -> str:
    out = run([kubernetes_validate, "--help"]).stdout
    match = re.search(r"Defaults to\s+(\d+\.\d+\.\d+)", out)
    assert match, out
    return match.group(1)


def objects_of(kind: str) -> list[tuple[Path, dict[str, Any]]]:
    return [(p, o) for p, o in k8s_objects() if o["kind"] == kind]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = obj["spec"]["template"]["spec"]
    return spec


def workloads() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, o) for p, o in k8s_objects() if o["kind"] in {"Deployment", "StatefulSet"}]


def prober_containers() -> list[tuple[Path, dict[str, Any], dict[str, Any]]]:
    found = []
    for path, obj in workloads():
        spec = pod_spec(obj)
        for container in spec["containers"]:
            if PROBER_IMAGE in container["image"]:
                found.append((path, spec, container))
    return found


def configmap_config(name: str) -> dict[str, Any]:
    for _, obj in objects_of("ConfigMap"):
        if obj["metadata"]["name"] == name:
            config: dict[str, Any] = yaml.safe_load(obj["data"]["config.yml"])
            return config
    raise AssertionError(f"no ConfigMap {name}")


def mounted_config(spec: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The prober config a container reads: ConfigMap volume mounted at /etc/llm-prober."""
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/etc/llm-prober")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    return configmap_config(volume["configMap"]["name"])


# --- kubernetes-validate ---------------------------------------------------------------------
def validate(tool: Path, version: str, files: list[Path]) -> tuple[int, str]:
    out = run([tool, "--strict", "-k", version, *files], timeout=300)
    return out.returncode, out.stdout + out.stderr


def test_builtin_kinds_pass_kubernetes_validate_strict(kubernetes_validate: Path) -> None:
    files = k8s_manifest_files()
    assert len(files) >= 10
    for version in (OLDEST_K8S, newest_k8s(kubernetes_validate)):
        code, output = validate(kubernetes_validate, version, files)
        assert code == 0, f"k8s {version}:\n{output}"
        for line in output.splitlines():
            if line.startswith("WARN"):
                # Only our custom resources may lack a built-in schema; they are checked below.
                assert any(f"kind {kind} " in line for _, kind in CUSTOM_KINDS), line
            else:
                assert " passed " in line, line
        builtin = sum(
            1 for _, o in k8s_objects() if (o["apiVersion"], o["kind"]) not in CUSTOM_KINDS
        )
        assert output.count(" passed ") == builtin, output


def test_kubernetes_validate_rejects_a_typo(kubernetes_validate: Path, tmp_path: Path) -> None:
    """Control: strict mode catches an unknown field, so the test above can fail."""
    deployment = copy.deepcopy(objects_of("Deployment")[0][1])
    deployment["spec"]["template"]["spec"]["containers"][0]["readOnlyRootFileSystem"] = True
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(deployment))
    code, output = validate(kubernetes_validate, OLDEST_K8S, [bad])
    assert code != 0, output


# --- custom resources against CRD schemas ----------------------------------------------------
METADATA_SCHEMA = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}


def strict(schema: Any) -> Any:
    """Reject unknown keys wherever the CRD lists properties (the API server would prune them
    silently, hiding a typo)."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(v) for v in schema]
    return schema


def crd_validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    schema = strict(load_yaml(SCHEMAS_DIR / CUSTOM_KINDS[(api_version, kind)])["openAPIV3Schema"])
    schema["properties"]["metadata"] = METADATA_SCHEMA
    schema["required"] = sorted({*schema.get("required", []), "apiVersion", "kind", "metadata"})
    return jsonschema.Draft7Validator(schema)


def custom_resources() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, o) for p, o in k8s_objects() if (o["apiVersion"], o["kind"]) in CUSTOM_KINDS]


def test_every_custom_kind_is_present() -> None:
    kinds = {(o["apiVersion"], o["kind"]) for _, o in custom_resources()}
    assert kinds == set(CUSTOM_KINDS)


@pytest.mark.parametrize(
    ("path", "obj"),
    custom_resources(),
    ids=[f"{p.relative_to(K8S_DIR)}:{o['kind']}" for p, o in custom_resources()],
)
def test_custom_resource_matches_crd_schema(path: Path, obj: dict[str, Any]) -> None:
    validator = crd_validator(obj["apiVersion"], obj["kind"])
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)
    ]
    assert not errors, f"{path}: {errors}"


def test_crd_schemas_reject_typos() -> None:
    """Control: a misspelt field fails each vendored schema."""
    for path, obj in custom_resources():
        bad = copy.deepcopy(obj)
        bad["spec"]["scrapeInterval" if obj["kind"] == "ServiceMonitor" else "pollinginterval"] = 1
        assert not crd_validator(obj["apiVersion"], obj["kind"]).is_valid(bad), path


# --- PrometheusRule embeds the rule files ----------------------------------------------------
def test_prometheusrule_embeds_the_rule_files() -> None:
    [(_, rule)] = objects_of("PrometheusRule")
    assert rule["spec"]["groups"] == rule_groups(), (
        "deploy/kubernetes/prometheus-rule/prometheusrule.yaml is out of date: run "
        "deploy/kubernetes/generate_prometheusrule.py"
    )


def test_prometheusrule_generator_is_up_to_date() -> None:
    out = run([sys.executable, K8S_DIR / "generate_prometheusrule.py", "--check"])
    assert out.returncode == 0, out.stderr


# --- security and secrets --------------------------------------------------------------------
def test_prober_containers_are_locked_down() -> None:
    assert len(prober_containers()) == 4  # standalone, sidecar, sharded, discovery
    for path, spec, container in prober_containers():
        pod_sc = spec.get("securityContext", {})
        sc = {**pod_sc, **container["securityContext"]}
        assert sc["runAsNonRoot"] is True, path
        assert isinstance(sc["runAsUser"], int), path
        assert sc["runAsUser"] > 0, path
        assert sc["readOnlyRootFilesystem"] is True, path
        assert sc["allowPrivilegeEscalation"] is False, path
        assert sc["capabilities"]["drop"] == ["ALL"], path
        assert spec.get("automountServiceAccountToken") is False, path
        assert "memory" in container["resources"]["limits"], path


def test_api_keys_come_from_secrets() -> None:
    for path, spec, container in prober_containers():
        config = mounted_config(spec, container)
        env = {e["name"]: e for e in container.get("env", [])}
        for target in [*config.get("targets", []), *config.get("target_groups", [])]:
            assert "api_key" not in target, f"{path}: literal api_key in config"
            if "api_key_env" in target:
                var = env[target["api_key_env"]]
                assert "secretKeyRef" in var["valueFrom"], f"{path}: {var}"
    secrets = {o["metadata"]["name"] for _, o in objects_of("Secret")}
    for _, obj in workloads():
        for container in pod_spec(obj)["containers"]:
            for var in container.get("env", []):
                ref = var.get("valueFrom", {}).get("secretKeyRef")
                if ref:
                    assert ref["name"] in secrets


# --- layouts ---------------------------------------------------------------------------------
def test_prober_configs_are_well_formed() -> None:
    for path, spec, container in prober_containers():
        config = mounted_config(spec, container)
        assert config["server"]["listen"].endswith(":9470"), path
        port = next(p for p in container["ports"] if p["containerPort"] == 9470)
        assert port["name"], path
        targets, groups = config.get("targets", []), config.get("target_groups", [])
        assert targets or groups, path
        names = [t["name"] for t in targets]
        assert len(names) == len(set(names)), path
        for target in targets:
            assert {"name", "url", "model", "interval_seconds"} <= set(target), path
            assert re.fullmatch(r"https?://.+/v1", target["url"]), target["url"]
        for group in groups:  # a template: {address} in place of the host and port
            assert {"group", "url", "model", "interval_seconds"} <= set(group), path
            assert re.fullmatch(r"https?://\{address\}/v1", group["url"]), group["url"]
        args = container["args"]
        assert args[args.index("--config") + 1] == "/etc/llm-prober/config.yml"


def test_sidecar_probes_its_engine_over_loopback() -> None:
    [(_, deployment)] = [(p, o) for p, o in objects_of("Deployment") if "sidecar" in str(p)]
    spec = pod_spec(deployment)
    engine = next(c for c in spec["containers"] if PROBER_IMAGE not in c["image"])
    prober = next(c for c in spec["containers"] if PROBER_IMAGE in c["image"])
    engine_port = engine["ports"][0]["containerPort"]
    [target] = mounted_config(spec, prober)["targets"]
    assert target["url"] == f"http://127.0.0.1:{engine_port}/v1"
    assert target["metrics_url"] == f"http://127.0.0.1:{engine_port}/metrics"
    # A sidecar readiness probe would pull the engine out of its Service.
    assert "readinessProbe" not in prober
    assert "load" not in target, "background load in a production engine pod"


def test_sharded_statefulset_derives_shard_from_pod_index() -> None:
    [(path, sts)] = objects_of("StatefulSet")
    [container] = pod_spec(sts)["containers"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["LLMPROBER_SHARD__INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert ref == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert int(env["LLMPROBER_SHARD__COUNT"]["value"]) == sts["spec"]["replicas"], path
    assert "shard" not in mounted_config(pod_spec(sts), container), (
        "shard in the shared ConfigMap would be the same for every replica"
    )


def test_services_select_pods_and_monitors_select_services() -> None:
    pod_labels = [
        pod_spec(o) and o["spec"]["template"]["metadata"]["labels"] for _, o in workloads()
    ]
    services = [o for _, o in objects_of("Service")]
    for svc in services:
        selector = svc["spec"]["selector"].items()
        assert any(selector <= labels.items() for labels in pod_labels), svc["metadata"]
    for path, monitor in objects_of("ServiceMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"].items()
        matched = [s for s in services if wanted <= s["metadata"]["labels"].items()]
        assert matched, path
        ports = {p["name"] for s in matched for p in s["spec"]["ports"]}
        for endpoint in monitor["spec"]["endpoints"]:
            assert endpoint["port"] in ports, path
        jobs = [
            r["replacement"]
            for e in monitor["spec"]["endpoints"]
            for r in e.get("relabelings", [])
            if r.get("targetLabel") == "job"
        ]
        assert "llm-prober" in jobs, f"{path}: LLMProberExporterDown matches job=llm-prober"


def test_every_manifest_belongs_to_a_kustomization() -> None:
    folders = [*layouts(), *FRAGMENTS]
    reached = set().union(*(kustomize_files(K8S_DIR / folder) for folder in folders))
    assert {p.resolve() for p in k8s_manifest_files()} == reached


# --- autoscaling contract --------------------------------------------------------------------
def keda_triggers() -> dict[str, dict[str, Any]]:
    [(_, scaled)] = objects_of("ScaledObject")
    return {t["name"]: t for t in scaled["spec"]["triggers"]}


def test_keda_scales_the_sidecar_engine_on_recording_rules() -> None:
    [(_, scaled)] = objects_of("ScaledObject")
    ref = scaled["spec"]["scaleTargetRef"]
    engines = {o["metadata"]["name"] for p, o in objects_of("Deployment") if "sidecar" in str(p)}
    assert ref["kind"] == "Deployment"
    assert ref["name"] in engines
    triggers = keda_triggers()
    assert set(triggers) == {"queue-waiting", "ttft-p95", "in-system"}
    defined = set(recording_rules())
    for name, trigger in triggers.items():
        assert trigger["type"] == "prometheus"
        meta = trigger["metadata"]
        assert float(meta["threshold"]) > 0
        used = recorded_names(meta["query"])
        assert used, f"{name}: query must read a recording rule"
        assert used <= defined, f"{name}: {used - defined}"
        # An empty result or NaN must read as 0, not as a scaler error.
        assert meta["query"].endswith("or vector(0)"), name
    assert "queue_waiting" in triggers["queue-waiting"]["metadata"]["query"]
    assert "ttft_seconds:p95" in triggers["ttft-p95"]["metadata"]["query"]
    assert triggers["ttft-p95"]["metricType"] == "Value"
    assert triggers["queue-waiting"]["metricType"] == "AverageValue"


def test_keda_saturation_option_is_a_valid_trigger_on_a_recording_rule() -> None:
    """The commented saturation trigger, uncommented, is a trigger like the shipped ones."""
    [trigger] = commented_option("saturation")
    assert trigger["name"] == "saturation"
    assert trigger["metricType"] == "Value"
    meta = trigger["metadata"]
    assert recorded_names(meta["query"]) == {"llmprober:saturation:avg"}
    assert "llmprober:saturation:avg" in set(recording_rules())
    assert meta["query"].endswith("or vector(0)")
    assert 0 < float(meta["threshold"]) < 1  # scale out before every slot is busy


def test_keda_slo_ratio_option_scales_before_either_slo_is_missed() -> None:
    """The commented SLO-ratio trigger, uncommented, reads `llmprober:slo_ratio:max` (the
    worse of TTFT p90 and TPOT p90 over their SLOs) with its NaN filtered out, and asks for
    replicas before the ratio reaches 1."""
    [trigger] = commented_option("slo-ratio")
    assert (trigger["name"], trigger["metricType"]) == ("slo-ratio", "Value")
    meta = trigger["metadata"]
    assert recorded_names(meta["query"]) == {"llmprober:slo_ratio:max"}
    assert "llmprober:slo_ratio:max" in set(recording_rules())
    assert ">= 0" in meta["query"]  # NaN (no request in 5m) is no figure
    assert meta["query"].endswith("or vector(0)")
    assert 0 < float(meta["threshold"]) < 1


def adapter_rules() -> dict[str, dict[str, Any]]:
    [(_, cm)] = [
        (p, o)
        for p, o in objects_of("ConfigMap")
        if o["metadata"]["name"] == "llm-prober-adapter-rules"
    ]
    config = yaml.safe_load(cm["data"]["config.yaml"])
    return {r["name"]["as"]: r for r in config["externalRules"]}


def test_hpa_alternative_matches_keda_and_the_adapter() -> None:
    [(_, hpa)] = objects_of("HorizontalPodAutoscaler")
    [(_, scaled)] = objects_of("ScaledObject")
    assert hpa["spec"]["scaleTargetRef"] == scaled["spec"]["scaleTargetRef"]
    assert hpa["spec"]["maxReplicas"] == scaled["spec"]["maxReplicaCount"]
    rules = adapter_rules()
    defined = set(recording_rules())
    thresholds = {}
    for metric in hpa["spec"]["metrics"]:
        assert metric["type"] == "External"
        name = metric["external"]["metric"]["name"]
        rule = rules[name]
        assert rule["resources"] == {"namespaced": False}
        series = recorded_names(rule["seriesQuery"])
        assert series <= defined
        assert series, name
        assert re.fullmatch(rule["name"]["matches"].strip("^$"), series.pop())
        target = metric["external"]["target"]
        thresholds[name] = (target["type"], float(target.get("value") or target["averageValue"]))
    triggers = keda_triggers()
    assert thresholds == {
        "llmprober_queue_waiting_sum": (
            "AverageValue",
            float(triggers["queue-waiting"]["metadata"]["threshold"]),
        ),
        "llmprober_ttft_seconds_p95_5m": (
            "Value",
            float(triggers["ttft-p95"]["metadata"]["threshold"]),
        ),
        "llmprober_requests_in_system_sum": (
            "AverageValue",
            float(triggers["in-system"]["metadata"]["threshold"]),
        ),
    }
    assert (
        hpa["spec"]["behavior"]
        == scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    )


# --- the real daemon, once it exists ---------------------------------------------------------
def shipped_configs(tmp_path: Path) -> list[Path]:
    paths = [ROOT / "deploy" / "compose" / "llm-prober.yml"]
    for _, obj in objects_of("ConfigMap"):
        if "config.yml" in obj["data"]:
            path = tmp_path / f"{obj['metadata']['name']}.yml"
            path.write_text(obj["data"]["config.yml"])
            paths.append(path)
    return paths


def test_shipped_configs_pass_check_config(tmp_path: Path) -> None:
    """Every prober config shipped in deploy/ is accepted by the real daemon's validation."""
    pytest.importorskip("prober.cli", reason="the daemon (prober.cli) does not exist yet")
    env = {**os.environ, "LLM_API_KEY": "not-a-real-key"}  # api_key_env must resolve
    for path in shipped_configs(tmp_path):
        out = run([sys.executable, "-m", "prober.cli", "check-config", path], env=env)
        assert out.returncode == 0, f"{path.name}: {out.stdout}{out.stderr}"


def test_manifest_documents_parse() -> None:
    for path in k8s_manifest_files():
        for doc in load_yaml_docs(path):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), path


def commented_option(name: str) -> list[dict[str, Any]]:
    """The triggers of the ScaledObject's commented `# option: NAME` block, uncommented."""
    text = KEDA_FILE.read_text()
    block = text.split(f"# option: {name}\n", 1)[1].split("# end option\n", 1)[0]
    lines = [line.replace("# ", "", 1) for line in block.splitlines() if line.strip()]
    triggers: list[dict[str, Any]] = yaml.safe_load("\n".join(lines))
    return triggers


def test_keda_keep_alive_option_wakes_a_scaled_to_zero_deployment() -> None:
    """Uncommented with minReplicaCount 0, the keep-alive trigger is a valid ScaledObject
    whose activation reads traffic in front of the engines, not a prober series (with no
    replica there is none)."""
    [trigger] = commented_option("keep-alive")
    meta = trigger["metadata"]
    assert not recorded_names(meta["query"])
    assert "llmprober" not in meta["query"]
    assert meta["query"].endswith("or vector(0)")
    assert meta["activationThreshold"] == "0"
    assert trigger["metricType"] == "AverageValue"
    assert float(meta["threshold"]) == 1  # one replica, never more
    [(_, scaled)] = objects_of("ScaledObject")
    to_zero = copy.deepcopy(scaled)
    to_zero["spec"]["minReplicaCount"] = 0
    to_zero["spec"]["triggers"].append(trigger)
    validator = crd_validator(to_zero["apiVersion"], to_zero["kind"])
    assert not [e.message for e in validator.iter_errors(to_zero)]


def emitted_objects(tmp_path: Path) -> tuple[Path, Path]:
    """`llm-prober bench --emit-keda/--emit-hpa` from a measured report (the emitter's path)."""
    from prober.bench.cli import _emit

    report = {
        "config": {"slo_ttft_seconds": 2.0},
        "levels": [
            {"level": {"concurrency": 1}, "ttft_seconds": {"p95": 0.1}},
            {"level": {"concurrency": 32}, "ttft_seconds": {"p95": 0.9}},
        ],
        "capacity": {"level": {"concurrency": 32}, "request_throughput": 6.4,
                     "mean_e2e_from_send_seconds": 5.0, "mean_service_seconds": 4.8},
    }  # fmt: skip
    keda, hpa = tmp_path / "keda.yaml", tmp_path / "hpa.yaml"
    args = type("Args", (), {"emit_keda": keda, "emit_hpa": hpa, "slots": 32,
                             "scale_name": "vllm"})()  # fmt: skip
    assert _emit(args, report) == 0  # type: ignore[arg-type]
    return keda, hpa


def test_emitted_autoscaling_objects_are_valid(kubernetes_validate: Path, tmp_path: Path) -> None:
    keda, hpa = emitted_objects(tmp_path)
    code, output = validate(kubernetes_validate, OLDEST_K8S, [hpa])
    assert code == 0, output
    assert " passed " in output, output
    scaled = load_yaml(keda)
    validator = crd_validator(scaled["apiVersion"], scaled["kind"])
    assert not [e.message for e in validator.iter_errors(scaled)]
    # the shipped object's trigger names and queries, with the derived thresholds
    [(_, shipped)] = objects_of("ScaledObject")
    ours = {t["name"]: t for t in scaled["spec"]["triggers"]}
    assert set(ours) == set(keda_triggers())
    for name, trigger in keda_triggers().items():
        assert ours[name]["metadata"]["query"] == trigger["metadata"]["query"]
        assert ours[name]["metricType"] == trigger["metricType"]
    behavior = shipped["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] == behavior
    assert load_yaml(hpa)["spec"]["behavior"] == behavior
