"""The foreign-traffic queue experiment: the engine serves another process, the daemon only probes.

For each level, `foreign_load` (its own process, plain aiohttp) drives the engine; after a
settling time this harness samples, every `sample_every` seconds, the daemon's
`llmprober_queue_depth{source="estimate"}` and the engine's own waiting and running counts,
read straight from the engine's `/metrics` with a parser of its own (the daemon is given no
`metrics_url` and never sees them). The truth is averaged over the trailing `truth_seconds`
(probes a second apart cannot follow sub-second swings; a constant at the true mean scores
0 against that average), and each level reports mean truth, mean estimate and mean absolute
error for waiting and running, with the estimate's basis and slots.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tests.integration.daemon import daemon, scrape, value
from tests.integration.engine import _healthy
from tests.support.net import free_port

# The engine's own names for its queue (llama-server; the simulator speaks vLLM's).
_WAITING = ("llamacpp:requests_deferred", "vllm:num_requests_waiting")
_RUNNING = ("llamacpp:requests_processing", "vllm:num_requests_running")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class Level:
    """One foreign load: Poisson at `rate`/s, or a closed loop of `workers` clients."""

    name: str
    mode: str
    rate: float = 0.0
    workers: int = 0

    def args(self) -> list[str]:
        if self.mode == "closed":
            return ["--mode", "closed", "--workers", str(self.workers)]
        return ["--mode", "poisson", "--rate", f"{self.rate:.4f}"]


@dataclass
class Score:
    level: Level
    pairs: list[tuple[float, float, float, float]] = field(default_factory=list)
    bases: Counter[str] = field(default_factory=Counter)
    slots: Counter[int] = field(default_factory=Counter)
    completed_per_second: float = 0.0  # the traffic's own completions over the level
    # Seconds from the level's start to the first scrape with a basis other than "none"
    # (scrapes run through the settling time too); None if it never had one.
    known_after: float | None = None

    def _mean(self, i: int) -> float:
        return sum(p[i] for p in self.pairs) / len(self.pairs)

    def _mae(self, i: int, j: int) -> float:
        return sum(abs(p[i] - p[j]) for p in self.pairs) / len(self.pairs)

    @property
    def true_waiting(self) -> float:
        return self._mean(0)

    @property
    def waiting_mae(self) -> float:
        return self._mae(0, 1)

    @property
    def true_running(self) -> float:
        return self._mean(2)

    @property
    def running_mae(self) -> float:
        return self._mae(2, 3)

    def row(self) -> str:
        basis = ",".join(f"{b}:{n}" for b, n in self.bases.most_common())
        slots = ",".join(f"{s}:{n}" for s, n in self.slots.most_common())
        return (
            f"{self.level.name:>10} {self.true_waiting:8.2f} {self._mean(1):8.2f} "
            f"{self.waiting_mae:6.2f} {self.true_running:8.2f} {self._mean(3):8.2f} "
            f"{self.running_mae:6.2f} {len(self.pairs):4d} {self.completed_per_second:6.2f}  "
            f"{basis}  slots {slots}"
        )


def table(scores: list[Score], note: str = "") -> str:
    head = (
        f"{'level':>10} {'wait tru':>8} {'wait est':>8} {'MAE':>6} {'run tru':>8} "
        f"{'run est':>8} {'MAE':>6} {'n':>4} {'done/s':>6}  basis"
    )
    return "\n".join([note, head, *(s.row() for s in scores)])


def engine_counts(text: str) -> tuple[float, float]:
    """(waiting, running) from an engine's /metrics text, by the engine's own names."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        name = name.split("{", 1)[0]
        if name in _WAITING or name in _RUNNING:
            found[name] = float(rest.split()[0])
    waiting = next((found[n] for n in _WAITING if n in found), None)
    running = next((found[n] for n in _RUNNING if n in found), None)
    if waiting is None or running is None:
        raise AssertionError(f"engine /metrics lacks queue counts: {sorted(found)}")
    return waiting, running


async def engine_truth(session: aiohttp.ClientSession, base: str) -> tuple[float, float]:
    """(waiting, running) as the engine at `base` reports them now."""
    async with session.get(f"{base}/metrics") as resp:
        return engine_counts(await resp.text())


@contextmanager
def sim_process(*flags: str) -> Iterator[str]:
    """`llm-prober sim` in a process of its own (the engine must not share the daemon's
    event loop); yields its base URL."""
    port = free_port()
    cmd = [sys.executable, "-m", "prober.cli", "sim", "--port", str(port), *flags]
    proc = subprocess.Popen(cmd, cwd=_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while not _healthy(base):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"simulator did not start: {cmd}")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


def check(scores: list[Score], slots: int) -> list[str]:
    """The issue's bounds: waiting MAE ≤ max(1, 25 % of the mean true depth), running MAE ≤
    max(1, 25 % of the slots), at every level; one line per miss."""
    misses = []
    for s in scores:
        if s.waiting_mae > max(1.0, 0.25 * s.true_waiting):
            misses.append(f"{s.level.name}: waiting MAE {s.waiting_mae:.2f}")
        if s.running_mae > max(1.0, 0.25 * slots):
            misses.append(f"{s.level.name}: running MAE {s.running_mae:.2f}")
    return misses


@asynccontextmanager
async def foreign_load(base: str, level: Level, *extra: str) -> AsyncIterator[list[Any]]:
    """The load process for `level`; yields a list that holds its report once it has stopped."""
    cmd = [
        sys.executable, "-m", "tests.integration.foreign_load", "--url", f"{base}/v1",
        "--seconds", "3600", *level.args(), *extra,
    ]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=_ROOT, stdout=asyncio.subprocess.PIPE)
    report: list[Any] = []
    try:
        yield report
    finally:
        if proc.returncode is None:
            proc.terminate()
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
        if out.strip():
            report.append(json.loads(out.decode().strip().splitlines()[-1]))


