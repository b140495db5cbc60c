"""Answer checks: whether a probe's answer is what its target expects (`expect:`).

`AnswerChecks` is what a target's `expect:` section compiles to once, at configuration load
(the regex compiled, the JSON Schema checked and its validator built); `evaluate` judges one
result with it, a pure function of the two:

    regex              the answer matches (`re.search`: anywhere, unless the pattern anchors)
    json               the answer parses as one JSON value (strict: no NaN or Infinity); an
                       answer wrapped whole in one Markdown code fence (```json … ```) is
                       unwrapped first, as chat models fence JSON by habit
    json_schema        that value is valid against the schema (and a JSON answer is needed)
    min_answer_tokens  at least this many answer tokens: output tokens less reasoning ones
    model              the response's `model` field names exactly this model

Checks run only on a result whose outcome is `ok`: a failed request has no answer to judge,
and is already not good. A failed check makes the request not good (`timings.is_good`)
while its outcome stays `ok`. The answer judged is at most `request.stream.answer_chars`
characters (a bound of the request's `max_tokens`): an answer past it fails the text checks
as cut, unjudged. Each failure's detail is one printable, redacted line of at most
`DETAIL_CHARS` characters, since it may quote what the server sent.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

from prober.logs import safe_line
from prober.result import Check, CheckResult, FinishReason, Outcome, RequestResult

DETAIL_CHARS = 200
# One Markdown code fence around the whole answer, any info string (```json, ```JSON, ```).
_FENCE = re.compile(r"\A\s*```[^\n`]*\n(.*?)\n?[ \t]*```\s*\Z", re.S)


@dataclass(frozen=True, slots=True)
class AnswerChecks:
    """What a target expects of each probe's answer; every field unset checks nothing."""

    regex: re.Pattern[str] | None = None
    json: bool = False
    schema: Validator | None = None
    min_answer_tokens: int | None = None
    model: str | None = None

    @property
    def names(self) -> tuple[Check, ...]:
        """The checks asked for, in the order they run."""
        asked = (
            (Check.REGEX, self.regex is not None),
            (Check.JSON, self.json),
            (Check.JSON_SCHEMA, self.schema is not None),
            (Check.MIN_ANSWER_TOKENS, self.min_answer_tokens is not None),
            (Check.MODEL, self.model is not None),
        )
        return tuple(check for check, on in asked if on)

    @property
    def needs_text(self) -> bool:
        """Whether the answer's text must be kept for them (the counts and model need none)."""
        return self.regex is not None or self.json or self.schema is not None


NO_CHECKS = AnswerChecks()


def evaluate(checks: AnswerChecks, r: RequestResult) -> tuple[CheckResult, ...]:
    """Each check `checks` asks for, run on `r`'s answer; none for a result not `ok`."""
    if r.outcome is not Outcome.OK or not checks.names:
        return ()
    out: list[CheckResult] = []
    if checks.regex is not None:
        out.append(_regex(checks.regex, r))
    if checks.json or checks.schema is not None:
        value, problem = parse_answer(r)
        if checks.json:
            out.append(_result(Check.JSON, problem))
        if checks.schema is not None:
            out.append(_result(Check.JSON_SCHEMA, problem or _invalid(checks.schema, value)))
    if checks.min_answer_tokens is not None:
        tokens = max(0, r.output_tokens - r.reasoning_tokens)
        short = tokens < checks.min_answer_tokens
        detail = f"{tokens} answer tokens, fewer than {checks.min_answer_tokens}" if short else ""
        out.append(_result(Check.MIN_ANSWER_TOKENS, detail))
    if checks.model is not None:
        out.append(_result(Check.MODEL, _other_model(checks.model, r.response_model)))
    return tuple(out)


def _result(check: Check, problem: str) -> CheckResult:
    return CheckResult(check, not problem, safe_line(problem, DETAIL_CHARS))


def _uncheckable(r: RequestResult) -> str:
    """Why `r`'s text cannot be judged, or ""."""
    if r.text_cut:
        return f"answer cut at its bound of {len(r.text)} characters (for max_tokens), unjudged"
    if not r.text.strip():
        return "empty answer"
    return ""


def _regex(pattern: re.Pattern[str], r: RequestResult) -> CheckResult:
    problem = _uncheckable(r)
    if not problem and pattern.search(r.text) is None:
        problem = "the answer does not match the regex"
    return _result(Check.REGEX, problem)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_answer(r: RequestResult) -> tuple[Any, str]:
    """`r`'s answer as a JSON value (a whole-answer code fence removed), and "" ; or None and
    why it is none."""
    problem = _uncheckable(r)
    if problem:
        return None, problem
    fenced = _FENCE.fullmatch(r.text)
    text = fenced.group(1) if fenced else r.text
    try:
        return json.loads(text, parse_constant=_no_constant), ""
    except json.JSONDecodeError as exc:
        return None, f"not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}{_ended(r)}"
    except ValueError as exc:  # NaN, Infinity, an integer past Python's digit limit
        return None, f"not JSON: {exc}"
    except RecursionError:
        return None, "not JSON: nested too deep"


def _ended(r: RequestResult) -> str:
    """Why a JSON answer broke off, where the server said it ran out of `max_tokens`: the
    answer may be right but too long (a grammar's white space, say), not malformed."""
    if r.finish_reason is FinishReason.LENGTH:
        return "; the server stopped it at max_tokens (finish_reason length)"
    return ""


def _invalid(schema: Validator, value: Any) -> str:
    """The first way `value` fails `schema`, where in the value; "" when it is valid."""
    try:
        error: ValidationError | None = next(iter(schema.iter_errors(value)), None)
    except RecursionError:
        return "nested too deep to validate"
    if error is None:
        return ""
    return f"{error.message} (at {error.json_path})"


def _other_model(expected: str, named: str) -> str:
    if named == expected:
        return ""
    if not named:
        return f"the response named no model (expected {expected!r})"
    return f"the response named model {named!r}, not {expected!r}"
