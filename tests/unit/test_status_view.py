"""The status page's parts without a server: the recent-probes ring, what a probe's record
keeps, the view model's strings, pagination, and the debug account's redaction."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from multidict import CIMultiDict
from prometheus_client import CollectorRegistry

from prober.logs import REDACTED, register_secret
from prober.metrics import Metrics
from prober.recent import ERROR_CHARS, RECENT_PROBES, RecentProbes, summary
from prober.record import Mode, Recorder
from prober.request.debug import MAX_BODY_BYTES, MAX_HEADERS, ProbeTrace
from prober.result import FinishReason, Outcome, RequestResult
from prober.settings import TargetConfig
from prober.status.debug import BODY_LINES, LINE_CHARS, body_lines, header_lines
from prober.status.view import PAGE_TARGETS, index_names, probe_row, public_url, seconds
from prober.targets import Target

MS = 1_000_000
KEY = "sk-unit-status-0123456789abcdef"


def ok_result(**fields: Any) -> RequestResult:
    """An ok stream of 4 tokens: first token at 50 ms, first answer at 60 ms, last at 90 ms."""
    result = RequestResult(
        Outcome.OK, 0, 1 * MS, 100 * MS, output_tokens=4, t_first_token_ns=50 * MS,
        t_first_content_ns=60 * MS, t_last_token_ns=90 * MS,
    )  # fmt: skip
    return replace(result, **fields)


def test_the_ring_keeps_the_last_twenty_newest_first_and_counts_all() -> None:
    recent = RecentProbes()
    for i in range(RECENT_PROBES + 7):
        recent.add("t", summary(ok_result(), wall_end=float(i), good=True, companion=False))
    kept = recent.of("t")
    assert len(kept) == RECENT_PROBES
    assert [r.wall_end for r in kept[:2]] == [26.0, 25.0]
    assert recent.last("t") == kept[0]
    assert recent.count("t") == RECENT_PROBES + 7
    recent.forget("t")
    assert recent.of("t") == ()
    assert recent.count("t") == 0
    assert recent.last("t") is None


def test_a_record_keeps_the_timings_and_a_bounded_redacted_error() -> None:
    register_secret(KEY)
    split = KEY[:10] + "\u200b" + KEY[10:]
    error = f"HTTP 500: <script>x</script>\x1b[31m\x07 {split} " + "y" * 1000
    failed = RequestResult(Outcome.HTTP_5XX, 0, MS, 2 * MS, error=error, http_status=500)
    record = summary(failed, wall_end=1.0, good=False, companion=False)
    assert KEY not in record.error
    assert REDACTED in record.error
    assert "\x1b" not in record.error
    assert "\x07" not in record.error
    assert record.error.startswith("HTTP 500: <script>x</script>")  # escaped by the template
    assert len(record.error) <= ERROR_CHARS
    good = summary(ok_result(), wall_end=1.0, good=True, companion=True)
    assert (good.ttft_seconds, good.ttfo_seconds) == (0.05, 0.06)
    assert good.tpot_seconds == pytest.approx(0.04 / 3)
    assert good.companion
    assert good.error == ""


def test_a_row_is_made_of_strings() -> None:
    record = summary(
        ok_result(finish_reason=FinishReason.STOP), wall_end=0.0, good=False, companion=False
    )
    row = probe_row(record, now=75.0)
    assert (row.outcome, row.css, row.ttft, row.finish) == ("ok", "slow", "50 ms", "stop")
    assert row.when == "00:00:00 UTC"
    assert row.age == "75 s ago"
    assert seconds(None) == "–"
    assert seconds(float("nan")) == "–"
    assert seconds(2.5) == "2.50 s"


def test_the_recorder_keeps_probes_not_load() -> None:
    cfg = TargetConfig.model_validate({"name": "t", "url": "http://127.0.0.1:9/v1", "model": "m"})
    target = Target.from_config(cfg)
    recorder = Recorder(Metrics(CollectorRegistry()), wall_clock=lambda: 42.0)
    recorder.record(target, ok_result(), Mode.LOAD)
    assert recorder.recent.count("t") == 0
    recorder.record(target, ok_result(), Mode.PROBE)
    recorder.record_pair(target, ok_result(), ok_result())
    assert recorder.recent.count("t") == 3
    assert [r.companion for r in recorder.recent.of("t")] == [True, False, False]
    assert recorder.recent.last("t").wall_end == 42.0  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "http://user:secret@host:8000/v1?api-version=2024-01-01",
            "http://host:8000/v1?api-version=2024-01-01",
        ),
        ("https://host/v1", "https://host/v1"),
        ("http://host/v1?<script>", "http://host/v1?%3Cscript%3E"),
    ],
)
def test_a_url_is_shown_without_its_user_info(url: str, shown: str) -> None:
    assert public_url(url) == shown


def test_the_index_is_paginated() -> None:
    names = [f"t{i:03}" for i in range(PAGE_TARGETS * 2 + 3)]
    first, page, pages = index_names(reversed(names), 1)
    assert first == names[:PAGE_TARGETS]
    assert (page, pages) == (1, 3)
    last, page, _ = index_names(names, 99)
    assert last == names[-3:]
    assert page == 3
    assert index_names([], 0) == ([], 1, 1)


def test_the_debug_account_redacts_credentials_and_bounds_what_it_shows() -> None:
    register_secret(KEY)
    trace = ProbeTrace()
    headers = CIMultiDict(
        [("Content-Type", "text/event-stream"), ("Set-Cookie", "s=1"), ("Authorization", "x"),
         ("api-key", "x"), ("X-Amz-Security-Token", "x"), ("X-Note", f"a {KEY} \x1b[2J b")]
        + [(f"X-Pad-{i}", "p") for i in range(MAX_HEADERS)]
    )  # fmt: skip
    trace.response(200, headers)
    lines = header_lines(trace)
    assert lines[0] == "Content-Type: text/event-stream"
    for secret in ("Set-Cookie", "Authorization", "api-key", "X-Amz-Security-Token"):
        assert f"{secret}: {REDACTED}" in lines
    assert f"X-Note: a {REDACTED} b" in lines
    assert lines[-1] == "... and 6 more"
    trace.chunk(b"data: " + KEY.encode() + b"\n\n" + b"data: " + b"z" * 500 + b"\n")
    for i in range(100):
        trace.chunk(f"data: {i}\r\n\r\n".encode())
    assert len(trace.body) == min(trace.body_bytes, MAX_BODY_BYTES)
    shown = body_lines(trace)
    assert shown[0] == f"data: {REDACTED}"
    assert len(shown[1]) == LINE_CHARS
    assert len(shown) == BODY_LINES
