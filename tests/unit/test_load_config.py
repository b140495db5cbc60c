"""Workload options end to end without a server: the configuration (each fault one line naming
its field), the seeded request stream a load config makes, the load driver's absolute
schedule under an injected clock, and bench's flags for the same options."""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import logging
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from prober.bench.cli import add_bench_parser, config_from_args
from prober.bench.runner import BenchRunner, PrefetchingPrompts
from prober.capacity.state import EngineWatch
from prober.load.driver import SHED, LoadDriver, mean_rate, requests
from prober.metrics import Metrics
from prober.prompts import PromptBuilder, SharedPrefix
from prober.record import Recorder
from prober.result import Outcome, RequestResult
from prober.settings import ConfigError, LoadConfig, Settings, TargetConfig, load_settings
from prober.targets import Target
from tests.support.results import recorder

ROOT = Path(__file__).resolve().parents[2]
TARGET = "targets:\n  - name: a\n    url: http://x/v1\n    model: m\n"
TRACE = [
    '{"timestamp": 0, "input_length": 100, "output_length": 5, "hash_ids": [1, 2]}',
    '{"timestamp": 1000, "input_length": 200, "output_length": 6, "hash_ids": [1, 3]}',
    '{"timestamp": 1500, "input_length": 300, "output_length": 7}',
    '{"timestamp": 4000, "input_length": 400, "output_length": 8}',
]


@pytest.fixture(autouse=True)
def trace_file(clean_env: None, tmp_path: Path) -> None:
    """`trace.jsonl` in the working directory (a fresh folder: tests/unit/conftest.py)."""
    (tmp_path / "trace.jsonl").write_text("".join(line + "\n" for line in TRACE))


def load(tmp_path: Path, load_yaml: str, environ: dict[str, str] | None = None) -> Settings:
    path = tmp_path / "config.yaml"
    path.write_text(TARGET + "    load: " + load_yaml + "\n")
    return load_settings(path, environ or {})


