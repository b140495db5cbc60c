"""prober.load.workload: length distributions, trace parsing and replay, shared prefixes in the
prompts; plain numbers and small files, seeded."""

from __future__ import annotations

import collections
import importlib.util
import itertools
import json
import math
import os
import random
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from prober.load import workload
from prober.load.workload import (
    Empirical,
    Fixed,
    Replay,
    TraceError,
    TraceRequest,
    Uniform,
    check_trace,
    lognormal,
    normal,
    read_trace,
    replay,
    resolve_trace,
)
from prober.prompts import PromptBuilder, SharedPrefix

ROOT = Path(__file__).resolve().parents[2]
N = 20_000


def draws(sampler: workload.LengthSampler, n: int = N, seed: int = 1) -> list[int]:
    rng = random.Random(seed)
    return [sampler.draw(rng) for _ in range(n)]


# -- lengths ------------------------------------------------------------------------------------


def test_fixed_and_uniform() -> None:
    assert set(draws(Fixed(77), 100)) == {77}
    values = draws(Uniform(10, 20))
    assert min(values) == 10
    assert max(values) == 20
    assert statistics.fmean(values) == pytest.approx(15, rel=0.01)
    assert draws(Uniform(10, 20)) == values  # seeded


def test_truncated_normal_has_the_truncated_mean_and_no_mass_piled_on_the_bounds() -> None:
    mu, sd, low, high = 100.0, 30.0, 50, 200
    values = draws(normal(mu, sd, low, high))
    assert low <= min(values)
    assert max(values) <= high
    unit = statistics.NormalDist()
    a, b = (low - 0.5 - mu) / sd, (high + 0.5 - mu) / sd
    expected = mu + sd * (unit.pdf(a) - unit.pdf(b)) / (unit.cdf(b) - unit.cdf(a))
    assert statistics.fmean(values) == pytest.approx(expected, rel=0.01)
    # Clipping would put all of Φ(a) ≈ 5 % on 50; truncation gives 50 the weight of one integer.
    at_low = values.count(low) / N
    assert at_low < 0.01
    assert at_low == pytest.approx(values.count(low + 1) / N, abs=0.003)


def test_lognormal_median_mean_and_bounds() -> None:
    values = draws(lognormal(300, 1.0, 1, 1_000_000))
    assert statistics.median(values) == pytest.approx(300, rel=0.03)
    assert statistics.fmean(values) == pytest.approx(300 * math.exp(0.5), rel=0.04)
    tight = draws(lognormal(300, 1.0, 200, 400))
    assert min(tight) == 200
    assert max(tight) == 400
    assert lognormal(300, 1.0, 1, 1_000_000).nominal == 300


def test_a_window_in_the_far_tail_is_drawn_accurately() -> None:
    """z from 5 to 6: probabilities near 1 would lose their digits; the mirror keeps them."""
    sampler = normal(100, 10, 150, 160)
    values = draws(sampler, 5000)
    assert min(values) >= 150
    assert max(values) <= 160
    assert statistics.fmean(values) < 153  # the density falls fast: most draws near 150
    assert 150 <= sampler.nominal <= 152


def test_a_window_without_mass_is_refused() -> None:
    with pytest.raises(ValueError, match="holds less than"):
        normal(100, 1, 10_000, 20_000)
    with pytest.raises(ValueError, match="1 <= min <= max"):
        lognormal(100, 1, 50, 10)


def test_empirical_weights_and_median() -> None:
    sampler = Empirical([10, 20, 30], [1, 0, 3])
    counts = collections.Counter(draws(sampler))
    assert counts[20] == 0
    assert counts[30] / counts[10] == pytest.approx(3, rel=0.05)
    assert sampler.nominal == 30
    assert Empirical([5, 1, 9]).nominal == 5
    assert set(draws(Empirical([5, 1, 9]), 300)) == {1, 5, 9}
    with pytest.raises(ValueError, match="not all be 0"):
        Empirical([1, 2], [0, 0])


# -- traces ---------------------------------------------------------------------------------------

MOONCAKE = [
    '{"timestamp": 0, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 48]}',
    '{"timestamp": 27482, "input_length": 6472, "output_length": 26, "hash_ids": [46, 47, 49]}',
    '{"timestamp": 30535, "input_length": 6955, "output_length": 14, "hash_ids": []}',
    '{"timestamp": 30535, "input_length": 512, "output_length": 1}',
]


