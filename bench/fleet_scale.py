"""Fleet scale: one daemon following 500 discovered targets (issue 35, item 7).

    .venv/bin/python bench/fleet_scale.py [--targets 500] [--seconds 120] [--repeats 3]
        [--lean] [--loop default|asyncio|uvloop]

One stub engine process (the simulator's app: a token every 10 ms, 512 slots, nothing
queues) listens on `--targets + 100` loopback addresses, 127.0.1.1, 127.0.1.2, … (all of
127.0.0.0/8 is loopback on Linux), one port, so every target has an address of its own.
The daemon (`llm-prober run`) finds them in a file_sd file (one `target_groups:` entry,
probes every 15 s with the default jitter and pairs, no `metrics_url`, no load). Once every
target is running and a 30 s settling period has passed (the warm-ups), it measures, each
run on a fresh daemon:

- its CPU (user + system from /proc/PID/stat over the window, % of one core) and RSS (VmRSS
  sampled every 5 s, the largest), scraped every 15 s as Prometheus would;
- `/metrics`: its size, its series count, and the series a target costs (the median over
  targets of the lines that carry its `target` label), by family for that target;
- render time: 30 GETs of `/metrics` one after the other (p50, p99: the largest but none);
- dispatch lag p99 over the window, from the daemon's own histogram
  (`llmprober_dispatch_lag_seconds`, every target's probes, bucket counts' increase);
- no probe skipped: `llmprober_probe_skipped_total`'s increase, and each target's probes
  (`llmprober_requests_total{mode="probe"}`) over the window, least and median;
- reload: `POST /-/reload` with nothing changed (5 times: median, largest); and a rewrite of
  the file_sd file that removes 100 targets and adds 100 others, timed from the write until
  every added target is probed and described (`llmprober_probe_interval_seconds`: the fleet
  has started its job) and until every removed target's series are gone; this includes the
  file's look interval (5 s) and discovery's debounce (1 s). Over the 30 s after it, the 400
  unchanged targets' probes go on: none skipped, each probed.

The load average (1 min) is printed beside each figure: the machine is shared. With
`--repeats`, the medians of the runs are printed last, and the ratio to the goals. `--lean`
runs the group with `series: {itl: false, phases: false}`. Nothing here asserts anything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from perf_common import (
    PYTHON,
    ROOT,
    exit_on_sigterm,
    free_port,
    proc_cpu_seconds,
    proc_rss_bytes,
    spawn_cli,
    wait_http,
)

Run = dict[str, Any]  # one run's figures
SETTLE_SECONDS = 30.0
SCRAPE_EVERY = 15.0
SAMPLE_SECONDS = 5.0
RENDERS = 30
RELOADS = 5
CHURN = 100
AFTER_CHURN_SECONDS = 30.0
GROUP = "fleet"
GOALS = {"cpu_pct": 15.0, "rss_mb": 400.0, "render_p99_s": 1.0, "lag_p99_ms": 20.0,
         "noop_reload_s": 1.0}  # fmt: skip
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def address(i: int) -> str:
    """The i-th loopback host: 127.0.1.1 upwards, 250 a /24."""
    return f"127.0.{1 + i // 250}.{1 + i % 250}"


# --- the stub engine: the simulator's app on many loopback addresses --------------------------
def serve(port: int, count: int) -> None:
    from aiohttp import web

    from prober.sim.app import build_app
    from prober.sim.config import SimConfig

    async def run() -> None:
        cfg = SimConfig(slots=512, decode_step_seconds=0.01, decode_slowdown=0,
                        prefill_base_seconds=0.001, prefill_tokens_per_second=1e9)  # fmt: skip
        runner = web.AppRunner(build_app(cfg), access_log=None)
        await runner.setup()
        for i in range(count):
            await web.TCPSite(runner, address(i), port, backlog=512).start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(run())


class Stub:
    def __init__(self, count: int) -> None:
        self.port = free_port()
        cmd = [PYTHON, str(Path(__file__)), "--serve", str(self.port), "--count", str(count)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != b"ready":
            raise RuntimeError("the stub engine did not start")
        wait_http(f"http://{address(count - 1)}:{self.port}/health")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


# --- reading /metrics ------------------------------------------------------------------------
def get(url: str, data: bytes | None = None) -> tuple[bytes, float, int]:
    """The body, the seconds it took, the status."""
    t0 = time.perf_counter()
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            body, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        body, status = exc.read(), exc.code
    return body, time.perf_counter() - t0, status


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        match = _SAMPLE.match(line)
        if match:
            labels = dict(_LABEL.findall(match.group(2) or ""))
            out.append((match.group(1), labels, float(match.group(3))))
    return out


def scrape(base: str, family: str | None = None) -> list[tuple[str, dict[str, str], float]]:
    query = f"?name[]={family}" if family else ""
    body, _, _ = get(f"{base}/metrics{query}")
    return samples(body.decode())


def lag_buckets(series: list[tuple[str, dict[str, str], float]]) -> dict[float, float]:
    buckets: dict[float, float] = defaultdict(float)
    for name, labels, value in series:
        if name == "llmprober_dispatch_lag_seconds_bucket":
            buckets[float(labels["le"])] += value
    return buckets


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float:
    """histogram_quantile over the increase of cumulative buckets, as Prometheus computes it."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1]
    if total <= 0:
        return float("nan")
    rank, lower, below = q * total, 0.0, 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = bound, count
    return lower


