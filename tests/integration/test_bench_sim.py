"""`llm-prober bench` against the simulator: the five bench experiments, the command line end
to end (JSON keys, plots), and the fast failure on an unreachable server.

The simulator runs on its own event loop in a thread, so `run_bench` (which owns an
`asyncio.run`) is exercised exactly as the command line calls it. The simulated engine is
deterministic (prefill = base + tokens / rate; a decode step slows by `decode_slowdown` per
extra running sequence), so the tolerances are tight; each is stated where it is asserted.
The simulator has no prefix cache: experiment 5 is a negative control here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from prober.bench import add_bench_parser, run_bench
from prober.sim import SimConfig, bound_port, serve
from tests.support.bench_report import fig

PREFILL_TPS = 4000.0
DECODE_STEP = 0.01


@contextmanager
def sim_server(**overrides: Any) -> Iterator[str]:
    """A simulator on a free port, served from a thread; yields its base URL (no /v1)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="sim", daemon=True)
    thread.start()
    cfg = SimConfig(**{"prefill_tokens_per_second": PREFILL_TPS, "decode_step_seconds": DECODE_STEP,
                       **overrides})  # fmt: skip
    runner = asyncio.run_coroutine_threadsafe(serve(cfg, "127.0.0.1", 0), loop).result(10)
    try:
        yield f"http://127.0.0.1:{bound_port(runner)}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="llm-prober")
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


def bench(base: str, tmp_path: Path, *argv: str) -> dict[str, Any]:
    """Run `llm-prober bench` against `base`; return its JSON report."""
    out = tmp_path / f"bench-{time.perf_counter_ns()}.json"
    args = parse(["--url", base + "/v1", "--model", "sim", "--no-progress", "--seed", "7",
                  "--out", str(out), *argv])  # fmt: skip
    assert run_bench(args) == 0
    doc: dict[str, Any] = json.loads(out.read_text())
    return doc


def row(level: dict[str, Any]) -> str:
    name = f"c={level['concurrency']}" if "concurrency" in level else f"{level['rate']:g}/s"
    return (
        f"{name:>8} TTFT p50 {fig(level, 'ttft_seconds', 'p50'):.3f} "
        f"p99 {fig(level, 'ttft_seconds', 'p99'):.3f}  TPOT p50 "
        f"{fig(level, 'tpot_seconds', 'p50') * 1000:.1f} ms  {fig(level, 'request_throughput'):.2f}"
        f" req/s  L {fig(level, 'littles_law', 'mean_in_flight'):.2f}  λW "
        f"{fig(level, 'littles_law', 'lambda_times_w'):.2f}  in-flight growth "
        f"{fig(level, 'littles_law', 'arrival_window', 'growth'):.2f}"
    )


def test_ttft_linear_in_prompt_length_tpot_flat(tmp_path: Path) -> None:
    lens = (32, 256, 1024)
    with sim_server(slots=1) as base:
        docs = [bench(base, tmp_path, "--concurrency", "1", "--num-requests", "3",
                      "--warmup", "1", "--input-len", str(n), "--output-len", "8")
                for n in lens]  # fmt: skip
    levels = [d["levels"][0] for d in docs]
    ttft = [fig(lvl, "ttft_seconds", "p50") for lvl in levels]
    tpot = [fig(lvl, "tpot_seconds", "p50") for lvl in levels]
    prompts = [fig(lvl, "prompt_tokens_mean") for lvl in levels]
    print("\nsim, 1 slot, c=1: prompt tokens -> TTFT p50 / TPOT p50")
    for n, t, p in zip(prompts, ttft, tpot, strict=True):
        print(f"  {n:6.0f} tok  TTFT {t:.3f}s  TPOT {p * 1000:.1f} ms")
    # Calibration lands within 5 % of the requested length.
    assert all(abs(p / n - 1) < 0.05 for p, n in zip(prompts, lens, strict=True))
    # Prefill costs 1/PREFILL_TPS per token: each slope within 20 % of it (timer jitter).
    for i in (1, 2):
        slope = (ttft[i] - ttft[i - 1]) / (prompts[i] - prompts[i - 1])
        assert slope == pytest.approx(1 / PREFILL_TPS, rel=0.2)
    # Decode does not depend on the prompt: TPOT within 20 %.
    assert max(tpot) / min(tpot) < 1.2


CLOSED = ("--concurrency", "1,2,4", "--num-requests", "12", "--input-len", "64",
          "--output-len", "16")  # fmt: skip


