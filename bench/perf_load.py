"""Open-loop capacity: the Poisson rate one llm-prober process sustains, and its dispatch lag.

    .venv/bin/python bench/perf_load.py [--rates 50,100,200,300,400] [--seconds 20]
        [--repeats 3] [--clients prober,prober@uvloop+gc] [--before DIR] [--no-pin] [--json FILE]

Each run is a fresh process that drives `LoadDriver` exactly as the daemon does (metrics on a
private registry, the capacity estimator fed every result) at one Poisson rate, 64 output
tokens per request, against the simulator in a process of its own (10 ms decode step, no batch
slowdown, 4096 slots: it never queues). Dispatch lag is `t_send − t_sched` of every request
scheduled after a 2 s warm-up. The sustained rate is the highest one whose median p99 lag
stays ≤ 5 ms with nothing dropped and every request ok; the simulator's CPU share is printed
beside it, because on a small machine the simulator can run out of core before the client.
The simulator and the prober get a core each when there are two (`--no-pin`); client specs
are `MODE[@LOOP][+gc]` as in `perf_client.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from typing import Any

from perf_common import (
    Sim,
    TruthServer,
    add_client_args,
    add_run_args,
    add_worker_args,
    client_worker,
    emit,
    exit_on_sigterm,
    fast_sim_args,
    fmt,
    median,
    pct,
    pinning,
    set_loop,
    tune_gc,
    wait_quiet,
    write_runs,
)

SIM_ARGS = fast_sim_args(slots=4096)
WARMUP_SECONDS = 2.0
LAG_GOAL_MS = 5.0


async def _drive(
    port: int, rate: float, seconds: float, tokens: int, gc_tuned: bool
) -> dict[str, object]:
    from prometheus_client import CollectorRegistry

    from prober.capacity.own import OwnLoad
    from prober.capacity.target import TargetCapacity
    from prober.load.driver import LoadDriver
    from prober.metrics import Metrics
    from prober.record import Recorder, ScrapeRecorder
    from prober.result import RequestResult
    from prober.settings import LoadConfig, TargetConfig
    from prober.targets import Target
    from prober.web import client_session

    load = LoadConfig(rate=rate, max_in_flight=100_000, max_tokens=tokens, seed=1)
    cfg = TargetConfig(name="bench", url=f"http://127.0.0.1:{port}/v1", model="sim", load=load)
    target = Target.from_config(cfg)
    metrics = Metrics(CollectorRegistry())
    capacity = TargetCapacity(target, ScrapeRecorder(metrics), own_load=OwnLoad())
    recorder = Recorder(metrics, {target.name: capacity})
    # Only plain ints are kept (never tracked by the GC): holding every RequestResult would
    # grow the heap the collector walks, which the daemon, keeping none, never does.
    sched: list[int] = []
    sent: list[int] = []
    first: list[int] = []
    ok: list[int] = []
    ids: list[str] = []

    def on_result(result: RequestResult) -> None:
        ids.append(result.request_id)
        sched.append(result.t_sched_ns)
        sent.append(result.t_send_ns)
        first.append(result.t_first_token_ns or 0)
        ok.append(result.ok)

    async with client_session() as session:
        if gc_tuned:
            tune_gc()
        driver = LoadDriver(
            session, target, load, recorder, on_result=on_result, own_load=capacity.own_load
        )
        start = time.perf_counter_ns()
        cpu0 = time.process_time()
        driver.start()
        await asyncio.sleep(seconds)
        cpu = time.process_time() - cpu0
        await driver.stop(grace_seconds=30.0)
    after = start + WARMUP_SECONDS * 1e9
    counted = [i for i, t in enumerate(sched) if t >= after]
    return {
        "lags_ms": [(sent[i] - sched[i]) / 1e6 for i in counted],
        "ok": sum(ok[i] for i in counted),
        "requests": len(counted),
        "dropped": driver.dropped,
        "cpu_share": cpu / seconds,
        "ttft_p50_ms": pct([(first[i] - sched[i]) / 1e6 for i in counted if first[i]], 50),
        "ttft_ms": {ids[i]: (first[i] - sched[i]) / 1e6 for i in counted if first[i]},
    }


def worker(ns: argparse.Namespace) -> None:
    set_loop(ns.loop)
    emit(asyncio.run(_drive(ns.port, ns.rate, ns.seconds, ns.tokens, ns.tune_gc)), ns.out)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="50,100,200,300,400")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--server", choices=["sim", "truth"], default="sim",
        help="truth: bench/truth_server.py, and TTFT percentiles against its stamps",
    )  # fmt: skip
    add_run_args(parser)
    add_client_args(parser, "prober")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    add_worker_args(parser)
    parser.add_argument("--rate", type=float, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.worker:
        worker(ns)
        return
    exit_on_sigterm()
    sim_cpus, client_cpus = pinning(not ns.no_pin)
    rates = [float(x) for x in ns.rates.split(",")]
    clients = ns.clients.split(",")
    runs: dict[tuple[float, str], list[dict[str, float]]] = {}
    for rate in rates:
        for repeat in range(ns.repeats):
            for client in clients:
                wait_quiet(ns.quiet)
                # A fresh server per run: its CPU share is this run's alone.
                server = (
                    TruthServer(sim_cpus) if ns.server == "truth" else Sim(SIM_ARGS, cpus=sim_cpus)
                )
                with server as sim:
                    figures = one_run(ns, sim, rate, client, client_cpus)
                runs.setdefault((rate, client), []).append(figures)
                print(
                    f"  {rate:>6.0f}/s {client:<16} run {repeat + 1}: lag p99 "
                    f"{figures['lag_p99']:.2f} ms, ok {figures['ok_share']:.3f}, "
                    f"cpu {figures['cpu_share']:.2f}, sim cpu {figures['sim_cpu_share']:.2f}",
                    file=sys.stderr,
                )
    report(rates, clients, runs)
    write_runs(ns.json, runs)


def one_run(
    ns: argparse.Namespace, sim: Sim, rate: float, client: str, cpus: set[int] | None
) -> dict[str, float]:
    _, flags, env = client_worker(client, ns.before)
    args = [
        __file__, "--worker", *flags, "--port", str(sim.port),
        "--rate", str(rate), "--seconds", str(ns.seconds), "--tokens", str(ns.tokens),
    ]  # fmt: skip
    run = sim.run_worker(args, env, cpus)
    errors = ttft_errors(sim.truth(), run["ttft_ms"]) if isinstance(sim, TruthServer) else {}  # type: ignore[arg-type]
    lags: list[float] = run["lags_ms"]  # type: ignore[assignment]
    requests = int(run["requests"])  # type: ignore[call-overload]
    return {
        "lag_p50": pct(lags, 50),
        "lag_p99": pct(lags, 99),
        "lag_max": max(lags, default=float("nan")),
        "ok_share": int(run["ok"]) / requests if requests else 0.0,  # type: ignore[call-overload]
        "dropped": float(run["dropped"]),  # type: ignore[arg-type]
        "cpu_share": float(run["cpu_share"]),  # type: ignore[arg-type]
        "sim_cpu_share": float(run["sim_cpu_share"]),  # type: ignore[arg-type]
        "ttft_p50": float(run["ttft_p50_ms"]),  # type: ignore[arg-type]
        "achieved_rate": requests / (ns.seconds - WARMUP_SECONDS),
        "other_load": float(run["other_load"]),  # type: ignore[arg-type]
    } | errors


def ttft_errors(truth: dict[str, list[Any]], seen_ms: dict[str, float]) -> dict[str, float]:
    """TTFT p50 / p99 as the driver saw it (from `t_sched`) minus the truth's (the server's
    first-token write − the request's arrival there), over the same requests."""
    client, true = [], []
    for rid, ms in seen_ms.items():
        if rid in truth:
            arrival, writes = truth[rid]
            client.append(ms)
            true.append((writes[0] - arrival) / 1e6)
    return {
        "ttft_p50_err": pct(client, 50) - pct(true, 50),
        "ttft_p99_err": pct(client, 99) - pct(true, 99),
    }


