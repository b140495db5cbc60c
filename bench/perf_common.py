"""Shared pieces of the performance benchmarks: processes, the simulator, clocks, statistics,
and the command-line flags and worker plumbing the simulator-driven benchmarks have in common.

Every figure these benchmarks print is a median over repeated runs or a ratio measured in the
same run: the machines are small and shared, so one absolute time means little. Stamps are
`time.perf_counter_ns()` (CLOCK_MONOTONIC on Linux), comparable across processes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
CLK_TCK = os.sysconf("SC_CLK_TCK")

STEP_SECONDS = 0.01  # the fast engine's decode step


def fast_sim_args(slots: int = 512, prefill_base: float = 0.001) -> tuple[str, ...]:
    """The fast local engine of the benchmarks, as `llm-prober sim` flags.

    Every stream gets a token each 10 ms, batch size does not slow it, there are more slots
    than streams, so nothing ever queues, and a prompt's prefill costs `prefill_base` whatever
    its length (at the default 2,000 tokens/s a 40-token prompt would stretch everyone's step
    by 20 ms and bunch the streams up).
    """
    return (
        "--slots", str(slots), "--decode-step", f"{STEP_SECONDS:g}", "--decode-slowdown", "0",
        "--prefill-base", f"{prefill_base:g}", "--prefill-tps", "1e9",
    )  # fmt: skip


FAST_SIM_ARGS = fast_sim_args()


def loop_bootstrap(loop: str) -> str:
    """Python source that installs the chosen event loop before anything else runs."""
    if loop == "uvloop":
        return "import asyncio, uvloop; asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())\n"
    if loop == "asyncio":
        return ""
    raise ValueError(f"unknown loop {loop!r}")


def cli_command(args: Sequence[str], loop: str = "asyncio") -> list[str]:
    """`python -m prober.cli ARGS`, on the chosen event loop."""
    main = "import sys\nfrom prober.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    code = loop_bootstrap(loop) + main
    return [PYTHON, "-c", code, *args]


def spawn_cli(
    args: Sequence[str], loop: str = "asyncio", cpus: set[int] | None = None
) -> subprocess.Popen[bytes]:
    """`python -m prober.cli ARGS` in a process of its own, output discarded, on `cpus` if set."""
    return subprocess.Popen(
        cli_command(args, loop), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        preexec_fn=_affinity(cpus),
    )  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1.0) as resp:
                if resp.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.1)


def pinning(enabled: bool = True) -> tuple[set[int] | None, set[int] | None]:
    """CPU sets for (simulator, client): one core each, or no pinning (None, None).

    On a small machine the scheduler, when the simulator wakes the client, tends to run the
    client on the simulator's core (wake-affine), where it waits for the simulator's whole
    burst of writes: the raw client's p99 error was 3 ms unpinned and 0.03 ms pinned. In
    production the prober and the engine do not share a core; pinning measures the client.
    """
    cpus = sorted(os.sched_getaffinity(0))
    if not enabled or len(cpus) < 2:
        return None, None
    return {cpus[0]}, {cpus[1]}


def _affinity(cpus: set[int] | None) -> Callable[[], None] | None:
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)


class Sim:
    """The simulator in a process of its own (so its CPU never counts as the client's)."""

    def __init__(
        self,
        args: Sequence[str] = FAST_SIM_ARGS,
        loop: str = "asyncio",
        cpus: set[int] | None = None,
    ) -> None:
        self.port = free_port()
        self.proc = spawn_cli(["sim", "--port", str(self.port), *args], loop, cpus)
        wait_http(f"http://127.0.0.1:{self.port}/health")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stamps(self, request_id: str) -> dict[str, object]:
        url = f"http://127.0.0.1:{self.port}/sim/requests/{request_id}"
        with urllib.request.urlopen(url, timeout=10.0) as resp:
            return dict(json.load(resp))

    def cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.proc.pid)

    def run_worker(
        self, args: Sequence[str], env: dict[str, str] | None = None, cpus: set[int] | None = None
    ) -> dict[str, object]:
        """`run_worker` against this simulator, plus `sim_cpu_share`: the simulator's CPU
        seconds over the run's wall time (a share of one core)."""
        cpu0, wall0 = self.cpu_seconds(), time.monotonic()
        out = run_worker(args, env=env, ours=[self.proc.pid], cpus=cpus)
        out["sim_cpu_share"] = (self.cpu_seconds() - cpu0) / (time.monotonic() - wall0)
        return out

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> Sim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TruthServer(Sim):
    """`truth_server.py` in a process of its own: arrival and token-write stamps per request
    (`truth()`), 50 ms to the first token, then a token every 10 ms (`STEP_SECONDS`)."""

    def __init__(self, cpus: set[int] | None = None) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [PYTHON, str(ROOT / "bench" / "truth_server.py"), "--port", str(self.port),
             "--step", f"{STEP_SECONDS:g}"], cwd=ROOT, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=_affinity(cpus),
        )  # fmt: skip
        wait_http(f"http://127.0.0.1:{self.port}/health")

    def truth(self) -> dict[str, list[Any]]:
        """{request id: [arrival_ns, [token write ns, ...]]} since the last call."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/truth", timeout=30) as resp:
            return dict(json.load(resp))


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (from /proc, clock-tick resolution)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no VmRSS for pid {pid}")


def machine_cpu_seconds() -> float:
    """CPU seconds all processes on this machine have used (all cores, from /proc/stat)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / CLK_TCK


