"""Helpers for the deployment-artifact tests: paths, the metric contract (docs/design.md §5), YAML
loading and the lookup of external tools (promtool/prometheus, hadolint, kubernetes-validate).

A missing tool skips its tests on a developer machine and fails them when `CI` is set, so
that CI can never pass by not running a check.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from prober.metric_specs import SPECS, Kind, names
from tests.support.net import wait_http

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
RULES_DIR = DEPLOY / "prometheus" / "rules"
PROM_TESTS_DIR = DEPLOY / "prometheus" / "tests"
K8S_DIR = DEPLOY / "kubernetes"
GRAFANA_DIR = ROOT / "grafana"
DASHBOARDS_DIR = GRAFANA_DIR / "dashboards"
SCHEMAS_DIR = ROOT / "tests" / "deploy" / "schemas"

# --- the metric contract (docs/design.md §5, binding): prober/metric_specs.py's table -----
HISTOGRAMS = names(Kind.HISTOGRAM)
COUNTERS = names(Kind.COUNTER)
GAUGES = names(Kind.GAUGE)
EXPORTED_SERIES = frozenset(series for spec in SPECS for series in spec.series)
OUTCOMES = {
    "ok",
    "timeout_connect",
    "timeout_first_token",
    "timeout_total",
    "stalled",
    "connect_error",
    "http_429",
    "http_4xx",
    "http_5xx",
    "protocol_error",
    "cancelled",
}

METRIC_RE = re.compile(r"\bllmprober_[a-z0-9_]+\b")
RECORDED_RE = re.compile(r"\bllmprober:[a-z0-9_]+:[a-z0-9_]+\b")


# --- files -----------------------------------------------------------------------------------
def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load_yaml_docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def rule_groups() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in sorted(RULES_DIR.glob("*.yml")):
        groups.extend(load_yaml(path)["groups"])
    return groups


def all_rules() -> list[dict[str, Any]]:
    return [rule for group in rule_groups() for rule in group["rules"]]


def recording_rules() -> dict[str, str]:
    return {r["record"]: r["expr"] for r in all_rules() if "record" in r}


def alert_rules() -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for r in all_rules() if "alert" in r}


def k8s_manifest_files() -> list[Path]:
    """Every Kubernetes manifest (kustomizations are build inputs, not resources)."""
    return sorted(p for p in K8S_DIR.rglob("*.yaml") if p.name != "kustomization.yaml")


def k8s_objects() -> Iterator[tuple[Path, dict[str, Any]]]:
    for path in k8s_manifest_files():
        for doc in load_yaml_docs(path):
            yield path, doc


# vLLM's own series a dashboard may name: those of the real capture, so a panel never asks for
# a name vLLM does not export (histograms by their sample names).
VLLM_RE = re.compile(r"\bvllm:[a-z_]+")
VLLM_SERIES = frozenset(
    VLLM_RE.findall((ROOT / "tests" / "fixtures" / "metrics" / "vllm.txt").read_text())
)


def vllm_names(expr: str) -> set[str]:
    return set(VLLM_RE.findall(expr))


def metric_names(expr: str) -> set[str]:
    return set(METRIC_RE.findall(expr))


def recorded_names(expr: str) -> set[str]:
    return set(RECORDED_RE.findall(expr))


# --- tools -----------------------------------------------------------------------------------
def missing_tool(reason: str) -> None:
    """Fail under CI (a check must not silently vanish), skip elsewhere."""
    if os.environ.get("CI"):
        pytest.fail(f"required tool missing in CI: {reason}")
    pytest.skip(reason)


def run(
    cmd: list[str | Path], timeout: float = 120, **kwargs: Any
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
        **kwargs,
    )


def venv_tool(name: str) -> Path | None:
    local = Path(sys.executable).parent / name
    if local.exists():
        return local
    found = shutil.which(name)
    return Path(found) if found else None


def set_up_path(variable: str, script: str) -> Path | None:
    """The path in `variable`, else the one the set-up `script` (scripts/NAME) prints as
    `VARIABLE=PATH` on a line of its own (it installs the tool first where it is missing)."""
    env = os.environ.get(variable)
    if env:
        return Path(env)
    path = ROOT / "scripts" / script
    if not path.exists():
        return None
    try:
        out = run(["bash", path], timeout=300)
    except subprocess.TimeoutExpired:
        return None
    for line in reversed(out.stdout.splitlines()):
        if line.startswith(f"{variable}="):
            return Path(line.split("=", 1)[1].strip())
    return None


def prometheus_bin_dir() -> Path | None:
    return set_up_path("PROMETHEUS_BIN", "setup-prometheus.sh")


def dashboard_exprs(name: str) -> list[str]:
    """Every panel query of a dashboard in grafana/dashboards/."""
    dashboard = json.loads((DASHBOARDS_DIR / name).read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


# --- dashboard queries as Prometheus runs them: Grafana's variables substituted ------------
def substitute(expr: str, *, interval: str = "15s", range_: str = "1h") -> str:
    """`expr` with Grafana's variables replaced: every target, model, mode and group; `interval` for
    `$__interval`, `range_` for `$__range` (a live test scrapes every second over minutes)."""
    values = {
        "${datasource}": "prometheus", "$__rate_interval": "1m", "$__interval": interval,
        "$__range": range_, "$target": ".*", "$model": ".*", "$mode": ".*", "$group": ".*",
    }  # fmt: skip
    for var, value in values.items():
        expr = expr.replace(var, value)
    return expr


# The live stack: a real Prometheus scraping a daemon (tests/deploy/test_dashboards_live*.py).

LIVE_WARMUP_SECONDS = 40
LIVE_DEADLINE_SECONDS = 150
_LIVE_WINDOWS = {"interval": "1s", "range_": "5m"}


def dashboard_queries() -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and query variable of every dashboard, its
    `$__rate_interval` and `$__range` as a stack scraping every second for minutes has them."""
    queries = []
    for path in sorted(DASHBOARDS_DIR.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                where = f"{path.name} / {panel['title']} / {target['refId']}"
                queries.append((where, substitute(target["expr"], **_LIVE_WINDOWS)))
        for var in dashboard["templating"]["list"]:
            if var["type"] == "query":
                inner = var["query"]["query"].removeprefix("label_values(").rsplit(",", 1)[0]
                where = f"{path.name} / variable {var['name']}"
                queries.append((where, substitute(inner, **_LIVE_WINDOWS)))
    return queries


class Prometheus:
    """A running Prometheus's query API."""

    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, expr: str) -> list[dict[str, Any]]:
        qs = urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{qs}", timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


