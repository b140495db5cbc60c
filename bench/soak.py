"""Soak test: the daemon under steady background load for a long time; does it grow?

    .venv/bin/python bench/soak.py --minutes 30 --rate 20
    .venv/bin/python bench/soak.py --minutes 5 --rate 40 --overload   # a target 30x too slow

Starts the simulator (`python -m prober.cli sim`) and the daemon (`python -m prober.cli run`)
as subprocesses on free 127.0.0.1 ports, with open-loop background load at `--rate` and a
periodic probe. By default the simulator injects a few faults at random (503s, streams cut
mid-body, stalls, bad JSON) so the failure paths run too. `--overload` makes the simulator far
slower than the load, so the in-flight cap is hit and arrivals are dropped: memory must stay
bounded anyway (the evidence for the overload requirement, instead of a timed test).

Every `--interval` seconds it prints the daemon's resident memory (VmRSS from
/proc/PID/status), its open file descriptors (/proc/PID/fd), and from its /metrics the
requests finished, in flight and dropped. At the end: first vs last sample, the growth, and the
growth per hour, over the whole run and over its second half (after warm-up). With
`--no-scrape` nothing reads /metrics (as when Prometheus is down), so state that is only
pruned at scrape time shows as growth; the request columns are then empty. With
`--tracemalloc` the daemon runs under Python's allocation tracer (`traced_daemon.py`): each
sample adds the Python heap's traced size, and the summary its growth and the source lines
whose allocations grew most over the second half. RSS can creep while the heap stays flat
(the allocator's arenas, native buffers); only a growing heap is objects the daemon keeps.
Traced, the RSS also holds the tracer's own tables and its two snapshots: read the heap.
Everything stops by itself after `--minutes`, or on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from perf_common import free_port
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
TRACED = Path(__file__).resolve().parent / "traced_daemon.py"
CLI = [sys.executable, "-m", "prober.cli"]
_SERIES = ("llmprober_requests_total", "llmprober_load_in_flight", "llmprober_load_dropped_total")
FAULTS = ["status:503=0.02", "close_mid_body=0.01", "stall_after:2=0.01", "bad_json=0.01"]


@dataclass(frozen=True)
class Sample:
    elapsed: float
    rss_kib: int
    fds: int
    requests: float
    in_flight: float
    dropped: float
    heap_kib: float = math.nan  # the Python heap's traced size (--tracemalloc)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def signalled(pid: int, sig: signal.Signals, path: Path, timeout: float = 30.0) -> Path:
    """Send `sig` to the traced daemon and wait for the file it answers with."""
    path.unlink(missing_ok=True)
    os.kill(pid, sig)
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the traced daemon did not write {path.name} in {timeout:g} s")
        time.sleep(0.05)
    return path


def heap_kib(pid: int, folder: Path) -> float:
    return int(signalled(pid, signal.SIGUSR1, folder / "traced").read_text()) / 1024


def heap_growth(first: Path, last: Path, top: int = 10) -> list[str]:
    """The source lines whose traced allocations grew most from `first` to `last`."""
    own = [tracemalloc.Filter(False, tracemalloc.__file__)]
    old = tracemalloc.Snapshot.load(str(first)).filter_traces(own)
    new = tracemalloc.Snapshot.load(str(last)).filter_traces(own)
    grew = [d for d in new.compare_to(old, "lineno") if d.size_diff > 0]
    return [
        f"  {d.size_diff / 1024:+9.1f} KiB {d.count_diff:+7d} blocks  {d.traceback[0]}"
        for d in grew[:top]
    ]


def scrape(port: int) -> dict[str, float]:
    """Sums over all label sets of the few series the soak reports."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    sums = dict.fromkeys(_SERIES, 0.0)
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in _SERIES:
                sums[s.name] += s.value
    return sums


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def config_text(port: int, sim_port: int, args: argparse.Namespace) -> str:
    sim = f"http://127.0.0.1:{sim_port}"
    config = {
        "server": {"listen": f"127.0.0.1:{port}", "grace_seconds": 5},
        "logging": {"level": "warning", "format": "json"},
        "targets": [{
            "name": "soak", "url": f"{sim}/v1", "model": "sim", "interval_seconds": 5,
            "jitter_seconds": 0.5, "prompt_tokens": 64, "max_tokens": 16,
            "metrics_url": f"{sim}/metrics",
            "timeouts": {"connect_seconds": 2, "first_token_seconds": 10, "idle_seconds": 2,
                         "total_seconds": 30},
            "load": {"rate": args.rate, "arrival": "poisson", "max_in_flight": args.max_in_flight,
                     "prompt_tokens": 128, "prompt_tokens_spread": 0.5, "max_tokens": 16,
                     "max_tokens_spread": 0.5, "seed": 1},
        }],
    }  # fmt: skip
    return json.dumps(config, indent=2)  # JSON is YAML


