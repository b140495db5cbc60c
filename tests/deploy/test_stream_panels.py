"""The Overview dashboard shows what each stream said (issue 13): answers missing, finish
reasons, token source, probe phases by connection; the new alert has its promtool test."""

from __future__ import annotations

from tests.support.deploy import (
    PROM_TESTS_DIR,
    alert_rules,
    dashboard_exprs,
    load_yaml,
    metric_names,
)

NEW_FAMILIES = {
    "llmprober_requests_without_answer_total",
    "llmprober_finish_reasons_total",
    "llmprober_token_source_total",
    "llmprober_probe_phase_seconds_bucket",
    "llmprober_connections_total",
}


def test_overview_queries_every_new_family() -> None:
    used = set().union(*(metric_names(e) for e in dashboard_exprs("llm-prober-overview.json")))
    assert used >= NEW_FAMILIES, NEW_FAMILIES - used


def test_phase_panel_splits_by_phase_and_connection() -> None:
    phase = [e for e in dashboard_exprs("llm-prober-overview.json") if "probe_phase" in e]
    assert phase
    assert all("by (phase, connection, le)" in e for e in phase)


def test_answers_missing_alert_is_tested_firing_and_silent() -> None:
    assert "LLMProberAnswersMissing" in alert_rules()
    tests = load_yaml(PROM_TESTS_DIR / "answers.test.yml")["tests"]
    cases = [
        c
        for t in tests
        for c in t["alert_rule_test"]
        if c["alertname"] == "LLMProberAnswersMissing"
    ]
    assert any(c["exp_alerts"] == [] for c in cases)
    assert any(c["exp_alerts"] for c in cases)
