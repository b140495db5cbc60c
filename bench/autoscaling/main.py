"""`bench/autoscale.py`: measure one replica, emit its ScaledObject, run every policy on the
same trace in a closed loop, and report goodput, cost and recovery (docs/autoscaling.md).

Steps: (1) one simulator replica with the engine profile is swept by `llm-prober bench`'s
library entry (closed loop) and its capacity at the SLO gives the budgets
(`prober.bench.keda.derive`); (2) the ScaledObject emitted from them is the "shipped" policy
(its behaviour is the shipped one); (3) each policy runs on the same seeded trace; (4) the
summaries, a Markdown table and the plots go to `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import yaml

from prober.bench import BenchConfig, measure
from prober.bench.keda import Budgets, derive, header, scaled_object
from prober.load.config import LengthConfig

from . import report
from .experiment import Setup, run_policy
from .fleet import Engine, Sidecar
from .policy import (
    by_name,
    from_scaled_object,
    saturation_trigger,
    standard_policies,
)
from .trace import TRACES

ROOT = Path(__file__).resolve().parents[2]  # bench/autoscaling/ -> the repository
RULES = ROOT / "deploy" / "prometheus" / "rules" / "llm-prober.rules.yml"
POLICIES = ("gpu-util", "queue", "ttft-p95", "saturation", "shipped")

# The engine profile, compressed 10x (docs/autoscaling.md, "The closed loop"): a vLLM-like
# replica with 16 slots; 16 output tokens of 20 ms stand for 160 real tokens of 20 ms.
ENGINE = Engine(
    slots=16,
    prefill_tps=400_000.0,
    prefill_base=0.0005,
    decode_step=0.02,
    decode_slowdown=0.015,
    max_tokens=16,
    prompt_tokens=512,
    slo_ttft=0.2,
)
FACTOR = 10.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/autoscale.py", description=__doc__.split("\n")[0])
    p.add_argument(
        "--policies", default=",".join(POLICIES), help=f"comma-separated, of {', '.join(POLICIES)}"
    )
    p.add_argument(
        "--scale",
        type=float,
        default=1.0,
        help="trace length factor (1.0: 30 real minutes, 3 compressed)",
    )
    p.add_argument(
        "--trace",
        choices=sorted(TRACES),
        default="standard",
        help="standard: 30 real minutes; short: 12, up to the step",
    )
    p.add_argument(
        "--no-metrics-url",
        action="store_true",
        help="sidecars probe only: the rules run on the client estimate",
    )
    p.add_argument("--seed", type=int, default=16)
    p.add_argument("--out", type=Path, default=Path("autoscale-out"))
    p.add_argument("--prometheus-bin", type=Path, default=_default_prometheus())
    return p


def _default_prometheus() -> Path:
    env = os.environ.get("PROMETHEUS_BIN")
    folder = Path(env) if env else Path.home() / ".cache/llm-prober/prometheus/bin"
    return folder / "prometheus"


async def measure_replica(engine: Engine) -> dict[str, Any]:
    """`llm-prober bench` (closed loop) against one replica of the profile."""
    from prober.sim import SimConfig, bound_port, serve

    cfg = SimConfig(
        slots=engine.slots,
        prefill_tokens_per_second=engine.prefill_tps,
        prefill_base_seconds=engine.prefill_base,
        decode_step_seconds=engine.decode_step,
        decode_slowdown=engine.decode_slowdown,
        default_max_tokens=engine.max_tokens,
    )
    runner = await serve(cfg, "127.0.0.1", 0)
    try:
        s = engine.slots
        levels = tuple(sorted({1, max(1, s // 4), max(1, s // 2), s, s + s // 2, 2 * s}))
        bench = BenchConfig(
            url=f"http://127.0.0.1:{bound_port(runner)}/v1",
            model="sim",
            levels=levels,
            num_requests=6 * s,
            input_len=LengthConfig.fixed(engine.prompt_tokens),
            output_len=LengthConfig.fixed(engine.max_tokens),
            slo_ttft_seconds=engine.slo_ttft,
            slo_tpot_seconds=60.0,
            seed=1,
        )
        return await measure(bench)
    finally:
        await runner.cleanup()


def setup_for(args: argparse.Namespace, budgets: Budgets) -> Setup:
    f = FACTOR
    return Setup(
        factor=f,
        engine=ENGINE,
        sidecar=Sidecar(
            interval=10.0 / f, metrics_interval=5.0 / f, server_truth=not args.no_metrics_url
        ),
        startup=120.0 / f,
        sync=15.0 / f,
        warmup=60.0 / f,
        trace=TRACES[getattr(args, "trace", "standard")](args.scale).compressed(f),
        capacity=budgets.drain_rps,
        prometheus_bin=args.prometheus_bin,
        rules=RULES,
        seed=args.seed,
        grace=120.0 / f,
        initial=2,
        user_timeout=60.0 / f,
    )


async def experiment(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The whole experiment; `args.out` must exist."""
    out: Path = args.out
    bench = await measure_replica(ENGINE)
    budgets = derive(bench, ENGINE.slots)
    doc = scaled_object(budgets, name="vllm", target="vllm")
    (out / "keda-scaledobject.yaml").write_text(header(budgets) + yaml.safe_dump(doc))
    shipped = from_scaled_object(doc, FACTOR)
    chosen = by_name(
        standard_policies(shipped, saturation_trigger(budgets.saturation)), args.policies.split(",")
    )
    setup = setup_for(args, budgets)
    rows, runs = [], []
    for policy in chosen:
        work = out / policy.name
        await asyncio.to_thread(work.mkdir, parents=True, exist_ok=True)
        run = await run_policy(setup, policy, work)
        (work / "run.json").write_text(json.dumps(run))
        rows.append(report.summarize(run, setup.trace, ENGINE.slo_ttft, FACTOR))
        runs.append(run)
        print(report.table(rows[-1:], setup.trace), end="", flush=True)
    summary = {
        "budgets": budgets.as_json(),
        "factor": FACTOR,
        "rows": rows,
        "server_truth": not args.no_metrics_url,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    (out / "table.md").write_text(report.table(rows, setup.trace))
    if report.plot(runs, setup.trace, ENGINE.slo_ttft, FACTOR, out / "autoscale.png") is None:
        print("autoscale: no plots: pip install 'llm-prober[bench]'", file=sys.stderr)
    return rows


async def _stoppable(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The experiment, cancelled by SIGTERM or SIGINT so that every process it started stops
    (a background job ignores SIGINT, and the default SIGTERM would skip the `finally`s)."""
    task = asyncio.current_task()
    assert task is not None
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, task.cancel)
    return await experiment(args)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not args.prometheus_bin.exists():
        print(
            f"autoscale: no Prometheus at {args.prometheus_bin} (PROMETHEUS_BIN)", file=sys.stderr
        )
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    rows = asyncio.run(_stoppable(args))
    trace = TRACES[getattr(args, "trace", "standard")](args.scale)
    print(report.table(rows, trace), end="")
    return 0