async def measure_capacity(base: str, workers: int, seconds: float, *extra: str) -> float:
    """Completions per second of a closed loop of `workers` foreign clients (after a warm-up)."""
    level = Level("capacity", "closed", workers=workers)
    async with foreign_load(base, level, "--warmup", str(seconds / 4), *extra) as report:
        await asyncio.sleep(seconds)
    await drain(base, timeout=120)
    return float(report[0]["rate"])


async def drain(base: str, timeout: float) -> None:
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await engine_truth(session, base) == (0.0, 0.0):
                return
            await asyncio.sleep(0.5)
    raise AssertionError("engine did not drain between levels")


async def run_levels(
    base: str, levels: list[Level], target: Mapping[str, Any], *, settle: float, seconds: float,
    load_args: tuple[str, ...] = (), sample_every: float = 0.5, truth_seconds: float = 5.0,
    learn: float = 0.0, learn_at: tuple[int, ...] = (0,),
) -> list[Score]:  # fmt: skip
    """One daemon probing `base` (no metrics_url, no load) through every level in turn.

    `learn`: seconds the levels `learn_at` settle longer, for a fresh daemon to learn what a
    long-running one has long known: the decode slowdown from its first pairs of probes (a
    level below saturation, where a companion finds a free slot), and, without a slots hint,
    the slots from probes that decoded at full batch (the first queued level). How long that
    took is each level's `known_after`."""
    config = {
        "server": {"listen": "127.0.0.1:0", "grace_seconds": 0.5},
        "targets": [{"name": "engine", "url": f"{base}/v1", "model": "m", **target}],
    }
    scores = []
    async with daemon(config) as (url, _), aiohttp.ClientSession() as session:
        for i, level in enumerate(levels):
            wait_first = settle + (learn if i in learn_at else 0.0)
            async with foreign_load(base, level, *load_args) as report:
                truth: deque[tuple[float, float, float]] = deque()
                score = Score(level)
                started = time.monotonic()
                while (elapsed := time.monotonic() - started) < wait_first + seconds:
                    waiting, running = await engine_truth(session, base)
                    now = time.monotonic()
                    truth.append((now, waiting, running))
                    while truth[0][0] < now - truth_seconds:
                        truth.popleft()
                    samples = await scrape(url)
                    if score.known_after is None and _known(samples):
                        score.known_after = elapsed
                    if elapsed >= wait_first:
                        _sample(score, truth, samples)
                    await asyncio.sleep(sample_every)
            score.completed_per_second = float(report[0]["rate"]) if report else 0.0
            scores.append(score)
            await drain(base, timeout=300)
    return scores


def _known(samples: Any) -> bool:
    return any(
        name == "llmprober_queue_estimate_basis" and v == 1 and dict(labels)["basis"] != "none"
        for (name, labels), v in samples.items()
    )


def _sample(score: Score, truth: deque[tuple[float, float, float]], samples: Any) -> None:
    n = len(truth)
    true_waiting = sum(t[1] for t in truth) / n
    true_running = sum(t[2] for t in truth) / n
    est = {
        state: value(samples, "llmprober_queue_depth", source="estimate", state=state)
        for state in ("waiting", "running")
    }
    score.pairs.append((true_waiting, est["waiting"], true_running, est["running"]))
    for (name, labels), v in samples.items():
        if name == "llmprober_queue_estimate_basis" and v == 1:
            score.bases[dict(labels)["basis"]] += 1
        if name == "llmprober_engine_slots":
            score.slots[int(v)] += 1
