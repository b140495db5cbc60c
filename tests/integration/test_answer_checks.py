"""Answer checks (`expect:`) against real servers.

On llama-server (gemma-3-270m, started with `--alias probe-model`), which enforces a
`response_format` JSON Schema with a grammar: a schema-constrained answer passes every check
on every one of `N_PROBES` probes, cache-busted all the while (each prompt differs only in its
salt line); a wrong model name is answered all the same (llama-server ignores it: outcome
`ok`) and only `expect.model` catches it, from the response's own `model` field; a schema the
answer cannot meet fails every time. A small local server that answers empty (white space,
or reasoning tokens only) fails the text checks with its outcome `ok`; one that sends no token
at all is `protocol_error`, and no check runs. Each failure is counted in
`llmprober_answer_checks_total`, is not good, and shows in `/probe`'s output.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from prober.metrics import Metrics
from prober.record import Mode, Recorder
from prober.request.wire import client_session
from prober.result import Check, Outcome, RequestResult
from prober.settings import TargetConfig
from prober.targets import Target
from tests.support.daemon import daemon
from tests.support.engine import llama_server_fixture
from tests.support.servers import serve

N_PROBES = 5
ALIAS = "probe-model"
COLOUR = {
    "type": "object",
    # An enum bounds the grammar's answer: llama-server's grammar for this schema is
    # `"{" space "\"colour\"" space ":" space ("\"red\"" | ...) space "}" space`, and its
    # `space` is `| " " | "\n"{1,2} [ \t]{0,20}` (read from the binary), so an answer is at
    # most 5 x 22 characters of white space and 19 of JSON: `MAX_TOKENS` covers it, a token
    # being at least a character. (At 96 the model once spent them all on tabs and was cut.)
    "properties": {"colour": {"enum": ["red", "green", "blue", "yellow"]}},
    "required": ["colour"],
    "additionalProperties": False,
}
MAX_TOKENS = 5 * 22 + 19 + 31  # the grammar's longest answer, and room to spare
QUESTION = "Name one colour. Reply with a JSON object."
engine = llama_server_fixture(1, extra_args=("--alias", ALIAS))


def target(url: str, expect: dict[str, Any], model: str = ALIAS) -> Target:
    cfg = TargetConfig.model_validate(
        {
            "name": "t", "url": url, "model": model, "question": QUESTION, "max_tokens": MAX_TOKENS,
            "slo": {"ttft_seconds": 60, "tpot_seconds": 10},
            "extra_body": {
                "response_format": {"type": "json_schema", "json_schema": {"schema": COLOUR}}
            },
            "expect": expect,
        }
    )  # fmt: skip
    return Target.from_config(cfg)


async def probes(t: Target, n: int, recorder: Recorder) -> list[RequestResult]:
    """`n` probes of `t`, each recorded as the daemon's are."""
    seen = []
    async with client_session() as session:
        for _ in range(n):
            result = await t.send(session, time.perf_counter_ns())
            recorder.record(t, result, Mode.PROBE)
            seen.append(result)
    return seen


def recorder_for(t: Target) -> tuple[Recorder, Counts]:
    registry = CollectorRegistry()
    recorder = Recorder(Metrics(registry))
    recorder.describe(t)
    return recorder, Counts(registry, t.config.model)


class Counts:
    """A target's answer-check and good counts, read from its registry."""

    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        self.registry = registry
        self.labels = {"target": "t", "model": model, "mode": "probe"}

    def __call__(self, check: str, result: str) -> float:
        labels = {**self.labels, "check": check, "result": result}
        return self.registry.get_sample_value("llmprober_answer_checks_total", labels) or 0.0

    @property
    def good(self) -> float:
        return self.registry.get_sample_value("llmprober_requests_good_total", self.labels) or 0