def problems(tmp_path: Path, load_yaml: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load(tmp_path, load_yaml)
    return info.value.problems


# -- configuration --------------------------------------------------------------------------

P = "targets[0].load."
INVALID = [
    ("{rate: 1, prompt_tokens: {dist: lognormal, median: 500, sigma: 1}}",
     P + "prompt_tokens.max: required by lognormal"),
    ("{rate: 1, prompt_tokens: {dist: lognormal, median: 500, sigma: 1, max: 0}}",
     P + "prompt_tokens.max: must be at least 1, got 0"),
    ("{rate: 1, max_tokens: {dist: normal, mean: 50, std: 5, min: 90, max: 80}}",
     P + "max_tokens.max: must be at least min (90), got 80"),
    ("{rate: 1, max_tokens: {dist: normal, mean: 50, std: 1, min: 900, max: 980}}",
     P + "max_tokens: [min, max] = [900, 980] holds less than 1e-09 of the distribution"),
    ("{rate: 1, prompt_tokens: {dist: uniform, min: 5, max: 9, sigma: 2}}",
     P + "prompt_tokens.sigma: not a parameter of uniform (it takes min, max)"),
    ("{rate: 1, prompt_tokens: {dist: zipf, max: 9}}",
     P + "prompt_tokens.dist: must be one of 'fixed', 'uniform', 'normal', 'lognormal' or "
     "'empirical', got 'zipf'"),
    ("{rate: 1, prompt_tokens: {max: 9}}", P + "prompt_tokens.dist: required"),
    ("{rate: 1, prompt_tokens: {dist: empirical, values: [1, 2], weights: [1]}}",
     P + "prompt_tokens.weights: must give one weight per value"),
    ("{rate: 1, prompt_tokens: {dist: empirical, values: [1, 2], weights: [0, 0]}}",
     P + "prompt_tokens.weights: must not all be 0"),
    ("{rate: 1, prompt_tokens: {dist: empirical, values: [1, true]}}",
     P + "prompt_tokens.values: must be numbers, not true or false"),
    ("{rate: 1, prompt_tokens: true}",
     P + "prompt_tokens: must be a token count or a distribution (dist: fixed | uniform | "
     "normal | lognormal | empirical), got True"),
    ("{rate: 1, prompt_tokens: 0}", P + "prompt_tokens: must be at least 1, got 0"),
    ("{rate: 1, prompt_tokens: [" + ", ".join(["1000"] * 50) + "]}",  # the value cut at 40
     P + "prompt_tokens: must be a token count or a distribution (dist: fixed | uniform | "
     "normal | lognormal | empirical), got [1000, 1000, 1000, 1000, 1000, 1000, 100"),
    ("{rate: 1, prompt_tokens: {dist: uniform, min: 5, max: 9}, prompt_tokens_spread: 0.2}",
     P + "prompt_tokens_spread: a spread needs a plain prompt_tokens: give a spread or a "
     "distribution"),
    ("{rate: 1, arrival: gamma}",
     P + "burstiness: required with arrival: gamma (1 is Poisson, below 1 burstier)"),
    ("{rate: 1, burstiness: 0.5}", P + "burstiness: only with arrival: gamma"),
    ("{rate: 1, arrival: gamma, burstiness: 0}",
     P + "burstiness: must be at least 0.01, got 0"),
    ("{rate: 1, schedule: {steps: [{seconds: 5, rate: 1}]}}",
     P + "schedule: give rate or schedule, not both"),
    ("{schedule: {steps: [{seconds: 5, rate: 0}]}}",
     P + "schedule.steps: at least one step needs a rate above 0"),
    ("{schedule: {steps: [{seconds: 0, rate: 1}]}}",
     P + "schedule.steps[0].seconds: must be greater than 0, got 0"),
    ("{schedule: {steps: []}}",
     P + "schedule.steps: List should have at least 1 item after validation, not 0"),
    ("{trace: {path: nope.jsonl}}",
     P + "trace.path: nope.jsonl: cannot read: No such file or directory"),
    ("{trace: {path: 'builtin:nope'}}",
     P + "trace.path: no built-in trace 'nope' (there are: diurnal)"),
    ("{trace: {path: trace.jsonl}, prompt_tokens: 100}",
     P + "prompt_tokens: the trace gives it: remove one of the two"),
    ("{trace: {path: trace.jsonl}, arrival: constant}",
     P + "arrival: the trace gives it: remove one of the two"),
    ("{trace: {path: trace.jsonl, time_scale: 2}, rate: 3}",
     P + "rate: sets the trace's speed: give rate or trace.time_scale, not both"),
    ("{trace: {path: trace.jsonl, time_scale: 0}}",
     P + "trace.time_scale: must be greater than 0, got 0"),
    ("{trace: {path: trace.jsonl, speed: 2}}", P + "trace.speed: unknown key"),
    ("{trace: {path: trace.jsonl, time_scale: 0.00005}}",
     P + "trace: replays at 15000 requests/s, over the bound of 10000: raise time_scale"),
    ("{trace: {path: trace.jsonl, rate_scale: 0}}",
     P + "trace.rate_scale: must be at least 0.01, got 0"),
]  # fmt: skip


@pytest.mark.parametrize(("text", "expected"), INVALID)
def test_each_workload_fault_is_one_line_naming_its_field(
    tmp_path: Path, text: str, expected: str
) -> None:
    assert problems(tmp_path, text) == [expected]


def test_a_bad_trace_line_is_named_at_config_load(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(TRACE[1] + "\n" + TRACE[0] + "\n")
    assert problems(tmp_path, "{trace: {path: bad.jsonl}}") == [
        P + "trace.path: bad.jsonl:2: timestamp 0 is before the previous line's 1000: sort the "
        "trace by timestamp"
    ]
    one = tmp_path / "one.jsonl"
    one.write_text(TRACE[0] + "\n")
    assert problems(tmp_path, "{trace: {path: one.jsonl}}") == [
        P + "trace.loop: a trace whose requests share one instant cannot loop: set loop: false"
    ]
    assert load(tmp_path, "{trace: {path: one.jsonl, loop: false}}").targets[0].load
    assert problems(tmp_path, "{trace: {path: one.jsonl, loop: false}, rate: 2}") == [
        P + "rate: the trace's requests share one instant: there is no rate to scale"
    ]


async def test_a_lone_instant_trace_is_still_sent(tmp_path: Path) -> None:
    (tmp_path / "one.jsonl").write_text(TRACE[0] + "\n" + TRACE[0] + "\n")
    cfg = load(tmp_path, "{trace: {path: one.jsonl, loop: false}}").targets[0].load
    assert cfg is not None
    clock, target = FakeClock(), recording_target()
    driver = await drive(cfg, clock, target)
    assert driver.rate == 0
    assert driver.sent == 2


def test_the_spread_shorthand_is_a_uniform_distribution(tmp_path: Path) -> None:
    cfg = load(tmp_path, "{rate: 1, prompt_tokens: 100, prompt_tokens_spread: 0.2}").targets[0]
    assert cfg.load is not None
    lengths = cfg.load.prompt_lengths(64)
    assert (lengths.dist, lengths.min, lengths.max) == ("uniform", 80, 120)
    # unset: the target's length, spread
    assert cfg.load.answer_lengths(16).model_dump(exclude_none=True) == {"dist": "fixed",
                                                                         "value": 16}  # fmt: skip
    bare = LoadConfig(rate=1, max_tokens_spread=0.5)
    assert (bare.answer_lengths(16).min, bare.answer_lengths(16).max) == (8, 24)


def test_the_environment_sets_lengths_too(tmp_path: Path) -> None:
    env = {
        "LLMPROBER_TARGETS__0__LOAD__PROMPT_TOKENS": "256",
        "LLMPROBER_TARGETS__0__LOAD__MAX_TOKENS": '{"dist": "uniform", "min": 8, "max": 32}',
    }
    cfg = load(tmp_path, "{rate: 1}", env).targets[0].load
    assert cfg is not None
    assert cfg.prompt_tokens is not None
    assert cfg.max_tokens is not None
    assert (cfg.prompt_tokens.dist, cfg.prompt_tokens.value) == ("fixed", 256)
    assert (cfg.max_tokens.min, cfg.max_tokens.max) == (8, 32)
    env = {"LLMPROBER_TARGETS__0__LOAD__MAX_TOKENS__MAX": "4"}
    assert (
        load(tmp_path, "{rate: 1, max_tokens: {dist: uniform, min: 2, max: 9}}", env)
        .targets[0]
        .load.max_tokens.max
        == 4
    )  # type: ignore[union-attr]


def doc_workload_examples() -> list[str]:
    """The `load:` examples of docs/workloads.md (every YAML block there is one)."""
    text = (ROOT / "docs" / "workloads.md").read_text()
    return re.findall(r"```yaml\n(.*?)```", text, re.S)


@pytest.mark.parametrize("example", doc_workload_examples())
def test_every_documented_workload_example_loads(tmp_path: Path, example: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(TARGET + "    load:\n" + "".join(f"      {line}\n" for line in
                                                  example.splitlines()))  # fmt: skip
    assert load_settings(path, {}).targets[0].load is not None


def test_the_workloads_doc_has_examples() -> None:
    assert len(doc_workload_examples()) >= 4


# -- the request stream ---------------------------------------------------------------------

T = TargetConfig(name="a", url="http://x/v1", model="m", prompt_tokens=64, max_tokens=16)


def first(cfg: LoadConfig, n: int, **kw: Any) -> list[Any]:
    return list(itertools.islice(requests(cfg, T, **kw), n))


def test_lengths_are_seeded_and_drawn_per_arrival() -> None:
    cfg = LoadConfig(
        rate=10, seed=7,
        prompt_tokens={"dist": "lognormal", "median": 300, "sigma": 1, "min": 10, "max": 5000},
        max_tokens={"dist": "empirical", "values": [16, 256], "weights": [3, 1]},
    )  # type: ignore[arg-type]  # fmt: skip
    out = first(cfg, 4000)
    assert out == first(cfg, 4000)  # the same seed, the same requests
    prompts = [r.prompt_tokens for r in out]
    assert min(prompts) >= 10
    assert max(prompts) <= 5000
    assert statistics.median(prompts) == pytest.approx(300, rel=0.08)
    answers = [r.max_tokens for r in out]
    assert answers.count(16) / answers.count(256) == pytest.approx(3, rel=0.15)
    assert first(LoadConfig(rate=10), 3)[0].prompt_tokens == 64  # unset: the target's


def test_each_replica_sends_its_share() -> None:
    cfg = LoadConfig(rate=8, arrival="constant")
    assert [r.offset for r in first(cfg, 3, shard=(1, 4))] == [0.5, 1.0, 1.5]
    assert mean_rate(cfg, (1, 4)) == 2
    steps = LoadConfig(schedule={"steps": [{"seconds": 1, "rate": 8}, {"seconds": 3, "rate": 0}]},
                       arrival="constant")  # type: ignore[arg-type]  # fmt: skip
    assert [r.offset for r in first(steps, 4, shard=(0, 2))] == [0.25, 0.5, 0.75, 4.0]
    assert mean_rate(steps) == 2


def test_a_trace_config_replays_the_file(tmp_path: Path) -> None:
    cfg = load(tmp_path, "{trace: {path: trace.jsonl, time_scale: 0.5, loop: false}}")
    load_cfg = cfg.targets[0].load
    assert load_cfg is not None
    out = first(load_cfg, 10)
    assert [(r.offset, r.prompt_tokens, r.max_tokens) for r in out] == [
        (0.0, 100, 5), (0.5, 200, 6), (0.75, 300, 7), (2.0, 400, 8)]  # fmt: skip
    # With rate: time is scaled so the trace's mean rate is that rate (a pass: 4 s × 4/3).
    fast = load(tmp_path, "{trace: {path: trace.jsonl}, rate: 3}").targets[0].load
    assert fast is not None
    assert mean_rate(fast) == pytest.approx(3)
    assert first(fast, 2)[1].offset == pytest.approx(1.0 * (4 / (16 / 3)) / 3)


# -- the driver's schedule, with an injected clock --------------------------------------------


class FakeClock:
    """Monotonic ns; each sleep wakes `late_ns` after its deadline, like a busy loop."""

    def __init__(self, late_ns: int = 0) -> None:
        self.now = 5_000_000_000
        self.late_ns = late_ns
        self.wakes: list[int] = []

    def __call__(self) -> int:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += int(seconds * 1e9) + self.late_ns
        self.wakes.append(self.now)
        await asyncio.sleep(0)  # let the requests started so far run


class RecordingTarget(Target):
    """Records what the driver asked for; `hold` keeps requests in flight until set."""

    sent: list[tuple[int, int, int, SharedPrefix | None]]
    hold: asyncio.Event | None = None

    async def send(  # type: ignore[override]
        self, session: Any, t_sched_ns: int, *, prompt_tokens: int | None = None,
        max_tokens: int | None = None, prefix: SharedPrefix | None = None, **_: Any,
    ) -> RequestResult:  # fmt: skip
        self.sent.append((t_sched_ns, prompt_tokens or 0, max_tokens or 0, prefix))
        if self.hold is not None:
            await self.hold.wait()
        return RequestResult(Outcome.OK, t_sched_ns, t_sched_ns, t_sched_ns)


def recording_target() -> RecordingTarget:
    target = RecordingTarget.from_config(T)
    target.sent = []
    return target


async def drive(cfg: LoadConfig, clock: FakeClock, target: RecordingTarget) -> LoadDriver:
    driver = LoadDriver(None, target, cfg, recorder(), clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    start = clock.now
    driver.start()
    await driver.arrivals_done()
    if target.hold is not None:
        target.hold.set()
    await driver.stop(1.0)
    assert clock.now >= start
    return driver


async def test_replayed_arrivals_are_sent_at_absolute_offsets(tmp_path: Path) -> None:
    """Each sleep wakes 3 ms late: a relative sleep would drift by 3 ms an arrival; the
    absolute schedule puts every t_sched exactly at start + offset."""
    cfg = load(tmp_path, "{trace: {path: trace.jsonl, time_scale: 0.5, loop: false}}")
    load_cfg = cfg.targets[0].load
    assert load_cfg is not None
    clock, target = FakeClock(late_ns=3_000_000), recording_target()
    start = clock.now
    driver = await drive(load_cfg, clock, target)
    offsets_ms = [(t - start) / 1e6 for t, *_ in target.sent]
    assert offsets_ms == [0.0, 500.0, 750.0, 2000.0]
    assert [(p, m) for _, p, m, _ in target.sent] == [(100, 5), (200, 6), (300, 7), (400, 8)]
    # The sleeps aimed at the schedule: each wake is 3 ms past its own arrival, not 3 ms
    # more per arrival.
    assert [(w - start) / 1e6 for w in clock.wakes] == [503.0, 753.0, 2003.0]
    first_prefix, second_prefix = target.sent[0][3], target.sent[1][3]
    assert first_prefix is not None
    assert second_prefix is not None
    assert first_prefix.hash_ids[0] == second_prefix.hash_ids[0]  # both start with block 1
    assert first_prefix.block_tokens == 512
    assert driver.sent == 4
    assert driver.dropped == 0


async def test_a_load_driver_starts_every_load_outcome_at_zero() -> None:
    """No `_created` series: a first load failure must be an increase from a 0 sample."""
    metrics = Metrics(CollectorRegistry())
    cfg = LoadConfig(rate=0.001, arrival="constant", schedule=None, seed=1)
    target = recording_target()
    target.hold = asyncio.Event()
    driver = LoadDriver(None, target, cfg, Recorder(metrics), clock=FakeClock(),  # type: ignore[arg-type]
                        sleep=asyncio.sleep)  # fmt: skip
    driver.start()
    target.hold.set()
    await driver.stop(1.0)
    series = "llmprober_requests_total"
    for outcome in Outcome:
        labels = {"target": T.name, "model": T.model, "mode": "load", "outcome": outcome.value}
        assert metrics.registry.get_sample_value(series, labels) is not None, outcome


async def test_arrivals_beyond_the_cap_are_dropped_and_counted(tmp_path: Path) -> None:
    cfg = LoadConfig(rate=100, arrival="constant", max_in_flight=3,
                     schedule=None, seed=1)  # fmt: skip
    clock, target = FakeClock(), recording_target()
    target.hold = asyncio.Event()  # nothing finishes
    driver = LoadDriver(None, target, cfg, recorder(), clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    driver.start()
    for _ in range(20):
        await asyncio.sleep(0)
    await driver.set_rate(0)  # set_rate still stops the arrivals
    target.hold.set()
    await driver.stop(1.0)
    assert driver.sent == 3
    assert driver.dropped > 0
    assert len(target.sent) == 3


async def test_a_trace_that_turns_bad_ends_the_load_not_the_daemon(tmp_path: Path) -> None:
    cfg = load(tmp_path, "{trace: {path: trace.jsonl, loop: false}}").targets[0].load
    assert cfg is not None
    (tmp_path / "trace.jsonl").write_text(TRACE[0] + "\n" + "garbage\n")
    clock, target = FakeClock(), recording_target()
    driver = await drive(cfg, clock, target)
    assert driver.sent == 1  # the first line went out, then the load ended quietly


async def test_a_burst_falling_due_at_once_lets_the_loop_run(tmp_path: Path) -> None:
    """3,000 lines at one instant: the driver yields while it dispatches and drops them."""
    line = '{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
    (tmp_path / "burst.jsonl").write_text(line * 3000)
    cfg = load(tmp_path, "{trace: {path: burst.jsonl, loop: false}, max_in_flight: 1}")
    load_cfg = cfg.targets[0].load
    assert load_cfg is not None
    clock, target = FakeClock(), recording_target()
    target.hold = asyncio.Event()
    driver = LoadDriver(None, target, load_cfg, recorder(), clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    seen: list[int] = []

    async def watch() -> None:
        while driver.dropped < 2999:
            seen.append(driver.dropped)
            await asyncio.sleep(0)

    watcher = asyncio.create_task(watch())
    driver.start()
    await driver.arrivals_done()
    await watcher
    target.hold.set()
    await driver.stop(1.0)
    assert driver.dropped == 2999
    assert any(0 < n < 2999 for n in seen)  # the watcher ran in the middle of the burst


async def test_set_rate_replaces_a_schedule_with_a_plain_rate() -> None:
    cfg = LoadConfig(schedule={"steps": [{"seconds": 10, "rate": 1}]}, arrival="constant")  # type: ignore[arg-type]
    clock, target = FakeClock(), recording_target()
    driver = LoadDriver(None, target, cfg, recorder(), clock=clock, sleep=clock.sleep)  # type: ignore[arg-type]
    assert driver.rate == 1
    await driver.set_rate(4)
    for _ in range(10):
        await asyncio.sleep(0)
    await driver.stop(0)
    gaps = {b[0] - a[0] for a, b in itertools.pairwise(target.sent)}
    assert gaps == {250_000_000}  # 4/s, constant


# -- bench's flags for the same options ---------------------------------------------------------


def bench(*argv: str) -> Any:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--url", "http://127.0.0.1:1/v1", "--model", "m", *argv])
    return config_from_args(args)


def test_bench_takes_length_distributions_as_yaml() -> None:
    cfg = bench("--input-len", "{dist: lognormal, median: 512, sigma: 1, max: 8192}",
                "--output-len", "{dist: uniform, min: 16, max: 256}", "--seed", "3")  # fmt: skip
    assert cfg.nominal_input == pytest.approx(512, rel=0.01)
    assert cfg.as_json()["input_len"] == {"dist": "lognormal", "median": 512.0, "sigma": 1.0,
                                          "max": 8192}  # fmt: skip
    assert bench("--input-len", "300").as_json()["input_len"] == 300  # a count stays a number
    assert cfg.target_config().max_tokens == 136


def test_bench_levels_stay_mean_rates_for_every_shape() -> None:
    gamma = bench("--mode", "rate", "--levels", "2,4", "--arrival", "gamma", "--burstiness", "0.5")
    assert (gamma.load_config(4).rate, gamma.load_config(4).burstiness) == (4, 0.5)
    shape = "{steps: [{seconds: 3, rate: 1}, {seconds: 1, rate: 5}]}"
    steps = bench("--mode", "rate", "--levels", "2,4", "--schedule", shape)
    scaled = steps.load_config(4).schedule
    assert scaled is not None
    assert [s.rate for s in scaled.steps] == [2, 10]
    replay = bench("--mode", "rate", "--levels", "2", "--trace", "builtin:diurnal")
    assert mean_rate(replay.load_config(2)) == pytest.approx(2)
    assert replay.nominal_input == round(replay.trace.summary.mean_input)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--trace", "builtin:diurnal"), "--trace: an open-loop option: add --mode rate"),
        (("--mode", "rate", "--levels", "1", "--trace", "builtin:diurnal", "--input-len", "9"),
         "--input-len: the trace gives it: remove one of the two"),
        (("--mode", "rate", "--levels", "1", "--trace", "{path: 'builtin:diurnal', loop: 3}"),
         "--trace: loop: must be a bool, got 3"),
        (("--mode", "rate", "--levels", "1", "--trace", "{path: 'builtin:diurnal', "
          "time_scale: 2}"), "--trace: time_scale: each level's rate sets the trace's speed"),
        (("--mode", "rate", "--levels", "1", "--trace", "x.jsonl"),
         "--trace: path: x.jsonl: cannot read: No such file or directory"),
        (("--mode", "rate", "--levels", "1", "--arrival", "gamma"),
         "--burstiness: required with arrival: gamma"),
        (("--mode", "rate", "--levels", "1", "--schedule", "{steps: ["), "--schedule: not YAML"),
        (("--mode", "rate", "--levels", "1", "--schedule", "{steps: [{seconds: 1, rate: 0}]}"),
         "--schedule: steps: at least one step needs a rate above 0"),
        (("--input-len", "{dist: normal, mean: 10, std: 2}"),
         "--input-len: max: required by normal"),
        (("--output-len", "lots"), "--output-len: must be a token count or a distribution"),
        (("--no-cache-bust", "--input-len", "{dist: uniform, min: 5, max: 9}"),
         "--no-cache-bust: one prompt for every request: give a plain --input-len"),
    ],
)  # fmt: skip
def test_bench_workload_flag_faults_name_the_flag(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValueError) as info:
        bench(*argv)
    assert str(info.value).startswith(message), str(info.value)


def test_prefetched_prompts_wait_by_length() -> None:
    """With varied lengths a worker takes the text built for its own next length."""
    prompts = PrefetchingPrompts()
    prompts.prefetch(100)
    prompts.prefetch(300)
    long_text, long_words = prompts.build(300)
    assert long_words == PromptBuilder().words_for(300)
    short_text, _ = prompts.build(100)
    assert len(short_text.split()) < len(long_text.split())
    assert prompts._ready == {}
    assert prompts._waiting == 0


async def test_bench_draws_lengths_per_request_and_replays_a_trace() -> None:
    """The runner's two loops with a recording target (no server): a closed loop draws each
    request's lengths, an open loop at a level's mean rate replays the trace's lines."""
    cfg = bench("--concurrency", "2", "--num-requests", "40", "--seed", "5",
                "--input-len", "{dist: uniform, min: 10, max: 20}",
                "--output-len", "{dist: empirical, values: [3, 4]}")  # fmt: skip
    runner = BenchRunner(cfg)
    runner.target = target = recording_target()
    results = await runner._closed(None, 2, 40, None)  # type: ignore[arg-type]
    assert len(results) == 40
    prompts = [p for _, p, _, _ in target.sent]
    assert min(prompts) >= 10
    assert max(prompts) <= 20
    assert len(set(prompts)) > 5
    assert {m for _, _, m, _ in target.sent} == {3, 4}

    cfg = bench("--mode", "rate", "--levels", "400", "--num-requests", "25", "--seed", "1",
                "--trace", "builtin:diurnal")  # fmt: skip
    runner = BenchRunner(cfg)
    runner.target = target = recording_target()
    results, dropped = await runner._open(None, cfg.sweep[0])  # type: ignore[arg-type]
    assert (len(results), dropped) == (25, 0)
    lines = (ROOT / "prober" / "load" / "traces" / "diurnal.jsonl").read_text().splitlines()[:25]
    expected = [(json.loads(line)["input_length"], json.loads(line)["output_length"])
                for line in lines]  # fmt: skip
    assert [(p, m) for _, p, m, _ in target.sent][:25] == expected
    assert all(prefix is not None for *_, prefix in target.sent)


# -- nothing ends silently (issue 38) ---------------------------------------------------------


def test_a_rate_too_slow_to_arrive_is_one_config_line(tmp_path: Path) -> None:
    # YAML reads 1e-300 (no dot) as text, which pydantic then reads as a number.
    assert problems(tmp_path, "{rate: 1.0e-300}") == [
        P + "rate: must be at least 1e-05, got 1e-300"
    ]
    assert problems(tmp_path, "{schedule: {steps: [{seconds: 5, rate: 1.0e-300}]}}") == [
        P + "schedule.steps[0].rate: must be 0 (a pause) or at least 1e-05, got 1e-300"
    ]


def test_a_trace_paced_past_the_bound_at_a_given_rate_is_one_config_line(tmp_path: Path) -> None:
    """15,000 lines in the first second, then one 1,000 s later: within the pace as written,
    past it once `rate` speeds it up 66-fold (those 15,000 then fall due in 15 ms)."""
    lines = [f'{{"timestamp": {i / 15:.4f}, "input_length": 1, "output_length": 1}}\n'
             for i in range(15_000)]  # fmt: skip
    last = '{"timestamp": 1000000, "input_length": 1, "output_length": 1}\n'
    (tmp_path / "burst.jsonl").write_text("".join(lines) + last)
    assert load(tmp_path, "{trace: {path: burst.jsonl}}").targets[0].load
    (message,) = problems(tmp_path, "{trace: {path: burst.jsonl}, rate: 1000}")
    assert re.match(re.escape(P) + r"rate: burst\.jsonl:\d+: \d+ requests due 0\.0\d+ s", message)
    assert message.endswith(": lower the rate"), message


async def test_an_arrival_however_far_away_is_waited_for_an_hour_at_a_time() -> None:
    metrics = Metrics(CollectorRegistry())
    clock, target = FakeClock(), recording_target()
    driver = LoadDriver(None, target, LoadConfig(rate=1, arrival="constant"), Recorder(metrics),  # type: ignore[arg-type]
                        clock=clock, sleep=clock.sleep)  # fmt: skip
    await driver.set_rate(1e-6)  # set_rate takes any rate: the first arrival is 1e6 s away
    for _ in range(50):
        await asyncio.sleep(0)
    gaps = [b - a for a, b in itertools.pairwise(clock.wakes)]
    assert len(gaps) >= 10
    assert set(gaps) == {3600 * 10**9}
    assert target.sent == []
    await driver.set_rate(1e-300)  # 1e300 s away: past any run, and past any timer
    await driver.arrivals_done()
    await driver.stop(0)
    assert load_ends(metrics) == {"too_far": 1.0}


def load_ends(metrics: Metrics) -> dict[str, float]:
    return {
        sample.labels["reason"]: sample.value
        for family in metrics.registry.collect()
        if family.name == "llmprober_load_stopped"
        for sample in family.samples
        if sample.name.endswith("_total")
    }


async def test_a_load_that_ends_says_why_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = load(tmp_path, "{trace: {path: trace.jsonl, loop: false}}").targets[0].load
    assert cfg is not None
    metrics = Metrics(CollectorRegistry())
    clock = FakeClock()
    driver = LoadDriver(None, recording_target(), cfg, Recorder(metrics), clock=clock,  # type: ignore[arg-type]
                        sleep=clock.sleep)  # fmt: skip
    driver.start()
    await driver.arrivals_done()
    assert load_ends(metrics) == {"finished": 1.0}
    (tmp_path / "trace.jsonl").write_text("\n\n")  # emptied: the next run's pass reads nothing
    driver.start()
    await driver.arrivals_done()
    await driver.stop(0)
    assert load_ends(metrics) == {"finished": 1.0, "trace_empty": 1.0}
    rate = metrics.registry.get_sample_value(
        "llmprober_load_target_rate", {"target": T.name, "model": T.model}
    )
    assert rate == 0


async def turns_until(done: Callable[[], bool], turns: int = 10_000) -> None:
    """Give the loop turns until `done` (the fake clock advances as the driver sleeps)."""
    for _ in range(turns):
        if done():
            return
        await asyncio.sleep(0)
    raise AssertionError("not done within the turns")


async def test_a_silent_target_gets_no_new_request_until_a_token_comes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A target whose requests wait without a token for `silent_seconds` (hung, or not
    answering): its arrivals are dropped and counted (reason silent), one line says so, and
    the load resumes once a token comes, one line again."""
    caplog.set_level(logging.INFO)
    metrics = Metrics(CollectorRegistry())
    cfg = LoadConfig(rate=1, arrival="constant", silent_seconds=5, schedule=None, seed=1)
    clock, target = FakeClock(), recording_target()
    target.hold = asyncio.Event()  # nothing answers
    engine = EngineWatch(target.activity, clock_ns=clock)
    results: list[RequestResult] = []
    driver = LoadDriver(None, target, cfg, Recorder(metrics), engine=engine, clock=clock,  # type: ignore[arg-type]
                        sleep=clock.sleep, on_result=results.append)  # fmt: skip
    waiting = target.activity.begin(clock())  # a probe that has had no token
    driver.start()
    await turns_until(lambda: len(target.sent) == 4)
    held = list(driver._tasks)
    await turns_until(lambda: clock.now - 5_000_000_000 >= 12_000_000_000)
    assert driver.paused
    sent = len(target.sent)
    assert sent == 4  # the arrivals at 1 to 4 s: the probe had not waited 5 s yet
    # The pause let go of all the load held there but its oldest request, each counted.
    assert len(driver._tasks) == 1
    load_labels = {"target": T.name, "model": T.model, "mode": "load"}
    count = metrics.registry.get_sample_value
    assert count("llmprober_requests_total", {**load_labels, "outcome": "cancelled"}) == 3
    assert [r.error for r in results] == [SHED] * 3
    assert [r.t_sched_ns for r in results] == [t for t, *_ in target.sent[1:]]
    # Each ended there, keeping no CancelledError (whose traceback holds its frames).
    assert [t.done() and not t.cancelled() for t in held] == [False, True, True, True]
    target.activity.token(clock())
    target.activity.end(waiting)
    await turns_until(lambda: len(target.sent) > sent)
    assert not driver.paused
    await driver.set_rate(0)
    target.hold.set()
    await driver.stop(1.0)
    labels = {"target": T.name, "model": T.model}
    dropped = metrics.registry.get_sample_value
    assert dropped("llmprober_load_dropped_total", {**labels, "reason": "silent"}) == 7
    assert dropped("llmprober_load_dropped_total", {**labels, "reason": "in_flight"}) == 0
    said = [r.msg.get("event") for r in caplog.records if isinstance(r.msg, dict)]
    assert said.count("load_paused") == 1
    assert said.count("load_resumed") == 1
    paused = next(r.msg for r in caplog.records if isinstance(r.msg, dict)
                  and r.msg.get("event") == "load_paused")  # fmt: skip
    assert paused["cancelled"] == 3