def probes_by_target(series: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    done: dict[str, float] = defaultdict(float)
    for name, labels, value in series:
        if name == "llmprober_requests_total" and labels.get("mode") == "probe":
            done[labels["target"]] += value
    return done


def skipped(series: list[tuple[str, dict[str, str], float]]) -> float:
    return sum(v for n, _, v in series if n == "llmprober_probe_skipped_total")


def load1() -> float:
    return os.getloadavg()[0]


# --- one run ---------------------------------------------------------------------------------
def write_sd(path: Path, indices: range | list[int], port: int) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": [f"{address(i)}:{port}" for i in indices]}]))
    tmp.replace(path)  # one step: the file is never seen half written


def config(listen: int, sd: Path, lean: bool) -> str:
    series = "\n    series: {itl: false, phases: false}" if lean else ""
    return (
        f'server:\n  listen: "127.0.0.1:{listen}"\n'
        f"target_groups:\n  - group: {GROUP}\n    model: sim\n    interval_seconds: 15\n"
        "    traffic: probes\n"
        f"    remove_after_seconds: 0\n    file_sd:\n      files: [{json.dumps(str(sd))}]"
        f"{series}\nlogging: {{level: warning}}\n"
    )


def wait_for(check: object, timeout: float, every: float = 0.25) -> float | None:
    """Seconds until `check()` is true, None past `timeout`."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if check():  # type: ignore[operator]
            return time.monotonic() - t0
        time.sleep(every)
    return None


def one_run(n: int, seconds: float, lean: bool, loop: str, stub: Stub, tmp: Path) -> Run:
    sd, port = tmp / "fleet.json", free_port()
    write_sd(sd, range(n), stub.port)
    (tmp / "prober.yml").write_text(config(port, sd, lean))
    base = f"http://127.0.0.1:{port}"
    daemon = spawn_cli(["run", "--config", str(tmp / "prober.yml")], loop)
    out: Run = {}
    try:
        wait_http(f"{base}/-/healthy", timeout=60)
        started = wait_for(lambda: len(probes_by_target(scrape(base))) >= n, 180, every=2)
        out["all_targets_probed_after_s"] = started
        time.sleep(SETTLE_SECONDS)
        out.update(window(daemon.pid, base, seconds))
        out.update(renders(base, n))
        out.update(reloads(base, sd, n, stub.port))
    finally:
        daemon.terminate()
        daemon.wait(60)
    return out


def window(pid: int, base: str, seconds: float) -> Run:
    before = scrape(base)
    cpu0, t0, loads, rss = proc_cpu_seconds(pid), time.monotonic(), [load1()], []
    next_scrape = t0 + SCRAPE_EVERY
    while (now := time.monotonic()) < t0 + seconds:
        if now >= next_scrape:
            get(f"{base}/metrics")
            next_scrape += SCRAPE_EVERY
        rss.append(proc_rss_bytes(pid))
        loads.append(load1())
        time.sleep(min(SAMPLE_SECONDS, max(0.0, t0 + seconds - now)))
    wall = time.monotonic() - t0
    cpu = (proc_cpu_seconds(pid) - cpu0) / wall
    after = scrape(base)
    done = probes_by_target(after)
    progress = [done[t] - v for t, v in probes_by_target(before).items()]
    return {
        "cpu_pct": 100 * cpu, "rss_mb": max(rss) / 2**20, "load_window": statistics.mean(loads),
        "lag_p99_ms": 1000 * quantile(0.99, lag_buckets(before), lag_buckets(after)),
        "lag_p50_ms": 1000 * quantile(0.5, lag_buckets(before), lag_buckets(after)),
        "skipped": skipped(after) - skipped(before),
        "probes_min": min(progress), "probes_median": statistics.median(progress),
        "probes_expected": wall / 15 * 1.5,  # half the runs send a companion (pair_share 0.5)
    }  # fmt: skip


def renders(base: str, n: int) -> Run:
    times, body = [], b""
    load = load1()
    for _ in range(RENDERS):
        body, took, _ = get(f"{base}/metrics")
        times.append(took)
    series = samples(body.decode())
    per_target: Counter[str] = Counter(labels.get("target", "") for _, labels, _ in series)
    mine = sorted((c, t) for t, c in per_target.items() if t.startswith(f"{GROUP}/"))
    median_count, median_target = mine[len(mine) // 2]
    families: Counter[str] = Counter()
    for name, labels, _ in series:
        if labels.get("target") == median_target:
            families[re.sub(r"_(bucket|sum|count|total)$", "", name)] += 1
    times.sort()
    return {
        "render_p50_s": statistics.median(times), "render_p99_s": times[-2],
        "render_load": load, "metrics_bytes": len(body), "series": len(series),
        "series_per_target": median_count, "targets_seen": len(mine),
        "families": dict(families.most_common()),
    }  # fmt: skip


def reloads(base: str, sd: Path, n: int, stub_port: int) -> Run:
    load, noop = load1(), []
    for _ in range(RELOADS):
        _, took, status = get(f"{base}/-/reload", data=b"")
        noop.append(took if status == 200 else float("nan"))
    churn = min(CHURN, n // 5)
    removed = [f"{GROUP}/{address(i)}:{stub_port}" for i in range(churn)]
    added = [f"{GROUP}/{address(i)}:{stub_port}" for i in range(n, n + churn)]
    before = scrape(base)
    t0 = time.monotonic()
    write_sd(sd, [*range(churn, n), *range(n, n + churn)], stub_port)

    def described() -> bool:
        have = {lab.get("target") for _, lab, _ in scrape(base, "llmprober_probe_interval_seconds")}
        return set(added) <= have

    def gone() -> bool:
        have = {lab.get("target") for _, lab, _ in scrape(base, "llmprober_requests_total")}
        return not set(removed) & have

    added_s = wait_for(described, 120)
    gone_s = wait_for(gone, 120)
    gone_s = None if gone_s is None or added_s is None else added_s + gone_s
    churn_load = load1()
    time.sleep(max(0.0, AFTER_CHURN_SECONDS - (time.monotonic() - t0)))
    after = scrape(base)
    done, then = probes_by_target(after), probes_by_target(before)
    kept = [done[t] - then[t] for t in then if t not in removed]
    return {
        "churn": churn, "noop_reload_s": statistics.median(noop), "noop_reload_max_s": max(noop),
        "reload_load": load, "churn_added_s": added_s, "churn_removed_s": gone_s,
        "churn_load": churn_load, "churn_skipped": skipped(after) - skipped(before),
        "churn_unchanged_min_probes": min(kept, default=float("nan")),
        "churn_window_s": time.monotonic() - t0,
    }  # fmt: skip


# --- report ----------------------------------------------------------------------------------
def seconds(value: float | None) -> str:
    return "never (120 s)" if value is None else f"{value:.2f} s"


def show(run: Run) -> None:
    r = run
    print(
        f"  CPU {r['cpu_pct']:.1f} % of a core, RSS {r['rss_mb']:.0f} MB "
        f"(load {r['load_window']:.1f}); dispatch lag p50 {r['lag_p50_ms']:.1f} ms, "
        f"p99 {r['lag_p99_ms']:.1f} ms\n"
        f"  /metrics {r['metrics_bytes'] / 2**20:.1f} MiB, {r['series']} series, "
        f"{r['series_per_target']} per target ({r['targets_seen']} targets); render p50 "
        f"{r['render_p50_s']:.3f} s, p99 {r['render_p99_s']:.3f} s (load {r['render_load']:.1f})\n"
        f"  probes skipped {r['skipped']:.0f}; probes per target over the window: least "
        f"{r['probes_min']:.0f}, median {r['probes_median']:.0f} (about {r['probes_expected']:.0f}"
        f" expected)\n"
        f"  no-op reload {r['noop_reload_s']:.3f} s (largest {r['noop_reload_max_s']:.3f} s, "
        f"load {r['reload_load']:.1f}); -{r['churn']}/+{r['churn']} targets by file_sd: added "
        f"and probed after {seconds(r['churn_added_s'])}, removed series gone after "
        f"{seconds(r['churn_removed_s'])} (load {r['churn_load']:.1f}); over "
        f"{r['churn_window_s']:.0f} s: {r['churn_skipped']:.0f} skipped, unchanged targets' "
        f"least probes {r['churn_unchanged_min_probes']:.0f}"
    )
    top = ", ".join(f"{k} {v}" for k, v in list(r["families"].items())[:8])
    print(f"  a target's series by family: {top}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--lean", action="store_true", help="series: {itl: false, phases: false}")
    parser.add_argument("--loop", default="default", choices=["default", "asyncio", "uvloop"])
    parser.add_argument("--json", help="write every run's figures here")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.serve:
        serve(ns.serve, ns.count)
        return
    exit_on_sigterm()
    loop = "asyncio" if ns.loop == "default" else ns.loop
    print(f"{ns.targets} targets by file_sd, 15 s probes with pairs, {ns.seconds:.0f} s windows,"
          f" {os.cpu_count()} cores, {'lean series' if ns.lean else 'every series'}")  # fmt: skip
    stub = Stub(ns.targets + CHURN)
    runs = []
    try:
        for i in range(ns.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                run = one_run(ns.targets, ns.seconds, ns.lean, loop, stub, Path(tmp))
            print(f"run {i + 1}:")
            show(run)
            runs.append(run)
    finally:
        stub.close()
    if ns.json:
        Path(ns.json).write_text(json.dumps(runs, indent=1))
    print(f"median of {len(runs)} runs, against the goals (figure / goal):")
    for key, goal in GOALS.items():
        value = statistics.median(r[key] for r in runs)
        print(f"  {key:>14} {value:10.3f}  goal {goal:g}  ratio {value / goal:.2f}")
    per = statistics.median(r["series_per_target"] for r in runs)
    print(f"  series per target {per:.0f}, /metrics series "
          f"{statistics.median(r['series'] for r in runs):.0f}")  # fmt: skip


if __name__ == "__main__":
    main()