def write(tmp_path: Path, lines: list[str], name: str = "t.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_mooncake_lines_are_read_as_they_are(tmp_path: Path) -> None:
    path = write(tmp_path, MOONCAKE)
    assert list(read_trace(path)) == [
        TraceRequest(0.0, 6955, 52, (46, 47, 48)),
        TraceRequest(27482.0, 6472, 26, (46, 47, 49)),
        TraceRequest(30535.0, 6955, 14, ()),
        TraceRequest(30535.0, 512, 1, ()),
    ]
    summary = check_trace(path)
    assert (summary.requests, summary.first_ms, summary.last_ms) == (4, 0.0, 30535.0)
    assert summary.shares_prefixes
    assert summary.period_seconds == pytest.approx(30.535 * 4 / 3)
    assert summary.mean_rate == pytest.approx(4 / (30.535 * 4 / 3))


GOOD = '{"timestamp": 5, "input_length": 10, "output_length": 3}'
BAD_LINES = [
    pytest.param("not json", "not JSON", id="not-json"),
    pytest.param("[1, 2]", "expected a JSON object, got list", id="not-an-object"),
    pytest.param('{"timestamp": 9, "output_length": 3}', 'missing "input_length"', id="missing"),
    pytest.param('{"timestamp": 1, "input_length": 10, "output_length": 3}',
                 "timestamp 1 is before the previous line's 5: sort the trace", id="unsorted"),
    pytest.param('{"timestamp": -5, "input_length": 10, "output_length": 3}',
                 "timestamp must be milliseconds >= 0, got -5", id="negative-timestamp"),
    pytest.param('{"timestamp": NaN, "input_length": 10, "output_length": 3}',
                 "timestamp must be milliseconds >= 0, got NaN", id="nan-timestamp"),
    pytest.param('{"timestamp": true, "input_length": 10, "output_length": 3}',
                 "timestamp must be milliseconds >= 0, got true", id="bool-timestamp"),
    pytest.param('{"timestamp": 9, "input_length": -10, "output_length": 3}',
                 "input_length must be 1..1000000, got -10", id="negative-length"),
    pytest.param('{"timestamp": 9, "input_length": 10, "output_length": 0}',
                 "output_length must be 1..1000000, got 0", id="zero-output"),
    pytest.param('{"timestamp": 9, "input_length": 10.5, "output_length": 3}',
                 "input_length must be 1..1000000, got 10.5", id="fractional-length"),
    pytest.param('{"timestamp": 9, "input_length": 10, "output_length": "3"}',
                 'output_length must be 1..1000000, got "3"', id="string-length"),
    pytest.param('{"timestamp": 9, "input_length": 10, "output_length": 3, "hash_ids": 4}',
                 "hash_ids must be a list", id="hash-ids-not-a-list"),
    pytest.param('{"timestamp": 9, "input_length": 10, "output_length": 3, "hash_ids": [1, -2]}',
                 "hash_ids hold 0..2^63-1, got -2", id="negative-hash-id"),
    pytest.param('{"timestamp": 9, "input_length": 10, "output_length": 3, "hash_ids": ['
                 + ", ".join(["1"] * 4097) + "]}", "hash_ids must be a list of at most 4096",
                 id="too-many-hash-ids"),
    pytest.param('{"timestamp": 604800006, "input_length": 10, "output_length": 3}',
                 "more than 604800000 ms after the first line", id="span-over-a-week"),
    pytest.param('{"timestamp": 9, "input_length": 10, "output_length": 3, "pad": "'
                 + "x" * 70_000 + '"}', "longer than 65536 bytes", id="huge-line"),
]  # fmt: skip


@pytest.mark.parametrize(("line", "problem"), BAD_LINES)
def test_each_bad_line_is_one_error_naming_the_file_and_line(
    tmp_path: Path, line: str, problem: str
) -> None:
    # Line 3 of the file: a good line, a blank one (skipped but counted), then the bad one.
    path = write(tmp_path, [GOOD, "", line, GOOD])
    with pytest.raises(TraceError) as info:
        check_trace(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: {problem}"), message
    assert "\n" not in message


def test_invalid_utf8_is_a_line_error(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_bytes(GOOD.encode() + b"\n" + b'{"timestamp": "\xff"}\n')
    with pytest.raises(TraceError, match=r":2: not JSON"):
        check_trace(path)


def test_file_faults_name_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TraceError, match=r"nope\.jsonl: cannot read: No such file"):
        check_trace(tmp_path / "nope.jsonl")
    with pytest.raises(TraceError, match=r"empty\.jsonl: holds no requests"):
        check_trace(write(tmp_path, ["", "  "], "empty.jsonl"))
    with pytest.raises(TraceError, match=r"cannot read"):
        check_trace(tmp_path)  # a directory
    big = write(tmp_path, [GOOD] * 100, "big.jsonl")
    monkeypatch.setattr(workload, "MAX_TRACE_BYTES", 1000)
    with pytest.raises(TraceError, match=r"big\.jsonl: 5\d\d\d bytes, over the bound"):
        check_trace(big)


def test_reading_streams_the_file(tmp_path: Path) -> None:
    """A fault far down the file is only met when the replay gets there: nothing is read ahead."""
    path = write(tmp_path, [GOOD] * 3 + ["oops"])
    lines = read_trace(path)
    assert [r.timestamp_ms for r in itertools.islice(lines, 3)] == [5.0, 5.0, 5.0]
    with pytest.raises(TraceError, match=":4: not JSON"):
        next(lines)


def test_builtin_traces_resolve() -> None:
    assert resolve_trace("builtin:diurnal") == ROOT / "prober" / "load" / "traces" / "diurnal.jsonl"
    with pytest.raises(ValueError, match=r"no built-in trace 'x' \(there are: diurnal\)"):
        resolve_trace("builtin:x")
    assert resolve_trace("a/b.jsonl") == Path("a/b.jsonl")


# -- replay ---------------------------------------------------------------------------------------

# Four lines over 3 s: one pass lasts 3 s × 4 / 3 = 4 s.
SMALL = [
    '{"timestamp": 1000, "input_length": 100, "output_length": 5, "hash_ids": [7, 8]}',
    '{"timestamp": 2000, "input_length": 200, "output_length": 6}',
    '{"timestamp": 2000, "input_length": 300, "output_length": 7, "hash_ids": [7, 9]}',
    '{"timestamp": 4000, "input_length": 400, "output_length": 8}',
]


def plan(tmp_path: Path, **kw: object) -> Replay:
    path = write(tmp_path, SMALL)
    return Replay(path, check_trace(path), **kw)  # type: ignore[arg-type]


def test_replay_once_in_time_scale(tmp_path: Path) -> None:
    out = list(replay(plan(tmp_path, time_scale=0.5, loop=False)))
    assert [r.offset for r in out] == [0.0, 0.5, 0.5, 1.5]  # from the first line, halved
    assert [(r.prompt_tokens, r.max_tokens) for r in out] == [(100, 5), (200, 6), (300, 7),
                                                             (400, 8)]  # fmt: skip
    assert out[0].prefix is not None
    assert out[1].prefix is None
    assert plan(tmp_path, time_scale=0.5).mean_rate == pytest.approx(4 / 2.0)


def test_replay_loops_one_mean_gap_after_the_last_line(tmp_path: Path) -> None:
    out = list(itertools.islice(replay(plan(tmp_path)), 12))
    assert [r.offset for r in out] == [0, 1, 1, 3, 4, 5, 5, 7, 8, 9, 9, 11]
    first, second = out[0].prefix, out[4].prefix
    assert first is not None
    assert second is not None
    # A second pass is a new set of prefixes: the cache holds the first one's.
    assert first.hash_ids[0] != second.hash_ids[0]
    assert first.hash_ids[0] & (2**64 - 1) == second.hash_ids[0] & (2**64 - 1) == 7


def test_rate_scale_copies_or_thins_on_the_same_timeline(tmp_path: Path) -> None:
    doubled = list(replay(plan(tmp_path, rate_scale=2.0, loop=False)))
    assert [r.offset for r in doubled] == [0, 0, 1, 1, 1, 1, 3, 3]
    a, b = doubled[0].prefix, doubled[1].prefix
    assert a is not None
    assert b is not None
    assert a.hash_ids != b.hash_ids
    many = plan(tmp_path, rate_scale=0.25, seed=4)
    kept = list(itertools.islice(replay(many), 4000))
    passes = kept[-1].offset / 4.0
    assert len(kept) / passes == pytest.approx(4 * 0.25, rel=0.05)
    assert [r.offset for r in itertools.islice(replay(many), 50)] == [
        r.offset for r in itertools.islice(replay(plan(tmp_path, rate_scale=0.25, seed=4)), 50)
    ]  # seeded


def test_each_replica_replays_its_share_of_the_lines(tmp_path: Path) -> None:
    zero = list(replay(plan(tmp_path, loop=False, shard=(0, 2))))
    one = list(replay(plan(tmp_path, loop=False, shard=(1, 2))))
    assert [r.prompt_tokens for r in zero] == [100, 300]
    assert [r.prompt_tokens for r in one] == [200, 400]
    assert plan(tmp_path, shard=(1, 2)).mean_rate == pytest.approx(0.5)


# -- shared prefixes in the prompts ---------------------------------------------------------------


def test_requests_sharing_leading_hash_ids_share_their_leading_text() -> None:
    builder = PromptBuilder()
    a, _ = builder.build_shared(100, SharedPrefix((1, 2, 3), 16))
    b, _ = builder.build_shared(100, SharedPrefix((1, 2, 9), 16))
    c, _ = builder.build_shared(100, SharedPrefix((5, 2, 3), 16))
    wa, wb, wc = a.split(), b.split(), c.split()
    assert wa[:32] == wb[:32]  # two shared blocks of 16 words
    assert wa[32:48] != wb[32:48]  # the third block differs
    assert wa[:16] != wc[:16]  # a different first id: nothing shared
    assert wa[16:32] == wc[16:32]  # the same id makes the same block, here as anywhere
    assert a.endswith("uses these words:")  # the instruction comes last, after the blocks


def test_prefix_prompts_are_sized_by_the_calibration() -> None:
    builder = PromptBuilder()
    text, words = builder.build_shared(1000, SharedPrefix((1,), 512))
    assert words == len(text.split()) == builder.words_for(1000)
    # 512 words of the one block, then the request's own words up to the length
    again, _ = builder.build_shared(1000, SharedPrefix((1,), 512))
    assert text.split()[:512] == again.split()[:512]
    assert text.split()[512:600] != again.split()[512:600]


def test_blocks_are_salted_per_run_unless_cache_busting_is_off() -> None:
    prefix = SharedPrefix((42,), 32)
    one, _ = PromptBuilder().build_shared(64, prefix)
    two, _ = PromptBuilder().build_shared(64, prefix)
    assert one.split()[:32] != two.split()[:32]  # a new run never hits the last run's cache
    fixed = [PromptBuilder(cache_bust=False).build_shared(64, prefix)[0] for _ in range(2)]
    assert fixed[0] == fixed[1]
    seeded = [PromptBuilder(seed=3).build_shared(64, prefix)[0] for _ in range(2)]
    assert seeded[0] == seeded[1]


# -- the shipped trace --------------------------------------------------------------------------


def test_the_shipped_trace_is_the_generator_output_and_has_its_shape() -> None:
    spec = importlib.util.spec_from_file_location("make_trace", ROOT / "bench" / "make_trace.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    path = ROOT / "prober" / "load" / "traces" / "diurnal.jsonl"
    text = path.read_text()
    assert module.generate() == text, "run: .venv/bin/python bench/make_trace.py"
    assert len(text.encode()) < 200_000
    summary = check_trace(path)
    assert 1000 <= summary.requests <= 3000
    assert summary.period_seconds == pytest.approx(300, rel=0.01)
    # A daily cycle: the busiest fifth of the day has well over twice the quietest's requests.
    lines = [json.loads(line) for line in text.splitlines()]
    fifths = collections.Counter(int(r["timestamp"] / 60_000) for r in lines)
    assert max(fifths.values()) > 2.5 * min(fifths.values())
    # Bursts: some 2-second window holds far more than the busiest fifth's mean.
    windows = collections.Counter(int(r["timestamp"] / 2000) for r in lines)
    assert max(windows.values()) > 1.8 * max(fifths.values()) / 30
    # Heavy-tailed, mixed lengths; leading blocks shared between requests.
    inputs = sorted(r["input_length"] for r in lines)
    assert inputs[int(0.99 * len(inputs))] > 5 * statistics.median(inputs)
    firsts = collections.Counter(r["hash_ids"][0] for r in lines if r["hash_ids"])
    assert firsts.most_common(1)[0][1] > 50


# -- the files a replay reads again, and its pace (issue 38 items 1 and 2) ---------------------

AT_ZERO = '{"timestamp": 0, "input_length": 10, "output_length": 2}'


def test_a_fifo_is_refused_before_any_byte_and_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.jsonl"
    os.mkfifo(fifo)  # nobody writes: a blocking open() would wait for ever
    with pytest.raises(TraceError, match=r"fifo\.jsonl: cannot read: not a regular file") as info:
        check_trace(fifo)
    assert info.value.reason == "unreadable"


def test_the_pace_bounds_what_falls_due_at_once_and_per_second(tmp_path: Path) -> None:
    assert check_trace(write(tmp_path, [AT_ZERO] * 10_000)).requests == 10_000
    with pytest.raises(TraceError, match=r":10001: 10001 requests due 0.000 s into a pass") as info:
        check_trace(write(tmp_path, [AT_ZERO] * 10_001))
    assert info.value.reason == "pace"
    # Copies count: 5,001 lines twice over is past the bucket.
    with pytest.raises(TraceError, match=r":5001: 10002 requests due"):
        check_trace(write(tmp_path, [AT_ZERO] * 5_001), rate_scale=2.0)
    # 30 lines 1 ms apart sped up 10,000 times: 30 requests in 3 µs fit the bucket's depth.
    lines = [f'{{"timestamp": {i}, "input_length": 1, "output_length": 1}}' for i in range(30)]
    assert check_trace(write(tmp_path, lines), time_scale=1e-4).requests == 30


def first_pass(tmp_path: Path, **kw: object) -> tuple[Path, Iterator[workload.Request]]:
    """A looping replay of `SMALL` with its first pass taken."""
    spec = plan(tmp_path, **kw)
    requests = replay(spec)
    assert len(list(itertools.islice(requests, 4))) == 4
    return spec.path, requests


def fifo_in_place(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def sent_until_the_fault(requests: Iterator[workload.Request]) -> TraceError:
    sent = 0
    try:
        for _ in requests:
            sent += 1
            assert sent <= 10_000  # a burst ends at the bucket's depth, never past it
    except TraceError as exc:
        return exc
    raise AssertionError("the replay went on")


def swap_in(path: Path, lines: list[str]) -> None:
    new = path.with_suffix(".new")
    new.write_text("".join(line + "\n" for line in lines))
    os.replace(new, path)


@pytest.mark.parametrize(
    ("change", "reason", "problem"),
    [
        (lambda p: p.write_text(""), "empty", "a pass of the replay read no request"),
        (lambda p: p.write_text("\n  \n\n"), "empty", "a pass of the replay read no request"),
        (lambda p: p.unlink(), "unreadable", "cannot read: No such file"),
        (fifo_in_place, "unreadable", "not a regular file"),
        (lambda p: swap_in(p, [AT_ZERO] * 10_001), "pace", "10001 requests due 0.000 s"),
        (lambda p: swap_in(p, [*SMALL, SMALL[-1].replace("4000", "9000")]), "changed",
         "runs 8.000 s into a pass, past the 3.000 s checked"),
    ],
    ids=["emptied", "blank-lines", "deleted", "fifo", "burst", "longer"],
)  # fmt: skip
def test_each_pass_is_checked_as_the_first_was(
    tmp_path: Path, change: Callable[[Path], object], reason: str, problem: str
) -> None:
    path, requests = first_pass(tmp_path)
    change(path)
    fault = sent_until_the_fault(requests)
    assert fault.reason == reason
    assert problem in str(fault)


def test_a_pass_replaced_by_a_good_file_goes_on_from_its_own_first_line(tmp_path: Path) -> None:
    path, requests = first_pass(tmp_path)
    swap_in(path, [line.replace('"timestamp": ', '"timestamp": 9') for line in SMALL])
    # 91000 .. 94000 ms: the same shape, its offsets from its own first line.
    assert [r.offset for r in itertools.islice(requests, 4)] == [4, 5, 5, 7]