@pytest.mark.engine
async def test_a_schema_constrained_answer_passes_every_time(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    expect = {"json": True, "json_schema": COLOUR, "model": ALIAS, "min_answer_tokens": 2}
    t = target(f"{engine}/v1", expect)
    recorder, count = recorder_for(t)
    prompts: list[str] = []
    build = t.prompts.build_question

    def kept(question: str) -> str:
        prompts.append(build(question))
        return prompts[-1]

    monkeypatch.setattr(t.prompts, "build_question", kept)
    seen = await probes(t, N_PROBES, recorder)
    for result in seen:
        assert result.outcome is Outcome.OK, result.error
        assert result.checks_passed, (result.checks, result.text)
        assert {c.check for c in result.checks} == {
            Check.JSON, Check.JSON_SCHEMA, Check.MODEL, Check.MIN_ANSWER_TOKENS
        }  # fmt: skip
    assert count("json_schema", "pass") == N_PROBES
    assert count("json_schema", "fail") == 0
    assert count.good == N_PROBES
    # Cache-busted, the question unchanged: the prompts differ in their salt line only.
    assert len(set(prompts)) == N_PROBES
    assert {p.partition("\n\n")[2] for p in prompts} == {QUESTION}
    print("answers:", [r.text for r in seen])


@pytest.mark.engine
async def test_a_wrong_model_name_is_answered_and_only_expect_model_catches_it(
    engine: str,
) -> None:
    expect = {"json_schema": COLOUR, "model": "no-such-model"}
    t = target(f"{engine}/v1", expect, model="no-such-model")
    recorder, count = recorder_for(t)
    seen = await probes(t, 2, recorder)
    for result in seen:
        assert result.outcome is Outcome.OK, result.error  # llama-server ignored the name
        assert result.response_model == ALIAS
        verdicts = {c.check: c for c in result.checks}
        assert verdicts[Check.JSON_SCHEMA].passed
        assert not verdicts[Check.MODEL].passed
        assert verdicts[Check.MODEL].detail == (
            f"the response named model {ALIAS!r}, not 'no-such-model'"
        )
    assert count("model", "fail") == 2
    assert count.good == 0


@pytest.mark.engine
async def test_a_schema_the_answer_cannot_meet_fails_every_time(engine: str) -> None:
    impossible = {"type": "object", "required": ["shape"]}
    t = target(f"{engine}/v1", {"json": True, "json_schema": impossible})
    recorder, count = recorder_for(t)
    for result in await probes(t, 3, recorder):
        assert result.outcome is Outcome.OK, result.error
        verdicts = {c.check: c for c in result.checks}
        assert verdicts[Check.JSON].passed
        assert verdicts[Check.JSON_SCHEMA].detail == "'shape' is a required property (at $)"
    assert count("json_schema", "fail") == 3
    assert count("json", "pass") == 3
    assert count.good == 0


def _events(*deltas: dict[str, str], model: str = "m") -> bytes:
    chunks = [{"model": model, "choices": [{"index": 0, "delta": d}]} for d in deltas]
    end = {"model": model, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    lines = [f"data: {json.dumps(c)}\n\n" for c in [*chunks, end]]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


EMPTY_ANSWERS = {
    "white space": _events({"content": " "}, {"content": "\n"}),
    "reasoning only": _events({"reasoning_content": "hmm"}, {"reasoning_content": " well"}),
    "no token": _events({"content": ""}),
}


def empty_server(kind: str) -> Callable[[web.Request], Any]:
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(EMPTY_ANSWERS[kind])
        await resp.write_eof()
        return resp

    return answer


@pytest.mark.parametrize("kind", list(EMPTY_ANSWERS))
async def test_a_server_that_answers_empty_fails_the_checks(kind: str) -> None:
    async with serve(empty_server(kind)) as url:
        t = target(url, {"regex": r"\w", "json": True, "min_answer_tokens": 1}, model="m")
        recorder, count = recorder_for(t)
        (result,) = await probes(t, 1, recorder)
    assert count.good == 0
    if kind == "no token":  # no answer to judge: the outcome says it
        assert result.outcome is Outcome.PROTOCOL_ERROR
        assert result.checks == ()
        assert count("regex", "fail") == 0
        return
    assert result.outcome is Outcome.OK
    verdicts = {c.check: c for c in result.checks}
    assert verdicts[Check.REGEX].detail == "empty answer"
    assert verdicts[Check.JSON].detail == "empty answer"
    assert verdicts[Check.MIN_ANSWER_TOKENS].passed is (kind == "white space")
    assert count("regex", "fail") == 1
    assert count("json", "fail") == 1


async def test_probe_shows_the_failed_check() -> None:
    async with serve(empty_server("white space")) as url:
        config = {
            "targets": [
                {"name": "t", "url": url, "model": "m", "interval_seconds": 3600, "warmup": 0,
                 "expect": {"json": True}}
            ]
        }  # fmt: skip
        async with (
            daemon(config) as (base, _),
            aiohttp.ClientSession() as session,
            session.get(f"{base}/probe", params={"target": "t"}) as resp,
        ):
            text = await resp.text()
    assert resp.status == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    labels = {"target": "t", "model": "m", "mode": "probe", "check": "json"}
    for result, value in (("fail", 1.0), ("pass", 0.0)):
        key = tuple(sorted({**labels, "result": result}.items()))
        assert samples[("llmprober_answer_checks_total", key)] == value, text
