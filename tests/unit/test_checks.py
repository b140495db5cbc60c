"""Answer checks (`expect:`): the configuration's faults, each check's verdict from a table,
goodput, the bounded answer text, the salt line of a question, the counter and the log line."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from prober.checks import NO_CHECKS, AnswerChecks, evaluate
from prober.config.expect import MAX_SCHEMA_BYTES, ExpectConfig
from prober.logs import register_secret, setup_logging
from prober.metrics import Metrics
from prober.prompts import SALT_LEAD, PromptBuilder
from prober.record import ANSWER_LOG_CHARS, Mode, Recorder
from prober.request.sse import SSEParser
from prober.request.stream import ANSWER_CHARS_PER_TOKEN, StreamState, answer_chars
from prober.result import Check, CheckResult, FinishReason, Outcome, RequestResult
from prober.settings import TargetConfig, load_settings
from prober.targets import Target
from prober.timings import Slo, is_good
from tests.support.config_faults import file_problems

pytestmark = pytest.mark.usefixtures("clean_env")  # tests/unit/conftest.py

TARGET = "targets:\n  - name: a\n    url: http://x/v1\n    model: m\n"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
SLO = Slo(ttft_seconds=10.0, tpot_seconds=10.0)


def problems(tmp_path: Path, extra: str) -> list[str]:
    return file_problems(tmp_path, TARGET + extra)


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        (
            "    expect: {regex: '(unclosed'}\n",
            "targets[0].expect.regex: not a regular expression: missing ), unterminated "
            "subpattern at position 0",
        ),
        (
            "    expect: {regex: ''}\n",
            "targets[0].expect.regex: must be a pattern of 1-1000 characters, got ''",
        ),
        (
            "    expect: {json_schema: {type: objec}}\n",
            "targets[0].expect.json_schema: not a valid JSON Schema: 'objec' is not valid under"
            " any of the given schemas at type",
        ),
        (
            "    expect: {json_schema: {$ref: 'https://example.com/s.json'}}\n",
            "targets[0].expect.json_schema: $ref 'https://example.com/s.json' points outside"
            " the schema: only '#...' refs",
        ),
        (
            "    expect: {min_answer_tokens: 17}\n",
            "targets[0].expect.min_answer_tokens: must be at most max_tokens (16), got 17",
        ),
        ("    expect: {min_answer_tokens: 0}\n", "targets[0].expect.min_answer_tokens: must be"),
        ("    expect: {jsn: true}\n", "targets[0].expect.jsn: unknown key, did you mean json?"),
        ("    question: ''\n", "targets[0].question: must be a question of 1-4000"),
        ('    question: "a\\x1bb"\n', "targets[0].question: must be text without control"),
    ],
)
def test_a_bad_expect_is_one_line_naming_the_field(
    tmp_path: Path, extra: str, problem: str
) -> None:
    found = problems(tmp_path, extra)
    assert len(found) == 1, found
    assert found[0].startswith(problem), found


def test_a_schema_is_bounded_in_size(tmp_path: Path) -> None:
    big = {"enum": ["x" * 1000] * (MAX_SCHEMA_BYTES // 1000 + 1)}
    (found,) = problems(tmp_path, f"    expect: {{json_schema: {json.dumps(big)}}}\n")
    assert found.startswith(f"targets[0].expect.json_schema: must be at most {MAX_SCHEMA_BYTES}")


def test_a_good_expect_loads_and_a_local_ref_resolves(tmp_path: Path) -> None:
    schema = {"$defs": {"n": {"type": "string"}}, "properties": {"name": {"$ref": "#/$defs/n"}}}
    path = tmp_path / "config.yml"
    extra = {"expect": {"json": True, "json_schema": schema, "model": "m", "regex": "^x"}}
    body = yaml_target(extra)
    path.write_text(body)
    target = load_settings(path).targets[0]
    assert target.expect is not None
    checks = target.expect.checks()
    assert checks.names == (Check.REGEX, Check.JSON, Check.JSON_SCHEMA, Check.MODEL)
    assert checks.needs_text
    bad = evaluate(checks, answer('{"name": 3}', model="m"))
    assert [c.passed for c in bad] == [False, True, False, True]
    assert bad[2].detail == "3 is not of type 'string' (at $.name)"


def yaml_target(extra: dict[str, Any]) -> str:
    return TARGET + "".join(f"    {k}: {json.dumps(v)}\n" for k, v in extra.items())


def answer(
    text: str,
    *,
    outcome: Outcome = Outcome.OK,
    output: int = 5,
    reasoning: int = 0,
    model: str = "m",
    cut: bool = False,
    finish: FinishReason = FinishReason.STOP,
) -> RequestResult:
    """An answered result whose answer is `text`."""
    return RequestResult(
        outcome, 0, 10, 100, t_first_token_ns=20, t_first_content_ns=20, t_last_token_ns=30,
        output_tokens=output, reasoning_tokens=reasoning, text=text, text_cut=cut,
        response_model=model, finish_reason=finish,
    )  # fmt: skip


def checks_of(**expect: Any) -> AnswerChecks:
    return ExpectConfig.model_validate(expect).checks()


@pytest.mark.parametrize(
    ("expect", "text", "passed", "detail"),
    [
        ({"regex": r"\bParis\b"}, "It is Paris.", True, ""),
        ({"regex": r"^Paris$"}, "It is Paris.", False, "the answer does not match the regex"),
        ({"regex": "x"}, "  \n", False, "empty answer"),
        ({"json": True}, '{"a": [1, 2]}', True, ""),
        ({"json": True}, '```json\n{"a": 1}\n```', True, ""),
        ({"json": True}, '```\n{"a": 1}\n```\n', True, ""),
        ({"json": True}, 'Sure: ```json\n{"a": 1}\n```', False, "not JSON: Expecting value"),
        ({"json": True}, "{'a': 1}", False, "not JSON: Expecting property name enclosed"),
        ({"json": True}, "NaN", False, "not JSON: NaN is not JSON"),
        ({"json": True}, "[" * 100_000, False, "not JSON: nested too deep"),
        ({"json_schema": SCHEMA}, '{"name": "x"}', True, ""),
        ({"json_schema": SCHEMA}, '{"nom": "x"}', False, "'name' is a required property (at $)"),
        ({"json_schema": SCHEMA}, "name: x", False, "not JSON: Expecting value"),
        ({"min_answer_tokens": 5}, "a b c d e", True, ""),
        ({"min_answer_tokens": 6}, "a b c d e", False, "5 answer tokens, fewer than 6"),
        ({"model": "m"}, "x", True, ""),
        ({"model": "other"}, "x", False, "the response named model 'm', not 'other'"),
    ],
)
def test_each_check_from_a_table(
    expect: dict[str, Any], text: str, passed: bool, detail: str
) -> None:
    (result,) = evaluate(checks_of(**expect), answer(text))
    assert result.passed is passed
    assert result.detail.startswith(detail), result.detail
    assert (result.detail == "") is passed


def test_reasoning_is_no_answer_token_and_a_cut_answer_is_not_judged() -> None:
    (short,) = evaluate(checks_of(min_answer_tokens=3), answer("ab", output=10, reasoning=8))
    assert short.detail == "2 answer tokens, fewer than 3"
    (cut,) = evaluate(checks_of(json=True), answer('{"a": 1}', cut=True))
    assert not cut.passed
    assert cut.detail.startswith("answer cut at its bound of 8 characters")


def test_a_json_answer_the_server_stopped_at_max_tokens_says_so() -> None:
    broken = '{\n\t \t "colour"\n\t \t:\n\t \t"g'
    (stopped,) = evaluate(checks_of(json=True), answer(broken, finish=FinishReason.LENGTH))
    assert stopped.detail == (
        "not JSON: Unterminated string starting at at line 4 column 4; the server stopped"
        " it at max_tokens (finish_reason length)"
    )
    (ended,) = evaluate(checks_of(json=True), answer(broken))
    assert ended.detail == "not JSON: Unterminated string starting at at line 4 column 4"


def test_checks_run_only_on_ok_results_and_a_failed_one_is_not_good() -> None:
    checks = checks_of(json=True, model="m")
    assert evaluate(checks, answer("{}", outcome=Outcome.STALLED)) == ()
    assert evaluate(NO_CHECKS, answer("x")) == ()
    good = answer("{}")
    assert is_good(good, SLO)
    judged = dataclasses.replace(good, checks=evaluate(checks, answer("nope")))
    assert judged.ok
    assert not judged.checks_passed
    assert not is_good(judged, SLO)


def test_a_failure_detail_is_one_redacted_line() -> None:
    register_secret("sk-answer-secret-1234")
    text = '{"name": 7, "x": "sk-answer-secret-1234\\n\\u001b[31m"}'
    schema = {"type": "object", "properties": {"x": {"type": "integer"}}}
    (result,) = evaluate(checks_of(json_schema=schema), answer(text))
    assert "sk-answer" not in result.detail
    assert "[REDACTED]" in result.detail
    assert result.detail.isprintable()
    assert len(result.detail) <= 200


def test_the_answer_text_is_kept_within_its_bound_only_when_asked() -> None:
    def stream(limit: int | None, keep: bool = False) -> RequestResult:
        state = StreamState("r", ndjson=False, keep_text=keep, text_limit=limit)
        parser = SSEParser(1 << 16, 1 << 16)
        for piece in ("abcd", "efgh", "ijkl"):
            chunk = {"model": "served", "choices": [{"delta": {"content": piece}}]}
            state.feed(parser, f"data: {json.dumps(chunk)}\n\n".encode(), 1)
        state.feed(parser, b"data: [DONE]\n\n", 2)
        return state.result(Outcome.OK, t_sched_ns=0, t_send_ns=0, t_end_ns=3, wall_start=0.0)

    assert stream(None).text == ""
    assert stream(None).response_model == "served"
    assert (stream(None, keep=True).text, stream(None, keep=True).text_cut) == (
        "abcdefghijkl",
        False,
    )
    cut = stream(6)
    assert (cut.text, cut.text_cut) == ("abcdef", True)
    assert answer_chars(16) == 16 * ANSWER_CHARS_PER_TOKEN


def test_a_question_is_asked_as_written_after_a_line_of_salt() -> None:
    builder = PromptBuilder(seed=1)
    first, second = builder.build_question("Q?"), builder.build_question("Q?")
    assert first != second  # the salt busts prefix caches
    for prompt in (first, second):
        salt, blank, question = prompt.partition("\n\n")
        assert blank
        assert question == "Q?"
        assert salt.startswith(SALT_LEAD + " ")
        assert "\n" not in salt
    assert PromptBuilder(cache_bust=False).build_question("Q?") == "Q?"


def test_the_counter_and_the_log_line() -> None:
    cfg = TargetConfig.model_validate(
        {"name": "t", "url": "http://x/v1", "model": "m", "expect": {"json": True}}
    )
    target = Target.from_config(cfg)
    registry = CollectorRegistry()
    recorder = Recorder(Metrics(registry))
    recorder.describe(target)
    labels = {"target": "t", "model": "m", "mode": "probe", "check": "json"}
    sample = "llmprober_answer_checks_total"
    assert registry.get_sample_value(sample, {**labels, "result": "fail"}) == 0
    out = io.StringIO()
    setup_logging("json", "info", out)
    text = "not json " + "y" * 400
    failed = answer(text)
    failed = dataclasses.replace(failed, checks=evaluate(target.spec.checks, failed))
    recorder.record(target, failed, Mode.PROBE)
    passed = dataclasses.replace(answer("{}"), checks=(CheckResult(Check.JSON, True),))
    recorder.record(target, passed, Mode.PROBE)
    assert registry.get_sample_value(sample, {**labels, "result": "fail"}) == 1
    assert registry.get_sample_value(sample, {**labels, "result": "pass"}) == 1
    good = {"target": "t", "model": "m", "mode": "probe"}
    assert registry.get_sample_value("llmprober_requests_good_total", good) == 1
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    bad, ok = lines[-2], lines[-1]
    assert bad["event"] == "probe_check_failed"
    assert bad["outcome"] == "ok"
    assert bad["answer"] == text[:ANSWER_LOG_CHARS]
    assert bad["checks"]["json"].startswith("not JSON: Expecting value")
    assert ok["event"] == "probe_ok"
    assert ok["checks"] == {"json": "pass"}
    assert "answer" not in ok
