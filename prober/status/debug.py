"""`/probe?target=NAME&debug=true`: the probe's own account, as text (blackbox_exporter's
`debug=true`): each phase with its time, the status, the response headers with secrets
redacted, the first lines of the body, the outcome and why, then the metrics the probe made.

Everything a server sent is hostile: each header value and body line is one printable,
redacted line (`logs.safe_line`), cut to a bound, and there are at most `BODY_LINES` lines and
`request.debug.MAX_HEADERS` headers, so the answer is bounded whatever the server sends.
"""

from __future__ import annotations

import re
import time

from prober import timings
from prober.logs import REDACTED, safe_line
from prober.request.debug import ProbeTrace
from prober.result import Outcome, RequestResult
from prober.status.view import public_url, seconds
from prober.targets import Target

BODY_LINES = 12
LINE_CHARS = 200
# Headers whose values are credentials or session state, whatever the server or proxy: never
# shown. Matched on the name's words, so `x-api-key`, `proxy-authorization` and
# `x-amz-security-token` are all caught.
_SECRET_HEADER = re.compile(
    r"auth|cookie|key|token|secret|session|signature|credential|password", re.IGNORECASE
)

WHY = {
    Outcome.OK: "the stream ended normally",
    Outcome.TIMEOUT_CONNECT: "no connection within timeouts.connect_seconds",
    Outcome.TIMEOUT_FIRST_TOKEN: "no token within timeouts.first_token_seconds",
    Outcome.TIMEOUT_TOTAL: "the stream went on past timeouts.total_seconds",
    Outcome.STALLED: "no event for longer than timeouts.idle_seconds",
    Outcome.CONNECT_ERROR: "the connection could not be made (refused, DNS, TLS)",
    Outcome.HTTP_429: "the server refused the request as too many (429)",
    Outcome.HTTP_4XX: "the server refused the request (4xx)",
    Outcome.HTTP_5XX: "the server failed (5xx, or an error event in the stream)",
    Outcome.PROTOCOL_ERROR: "the answer was not a valid stream (malformed, cut, no tokens)",
    Outcome.CANCELLED: "the probe was cancelled (shutdown)",
}


def header_lines(trace: ProbeTrace) -> list[str]:
    """Each response header as `name: value`, a credential's value redacted."""
    lines = []
    for name, value in trace.headers:
        shown = REDACTED if _SECRET_HEADER.search(name) else safe_line(value, LINE_CHARS)
        lines.append(f"{safe_line(name, 100)}: {shown}")
    if trace.more_headers:
        lines.append(f"... and {trace.more_headers} more")
    return lines


def body_lines(trace: ProbeTrace) -> list[str]:
    """The body's first non-empty lines (SSE `data:` lines, NDJSON objects), each made safe."""
    lines = []
    for raw in bytes(trace.body).split(b"\n"):
        line = safe_line(raw.decode("utf-8", errors="replace"), LINE_CHARS)
        if line:
            lines.append(line)
        if len(lines) == BODY_LINES:
            break
    return lines


def _phases(result: RequestResult) -> list[str]:
    found = timings.phases(result)
    if not found:
        return ["  (no connection was obtained)"]
    return [f"  {name:<16} {seconds(value)}" for name, value in found]


def _figures(result: RequestResult) -> list[str]:
    tokens = f"{result.output_tokens} output ({result.token_source.value})"
    if result.reasoning_tokens:
        tokens += f", {result.reasoning_tokens} reasoning"
    connection = {None: "none", True: "reused", False: "fresh"}[result.reused]
    lines = [
        f"Dispatch lag: {seconds(timings.dispatch_lag(result))}",
        f"TTFT: {seconds(timings.ttft(result))}   TTFO: {seconds(timings.ttfo(result))}"
        f"   TPOT: {seconds(timings.tpot(result))}   E2E: {seconds(timings.e2e(result))}",
        f"Tokens: {tokens}; finish reason {result.finish_reason.value}",
        f"Connection: {connection}",
    ]
    for check in getattr(result, "checks", ()):  # answer checks, where results carry them
        verdict = "pass" if check.passed else f"FAIL: {safe_line(str(check.detail), LINE_CHARS)}"
        lines.append(f"Answer check {getattr(check.check, 'value', check.check)}: {verdict}")
    return lines


def probe_account(target: Target, result: RequestResult, trace: ProbeTrace, metrics: str) -> str:
    """The whole text of a debug probe."""
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(result.wall_start or time.time()))
    status = "none" if result.http_status is None else str(result.http_status)
    out = [
        f"Probe of target {safe_line(target.name, 400)} (model {safe_line(target.config.model)})"
        f" started {when}",
        f"URL: {public_url(target.config.url)}",
        f"Outcome: {result.outcome.value}: {WHY[result.outcome]}",
    ]
    if result.error:
        out.append(f"Error: {result.error}")  # made safe and cut by the request path
    out += [f"HTTP status: {status}", f"Request id: {safe_line(result.request_id, 64)}", ""]
    out += ["Phases (from the moment the prober began the request):", *_phases(result), ""]
    out += [*_figures(result), ""]
    if trace.attempts > 1:
        out += ["(a pooled connection was stale: the request was sent again; its answer below)"]
    headers = header_lines(trace)
    out += [f"Response headers ({len(trace.headers)}, credentials redacted):"]
    out += [f"  {line}" for line in headers] or ["  (no response)"]
    out += ["", f"First lines of the body ({trace.body_bytes} bytes read):"]
    out += [f"  {line}" for line in body_lines(trace)] or ["  (none)"]
    out += ["", "Metrics that would have been returned:", metrics]
    return "\n".join(out)
