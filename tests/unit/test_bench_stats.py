"""Bench maths and flags without a server: percentiles, Little's law, the level summary, the
configuration's one-line errors, and the report's table. Stamps are plain integers (ns).
The intervals are tests/unit/test_bench_intervals.py's, the verdicts test_bench_verdicts.py's."""

from __future__ import annotations

import argparse
import dataclasses
import io

import pytest
from rich.console import Console

from prober.bench import add_bench_parser, config_from_args, run_bench
from prober.bench.config import BenchConfig, Mode, parse_levels
from prober.bench.stats import (
    distribution,
    in_flight_area,
    littles_law,
    percentile,
    prefill_baseline,
    summarize,
)
from prober.bench.text import print_summary, verdict_lines
from prober.bench.throughput import queue_wait, service_time
from prober.bench.verdicts import capacity, knee
from prober.result import Outcome, RequestResult, TokenSource
from prober.timings import Slo
from tests.support.results import S

SLO = Slo(ttft_seconds=1.0, tpot_seconds=0.1)


def evenly_streamed(
    send: float,
    end: float,
    *,
    first: float | None = None,
    tokens: int = 4,
    outcome: Outcome = Outcome.OK,
    sched: float | None = None,
) -> RequestResult:
    """A request sent at `send` s, first token at `first` (default send + 0.1), ending at `end`,
    its `tokens` token events evenly spread from the first token to the end."""
    t_first = send + 0.1 if first is None else first
    events = tuple(int((t_first + i * (end - t_first) / max(tokens - 1, 1)) * S)
                   for i in range(tokens))  # fmt: skip
    ok = outcome is Outcome.OK
    return RequestResult(
        outcome=outcome,
        t_sched_ns=int((send if sched is None else sched) * S),
        t_send_ns=int(send * S),
        t_end_ns=int(end * S),
        t_first_token_ns=events[0] if ok else None,
        t_first_content_ns=events[0] if ok else None,
        t_last_token_ns=events[-1] if ok else None,
        token_event_ns=events if ok else (),
        output_tokens=tokens if ok else 0,
        prompt_tokens=100,
        token_source=TokenSource.USAGE,
    )


# --- percentiles --------------------------------------------------------------------------


def test_percentile_interpolates_linearly() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 1.0) == 4.0
    assert percentile(values, 0.5) == pytest.approx(2.5)
    assert percentile(values, 0.99) == pytest.approx(3.97)
    assert percentile([], 0.5) is None
    assert percentile([7.0], 0.99) == 7.0


def test_distribution_keys_and_empty() -> None:
    d = distribution([1.0, 2.0, 3.0])
    assert d["p50"] == 2.0
    assert d["mean"] == 2.0
    assert d["count"] == 3
    assert set(d) == {"p50", "p90", "p95", "p99", "mean", "min", "max", "count"}
    assert distribution([])["p99"] is None


# --- Little's law -------------------------------------------------------------------------


def test_in_flight_area_clips_to_window() -> None:
    rs = [evenly_streamed(0, 2), evenly_streamed(1, 3)]
    assert in_flight_area(rs, 0, 3 * S) == pytest.approx(4.0)
    assert in_flight_area(rs, 1 * S, 2 * S) == pytest.approx(2.0)


def test_littles_law_closed_loop_two_workers() -> None:
    # Two workers, each back to back: 0-1, 1-2, 2-3 and 0-1.5, 1.5-3.
    rs = [
        evenly_streamed(0, 1),
        evenly_streamed(1, 2),
        evenly_streamed(2, 3),
        evenly_streamed(0, 1.5),
        evenly_streamed(1.5, 3),
    ]
    law = littles_law(rs)
    assert law["window_seconds"] == pytest.approx(3.0)
    assert law["mean_in_flight"] == pytest.approx(2.0)
    assert law["throughput"] == pytest.approx(5 / 3)
    assert law["mean_e2e_from_send_seconds"] == pytest.approx(6 / 5)
    assert law["lambda_times_w"] == pytest.approx(2.0)
    assert law["ratio"] == pytest.approx(1.0)
    window = law["arrival_window"]  # [0, 2]: both workers busy throughout
    assert window["mean_in_flight"] == pytest.approx(2.0)
    assert window["growth"] == pytest.approx(1.0)


def test_littles_law_failures_hold_the_server() -> None:
    # A request that times out after 2 s occupies the server but never completes: L > λW.
    rs = [
        evenly_streamed(0, 1),
        evenly_streamed(1, 2),
        evenly_streamed(0, 2, outcome=Outcome.TIMEOUT_TOTAL),
    ]
    law = littles_law(rs)
    assert law["mean_in_flight"] == pytest.approx(2.0)
    assert law["lambda_times_w"] == pytest.approx(1.0)
    assert law["ratio"] == pytest.approx(2.0)


