"""Prometheus rules, their promtool unit tests and the scrape configuration, checked with the
real promtool."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.deploy import (
    DEPLOY,
    EXPORTED_SERIES,
    PROM_TESTS_DIR,
    ROOT,
    RULES_DIR,
    alert_rules,
    all_rules,
    dashboard_exprs,
    load_yaml,
    metric_names,
    recorded_names,
    recording_rules,
    run,
)

RUNBOOK = ROOT / "docs" / "runbook.md"
RUNBOOK_URL = "https://github.com/llm-prober/llm-prober/blob/main/docs/runbook.md#"
RULE_FILES = sorted(RULES_DIR.glob("*.yml"))
TEST_FILES = sorted(PROM_TESTS_DIR.glob("*.yml"))


def github_anchor(heading: str) -> str:
    """The fragment GitHub generates for a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def test_rule_and_test_files_exist() -> None:
    assert RULE_FILES, "no rule files"
    assert TEST_FILES, "no promtool unit tests"


def test_promtool_check_rules(promtool: Path) -> None:
    out = run([promtool, "check", "rules", *RULE_FILES])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_unit_tests_pass(promtool: Path) -> None:
    out = run([promtool, "test", "rules", *TEST_FILES], timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(TEST_FILES), out.stdout


def test_promtool_unit_tests_catch_a_wrong_expectation(promtool: Path, tmp_path: Path) -> None:
    """Control: the unit tests compare real values, so a wrong expected value fails."""
    source = PROM_TESTS_DIR / "latency.test.yml"
    text = source.read_text().replace("is 7.5s over", "is 9.9s over")
    text = text.replace("../rules/", f"{RULES_DIR}/")
    broken = tmp_path / "broken.test.yml"
    broken.write_text(text)
    out = run([promtool, "test", "rules", broken])
    assert out.returncode != 0
    assert "FAILED" in out.stdout + out.stderr


def test_promtool_check_config(promtool: Path) -> None:
    out = run([promtool, "check", "config", DEPLOY / "prometheus" / "prometheus.yml"])
    assert out.returncode == 0, out.stdout + out.stderr


def test_scrape_config_has_daemon_and_probe_jobs() -> None:
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert jobs["llm-prober"].get("metrics_path", "/metrics") == "/metrics"
    probe = jobs["llm-prober-probe"]
    assert probe["metrics_path"] == "/probe"
    relabels = probe["relabel_configs"]
    assert {"source_labels": ["__address__"], "target_label": "__param_target"} in relabels
    assert any(
        r.get("target_label") == "__address__" and r.get("replacement", "").endswith(":9470")
        for r in relabels
    )
    # A probe is a whole streamed completion: its timeout must fit inside its interval.
    assert probe["scrape_timeout"] < probe["scrape_interval"]


def test_rule_files_loaded_by_scrape_config() -> None:
    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    base = DEPLOY / "prometheus"
    loaded = {p for pattern in config["rule_files"] for p in base.glob(pattern)}
    assert set(RULE_FILES) <= loaded


def test_recording_rule_names_follow_convention() -> None:
    names = [r["record"] for r in all_rules() if "record" in r]
    assert len(names) == len(set(names)), "duplicate recording rule"
    for name in names:
        assert re.fullmatch(r"llmprober:[a-z0-9_]+:[a-z0-9_]+", name), name


def test_rules_reference_only_contract_metrics() -> None:
    defined = set(recording_rules())
    for rule in all_rules():
        expr = rule["expr"]
        unknown = metric_names(expr) - EXPORTED_SERIES
        assert not unknown, f"{rule.get('record') or rule.get('alert')}: {unknown}"
        undefined = recorded_names(expr) - defined
        assert not undefined, f"{rule.get('record') or rule.get('alert')}: {undefined}"


def test_aggregations_keep_target_and_model() -> None:
    """Sharded replicas are only summed correctly when every aggregation keeps both labels;
    a group's rules (`llmprober:group_…`) compare its targets, and keep `group` instead."""
    for name, expr in recording_rules().items():
        if name == "llmprober:goodput_slo:objective":
            continue
        kept = {"group"} if name.startswith("llmprober:group_") else {"target", "model"}
        for group in re.findall(r"\b(?:sum|max|min|avg|quantile) by \(([^)]*)\)", expr):
            labels = {label.strip() for label in group.split(",")}
            assert kept <= labels, f"{name}: by ({group})"


def test_alerts_have_severity_and_annotations() -> None:
    for name, rule in alert_rules().items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        annotations = rule["annotations"]
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        assert annotations["runbook_url"] == RUNBOOK_URL + name.lower(), name


def test_runbook_has_a_section_per_alert() -> None:
    text = RUNBOOK.read_text()
    anchors = {github_anchor(h) for h in re.findall(r"^##+ (.+)$", text, flags=re.M)}
    sections = re.split(r"^## ", text, flags=re.M)
    for name, rule in alert_rules().items():
        anchor = rule["annotations"]["runbook_url"].split("#", 1)[1]
        assert anchor in anchors, f"docs/runbook.md has no section for {name}"
        body = next(s for s in sections if s.startswith(name))
        for part in ("Meaning", "Impact", "Diagnosis", "Mitigation"):
            assert f"**{part}**" in body, f"runbook section {name} lacks {part}"


def _alert_tests() -> list[tuple[str, list[object]]]:
    cases = []
    for path in TEST_FILES:
        for group in load_yaml(path)["tests"]:
            for case in group.get("alert_rule_test", []):
                cases.append((case["alertname"], case.get("exp_alerts") or []))
    return cases


@pytest.mark.parametrize("alert", sorted(alert_rules()))
def test_every_alert_is_tested_firing_and_silent(alert: str) -> None:
    cases = [expected for name, expected in _alert_tests() if name == alert]
    assert any(cases), f"{alert}: no promtool test where it fires"
    assert any(not c for c in cases), f"{alert}: no promtool test where it stays silent"


def test_unit_tests_load_every_rule_file() -> None:
    for path in TEST_FILES:
        loaded = {(PROM_TESTS_DIR / f).resolve() for f in load_yaml(path)["rule_files"]}
        assert loaded == {p.resolve() for p in RULE_FILES}, path.name


def test_autoscaling_contract_rules_have_value_tests() -> None:
    """Every recording rule that an autoscaler or the Capacity dashboard reads is pinned to
    hand-computed values by a promql_expr_test."""
    capacity = " ".join(dashboard_exprs("llm-prober-capacity.json"))
    keda = (DEPLOY / "kubernetes" / "autoscale-keda" / "keda-scaledobject.yaml").read_text()
    used = recorded_names(capacity) | recorded_names(keda)
    tested: set[str] = set()
    for path in TEST_FILES:
        for group in load_yaml(path)["tests"]:
            for case in group.get("promql_expr_test", []):
                tested |= recorded_names(case["expr"])
    assert used, "nothing found"
    assert used <= tested, f"untested: {sorted(used - tested)}"


def test_docs_name_only_defined_rules_and_alerts() -> None:
    defined = set(recording_rules())
    for doc in ("autoscaling.md", "runbook.md"):
        text = (ROOT / "docs" / doc).read_text()
        # `{5m,30m,1h,6h}`-style shorthands are expanded by hand in the text.
        names = recorded_names(text.replace("burn_rate{5m,30m,1h,6h}", "burn_rate5m"))
        assert names, doc
        assert names <= defined, f"{doc}: {sorted(names - defined)}"
        for alert in re.findall(r"\bLLMProber[A-Za-z]+\b", text):
            assert alert in alert_rules(), f"{doc}: {alert}"
