"""`llm-prober bench` against a real llama-server (gemma-3-270m on CPU): the five experiments.

Sized for 2 shared cores (the whole file runs in 1-2 minutes when the machine is quiet):
short answers, a handful of requests per level, `--ignore-eos` so every answer has exactly
`--output-len` tokens. Other work on the machine can starve the engine for seconds at a time;
such a stall is visible in the report itself (a long gap between two tokens, a prefill far
slower than the engine's, a client that did not hold its concurrency), and an experiment
that saw one is measured again, up to ATTEMPTS times. The assertions are then judged on the
first clean attempt (or the last one), with margins stated in place.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from prober.bench.verdicts import fell, rose, throughput_ratio
from prober.bench.watch import CPU_BUSY_SHARE
from tests.support.bench_report import Docs, bench, clean, fig, row
from tests.support.engine import llama_server_fixture
from tests.support.margins import holds

pytestmark = pytest.mark.engine

# One thread for the 1-slot engine: on this shared machine it runs ~2x faster than two
# threads that must meet at every step. Batching needs both threads to show any gain.
one_slot = llama_server_fixture(1, threads=1)
four_slots = llama_server_fixture(4, threads=2)


def test_ttft_linear_in_prompt_length_tpot_flat(one_slot: str, tmp_path: Path) -> None:
    # Requests a length: enough that each length's level lasts some seconds (a short prompt's
    # request takes about 0.35 s, a 512-token one 2.7 s), so that its fastest request meets
    # the machine at its own pace (below).
    requests = {32: 15, 192: 8, 512: 5}
    lens = tuple(requests)
    docs = clean(lambda: [bench(one_slot, tmp_path, "--concurrency", "1",
                                "--num-requests", str(requests[n]), "--warmup", "1",
                                "--input-len", str(n), "--output-len", "8")
                          for n in lens])  # fmt: skip
    levels = [d["levels"][0] for d in docs]
    ttft = [fig(lvl, "ttft_seconds", "p50") for lvl in levels]
    # The decode pace of each length's fastest request: this machine's own pace moves between
    # regimes (17, 23, 26, 30, 35 ms a token) for a second or two at a time, whatever the
    # prompt, one request switching from 17 to 26 ms halfway (quiet runs, 2026-12-07). The
    # median of five a length landed in whichever regime held most of them: 1.56x and 1.59x
    # in two runs of five (22.8 / 18.3 / 28.4 ms, 30.3 / 21.4 / 19.1), where the fastest
    # read 1.30x and 1.11x (22.7 / 17.4 / 18.6, 19.3 / 17.4 / 18.5), 1.03 to 1.31x over the
    # five. The noise only adds time, so the fastest is the engine's pace. The 1.30x and 1.31x
    # were whole levels in a slow regime (2 s of short prompts, 5 s of 192-token ones), hence
    # more requests there; then, three runs: 1.15 to 1.21x (17.1-17.4 / 18.1-19.0 / 19.7-20.8
    # ms: the longer context does cost the decode a little).
    tpot = [fig(lvl, "tpot_seconds", "min") for lvl in levels]
    prompts = [fig(lvl, "prompt_tokens_mean") for lvl in levels]
    slopes = [(ttft[i] - ttft[i - 1]) / (prompts[i] - prompts[i - 1]) for i in (1, 2)]
    print("\nllama-server -np 1, c=1: prompt tokens -> TTFT p50 / fastest request's TPOT")
    for n, t, p in zip(prompts, ttft, tpot, strict=True):
        print(f"  {n:6.0f} tok  TTFT {t:.3f}s  TPOT {p * 1000:.1f} ms")
    print(f"  prefill slopes {[f'{1 / s:.0f} tok/s' for s in slopes]}")
    # Calibration lands within 10 % of the requested length (32 has a template floor).
    assert all(abs(p / n - 1) < 0.1 for p, n in zip(prompts[1:], lens[1:], strict=True))
    # Linear: the slope over 192 -> 512 is within a factor 2 of the slope over 32 -> 192
    # (on a quiet machine within 15 %).
    assert 0.5 < slopes[1] / slopes[0] < 2.0
    assert ttft[2] > 5 * ttft[0]
    # Decode barely notices the prompt: TPOT within 1.5x across a 15x longer prompt.
    assert holds("TPOT, slowest prompt length's over fastest's", max(tpot) / min(tpot), at_most=1.5)


CLOSED = ("--num-requests", "8", "--input-len", "32", "--output-len", "24", "--warmup", "1")


@pytest.fixture(scope="module")
def sweep_one_slot(one_slot: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("np1")
    return clean(lambda: [bench(one_slot, tmp, "--concurrency", "1,2,4", *CLOSED)])[0]


@pytest.fixture(scope="module")
def sweep_four_slots(four_slots: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("np4")
    return clean(lambda: [bench(four_slots, tmp, "--concurrency", "1,4", *CLOSED)])[0]


# What a new user ran on -np 4 (c = 1, 2, 4, 8 x 16 requests), with short answers: about 20 s
# on a quiet machine.
USER_SWEEP = ("--concurrency", "1,2,4,8", "--num-requests", "16", "--input-len", "32",
              "--output-len", "16", "--warmup", "1")  # fmt: skip


@pytest.fixture(scope="module")
def user_sweep(four_slots: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("np4-user")
    return clean(lambda: [bench(four_slots, tmp, *USER_SWEEP, "--plot", str(tmp / "plots"))])[0]


def test_slots_bound_throughput(
    sweep_one_slot: dict[str, Any], sweep_four_slots: dict[str, Any]
) -> None:
    for name, doc in (("-np 1", sweep_one_slot), ("-np 4", sweep_four_slots)):
        print(f"\nllama-server {name}, closed loop:")
        for level in doc["levels"]:
            print("  " + row(level))
    one, four = sweep_one_slot["levels"], sweep_four_slots["levels"]
    thr1 = [fig(lvl, "request_throughput") for lvl in one]
    # One slot: c=4 gets no more than c=1 (quiet machine: within 5 %; allowed 25 %) ...
    assert thr1[2] < 1.25 * thr1[0]
    # ... and queues: at c=4 a request waits for ~3 others (median > 3x the c=1 TTFT).
    assert fig(one[2], "ttft_seconds", "p50") > 3 * fig(one[0], "ttft_seconds", "p50")
    # Four slots: batching 4 streams buys throughput (quiet machine: about 1.4x; on 2 CPU
    # cores a 4-sequence decode step costs ~3x a single one).
    assert fig(four[1], "request_throughput") > 1.15 * fig(four[0], "request_throughput")


def test_no_knee_below_the_capacity_from_noise(user_sweep: dict[str, Any]) -> None:
    # What a new user was shown on this sweep: "knee: c=2" from a dip (1.44 -> 1.17 -> 1.60
    # req/s) below "capacity: c=4", whose throughput had risen past both. On a shared
    # machine a level's pace can change (another process on the cores), so where the knee
    # falls depends on the run (c=8, where requests queue for the 4 slots; none when 16
    # requests cannot tell; a lower level when the engine was CPU-bound there); what must
    # hold on any run is that a knee is never followed by a rise the intervals show, a dip
    # is named, and an idle client is never called the bottleneck.
    doc = user_sweep
    levels, knee, cap = doc["levels"], doc["knee"], doc["capacity"]
    print("\nllama-server -np 4, c = 1, 2, 4, 8 x 16:")
    for level in levels:
        low, high = level["throughput_ci"]["request_throughput"]
        ttft = level["ttft_seconds"]
        print(f"  c={level['concurrency']}: {fig(level, 'request_throughput'):.2f} req/s "
              f"({low:.2f}-{high:.2f}), TTFT p50 {ttft['p50']:.3f}s {ttft['ci']['p50']}, "
              f"client CPU {level['client']['cpu_share']:.2f}")  # fmt: skip
        assert low <= fig(level, "request_throughput") <= high
        assert level["ttft_seconds"]["ci"]["p50"] is not None
        # The client idles at a CPU engine's pace: never the bottleneck then.
        assert level["client"]["cpu_share"] < CPU_BUSY_SHARE
        assert level["client"]["client_bound"] is False
    print(f"  knee {knee['level']} (undecided {knee['undecided']}); capacity {cap['level']} "
          f"({cap.get('trend')}, {cap.get('bounded_by')}); warnings {doc['warnings']}")  # fmt: skip
    if knee["level"] is not None:
        k = next(i for i, lvl in enumerate(levels) if lvl["level"] == knee["level"])
        for later in levels[k + 1 :]:
            assert not rose(throughput_ratio(levels[k - 1], later)), later["level"]
            assert not rose(throughput_ratio(levels[k], later)), later["level"]
        # So a capacity above the knee serves no more than the knee's last scaling level.
        if cap["level"] is not None and cap["level"]["concurrency"] > knee["level"]["concurrency"]:
            assert cap["trend"] in ("flat", "unclear"), cap
    # Every dip the intervals show is named: a level below an earlier one, then a rise.
    for i, level in enumerate(levels):
        dipped = any(fell(throughput_ratio(e, level)) for e in levels[:i]) and any(
            rose(throughput_ratio(level, e)) for e in levels[i + 1 :]
        )
        named = any(w == {**w, "level": level["level"], "kind": "dip"} for w in doc["warnings"])
        assert dipped == named, level["level"]


def test_littles_law_closed_loop(
    sweep_one_slot: dict[str, Any], sweep_four_slots: dict[str, Any]
) -> None:
    for doc in (sweep_one_slot, sweep_four_slots):
        for level in doc["levels"]:
            little = level["littles_law"]
            # L = λW within 10 % over the level (every request succeeded).
            assert little["ratio"] == pytest.approx(1.0, rel=0.1)
            # The client held C requests in flight while it was sending (within 10 %).
            held = little["arrival_window"]["mean_in_flight"]
            assert held == pytest.approx(level["concurrency"], rel=0.1)


def service_rate(level: dict[str, Any]) -> float:
    """Requests per second one slot serves back to back: 1 / median E2E at c=1.

    The closed loop's throughput also counts the client's turnaround between two requests
    (the slot idles then) and any stall, so it can sit on either side of what the open loop
    gets; the median E2E is the slot's own pace, which a backlog keeps it at."""
    return 1.0 / float(statistics.median(r["e2e_seconds"] for r in level["requests"]))


