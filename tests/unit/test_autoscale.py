"""The autoscale experiment's pure parts: the HPA's arithmetic, policies read from a
ScaledObject, the trace, the report's figures, the budgets `bench --emit-keda` derives, and
the simulator's utilisation gauge. Plain numbers, no processes."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import math
from pathlib import Path

import pytest
import yaml

from bench.autoscaling.hpa import Behavior, Hpa, ScalingPolicy, ScalingRules, desired_for_metric
from bench.autoscaling.policy import from_scaled_object, standard_policies
from bench.autoscaling.prometheus import scale_ranges
from bench.autoscaling.report import recovery, replica_seconds, summarize, table, ttft_p95_bins
from bench.autoscaling.trace import (
    DIURNAL_DAY_SECONDS,
    DIURNAL_MEAN_LOAD,
    Segment,
    Trace,
    arrivals,
    diurnal,
    replayed,
    standard,
)
from bench.autoscaling.traffic import Spec, _schedule
from prober.bench.keda import derive, scaled_object
from prober.load.workload import read_trace, resolve_trace
from prober.sim import SimConfig
from prober.sim.engine import Engine

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "deploy/kubernetes/autoscale-keda/keda-scaledobject.yaml"


def shipped_behavior() -> Behavior:
    return Behavior(
        up=ScalingRules(0, (ScalingPolicy("Pods", 2, 120),)),
        down=ScalingRules(600, (ScalingPolicy("Pods", 1, 300),)),
    )


def test_average_value_divides_the_fleet_total_by_the_per_replica_target() -> None:
    assert desired_for_metric("AverageValue", 17, 4, status_replicas=2, ready_pods=2) == 5
    # within 10 % of target x replicas: unchanged
    assert desired_for_metric("AverageValue", 8.7, 4, status_replicas=2, ready_pods=2) == 2
    assert desired_for_metric("AverageValue", 0, 4, status_replicas=3, ready_pods=3) == 0


def test_value_scales_the_ready_pods_by_the_ratio() -> None:
    assert desired_for_metric("Value", 3.0, 2.0, status_replicas=4, ready_pods=2) == 3
    assert desired_for_metric("Value", 2.1, 2.0, status_replicas=4, ready_pods=2) == 4
    assert desired_for_metric("Value", 100, 80, status_replicas=1, ready_pods=1) == 2


def test_scale_up_is_limited_per_period_and_scale_down_waits_for_the_window() -> None:
    hpa = Hpa(shipped_behavior(), min_replicas=1, max_replicas=8)
    assert hpa.decide(0, current=1, desired=8) == 3  # +2 per 120 s
    assert hpa.decide(60, current=3, desired=8) == 3  # same period
    assert hpa.decide(121, current=3, desired=8) == 5
    # down: the highest recommendation of the last 600 s holds
    assert hpa.decide(300, current=5, desired=1) == 5
    assert hpa.decide(722, current=5, desired=1) == 4  # window passed, 1 per 300 s
    assert hpa.decide(800, current=4, desired=1) == 4
    assert hpa.decide(1023, current=4, desired=1) == 3


def test_max_replicas_bounds_everything() -> None:
    hpa = Hpa(Behavior(ScalingRules(0, ()), ScalingRules(0, ())), 1, 4)
    assert hpa.decide(0, current=2, desired=2) == 2
    up = Behavior(ScalingRules(0, (ScalingPolicy("Percent", 100, 15),)), ScalingRules(0, ()))
    assert Hpa(up, 1, 4).decide(0, current=3, desired=9) == 4


def test_the_shipped_scaled_object_reads_as_a_policy_with_time_compressed() -> None:
    doc = yaml.safe_load(SHIPPED.read_text())
    policy = from_scaled_object(doc, factor=10)
    assert {t.name for t in policy.triggers} == {"queue-waiting", "ttft-p95", "in-system"}
    assert policy.behavior.down.stabilization_seconds == 60
    assert policy.behavior.up.policies[0].period_seconds == 12
    names = [p.name for p in standard_policies(policy)]
    assert names == ["gpu-util", "queue", "ttft-p95", "saturation", "shipped"]


def test_rule_ranges_are_divided_by_the_factor() -> None:
    text = "rate(x[5m]) avg_over_time(y[2m]) z[1h] w[30s]"
    scaled = "rate(x[30000ms]) avg_over_time(y[12000ms]) z[360000ms] w[3000ms]"
    assert scale_ranges(text, 10) == scaled


def test_trace_rates_and_arrivals_follow_the_segments() -> None:
    trace = Trace((Segment("a", 10, 1, 1), Segment("b", 10, 1, 3)))
    assert trace.rate_at(5) == 1
    assert trace.rate_at(15) == 2
    assert trace.rate_at(25) == 0
    times = list(arrivals(trace, capacity=50, seed=1))
    first, second = sum(t < 10 for t in times), sum(t >= 10 for t in times)
    assert 400 < first < 600
    assert 800 < second < 1200
    assert standard().compressed(10).seconds == pytest.approx(180)


def test_recovery_is_the_end_of_the_last_bin_over_the_slo() -> None:
    trace = Trace((Segment("step", 10, 1, 1),))
    late = [{"sched": t / 10, "outcome": "ok", "ttft": 1.0 if t < 35 else 0.1}
            for t in range(100)]  # fmt: skip
    assert recovery(late, trace, slo=0.5, width=1.0) == 4.0
    never = [{"sched": t / 10, "outcome": "timeout", "ttft": None} for t in range(100)]
    assert recovery(never, trace, slo=0.5, width=1.0) is None
    assert math.isinf(ttft_p95_bins(never, 0, 10, 5)[0][1] or 0)
    assert replica_seconds([(-5, 5), (2, 20)], 0, 10) == 13


def test_the_diurnal_trace_is_the_shipped_day_with_its_bursts() -> None:
    trace = diurnal()
    assert trace.seconds == pytest.approx(DIURNAL_DAY_SECONDS)
    assert trace.mean() == pytest.approx(DIURNAL_MEAN_LOAD)
    assert trace.replay == "builtin:diurnal"
    assert trace.replay_seconds >= 298  # the file's 300 s day, in whole bins
    # bench/make_trace.py puts four 8-second bursts on the day: four runs of burst bins.
    bursts = trace.spans("burst")
    assert len(bursts) == 4
    assert all(b - a <= 10 / 300 * DIURNAL_DAY_SECONDS + 1e-9 for a, b in bursts)
    assert trace.spans("night")[0][0] == 0  # the day starts at night
    peak_day = max(s.begin for s in trace.segments if s.name == "midday")
    night = max(s.begin for s in trace.segments if s.name == "night")
    assert peak_day > 2 * night
    short = diurnal(0.5).compressed(10)
    assert short.seconds == pytest.approx(DIURNAL_DAY_SECONDS / 20)
    assert short.replay_seconds == trace.replay_seconds  # the file's own time, unscaled


def test_a_replayed_trace_sends_the_files_requests_at_its_mean_load() -> None:
    trace = diurnal(0.5).compressed(10)  # 90 s
    capacity = 20.0
    sent = list(replayed(trace, capacity, seed=3))
    expected = trace.mean() * capacity * trace.seconds
    assert abs(len(sent) - expected) < 0.05 * expected
    offsets = [r.offset for r in sent]
    assert offsets == sorted(offsets)
    assert offsets[0] >= 0
    assert offsets[-1] < trace.seconds
    lines = list(read_trace(resolve_trace("builtin:diurnal")))
    assert {(r.prompt_tokens, r.max_tokens) for r in sent} <= {
        (line.input_length, line.output_length) for line in lines
    }
    # The envelope is the replay's: the burst bins get their share of the requests.
    start, end = trace.spans("burst")[0]
    in_burst = sum(start <= t < end for t in offsets)
    assert in_burst > 2 * trace.mean() * capacity * (end - start)
    assert [r.offset for r in replayed(trace, capacity, seed=3)] == offsets
    # A line's copies are spread before the next line, never sent at one instant.
    assert len(set(offsets)) == len(offsets)


def test_phases_of_several_spans_are_summarised_together() -> None:
    trace = Trace(
        (Segment("x", 10, 1, 1), Segment("burst", 5, 3, 3), Segment("x", 10, 1, 1),
         Segment("burst", 5, 3, 3)),
        columns=("x", "burst"), recovery_phase="burst",
    )  # fmt: skip
    assert trace.spans("burst") == [(10, 15), (25, 30)]
    assert trace.spans("x") == [(0, 10), (15, 25)]
    records = [{"sched": float(t), "outcome": "ok", "ttft": 1.0 if 25 <= t < 30 else 0.1}
               for t in range(30)]  # fmt: skip
    run = {"policy": "p", "requests": records, "replicas": [(0.0, 30.0)],
           "samples": [{"t": 12.0, "spec": 3}, {"t": 27.0, "spec": 5}]}  # fmt: skip
    row = summarize(run, trace, slo=0.5, factor=1.0, bin_real=1.0)
    assert row["goodput_by_phase"]["burst"] == 0.5  # 5 of the 10 burst requests were late
    assert row["goodput_by_phase"]["x"] == 1.0
    assert row["peak_replicas_by_phase"]["burst"] == 5
    assert row["mean_replicas_by_phase"]["burst"] == 1.0
    assert row["recovery_phase"] == "burst"
    assert row["recovery_seconds"] == 0.0  # the first burst was met
    head = table([row], trace).splitlines()[0]
    assert (
        head
        == "| policy | goodput | x | burst | replica-s | mean replicas | peak | burst recovery |"
    )


def test_the_traffic_process_sends_a_replay_with_its_lengths(tmp_path: Path) -> None:
    trace = diurnal(0.5).compressed(10)
    raw = {
        "trace": [dataclasses.asdict(s) for s in trace.segments], "replay": trace.replay,
        "replay_seconds": trace.replay_seconds, "output_scale": 0.1, "capacity": 5.0,
        "prompt_tokens": 512, "max_tokens": 16, "endpoints": str(tmp_path / "e"),
        "out": str(tmp_path / "o"), "seed": 1, "timeout": 6.0, "endpoints_refresh": 0.1,
    }  # fmt: skip
    (tmp_path / "spec.json").write_text(json.dumps(raw))
    spec = Spec.load(tmp_path / "spec.json")
    assert spec.trace.replay == "builtin:diurnal"
    assert spec.output_scale == 0.1
    bodies = [json.loads(body) for _, body in itertools.islice(_schedule(spec), 200)]
    answers = [b["max_tokens"] for b in bodies]
    assert min(answers) >= 1
    assert max(answers) <= 116  # the file's longest, 1,153, over 10
    assert len({len(b["messages"][0]["content"]) for b in bodies}) > 20  # mixed prompts
    plain = Spec.load(tmp_path / "spec.json")
    plain = dataclasses.replace(plain, trace=Trace(trace.segments))
    first = next(_schedule(plain))[1]
    assert json.loads(first)["max_tokens"] == 16  # the profile's one shape


def bench_report(floor: float = 0.1) -> dict[str, object]:
    level = {"level": {"concurrency": 32}}
    return {
        "config": {"slo_ttft_seconds": 2.0},
        "levels": [{"level": {"concurrency": 1}, "ttft_seconds": {"p95": floor}}, level],
        "capacity": {"level": {"concurrency": 32}, "request_throughput": 6.4,
                     "mean_e2e_from_send_seconds": 5.0, "mean_service_seconds": 4.8},
    }  # fmt: skip


def test_budgets_follow_littles_law_and_the_drain_rate() -> None:
    b = derive(bench_report(), slots=32)
    assert b.drain_rps == pytest.approx(32 / 4.8)
    assert b.queue_waiting == math.floor(32 / 4.8 * (2.0 - 0.1) / 2)  # 6
    assert b.in_system == 24  # 0.75 x min(32, 6.4 x 5.0)
    assert b.ttft_p95_seconds == 2.0
    assert b.saturation == 0.75
    obj = scaled_object(b, name="vllm", target="vllm")
    thresholds = {t["name"]: t["metadata"]["threshold"] for t in obj["spec"]["triggers"]}
    assert thresholds == {"queue-waiting": "6", "ttft-p95": "2", "in-system": "24"}


def test_budgets_refuse_a_floor_above_the_slo() -> None:
    with pytest.raises(ValueError, match="not below the SLO"):
        derive(bench_report(floor=2.5), slots=32)


async def test_utilization_reads_near_full_with_one_stream_and_zero_when_idle() -> None:
    engine = Engine(SimConfig(decode_step_seconds=0.005, default_max_tokens=400))
    task = asyncio.create_task(engine.run())
    try:
        assert engine.utilization() == 0.0
        engine.submit(8, 400)
        await asyncio.sleep(1.1)
        assert engine.utilization() > 0.9
    finally:
        task.cancel()