@pytest.fixture(scope="module")
def closed_sweeps(tmp_path_factory: pytest.TempPathFactory) -> dict[int, dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("closed")
    docs = {}
    for slots in (1, 4):
        with sim_server(slots=slots, decode_slowdown=0.05) as base:
            docs[slots] = bench(base, tmp, *CLOSED)
    return docs


def test_slots_bound_throughput(closed_sweeps: dict[int, dict[str, Any]]) -> None:
    for slots, doc in closed_sweeps.items():
        print(f"\nsim, {slots} slot(s), closed loop:")
        for level in doc["levels"]:
            print("  " + row(level))
    one = closed_sweeps[1]["levels"]
    four = closed_sweeps[4]["levels"]
    thr1 = [fig(lvl, "request_throughput") for lvl in one]
    thr4 = [fig(lvl, "request_throughput") for lvl in four]
    # One slot: concurrency adds no throughput (within 10 %) and TTFT p50 grows with the
    # queue: at c=4 a request waits for about 3 others (> 2x the c=1 TTFT with margin).
    assert max(thr1) / min(thr1) < 1.1
    assert fig(one[2], "ttft_seconds", "p50") > 2 * fig(one[0], "ttft_seconds", "p50")
    # Four slots: throughput grows; ideal 4 / (1 + 3 x 0.05) = 3.5x, prefill steps cost some.
    assert thr4[2] > 2.5 * thr4[0]
    assert thr4[1] > 1.6 * thr4[0]


def test_littles_law_closed_loop(closed_sweeps: dict[int, dict[str, Any]]) -> None:
    for doc in closed_sweeps.values():
        for level in doc["levels"]:
            little = level["littles_law"]
            # L = λW within 10 % (an identity here: every request succeeds).
            assert little["ratio"] == pytest.approx(1.0, rel=0.1)
            # While requests still arrive the client really holds C in flight (within 5 %).
            held = little["arrival_window"]["mean_in_flight"]
            assert held == pytest.approx(level["concurrency"], rel=0.05)
            assert little["arrival_window"]["growth"] == pytest.approx(1.0, abs=0.1)
            # λW against the configured C: held, less the ramp-down of 3 requests a worker.
            assert 0.75 < little["lambda_w_over_concurrency"] <= 1.0 + 1e-9


def test_open_loop_reveals_overload_closed_loop_hides_it(tmp_path: Path) -> None:
    with sim_server(slots=1) as base:
        closed = bench(base, tmp_path, "--concurrency", "1", "--num-requests", "8",
                       "--input-len", "64", "--output-len", "8")  # fmt: skip
        capacity = fig(closed["levels"][0], "request_throughput")
        rates = [round(capacity * k, 2) for k in (1.25, 2.0, 4.0)]
        levels = ",".join(map(str, rates))
        shape = ("--num-requests", "16", "--input-len", "64", "--output-len", "8")
        opened = bench(base, tmp_path, "--mode", "rate", "--levels", levels, *shape)
    print(f"\nsim, 1 slot: closed loop c=1 ({capacity:.1f} req/s = capacity), then open loop:")
    print("  " + row(closed["levels"][0]))
    for level in opened["levels"]:
        print("  " + row(level))
    p99 = [fig(lvl, "ttft_seconds", "p99") for lvl in opened["levels"]]
    # Above capacity the queue grows through each level: TTFT p99 rises level over level
    # (same seed, so each schedule is the last one compressed) ...
    assert p99[0] < p99[1] < p99[2]
    # ... and in-flight keeps growing while requests arrive (> 1.3x second half vs first).
    assert all(
        fig(lvl, "littles_law", "arrival_window", "growth") > 1.3 for lvl in opened["levels"]
    )
    # The closed loop ran at the same capacity and saw none of it: a flat in-flight count and
    # a tail latency a small fraction of the open loop's.
    shut = closed["levels"][0]
    assert fig(shut, "littles_law", "arrival_window", "growth") == pytest.approx(1.0, abs=0.1)
    assert fig(shut, "ttft_seconds", "p99") < p99[0] / 3
    # Throughput is the same capacity in both (within 15 %): only latency tells them apart.
    for level in opened["levels"]:
        assert fig(level, "request_throughput") == pytest.approx(capacity, rel=0.15)


def test_identical_prompt_negative_control(tmp_path: Path) -> None:
    # The simulator has no prefix cache: a repeated prompt must cost what a fresh one does.
    args = ("--concurrency", "1", "--num-requests", "4", "--input-len", "512", "--output-len", "4")
    with sim_server(slots=1) as base:
        fresh = bench(base, tmp_path, *args)["levels"][0]
        same = bench(base, tmp_path, *args, "--no-cache-bust")["levels"][0]
    a, b = fig(fresh, "ttft_seconds", "p50"), fig(same, "ttft_seconds", "p50")
    print(f"\nsim (no prefix cache), 512 tokens: fresh TTFT {a:.3f}s, repeated {b:.3f}s")
    assert b == pytest.approx(a, rel=0.2)


def test_command_line_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out, plots = tmp_path / "report.json", tmp_path / "plots"
    with sim_server(slots=2) as base:
        args = parse(["--url", base + "/v1", "--model", "sim", "--concurrency", "1,2",
                      "--num-requests", "4", "--input-len", "32", "--output-len", "4",
                      "--ignore-eos", "--target-rate", "5", "--out", str(out),
                      "--plot", str(plots), "--api", "completions"])  # fmt: skip
        assert run_bench(args) == 0
    doc = json.loads(out.read_text())
    assert set(doc) >= {"config", "environment", "levels", "knee", "capacity"}
    assert doc["config"]["ignore_eos"] is True
    assert [lvl["concurrency"] for lvl in doc["levels"]] == [1, 2]
    binding = {"ttft_seconds", "ttfo_seconds", "tpot_seconds", "itl_seconds", "e2e_seconds",
               "request_throughput", "output_token_throughput", "outcomes", "goodput",
               "littles_law", "requests"}  # fmt: skip
    for level in doc["levels"]:
        assert binding <= set(level)
        assert set(level["ttft_seconds"]) >= {"p50", "p90", "p95", "p99", "mean"}
        assert set(level["goodput"]) == {"ratio", "requests_per_second"}
        assert {"mean_in_flight", "lambda_times_w", "ratio"} <= set(level["littles_law"])
        assert level["outcomes"] == {"ok": 4}
        assert len(level["requests"]) == 4
        assert all(r["output_tokens"] == 4 for r in level["requests"])
    assert doc["capacity"]["level"] == {"concurrency": 2}
    assert doc["capacity"]["slots_needed"] >= 1
    assert sorted(p.name for p in plots.iterdir()) == ["throughput.png", "tpot.png", "ttft.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in plots.iterdir())
    printed = capsys.readouterr().out
    assert "TTFT p99" in printed
    assert "capacity:" in printed


def test_unreachable_server_fails_fast(capsys: pytest.CaptureFixture[str]) -> None:
    with sim_server() as base:
        dead = base  # the port is free again once the simulator stops
    started = time.monotonic()
    code = run_bench(parse(["--url", dead + "/v1", "--model", "m", "--no-progress"]))
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1
    assert elapsed < 5
    assert len(err) == 1, err
    assert "pre-flight request" in err[0]
    assert "connect_error" in err[0]


def test_ollama_api_and_the_runtime_recorded(tmp_path: Path) -> None:
    # Native Ollama /api/chat (NDJSON) end to end; the report names the loop it ran on, says
    # whether the client was the bottleneck, and warmed as many connections as the level held.
    with sim_server(slots=2) as base:
        doc = bench(base, tmp_path, "--api", "ollama", "--concurrency", "1,3", "--num-requests",
                    "6", "--input-len", "32", "--output-len", "5", "--target-rate", "4",
                    "--event-loop", "asyncio")  # fmt: skip
    assert doc["config"]["api"] == "ollama"
    assert doc["environment"]["event_loop"] == "asyncio"
    for level in doc["levels"]:
        assert level["outcomes"] == {"ok": 6}
        assert all(r["output_tokens"] == 5 for r in level["requests"])
        assert all(r["token_source"] == "usage" for r in level["requests"])
        assert level["connections_warmed"] == level["concurrency"]
        client = level["client"]
        assert client["event_loop"] == "asyncio"
        assert client["latencies_trustworthy"] is (not client["client_bound"])
        assert client["loop_lag_seconds"]["count"] > 0
        little = level["littles_law"]
        assert little["configured_concurrency"] == level["concurrency"]
        # λW / C is L / C here (every request succeeds): at most 1, the ramp-down below it.
        assert 0.5 < little["lambda_w_over_concurrency"] <= 1.0 + 1e-9
        assert level["service_time_seconds"]["mean"] <= level["e2e_seconds"]["mean"]
    cap = doc["capacity"]
    # Ollama reports its prefill: service time excludes the queue wait, so fewer slots.
    assert cap["slots_needed_service"] <= cap["slots_needed"]


def test_wide_closed_loop_starts_staggered(tmp_path: Path) -> None:
    # From RAMP_FROM_CONCURRENCY on, workers start spread over one request's duration (their
    # ramp request unrecorded), so the recorded sends do not all fall in one loop iteration.
    with sim_server(slots=64) as base:
        doc = bench(base, tmp_path, "--concurrency", "32", "--num-requests", "64",
                    "--input-len", "16", "--output-len", "8")  # fmt: skip
    level = doc["levels"][0]
    assert level["outcomes"] == {"ok": 64}
    assert level["connections_warmed"] == 32
    sends = sorted(r["t_send_offset_seconds"] for r in level["requests"])
    # Started together, the first 32 sends would lie within a few ms; staggered over the
    # warm-up's E2E (at least 8 decode steps), they span most of it.
    assert sends[31] - sends[0] > 8 * DECODE_STEP / 2


def test_knee_found_where_the_slots_run_out(tmp_path: Path) -> None:
    # 4 slots and no decode slowdown: each stream adds throughput until c=4; from c=8 half the
    # requests wait a whole service time for a slot, so TTFT jumps while throughput stays.
    plots = tmp_path / "plots"
    with sim_server(slots=4, decode_slowdown=0.0) as base:
        # 48 requests a level: with 16 (four waves at c=4) c=4's throughput interval was as
        # wide as 17.8-19.6 req/s, and bench rightly called no knee at c=8 ("too few requests
        # to tell": the gain's interval reached +10 %), 1 run in 3 here.
        doc = bench(base, tmp_path, "--concurrency", "1,2,4,8,16", "--num-requests", "48",
                    "--input-len", "32", "--output-len", "16", "--plot", str(plots))  # fmt: skip
    print("\nsim, 4 slots, closed loop:")
    for level in doc["levels"]:
        print("  " + row(level))
    knee = doc["knee"]
    print(f"  knee {knee['level']} after {knee.get('last_scaling_level')}: gain "
          f"{knee.get('throughput_gain_ci')}, TTFT x{knee.get('ttft_p50_ratio')}")  # fmt: skip
    assert knee["level"] == {"concurrency": 8}
    assert knee["last_scaling_level"] == {"concurrency": 4}
    assert knee["stopped"] == "flat"
    assert knee["throughput_gain_ci"][1] < 0.10
    assert knee["ttft_p50_ratio_ci"][0] > 2  # a 160 ms wait on a ~20 ms TTFT
    # Every level below the slots scaled beyond its interval: no knee could be called there.
    thr = [fig(lvl, "request_throughput") for lvl in doc["levels"]]
    cis = [lvl["throughput_ci"]["request_throughput"] for lvl in doc["levels"]]
    assert all(cis[i + 1][0] > cis[i][1] for i in range(2)), (thr, cis)
    # The default SLO (2 s TTFT) holds to c=16: the capacity is there, a flat ceiling since c=4.
    cap = doc["capacity"]
    assert cap["level"] == {"concurrency": 16}
    assert cap["trend"] == "flat"
    # Flat from where the slots run out: c=4, or c=8 where c=4's interval is too wide to call
    # it flat (with 16 requests in four waves: 17.8-19.7 req/s against c=16's 19.6-19.7 in
    # one run, a ratio interval reaching past +10 %); never before the slots are all busy.
    assert cap["plateau_from"] in ({"concurrency": 4}, {"concurrency": 8})
    assert cap["lower_bound"] is False
    assert doc["warnings"] == []
    assert sorted(p.name for p in plots.iterdir()) == ["throughput.png", "tpot.png", "ttft.png"]


def test_open_loop_reports_the_achieved_rate(tmp_path: Path) -> None:
    # 16 seeded arrivals fall in whatever time the schedule draws: the report gives the rate
    # achieved beside the nominal one, and the capacity in those terms.
    with sim_server(slots=2) as base:
        doc = bench(base, tmp_path, "--mode", "rate", "--levels", "2,4", "--num-requests", "16",
                    "--input-len", "32", "--output-len", "8")  # fmt: skip
    for level in doc["levels"]:
        arrival = level["arrival_rate"]
        scheds = sorted(r["t_sched_offset_seconds"] for r in level["requests"])
        assert arrival["nominal"] == level["rate"]
        assert arrival["arrivals"] == 16
        assert arrival["achieved"] == pytest.approx(15 / (scheds[-1] - scheds[0]), rel=1e-6)
        low, high = level["throughput_ci"]["request_throughput"]
        assert low <= level["request_throughput"] <= high
    # Same seed, same schedule scaled: the achieved rates keep the nominal ratio.
    achieved = [lvl["arrival_rate"]["achieved"] for lvl in doc["levels"]]
    assert achieved[1] / achieved[0] == pytest.approx(2.0, rel=0.02)
    cap = doc["capacity"]
    assert cap["level"] is not None
    assert cap["arrival_rate"]["achieved"] == pytest.approx(
        next(a for lvl, a in zip(doc["levels"], achieved, strict=True)
             if lvl["level"] == cap["level"])
    )  # fmt: skip