def wait_quiet(threshold: float = 0.25, patience: float = 120.0) -> float:
    """Wait (up to `patience` s) until other work uses under `threshold` of the machine.

    The machines are shared: a benchmark started while someone's test suite saturates the
    cores measures that suite. Returns the busy share seen last (0..1 of all cores).
    """
    cores = os.cpu_count() or 1
    deadline = time.monotonic() + patience
    while True:
        before = machine_cpu_seconds()
        time.sleep(1.0)
        busy = (machine_cpu_seconds() - before) / cores
        if busy < threshold or time.monotonic() > deadline:
            return busy


class OtherLoad:
    """Share of the machine that processes other than `ours` used over a run (0..1)."""

    def __init__(self, ours: Sequence[int]) -> None:
        self._ours = list(ours)
        self._t0 = time.monotonic()
        self._machine0 = machine_cpu_seconds()
        self._ours0 = self._ours_cpu()

    def _ours_cpu(self) -> float:
        total = 0.0
        for pid in self._ours:
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += proc_cpu_seconds(pid)
        return total

    def add(self, pid: int) -> None:
        self._ours.append(pid)

    def share(self, ours_extra: float = 0.0) -> float:
        """`ours_extra`: CPU seconds of our processes that already exited (e.g. a worker)."""
        wall = time.monotonic() - self._t0
        machine = machine_cpu_seconds() - self._machine0
        ours = self._ours_cpu() - self._ours0 + ours_extra
        return max(0.0, machine - ours) / (wall * (os.cpu_count() or 1))


# What a `+gc` client does after its warm-up: what the daemon does after start-up
# (`prober.runtime.tune_gc`, the same thresholds), repeated here because a `before` client
# imports an older `prober` that lacks it. Everything alive moves to the permanent generation
# (imports, app, session), so full collections stop walking it, and the young generation is
# collected every 10,000 allocations instead of every 700: a streamed token allocates several
# dicts, so with the defaults a collection interrupts the stream every few dozen tokens.
GC_THRESHOLDS = (10_000, 10, 10)


def tune_gc() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def client_spec(spec: str) -> tuple[str, str, bool]:
    """`MODE[@LOOP][+gc]` → (mode, loop, tune_gc)."""
    spec, plus, flag = spec.partition("+")
    if plus and flag != "gc":
        raise ValueError(f"unknown client option +{flag}")
    mode, _, loop = spec.partition("@")
    return mode, loop or "asyncio", bool(plus)


def client_worker(
    client: str, before: str | None, env: dict[str, str] | None = None
) -> tuple[str, list[str], dict[str, str] | None]:
    """Client spec `MODE[@LOOP][+gc]` → (worker mode, worker flags, worker environment).

    Client `before` is mode `prober` imported from the directory `before`; the flags are the
    worker's `--loop` and `--tune-gc`; `env` None inherits this process's environment.
    """
    mode, loop, gc_tuned = client_spec(client)
    if mode == "before":
        if before is None:
            raise ValueError("client `before` needs --before DIR")
        mode, env = "prober", {**(os.environ if env is None else env), "PYTHONPATH": before}
    return mode, ["--loop", loop, *(["--tune-gc"] if gc_tuned else [])], env


def set_loop(loop: str) -> None:
    """In a worker, before `asyncio.run`: run on uvloop if `loop` says so, else on asyncio."""
    if loop == "uvloop":
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit, so `with Sim(...)` still stops the simulator."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"p50": pct(values, 50), "p99": pct(values, 99), "max": max(values, default=math.nan)}