def test_littles_law_against_the_configured_concurrency() -> None:
    # Two workers configured, but a 1 s gap before each second request: the client held
    # fewer than 2, which λW / C shows and L / λW (an identity) cannot.
    rs = [
        evenly_streamed(0, 1),
        evenly_streamed(2, 3),
        evenly_streamed(0, 1),
        evenly_streamed(2, 3),
    ]
    law = littles_law(rs, concurrency=2)
    assert law["ratio"] == pytest.approx(1.0)
    assert law["configured_concurrency"] == 2
    assert law["lambda_w_over_concurrency"] == pytest.approx(4 / 3 * 1 / 2)
    assert "configured_concurrency" not in littles_law(rs)


def test_queue_wait_from_server_prefill_or_the_envelope() -> None:
    fast, slow = evenly_streamed(0, 1, first=0.1), evenly_streamed(0, 2, first=0.6)
    baseline = prefill_baseline([fast, slow])  # same prompt length: the floor is 0.1 s
    assert queue_wait(fast, baseline) == pytest.approx(0.0)
    assert queue_wait(slow, baseline) == pytest.approx(0.5)
    assert service_time(slow, baseline) == pytest.approx(1.5)
    # The server's own prefill figure wins over the envelope: 0.6 - 0.2 = 0.4 s waited.
    reported = dataclasses.replace(slow, server_prefill_seconds=0.2)
    assert queue_wait(reported, baseline) == pytest.approx(0.4)
    assert service_time(reported, baseline) == pytest.approx(1.6)
    failed = evenly_streamed(0, 1, outcome=Outcome.TIMEOUT_FIRST_TOKEN)
    assert queue_wait(failed, baseline) is None


def test_summary_has_queue_wait_and_service_time() -> None:
    rs = [evenly_streamed(0, 1, first=0.1), evenly_streamed(0, 2, first=0.6)]
    s = summarize(rs, SLO)
    assert s["queue_wait_seconds"]["mean"] == pytest.approx(0.25)
    assert s["service_time_seconds"]["mean"] == pytest.approx(1.25)
    # A sweep-wide envelope (here: a faster request elsewhere) is used when given.
    faster = prefill_baseline([evenly_streamed(0, 1, first=0.05)])
    assert summarize(rs, SLO, baseline=faster)["queue_wait_seconds"]["mean"] == pytest.approx(0.3)


def test_arrival_window_growth_shows_a_building_queue() -> None:
    # One arrival a second, each staying longer than the last: the queue builds.
    rs = [evenly_streamed(i, i + 1 + i, first=i + 0.5 + i) for i in range(6)]
    window = littles_law(rs)["arrival_window"]
    assert window["growth"] > 1.5


# --- level summary ------------------------------------------------------------------------


def test_summarize_counts_outcomes_goodput_and_throughput() -> None:
    rs = [
        evenly_streamed(0, 1),  # TTFT 0.1, TPOT 0.3: fails the 0.1 s TPOT SLO
        evenly_streamed(0, 0.4),  # TTFT 0.1, TPOT 0.1: good
        evenly_streamed(0, 0.5, first=0.2, sched=-1.0),  # TTFT from t_sched = 1.2 s: fails TTFT SLO
        evenly_streamed(0, 2, outcome=Outcome.HTTP_5XX),
    ]
    s = summarize(rs, SLO)
    assert s["requests_total"] == 4
    assert s["requests_ok"] == 3
    assert s["outcomes"] == {"ok": 3, "http_5xx": 1}
    assert s["duration_seconds"] == pytest.approx(3.0)  # first t_sched -1 to last end 2
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_token_throughput"] == pytest.approx(4.0)
    assert s["goodput"] == {"ratio": 0.25, "requests_per_second": pytest.approx(1 / 3)}
    assert s["ttft_seconds"]["max"] == pytest.approx(1.2)
    assert s["dispatch_lag_seconds"]["max"] == pytest.approx(1.0)
    assert s["itl_seconds"]["count"] == 9
    assert summarize([], SLO)["requests_total"] == 0


# --- the table ------------------------------------------------------------------------


def test_verdict_lines_and_table_render() -> None:
    rs = [evenly_streamed(0, 1), evenly_streamed(1, 2)]
    lvl = {"concurrency": 1, "level": {"concurrency": 1}, **summarize(rs, SLO)}
    doc = {
        "config": {"model": "m", "url": "http://x/v1", "mode": "concurrency"},
        "levels": [lvl],
        "knee": knee([lvl]),
        "capacity": capacity([lvl], 0.9, 4.0),
    }
    lines = verdict_lines(doc)
    assert lines[0].startswith("knee: none found")
    assert lines[1].startswith("capacity: no level meets the SLO")  # TPOT 0.3 > 0.1
    buffer = io.StringIO()
    print_summary(doc, Console(file=buffer, width=200))
    assert "c=1" in buffer.getvalue()
    assert "c=1: the client was the bottleneck" not in buffer.getvalue()