def sim_args(sim_port: int, args: argparse.Namespace) -> list[str]:
    out = ["sim", "--host", "127.0.0.1", "--port", str(sim_port), "--seed", "1"]
    if args.overload:
        # One slot, 50 ms per token: about 1.3 requests/s of capacity against --rate.
        out += ["--slots", "1", "--decode-step", "0.05"]
    else:
        # Prefill is serial in the simulator: at its default 2000 tokens/s, 128-token prompts
        # cap it near 14 requests/s. Fast prefill and 32 slots leave room for --rate 20+.
        out += ["--slots", "32", "--decode-step", "0.01", "--prefill-tps", "100000"]
    if not args.no_faults:
        for fault in FAULTS:
            out += ["--fault-rate", fault]
    return out


def stop(proc: subprocess.Popen[bytes], grace: float) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    return proc.returncode


def per_hour(first: Sample, last: Sample, value: float) -> float:
    hours = (last.elapsed - first.elapsed) / 3600
    return value / hours if hours > 0 else 0.0


def summary(samples: list[Sample]) -> dict[str, float]:
    first, last, mid = samples[0], samples[-1], samples[len(samples) // 2]
    rss = (last.rss_kib - first.rss_kib) / 1024
    rss_late = (last.rss_kib - mid.rss_kib) / 1024
    return {
        "minutes": round(last.elapsed / 60, 2),
        "samples": len(samples),
        "rss_first_mib": round(first.rss_kib / 1024, 1),
        "rss_last_mib": round(last.rss_kib / 1024, 1),
        "rss_max_mib": round(max(s.rss_kib for s in samples) / 1024, 1),
        "rss_growth_mib": round(rss, 1),
        "rss_growth_mib_per_hour": round(per_hour(first, last, rss), 1),
        "rss_growth_second_half_mib_per_hour": round(per_hour(mid, last, rss_late), 1),
        "fds_first": first.fds,
        "fds_last": last.fds,
        "fds_min": min(s.fds for s in samples),
        "fds_max": max(s.fds for s in samples),
        "fds_growth_per_hour": round(per_hour(first, last, last.fds - first.fds), 1),
        "requests": last.requests,
        "requests_per_second": round(last.requests / last.elapsed, 2) if last.elapsed else 0.0,
        "in_flight_max": max(s.in_flight for s in samples),
        "dropped": last.dropped,
        "heap_first_mib": round(first.heap_kib / 1024, 1),
        "heap_last_mib": round(last.heap_kib / 1024, 1),
        "heap_growth_second_half_mib_per_hour": round(
            per_hour(mid, last, (last.heap_kib - mid.heap_kib) / 1024), 1
        ),
    }


def print_summary(result: dict[str, float]) -> None:
    r = result
    print(
        f"\nsummary over {r['minutes']} min, {r['samples']} samples:\n"
        f"  RSS  {r['rss_first_mib']} -> {r['rss_last_mib']} MiB (max {r['rss_max_mib']}): "
        f"{r['rss_growth_mib']:+} MiB, {r['rss_growth_mib_per_hour']:+} MiB/h "
        f"(second half {r['rss_growth_second_half_mib_per_hour']:+} MiB/h)\n"
        f"  fds  {r['fds_first']} -> {r['fds_last']} (min {r['fds_min']}, max {r['fds_max']}; "
        f"they move with the connections in flight): {r['fds_growth_per_hour']:+}/h\n"
        + (
            "  requests: not read (--no-scrape)"
            if math.isnan(r["requests"])
            else f"  requests {r['requests']:.0f} ({r['requests_per_second']}/s), "
            f"in flight max {r['in_flight_max']:.0f}, dropped {r['dropped']:.0f}"
        )
        + (
            ""
            if math.isnan(r["heap_first_mib"])
            else f"\n  Python heap (traced) {r['heap_first_mib']} -> {r['heap_last_mib']} MiB "
            f"(second half {r['heap_growth_second_half_mib_per_hour']:+} MiB/h)"
        )
    )


def soak(args: argparse.Namespace, folder: Path) -> tuple[list[Sample], list[str]]:
    """The samples, and with `--tracemalloc` the lines whose heap grew most over the second
    half."""
    port, sim_port = free_port(), free_port()
    config = folder / "config.yml"
    config.write_text(config_text(port, sim_port, args))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    logs = (folder / "sim.log").open("wb"), (folder / "daemon.log").open("wb")
    sim = subprocess.Popen([*CLI, *sim_args(sim_port, args)], stdout=logs[0],
                           stderr=subprocess.STDOUT, env=env, cwd=ROOT)  # fmt: skip
    daemon: subprocess.Popen[bytes] | None = None
    samples: list[Sample] = []
    try:
        wait_http(f"http://127.0.0.1:{sim_port}/v1/models", 30, sim)
        run = ["run", "--config", str(config)]
        command = [sys.executable, str(TRACED), str(folder), *run] if args.tracemalloc else [
            *CLI, *run]  # fmt: skip
        daemon = subprocess.Popen(command, stdout=logs[1], stderr=subprocess.STDOUT, env=env,
                                  cwd=ROOT)  # fmt: skip
        wait_http(f"http://127.0.0.1:{port}/-/healthy", 30, daemon)
        mode = "overload" if args.overload else "steady"
        print(f"soak ({mode}): daemon pid {daemon.pid} on :{port}, simulator :{sim_port}, "
              f"load {args.rate}/s (cap {args.max_in_flight}), {args.minutes} min, "
              f"a sample every {args.interval} s; logs in {folder}", flush=True)  # fmt: skip
        print(f"{'elapsed':>8} {'rss_mib':>8} {'fds':>5} {'requests':>9} {'req/s':>7} "
              f"{'in_flight':>9} {'dropped':>8}" + (f" {'heap_mib':>8}" if args.tracemalloc
                                                    else ""), flush=True)  # fmt: skip
        snapshots: list[Path] = []
        start = time.monotonic()
        end = start + args.minutes * 60
        while True:
            time.sleep(max(0.0, min(args.interval, end - time.monotonic())))
            if daemon.poll() is not None:
                raise RuntimeError(f"daemon exited with {daemon.returncode}")
            elapsed = time.monotonic() - start
            m = scrape(port) if not args.no_scrape else dict.fromkeys(_SERIES, math.nan)
            s = Sample(elapsed, rss_kib(daemon.pid), open_fds(daemon.pid),
                       m["llmprober_requests_total"], m["llmprober_load_in_flight"],
                       m["llmprober_load_dropped_total"],
                       heap_kib(daemon.pid, folder) if args.tracemalloc else math.nan)  # fmt: skip
            rate = s.requests / elapsed if elapsed else 0.0
            heap = f" {s.heap_kib / 1024:8.1f}" if args.tracemalloc else ""
            print(f"{_clock(elapsed):>8} {s.rss_kib / 1024:8.1f} {s.fds:5d} {s.requests:9.0f} "
                  f"{rate:7.1f} {s.in_flight:9.0f} {s.dropped:8.0f}{heap}", flush=True)  # fmt: skip
            samples.append(s)
            last = time.monotonic() >= end - 0.5
            if args.tracemalloc and (last or (not snapshots and elapsed >= args.minutes * 30)):
                name = f"snapshot-{len(snapshots)}.bin"
                snapshots.append(signalled(daemon.pid, signal.SIGUSR2, folder / name))
            if last:
                growth = heap_growth(*snapshots) if len(snapshots) == 2 else []
                return samples, growth
    except KeyboardInterrupt:
        return samples, []
    finally:
        code = stop(daemon, 15) if daemon is not None else None
        stop(sim, 10)
        for log in logs:
            log.close()
        if code not in (None, 0):
            print(f"daemon exited with {code} on SIGTERM; see {folder}/daemon.log", flush=True)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes // 60}:{minutes % 60:02d}:{secs:02d}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long (default 30)")
    parser.add_argument("--rate", type=float, default=20.0, help="load arrivals/s (default 20)")
    parser.add_argument("--max-in-flight", type=int, default=64, help="load cap (default 64)")
    parser.add_argument("--interval", type=float, help="seconds between samples "
                        "(default: 30, or a tenth of the run if shorter)")  # fmt: skip
    parser.add_argument("--overload", action="store_true", help="a target far slower than "
                        "the load: the cap is hit and arrivals dropped")  # fmt: skip
    parser.add_argument("--no-faults", action="store_true", help="no random injected faults")
    parser.add_argument("--no-scrape", action="store_true", help="never read /metrics (only "
                        "/proc): shows state that only a scrape prunes")  # fmt: skip
    parser.add_argument("--tracemalloc", action="store_true", help="trace the daemon's Python "
                        "heap: its size per sample, and the lines that grew it most over the "
                        "second half (slows the daemon)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="also print the summary as JSON")
    args = parser.parse_args()
    if args.minutes <= 0 or args.rate <= 0:
        parser.error("--minutes and --rate must be positive")
    if args.interval is None:
        args.interval = min(30.0, max(1.0, args.minutes * 6))
    with tempfile.TemporaryDirectory(prefix="llmprober-soak-") as folder:
        samples, growth = soak(args, Path(folder))
    if len(samples) < 2:
        print("too few samples for a summary", file=sys.stderr)
        return 1
    result = summary(samples)
    print_summary(result)
    if growth:
        print("  heap growth over the second half, by source line (tracemalloc):")
        print("\n".join(growth))
    if args.json:
        print(json.dumps({k: None if math.isnan(v) else v for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