def median(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def run_worker(
    args: Sequence[str],
    timeout: float = 600.0,
    env: dict[str, str] | None = None,
    ours: Sequence[int] = (),
    cpus: set[int] | None = None,
) -> dict[str, object]:
    """Run `python ARGS --out FILE`; return the JSON object the worker wrote, plus `other_load`.

    Results travel through a file, not stdout: a worker on uvloop can leave its stdout
    non-blocking and a large print then comes back cut short. `other_load` is the share of
    the machine used by anything but the worker and `ours` (the simulator) while it ran: a
    run with much of it measured someone else's work too.
    """
    other = OtherLoad(ours)
    with tempfile.TemporaryDirectory() as tmp:
        out_path = Path(tmp) / "out.json"
        proc = subprocess.run(
            [PYTHON, *args, "--out", str(out_path)], cwd=ROOT, capture_output=True, text=True,
            timeout=timeout, check=False, env=env, preexec_fn=_affinity(cpus),
        )  # fmt: skip
        if proc.returncode != 0 or not out_path.exists():
            raise RuntimeError(f"worker {args} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        out = dict(json.loads(out_path.read_text()))
    # The worker reports its whole CPU time as `cpu_total` (see `emit`).
    out["other_load"] = other.share(float(out.get("cpu_total", 0.0)))
    return out


def emit(result: dict[str, object], path: str) -> None:
    """A worker's last act: write its result, with its whole CPU time, for `run_worker`."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result["cpu_total"] = usage.ru_utime + usage.ru_stime
    Path(path).write_text(json.dumps(result))


def fmt(value: float, digits: int = 2) -> str:
    return "—" if math.isnan(value) else f"{value:.{digits}f}"


# -- command-line flags the simulator-driven benchmarks share ---------------------------------


def add_run_args(parser: argparse.ArgumentParser) -> None:
    """`--tokens`, `--repeats`, `--quiet`: what a stream asks for, how often each run is made,
    and how idle the machine must be before it starts."""
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--quiet", type=float, default=0.25, metavar="SHARE",
        help="before each run, wait (up to 2 min) until other work uses under SHARE of the "
        "machine (default 0.25)",
    )  # fmt: skip


def add_client_args(parser: argparse.ArgumentParser, clients: str) -> None:
    """`--clients`, `--before`, `--json`, `--no-pin`: which clients to compare, and how."""
    parser.add_argument("--clients", default=clients)
    parser.add_argument("--before", metavar="DIR", help="client `before`: prober from DIR")
    parser.add_argument("--json", help="write every run's figures to this file")
    parser.add_argument(
        "--no-pin", action="store_true",
        help="let the simulator and the client share cores (see bench/README.md)",
    )  # fmt: skip


def add_worker_args(parser: argparse.ArgumentParser, *, client: bool = True) -> None:
    """The hidden flags a benchmark passes to its own worker process (`--worker` is its own).

    `client`: the worker takes a client spec's `--loop` and `--tune-gc` (see `client_worker`).
    """
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    if client:
        parser.add_argument("--loop", default="asyncio", help=argparse.SUPPRESS)
        parser.add_argument("--tune-gc", action="store_true", help=argparse.SUPPRESS)


def write_runs(path: str | None, runs: Mapping[tuple[Any, str], object]) -> None:
    """`--json`: every run's figures, keyed `LEVEL:CLIENT`; nothing without a path."""
    if path:
        with open(path, "w") as f:
            json.dump({f"{k[0]}:{k[1]}": v for k, v in runs.items()}, f, indent=1)


@contextlib.asynccontextmanager
async def serve_app(app: Any) -> AsyncIterator[int]:
    """Serve an aiohttp `app` on a free loopback port, in this loop; yield the port."""
    from aiohttp import web

    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield runner.addresses[0][1]
    finally:
        await runner.cleanup()


async def ask(
    port: int, path: str, every: float, seconds: float, timeout: float = 10.0
) -> list[float]:
    """Milliseconds of each GET of the daemon's `path`, one every `every` s for `seconds`;
    a failed or timed-out one counts as `timeout`."""
    import aiohttp

    url = f"http://127.0.0.1:{port}{path}"
    times: list[float] = []
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            t0 = time.perf_counter()
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                    await resp.read()
                times.append((time.perf_counter() - t0) * 1e3)
            except (aiohttp.ClientError, TimeoutError):
                times.append(timeout * 1e3)
            await asyncio.sleep(every)
    return times