def ttft_growth(level: dict[str, Any]) -> float:
    """Least-squares slope of TTFT against the scheduled arrival instant (seconds of queueing
    gained per second of arrivals): ~0 for a level the server keeps up with."""
    points = [(r["t_sched_offset_seconds"], r["ttft_seconds"]) for r in level["requests"]]
    return statistics.linear_regression(*zip(*points, strict=True)).slope


OVERLOAD = (1.25, 2.0, 4.0)
OVERLOADED = 1.1  # offered / served that counts as above capacity (nominal 1.25 at the least)


def kept_up(docs: Docs) -> list[str]:
    """Open levels the slot kept up with: the machine was slower while the closed loop ran
    (a run here: 2.28 req/s then, 3.1 in the open loop), so the capacity and every rate
    taken from it came out low, and the lowest level was not above capacity."""
    found = []
    for level in docs[1]["levels"]:
        load = level["rate"] / fig(level, "request_throughput")
        if load < OVERLOADED:
            found.append(f"{level['rate']:g}/s: offered only {load:.2f}x what was served")
    return found


def test_open_loop_reveals_overload_closed_loop_hides_it(one_slot: str, tmp_path: Path) -> None:
    shape = ("--input-len", "32", "--output-len", "8", "--warmup", "1")

    def run() -> list[dict[str, Any]]:
        closed = bench(one_slot, tmp_path, "--concurrency", "1", "--num-requests", "12", *shape)
        capacity = service_rate(closed["levels"][0])
        rates = ",".join(f"{capacity * k:.2f}" for k in OVERLOAD)
        opened = bench(one_slot, tmp_path, "--mode", "rate", "--levels", rates,
                       "--num-requests", "24", *shape)  # fmt: skip
        return [closed, opened]

    closed, opened = clean(run, kept_up)
    capacity = service_rate(closed["levels"][0])
    print(f"\nllama-server -np 1: closed loop c=1 (1/median E2E {capacity:.2f} req/s), then open:")
    for level in [*closed["levels"], *opened["levels"]]:
        print("  " + row(level))
    growth = [ttft_growth(lvl) for lvl in opened["levels"]]
    served = [fig(lvl, "request_throughput") for lvl in opened["levels"]]
    loads = [lvl["rate"] / t for lvl, t in zip(opened["levels"], served, strict=True)]
    print(f"  TTFT growth (s/s) {', '.join(f'{g:.2f}' for g in growth)}; "
          f"offered/served {', '.join(f'{k:.2f}' for k in loads)}")  # fmt: skip
    # Above capacity the queue grows while requests arrive: at k x the slot's rate, each
    # second of arrivals brings k seconds of work, so TTFT gains k - 1 seconds per second
    # (0.25, 1 and 3 here). Seed 7's first 24 arrivals, fitted the same way, come 1.18x
    # faster than the rate: a quiet run measured 0.49 / 1.38 / 3.66 at offered/served 1.26 /
    # 2.03 / 3.94, i.e. 1.18 k - 1 on every level. This holds whatever the slot's pace in
    # each level: a machine running one level 45 % slower than another (the spread seen in a
    # shared run, where the tail of the last request, bounded by N / rate, did not keep its
    # order) moves 0.25 / 1 / 3 to 0.9 / 1.8 / 3.2, still in order; so the growth is
    # asserted in order, and far apart between the ends (nominal 2.75).
    assert growth[0] < growth[1] < growth[2]
    assert growth[2] - growth[0] > 1.0
    # At 4x the slot serves less than half what arrives (nominal a quarter).
    assert served[2] < opened["levels"][2]["rate"] / 2
    # The tail grows too between the ends (N/mu x 0.2 vs 0.75 at a steady pace; the middle
    # level is within the machine's noise of either, so it is not ranked).
    p99 = [fig(lvl, "ttft_seconds", "p99") for lvl in opened["levels"]]
    assert p99[0] < p99[2]
    # The closed loop, at that same capacity, reports a tail several times smaller (> 3x).
    assert fig(closed["levels"][0], "ttft_seconds", "p99") < p99[0] / 3
    # And in-flight grows while requests arrive only in the open loop.
    top = opened["levels"][-1]["littles_law"]["arrival_window"]["growth"]
    flat = closed["levels"][0]["littles_law"]["arrival_window"]["growth"]
    assert top > 1.3
    assert flat == pytest.approx(1.0, abs=0.1)


def test_prompt_cache_cuts_ttft(one_slot: str, tmp_path: Path) -> None:
    args = ("--concurrency", "1", "--num-requests", "3", "--warmup", "1", "--input-len", "512",
            "--output-len", "4")  # fmt: skip
    docs = clean(lambda: [bench(one_slot, tmp_path, *args),
                          bench(one_slot, tmp_path, *args, "--no-cache-bust")])  # fmt: skip
    fresh, same = (doc["levels"][0] for doc in docs)
    a, b = fig(fresh, "ttft_seconds", "p50"), fig(same, "ttft_seconds", "p50")
    print(f"\nllama-server -np 1, 512-token prompt: fresh TTFT p50 {a:.3f}s, repeated {b:.3f}s "
          f"({1 - b / a:.0%} less)")  # fmt: skip
    # llama-server reuses the slot's KV for the common prefix: only the tail is prefilled.
    # A quiet machine shows > 90 % less; asserted: at least half.
    assert b < 0.5 * a