def test_a_client_bound_level_is_flagged_in_the_table() -> None:
    rs = [evenly_streamed(0, 1), evenly_streamed(1, 2)]
    client = {"cpu_share": 0.97, "client_bound": True, "reasons": ["client CPU 0.97 of a core"]}
    lvl = {"concurrency": 1, "level": {"concurrency": 1}, **summarize(rs, SLO), "client": client}
    doc = {
        "config": {"model": "m", "url": "http://x/v1", "mode": "concurrency"},
        "environment": {"event_loop": "uvloop 0.23.0"},
        "levels": [lvl],
        "knee": knee([lvl]),
        "capacity": capacity([lvl], 0.9, None),
    }
    buffer = io.StringIO()
    print_summary(doc, Console(file=buffer, width=250))
    text = buffer.getvalue()
    assert "client on uvloop 0.23.0" in text
    assert "BOUND 0.97" in text
    assert "c=1: the client was the bottleneck (client CPU 0.97 of a core)" in text
    assert "not trustworthy" in text


# --- configuration and flags --------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", "--url", "http://127.0.0.1:1/v1", "--model", "m", *argv])


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--concurrency", "0"), "--concurrency: each must be an integer 1..10000, got 0"),
        (
            ("--concurrency", "1,x"),
            "--concurrency: must be integers separated by commas, got '1,x'",
        ),
        (("--concurrency", "4,2"), "--concurrency: levels must be strictly increasing"),
        (
            ("--mode", "rate", "--levels", "a,b"),
            "--levels: must be numbers separated by commas, got 'a,b'",
        ),
        (("--mode", "rate", "--levels", "1,-2"), "--levels: each rate must be in (0, 10000]"),
        (
            (
                "--mode",
                "rate",
            ),
            "--levels: required with --mode rate",
        ),
        (("--input-len", "-5"), "--input-len: must be at least 1, got -5"),
        (("--output-len", "0"), "--output-len: must be at least 1, got 0"),
        (("--warmup", "x"), "--warmup: must be an integer, got 'x'"),
        (("--slo-ttft", "0"), "--slo-ttft: must be greater than 0, got 0.0"),
        (("--num-requests", "4"), "--num-requests: 4 is below the largest concurrency 8"),
        (("--duration", "5", "--num-requests", "9"), "--num-requests / --duration: give exactly"),
        (("--capacity-goodput", "1.5"), "--capacity-goodput: must be in (0, 1]"),
        (("--api-key-env", "LLMPROBER_TEST_SURELY_UNSET"), "--api-key-env: environment variable"),
    ],
)
def test_bad_flags_one_line_exit_2(
    argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_bench(parse(*argv)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("llm-prober bench: error: " + message)


def test_a_bad_key_in_the_variable_names_the_flag(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("LLMPROBER_TEST_TWO_LINES", "sk-one\nsk-two")
    assert run_bench(parse("--api-key-env", "LLMPROBER_TEST_TWO_LINES")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "llm-prober bench: error: --api-key-env: the key in environment variable"
        " LLMPROBER_TEST_TWO_LINES holds more than one line"
    ]


def test_bad_url_is_a_flag_error() -> None:
    with pytest.raises(ValueError, match="--url: must be an http"):
        BenchConfig(url="ftp://x", model="m")


def test_flags_build_the_config() -> None:
    cfg = config_from_args(parse("--mode", "rate", "--levels", "0.5,2", "--duration", "10",
                                 "--ignore-eos", "--no-cache-bust", "--api", "completions",
                                 "--seed", "3", "--target-rate", "7"))  # fmt: skip
    assert cfg.mode is Mode.RATE
    assert cfg.levels == (0.5, 2.0)
    assert cfg.num_requests is None
    assert cfg.duration_seconds == 10.0
    assert cfg.target_config().extra_body == {"ignore_eos": True}
    assert cfg.target_config().cache_bust is False
    assert cfg.as_json()["api"] == "completions"
    assert [lvl.key() for lvl in cfg.sweep] == [{"rate": 0.5}, {"rate": 2.0}]
    ollama = config_from_args(parse("--api", "ollama", "--event-loop", "asyncio"))
    assert ollama.target_config().api.value == "ollama"
    assert ollama.event_loop == "asyncio"
    default = config_from_args(parse())
    assert default.event_loop == "auto"
    assert default.levels == (1, 2, 4, 8)
    assert default.num_requests == 32
    assert default.warmup == 2
    assert default.target_config().extra_body == {}


def test_parse_levels() -> None:
    assert parse_levels("--levels", "1, 2.5 ,4", integers=False) == (1.0, 2.5, 4.0)
    with pytest.raises(ValueError, match="comma-separated"):
        parse_levels("--levels", "1,,2", integers=False)