def start(cmd: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def start_prometheus(prometheus_bin: Path, tmp: Path, port: int) -> subprocess.Popen[bytes]:
    """Prometheus on `tmp/prometheus.yml`, its data and log in `tmp`; returns once ready
    (stopped again if it never is)."""
    cmd = [
        str(prometheus_bin / "prometheus"),
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tmp / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = start(cmd, tmp / "prometheus.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=30)
    except BaseException:
        stop([proc])
        raise
    return proc


def empty_until_deadline(prom: Prometheus, queries: list[tuple[str, str]]) -> list[str]:
    """Queries still empty at the deadline (slow rules get time, failures fail fast)."""
    pending = list(queries)
    deadline = time.monotonic() + LIVE_DEADLINE_SECONDS - LIVE_WARMUP_SECONDS
    while True:
        pending = [(where, expr) for where, expr in pending if not prom.query(expr)]
        if not pending or time.monotonic() > deadline:
            return [f"{where}: {expr}" for where, expr in pending]
        time.sleep(2)


@contextmanager
def live_stack(
    prometheus_bin: Path,
    tmp: Path,
    daemon: dict[str, Any],
    prometheus: dict[str, Any],
    prometheus_port: int,
    engines: Sequence[tuple[list[str], str]] = (),
) -> Iterator[Prometheus]:
    """`engines` (command, a URL that answers once it is up), the daemon on the settings
    `daemon` and Prometheus on the configuration `prometheus`, each a process of its own
    with its log in `tmp`; yields Prometheus after `LIVE_WARMUP_SECONDS` of scraping, and
    stops them all."""
    (tmp / "prober.yml").write_text(yaml.safe_dump(daemon))
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(prometheus))
    listen = daemon["server"]["listen"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, (cmd, ready) in enumerate(engines):
            procs.append(start(cmd, tmp / f"engine-{i}.log"))
            wait_http(ready, timeout=30)
        cmd = [sys.executable, "-m", "prober.cli", "run", "--config", str(tmp / "prober.yml")]
        procs.append(start(cmd, tmp / "daemon.log"))
        wait_http(f"http://{listen}/-/healthy", timeout=30)
        procs.append(start_prometheus(prometheus_bin, tmp, prometheus_port))
        time.sleep(LIVE_WARMUP_SECONDS)
        yield Prometheus(f"http://127.0.0.1:{prometheus_port}")
    finally:
        stop(procs)


def rules_without_series(prom: Prometheus) -> list[str]:
    """The shipped recording rules that still have no series at the deadline."""
    return empty_until_deadline(prom, [(name, name) for name in recording_rules()])
