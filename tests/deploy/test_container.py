"""Dockerfile (hadolint for real, plus the properties the deployment relies on), .dockerignore
and the compose stack's structure. No Docker engine is needed."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from pathlib import Path
from typing import Any

import yaml

from tests.support.deploy import DEPLOY, ROOT, load_yaml, run

DOCKERFILE = ROOT / "Dockerfile"
COMPOSE_DIR = DEPLOY / "compose"


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n\s*", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage() -> list[tuple[str, str]]:
    steps = instructions(DOCKERFILE.read_text())
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


def test_hadolint_passes(hadolint: Path) -> None:
    out = run([hadolint, "--failure-threshold", "info", DOCKERFILE])
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_flags_a_bad_dockerfile(hadolint: Path, tmp_path: Path) -> None:
    """Control: the linter really runs and fails on the classic mistakes."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install curl\n")
    out = run([hadolint, bad])
    assert out.returncode != 0
    assert "DL3007" in out.stdout


def test_multi_stage_slim_build() -> None:
    steps = instructions(DOCKERFILE.read_text())
    args = dict(a.split("=", 1) for w, a in steps if w == "ARG" and "=" in a)
    froms = [a for w, a in steps if w == "FROM"]
    assert len(froms) >= 2
    for base in froms:
        image = base.split()[0]
        assert args.get(image.strip("${}"), image) == "python:3.12-slim", base


def test_runtime_stage_contract() -> None:
    stage = final_stage()
    words = dict(stage)
    user = words["USER"].split(":")[0]
    assert user.isdigit(), "numeric USER lets Kubernetes verify runAsNonRoot"
    assert int(user) > 0
    assert words["EXPOSE"] == "9470"
    assert json.loads(words["ENTRYPOINT"]) == ["llm-prober"]
    assert json.loads(words["CMD"]) == ["run", "--config", "/etc/llm-prober/config.yml"]
    health = words["HEALTHCHECK"]
    assert "/-/healthy" in health
    assert "curl" not in health
    assert "wget" not in health
    assert json.loads(health[health.index("CMD") + 3 :])[0] == "python"
    # Read-only root fs: nothing may need to write bytecode at run time.
    assert "PYTHONDONTWRITEBYTECODE=1" in words["ENV"]
    assert not any(w == "RUN" and "pip" in a for w, a in stage), "pip in the runtime stage"


def test_copied_sources_exist_and_pass_dockerignore() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["llm-prober"] == "prober.cli:main"
    patterns = [
        p for p in (ROOT / ".dockerignore").read_text().splitlines() if p and not p.startswith("#")
    ]
    copied = []
    for word, args in instructions(DOCKERFILE.read_text()):
        if word == "COPY" and "--from" not in args:
            copied += args.split()[:-1]
    assert "pyproject.toml" in copied
    assert "prober" in copied
    readme = project.get("readme", "README.md")
    assert any(fnmatch.fnmatch(readme, s) for s in copied), "setuptools reads the readme"
    assert included(readme, patterns), "the readme is excluded by .dockerignore"
    for source in copied:
        if "*" in source:  # optional by design: a glob may match nothing
            continue
        assert (ROOT / source).exists(), f"COPY {source}: missing in the repository"
        assert included(source, patterns), f"COPY {source}: excluded by .dockerignore"
    for private in (".venv", ".git", "tests", "results"):
        assert not included(private, patterns), f"{private} reaches the build context"


def included(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    keep = True
    for pattern in patterns:
        negate = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, glob) or path.startswith(glob + "/"):
            keep = negate
    return keep


# --- compose ---------------------------------------------------------------------------------
def compose() -> dict[str, Any]:
    data: dict[str, Any] = load_yaml(COMPOSE_DIR / "compose.yml")
    return data


def bind_mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path (relative to the compose file) for bind mounts."""
    mounts = {}
    for volume in service.get("volumes", []):
        host, container = volume.split(":")[:2]
        if host.startswith("."):
            mounts[container] = host
    return mounts


def test_compose_services_images_and_ports() -> None:
    services = compose()["services"]
    assert set(services) == {"sim", "llm-prober", "prometheus", "grafana"}
    for name in ("sim", "llm-prober"):
        build = services[name]["build"]
        assert (COMPOSE_DIR / build["context"] / build["dockerfile"]).resolve() == DOCKERFILE
    assert services["sim"]["command"] == ["sim", "--host", "0.0.0.0", "--port", "8000"]
    assert services["llm-prober"]["command"][0] == "run"
    for name in ("prometheus", "grafana"):
        image = services[name]["image"]
        assert re.fullmatch(r"[a-z/-]+:v?\d+\.\d+\.\d+", image), f"{name}: pin a version"
    ports = {name: [p.split(":")[-1] for p in s.get("ports", [])] for name, s in services.items()}
    assert ports == {
        "sim": ["8000"],
        "llm-prober": ["9470"],
        "prometheus": ["9090"],
        "grafana": ["3000"],
    }
    prober = services["llm-prober"]
    assert prober["read_only"] is True
    assert "ALL" in prober["cap_drop"]


def test_compose_bind_mounts_exist_in_the_repository() -> None:
    services = compose()["services"]
    named = set(compose().get("volumes", {}))
    for name, service in services.items():
        for volume in service.get("volumes", []):
            host = volume.split(":")[0]
            if host.startswith("."):
                assert (COMPOSE_DIR / host).exists(), f"{name}: {host}"
            else:
                assert host in named, f"{name}: undeclared volume {host}"


def test_compose_prober_config_targets_the_simulator() -> None:
    services = compose()["services"]
    mounts = bind_mounts(services["llm-prober"])
    config_path = services["llm-prober"]["command"][-1]
    config = load_yaml(COMPOSE_DIR / mounts[config_path])
    [target] = config["targets"]
    assert target["url"] == "http://sim:8000/v1"
    assert target["metrics_url"] == "http://sim:8000/metrics"
    assert config["server"]["listen"].endswith(":9470")


def test_compose_prometheus_scrapes_the_prober_with_the_rules() -> None:
    services = compose()["services"]
    mounts = bind_mounts(services["prometheus"])
    config_flag = next(
        a for a in services["prometheus"]["command"] if a.startswith("--config.file=")
    )
    config_file = Path(config_flag.split("=", 1)[1])
    host_dir = (COMPOSE_DIR / mounts[str(config_file.parent)]).resolve()
    assert host_dir == (DEPLOY / "prometheus").resolve()
    config = yaml.safe_load((host_dir / config_file.name).read_text())
    [job] = [j for j in config["scrape_configs"] if j["job_name"] == "llm-prober"]
    assert job["static_configs"][0]["targets"] == ["llm-prober:9470"]
    assert list(host_dir.glob(config["rule_files"][0]))