def report(
    rates: list[float], clients: list[str], runs: dict[tuple[float, str], list[dict[str, float]]]
) -> None:
    def med(rate: float, client: str, key: str) -> float:
        return median(r.get(key, float("nan")) for r in runs[(rate, client)])

    print(f"\nmedians of {len(next(iter(runs.values())))} runs; dispatch lag in ms")
    columns = (  # key, heading, digits, width
        ("achieved_rate", "achieved", 1, 9), ("lag_p50", "lag p50", 3, 8),
        ("lag_p99", "lag p99", 2, 8), ("lag_max", "lag max", 2, 8), ("ok_share", "ok", 3, 6),
        ("dropped", "dropped", 0, 8), ("cpu_share", "client cpu", 2, 11),
        ("sim_cpu_share", "sim cpu", 2, 8), ("ttft_p50", "TTFT p50", 1, 9),
        ("other_load", "other", 2, 6), ("ttft_p50_err", "TTFT err p50", 2, 12),
        ("ttft_p99_err", "p99", 2, 6),
    )  # fmt: skip
    print(f"{'rate/s':>7} {'client':<16} " + " ".join(f"{h:>{w}}" for _, h, _, w in columns))
    for rate in rates:
        for client in clients:
            cells = (fmt(med(rate, client, k), d).rjust(w) for k, _, d, w in columns)
            print(f"{rate:>7.0f} {client:<16} " + " ".join(cells))
    for client in clients:
        good = [
            rate
            for rate in rates
            if med(rate, client, "lag_p99") <= LAG_GOAL_MS
            and med(rate, client, "ok_share") == 1.0
            and med(rate, client, "dropped") == 0
        ]
        best = f"{max(good):.0f}/s" if good else "none of those tried"
        print(f"{client}: highest rate with dispatch lag p99 ≤ {LAG_GOAL_MS:g} ms: {best}")


if __name__ == "__main__":
    main()
