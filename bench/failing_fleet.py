"""A fleet of failing targets beside a healthy one (issue 38 item 6): is the daemon still there?

    .venv/bin/python bench/failing_fleet.py [--targets 200] [--seconds 20] [--baseline]
        [--repeat N] [--pin] [--same-seed] [--profile FILE]

Processes: the simulator (the healthy target's engine, a decode step of 2 ms), the failing
server (`tests/support/failing_server.py`: each target's path picks one way of failing: `blackhole`,
a listener whose backlog is full so a connect never completes; `drip`, a 200 head then one
byte every 0.5 s; `slow_lines`, an SSE content line every 2 s; `keepalive`, an SSE comment
every 0.1 s and never a token; every connection ends after 30 s), and a worker running the
daemon's app (`prober.web.build_app` on uvloop, as `llm-prober run`) with the healthy target
(a probe every 1 s, Poisson load at 2/s) and `--targets` failing ones, spread evenly over the
four ways, each with a probe every 1 s and load at `--failing-load` (default 2/s, each
target's seeded apart, as independent users are) and the default timeouts and
`load.silent_seconds`. `--same-seed` seeds every target's load alike: their arrivals then
leave at the same instants (a seed fixes the instants), and each of the healthy target's
requests is set up in the same turn of the loop as the 50 slow targets' (the silent ones are
paused), a burst the daemon makes itself. This process asks the worker's `/-/healthy` every
20 ms and its `/metrics` every 1 s.

Printed: `/-/healthy` p50 / p99 / max, `/metrics` p50 / p99 / max (ms), the healthy
target's TTFT p50 / p99 / max (ms, the prober's own stamps, probes and load) and its parts by
the simulator's own write stamps (the daemon sending late, the engine, the daemon reading
late), the failing targets' requests by outcome, the worker's CPU share, and how long the
app's shutdown took (`runner.cleanup()`, the drain SIGTERM starts, grace 2 s). `--baseline`
runs the healthy target alone first; `--repeat N` alternates the two N times and ends with the
medians, their ratios, and the TTFT with the engine's part held at the baseline's. Goals:
`/-/healthy` p99 <= 100 ms, `/metrics` p99 <= 1 s, TTFT within 2x the baseline, shutdown within
the grace + 2 s. `--profile FILE` writes the worker's cProfile. `--pin` gives the daemon the
first CPU and everything else the others: on a machine of two, the failing server (which
stands for 200 other machines: ~40 % of a core writing keep-alives and drips) and the simulator
otherwise share the daemon's CPU, and the daemon's part then holds the kernel's scheduling
waits as well as its own.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from perf_common import (
    PYTHON,
    ROOT,
    Sim,
    ask,
    emit,
    fast_sim_args,
    fmt,
    free_port,
    pct,
    set_loop,
    tune_gc,
    wait_http,
)

sys.path.insert(0, str(ROOT))  # the worker runs the tree this file is in, not an installed one

from tests.support.failing_server import WAYS

SETTLE_SECONDS = 3.0
# The simulator's decode step. At the benchmarks' usual 10 ms a first token waits for the step
# under way, 0 to 10 ms: the engine's part of a TTFT was bimodal (2.7-4.2 or 9.2-12.6 ms, by
# set of runs) and the median of ~45 moved between the modes from run to run, whatever the
# daemon did. At 2 ms it is steady, and the ratio of the TTFTs reads the daemon.
SIM_STEP_SECONDS = 0.002
GRACE_SECONDS = 2.0


def target(
    name: str, url: str, load_rate: float = 2.0, silent: float = 0.0, seed: int = 1
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": name, "url": url, "model": "sim", "interval_seconds": 1, "jitter_seconds": 0.5,
        "warmup": 0, "max_tokens": 16,
    }  # fmt: skip
    if load_rate > 0:
        config["load"] = {"rate": load_rate, "max_tokens": 16, "seed": seed}
        if silent > 0:
            config["load"]["silent_seconds"] = silent
    return config


# -- the worker: the daemon's app --------------------------------------------------------------


async def daemon(ns: argparse.Namespace) -> dict[str, Any]:
    from aiohttp import web

    from prober.logs import setup_logging
    from prober.runtime import favour_the_loop
    from prober.settings import Settings
    from prober.timings import ttft
    from prober.web import FLEET, build_app

    targets = [target("healthy", ns.sim_url)]
    for i in range(ns.targets):
        way = WAYS[i % len(WAYS)]
        port = ns.hole_port if way == "blackhole" else ns.failing_port
        targets.append(
            target(
                f"{way}-{i}",
                f"http://127.0.0.1:{port}/{way}/v1",
                ns.failing_load,
                ns.silent_seconds,
                1 if ns.same_seed else i + 2,
            )
        )
    settings = Settings.model_validate(
        {"server": {"listen": f"127.0.0.1:{ns.port}", "grace_seconds": GRACE_SECONDS},
         "logging": {"level": "error"}, "targets": targets}
    )  # fmt: skip
    setup_logging("json", "error")
    app = build_app(settings)
    seen: list[tuple[str, float, str, float | None]] = []
    recorder = app[FLEET].recorder
    record = recorder.record

    stamps: list[tuple[float, str, int, int, int]] = []  # the healthy target's answers

    def noting(t: Any, result: Any, mode: Any) -> None:
        now = time.monotonic()
        seen.append((t.name, now, result.outcome.value, ttft(result)))
        if t.name == "healthy" and result.t_first_token_ns is not None:
            stamps.append((now, result.request_id, result.t_sched_ns, result.t_send_ns,
                           result.t_first_token_ns))  # fmt: skip
        record(t, result, mode)

    recorder.record = noting  # type: ignore[method-assign]
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", ns.port).start()
    tune_gc()
    favour_the_loop()  # as `llm-prober run` does
    profile = cProfile.Profile() if ns.profile else None
    await asyncio.sleep(SETTLE_SECONDS)
    start = time.monotonic()
    cpu0 = time.process_time()
    if profile:
        profile.enable()
    peak = 0.0  # the most load requests in flight at once, all targets, read each second
    for _ in range(int(ns.seconds)):
        await asyncio.sleep(1.0)
        peak = max(peak, _total(recorder.metrics.load_in_flight))
    await asyncio.sleep(ns.seconds - int(ns.seconds))
    if profile:
        profile.disable()
        profile.dump_stats(ns.profile)
    cpu = (time.process_time() - cpu0) / ns.seconds
    await asyncio.sleep(0.5)  # the pings end first
    t0 = time.monotonic()
    await runner.cleanup()
    shutdown = time.monotonic() - t0
    measured = [x for x in seen if start <= x[1] <= start + ns.seconds]
    healthy = [x[3] * 1e3 for x in measured if x[0] == "healthy" and x[3] is not None]
    failing = Counter(x[2] for x in measured if x[0] != "healthy")
    dropped: Counter[str] = Counter()
    for metric in recorder.metrics.load_dropped.collect():
        for sample in metric.samples:
            if sample.name.endswith("_total"):
                dropped[sample.labels["reason"]] += int(sample.value)
    within = [x[1:] for x in stamps if start <= x[0] <= start + ns.seconds]
    return {"ttft_ms": healthy, "stamps": within, "failing": dict(failing), "cpu_share": cpu,
            "shutdown_s": shutdown, "peak_load_in_flight": peak,
            "dropped": dict(dropped)}  # fmt: skip


def _total(gauge: Any) -> float:
    return sum(s.value for metric in gauge.collect() for s in metric.samples)


# -- this process ------------------------------------------------------------------------------


async def watch(port: int, seconds: float) -> tuple[list[float], list[float]]:
    await asyncio.sleep(SETTLE_SECONDS)
    return await asyncio.gather(ask(port, "/-/healthy", 0.02, seconds),
                                ask(port, "/metrics", 1.0, seconds))  # fmt: skip


def run(ns: argparse.Namespace, sim: Sim, targets: int, ports: tuple[int, int]) -> dict[str, Any]:
    port = free_port()
    out = Path(f"/tmp/llmprober-fleet-run-{port}.json")
    args = [PYTHON, __file__, "--worker", "--port", str(port), "--sim-url", sim.url,
            "--targets", str(targets), "--failing-port", str(ports[0]), "--hole-port",
            str(ports[1]), "--seconds", str(ns.seconds), "--out", str(out),
            "--failing-load", str(ns.failing_load), "--silent-seconds",
            str(ns.silent_seconds)] + (["--same-seed"] if ns.same_seed else [])  # fmt: skip
    if ns.profile and targets:
        args += ["--profile", ns.profile]
    if ns.cpu is not None:
        args += ["--cpu", str(ns.cpu)]
    proc = subprocess.Popen(args, cwd=ROOT)
    try:
        wait_http(f"http://127.0.0.1:{port}/-/healthy")
        # Asked a second less than the worker measures: none falls in its shutdown.
        healthy, metrics = asyncio.run(watch(port, ns.seconds - 1))
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    result = dict(json.loads(out.read_text()))
    out.unlink()
    result["healthy_ms"], result["metrics_ms"] = healthy, metrics
    return result


def split(sim: Sim, result: dict[str, Any]) -> dict[str, list[float]]:
    """The healthy target's TTFT in three parts (ms), from the simulator's own write stamps
    (one monotonic clock for every process): the daemon sending late (`sched → send`), the
    network and the simulator (`send → the token's write`), the daemon reading late (`write →
    the token's stamp`). The first and last are the daemon's (`daemon`: their sum); the
    middle one is the engine's and the machine's (the failing server shares its cores)."""
    parts: dict[str, list[float]] = {"send late": [], "engine": [], "read late": [], "daemon": []}
    for request_id, sched, send, first in result["stamps"]:
        writes = sim.stamps(request_id)["token_write_ns"]
        if not isinstance(writes, list) or not writes:
            continue
        late_send, late_read = (send - sched) / 1e6, (first - writes[0]) / 1e6
        parts["send late"].append(late_send)
        parts["engine"].append((writes[0] - send) / 1e6)
        parts["read late"].append(late_read)
        parts["daemon"].append(late_send + late_read)
    return parts


def line(label: str, values: list[float]) -> str:
    if not values:
        return f"{label}: none"
    return (f"{label}: n={len(values)} p50 {fmt(pct(values, 50))} p99 {fmt(pct(values, 99))}"
            f" max {fmt(max(values))} ms")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--failing-load",
        type=float,
        default=2.0,
        metavar="RATE",
        help="each failing target's Poisson load, requests/s (default 2; 0: none)",
    )
    parser.add_argument(
        "--silent-seconds",
        type=float,
        default=0.0,
        metavar="S",
        help="each failing target's load.silent_seconds (default: the daemon's)",
    )
    parser.add_argument(
        "--same-seed",
        action="store_true",
        help="every target's load seeded alike (1): their arrivals leave at the same instants,"
        " the healthy target's each with the fleet's (default: each its own seed)",
    )
    parser.add_argument("--baseline", action="store_true")
    parser.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="runs of each (default 1)"
    )
    parser.add_argument("--profile", help="write the worker's cProfile here")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the daemon on the first CPU, everything else (the simulator, the failing server,"
        " this process) on the others: the failing targets and the engine stand for other"
        " machines, and on a small machine they would take the daemon's CPU (needs 2 CPUs)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--sim-url", help=argparse.SUPPRESS)
    parser.add_argument("--failing-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--hole-port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.worker and ns.cpu is not None:
        os.sched_setaffinity(0, {ns.cpu})
    elif ns.pin:
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            parser.error(f"--pin needs 2 CPUs, this process may use {len(cpus)}")
        ns.cpu = cpus[0]  # the daemon's
        os.sched_setaffinity(0, cpus[1:])  # the simulator and the failing server inherit it
    if ns.worker:
        set_loop("uvloop")
        emit(asyncio.run(daemon(ns)), ns.out)
        return
    failing_port = free_port()
    server = subprocess.Popen(
        [PYTHON, "-m", "tests.support.failing_server", "--port", str(failing_port)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        ports = (failing_port, int(server.stdout.readline()))
        runs: list[tuple[str, dict[str, Any]]] = []
        with Sim((*fast_sim_args(), "--decode-step", f"{SIM_STEP_SECONDS:g}")) as sim:
            for _ in range(ns.repeat):  # alternated: the machine's drift falls on both
                kinds = [("baseline", 0)] if ns.baseline else []
                for name, targets in [*kinds, ("fleet", ns.targets)]:
                    result = run(ns, sim, targets, ports)
                    result["parts"] = split(sim, result)
                    runs.append((name, result))
    finally:
        server.terminate()
        server.wait(10)
    for name, r in runs:
        print(f"{name} ({ns.targets if name == 'fleet' else 0} failing targets, {ns.seconds:g} s):")
        print("  " + line("/-/healthy", r["healthy_ms"]))
        print("  " + line("/metrics", r["metrics_ms"]))
        print("  " + line("healthy TTFT", r["ttft_ms"]))
        print("    its parts, p50 / p90: " + ", ".join(
            f"{part} {fmt(pct(v, 50))} / {fmt(pct(v, 90))}"
            for part, v in r["parts"].items()))  # fmt: skip
        print(
            f"  load in flight at most {r['peak_load_in_flight']:.0f} (read each second);"
            f" arrivals not sent {r['dropped']}"
        )
        print(f"  failing outcomes {r['failing']}; worker CPU {r['cpu_share']:.0%};"
              f" shutdown {r['shutdown_s']:.2f} s (grace {GRACE_SECONDS:g} s)")  # fmt: skip
    if ns.baseline:
        summary(runs)


def summary(runs: list[tuple[str, dict[str, Any]]]) -> None:
    """Medians over the runs of each kind, and the fleet's TTFT over the baseline's."""
    figures: dict[str, dict[str, list[float]]] = {"baseline": {}, "fleet": {}}
    for name, r in runs:
        mine = figures[name]
        for key, values in (("TTFT p50", r["ttft_ms"]), ("TTFT p99", r["ttft_ms"])):
            mine.setdefault(key, []).append(pct(values, 50 if "50" in key else 99))
        for part, values in r["parts"].items():
            mine.setdefault(part, []).append(pct(values, 50))
    print(f"medians of {len(runs) // 2} runs each (ms):")
    for key in figures["fleet"]:
        base, fleet = (statistics.median(figures[k][key]) for k in ("baseline", "fleet"))
        ratio = f"{fleet / base:.2f}x" if base > 0 else "—"
        print(
            f"  {key:<10} baseline {fmt(base)}  fleet {fmt(fleet)}  ({ratio}; +{fmt(fleet - base)})"
        )
    # The simulator's own part moves between runs by more than the daemon's does (a request
    # that meets a step under way waits for it): held at the baseline's, what is left is what
    # the failing fleet did to the daemon.
    engine = statistics.median(figures["baseline"]["engine"])
    base, fleet = (engine + statistics.median(figures[k]["daemon"]) for k in ("baseline", "fleet"))
    print(f"  TTFT p50, the engine's part held at the baseline's ({fmt(engine)}): baseline"
          f" {fmt(base)}  fleet {fmt(fleet)}  ({fleet / base:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
