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
import logging
import math
import os
import statistics
import subprocess
import sys
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import aiohttp

from tests.support.daemon import daemon, scrape, value
from tests.support.engine import _healthy
from tests.support.machine import LoopLag, snapshot, snapshot_at
from tests.support.margins import holds
from tests.support.net import free_port

# The engine's own names for its queue (llama-server; the simulator speaks vLLM's).
_WAITING = ("llamacpp:requests_deferred", "vllm:num_requests_waiting")
_RUNNING = ("llamacpp:requests_processing", "vllm:num_requests_running")
# Requests the engine finished (vLLM's and the simulator's; llama-server counts none).
_DEPARTED = ("vllm:request_success_total",)
T = TypeVar("T")
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass(frozen=True)
class Level:
    """One foreign load: Poisson at `rate`/s, or a closed loop of `workers` clients.

    `settle` and `seconds`, where set, replace `run_levels`' own for this level: a slow engine
    needs longer for the same number of probes (see `paced`)."""

    name: str
    mode: str
    rate: float = 0.0
    workers: int = 0
    settle: float | None = None
    seconds: float | None = None

    def args(self) -> list[str]:
        if self.mode == "closed":
            return ["--mode", "closed", "--workers", str(self.workers)]
        return ["--mode", "poisson", "--rate", f"{self.rate:.4f}"]


@dataclass
class Score:
    level: Level
    pairs: list[tuple[float, float, float, float]] = field(default_factory=list)
    known: list[bool] = field(default_factory=list)  # per pair: the estimate had a basis
    bases: Counter[str] = field(default_factory=Counter)
    drains: Counter[str] = field(default_factory=Counter)  # the drain rate's basis, per sample
    slots: Counter[int] = field(default_factory=Counter)
    completed_per_second: float = 0.0  # the traffic's own completions over the level
    failed: int = 0  # the traffic's requests that failed (a truth read beside them may lie)
    reasons: dict[str, int] = field(default_factory=dict)  # why they failed
    lag: float = 0.0  # the test loop's worst lateness over the level (a stalled machine)
    machine: str = ""  # the machine's busiest processes halfway through the level
    # Seconds from the level's start to the first scrape with a basis other than "none"
    # (scrapes run through the settling time too); None if it never had one.
    known_after: float | None = None
    # Seconds from the level's start to the daemon's word on the decode slowdown (whether the
    # batch can be read from the gaps): 0 where it came before the level, None if never.
    word_after: float | None = None
    # The daemon's drain rate (`llmprober_queue_drain_rate`) per sample, and the engine's count
    # of finished requests with its time: the departures the queue truly drained at, where a
    # queue lasts the whole level (every slot busy); the probes' own departures are in both.
    drain_estimates: list[float] = field(default_factory=list)
    departed: list[tuple[float, float]] = field(default_factory=list)

    def known_only(self) -> Score:
        """This level scored on the samples whose estimate had a basis (a figure was made)."""
        kept = [p for p, k in zip(self.pairs, self.known, strict=True) if k]
        return replace(self, pairs=kept, known=[True] * len(kept))

    def _mean(self, i: int) -> float:
        return sum(p[i] for p in self.pairs) / len(self.pairs)

    def _mae(self, i: int, j: int) -> float:
        return sum(abs(p[i] - p[j]) for p in self.pairs) / len(self.pairs)

    @property
    def _with_running(self) -> list[tuple[float, float, float, float]]:
        return [p for p in self.pairs if not math.isnan(p[3])]

    @property
    def running_share(self) -> float:
        """The share of samples with a running figure (none is made where the decode
        slowdown cannot tell the batch, below saturation)."""
        return len(self._with_running) / len(self.pairs) if self.pairs else 0.0

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
        """Over the samples with a running figure; 0 where none had one."""
        kept = self._with_running
        return sum(abs(p[2] - p[3]) for p in kept) / len(kept) if kept else 0.0

    @property
    def drain_estimated(self) -> float:
        return statistics.fmean(self.drain_estimates) if self.drain_estimates else math.nan

    @property
    def drain_true(self) -> float:
        """Departures per second over the scored samples, from the engine's own count."""
        if len(self.departed) < 2:
            return math.nan
        (t0, n0), (t1, n1) = self.departed[0], self.departed[-1]
        return (n1 - n0) / (t1 - t0) if t1 > t0 else math.nan

    @property
    def estimated_running(self) -> float:
        kept = self._with_running
        return sum(p[3] for p in kept) / len(kept) if kept else math.nan

    def row(self) -> str:
        basis = ",".join(f"{b}:{n}" for b, n in self.bases.most_common())
        basis += " drain " + ",".join(f"{b}:{n}" for b, n in self.drains.most_common())
        slots = ",".join(f"{s}:{n}" for s, n in self.slots.most_common())
        return (
            f"{self.level.name:>10} {self.true_waiting:8.2f} {self._mean(1):8.2f} "
            f"{self.waiting_mae:6.2f} {self.true_running:8.2f} {self.estimated_running:8.2f} "
            f"{self.running_mae:6.2f} {self.running_share:4.0%} {len(self.pairs):4d} "
            f"{self.completed_per_second:6.2f} "
            f"{self.failed:4d} {self.lag:5.1f} {self.drain_estimated:5.2f} {self.drain_true:5.2f}"
            f"  {basis}  slots {slots}" + (f"  failures {self.reasons}" if self.reasons else "")
        )


def table(scores: list[Score], note: str = "") -> str:
    head = (
        f"{'level':>10} {'wait tru':>8} {'wait est':>8} {'MAE':>6} {'run tru':>8} "
        f"{'run est':>8} {'MAE':>6} {'had':>4} {'n':>4} {'done/s':>6} {'fail':>4} {'lag':>5}"
        f" {'μ est':>5} {'μ tru':>5}  basis"
    )
    return "\n".join([note, head, *(s.row() for s in scores)])


def evidence(scores: list[Score]) -> str:
    """What the machine was doing halfway through each level: for a failure's message."""
    return "\n".join(f"{s.level.name}: {s.machine}" for s in scores if s.machine)


def _sums(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Each of `names` in an engine's /metrics text, summed over its series (an engine per
    `engine` label, as vLLM's data-parallel ranks; a finish reason per series)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        series, _, rest = line.rpartition("} ") if "{" in line else line.partition(" ")
        name = series.split("{", 1)[0]
        if name in names:
            found[name] = found.get(name, 0.0) + float(rest.split()[0])
    return found


def engine_counts(text: str) -> tuple[float, float]:
    """(waiting, running) from an engine's /metrics text, by the engine's own names."""
    found = _sums(text, _WAITING + _RUNNING)
    waiting = next((found[n] for n in _WAITING if n in found), None)
    running = next((found[n] for n in _RUNNING if n in found), None)
    if waiting is None or running is None:
        raise AssertionError(f"engine /metrics lacks queue counts: {sorted(found)}")
    return waiting, running


async def engine_truth(session: aiohttp.ClientSession, base: str) -> tuple[float, float]:
    """(waiting, running) as the engine at `base` reports them now."""
    waiting, running, _ = await engine_reading(session, base)
    return waiting, running


async def engine_reading(
    session: aiohttp.ClientSession, base: str
) -> tuple[float, float, float | None]:
    """(waiting, running, requests finished so far, None where the engine counts none)."""
    async with session.get(f"{base}/metrics") as resp:
        text = await resp.text()
    departed = next(iter(_sums(text, _DEPARTED).values()), None)
    return *engine_counts(text), departed


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


def check(scores: list[Score], slots: int, *, running_made: bool = True) -> list[str]:
    """The issue's bounds: waiting MAE ≤ max(1, 25 % of the mean true depth), running MAE ≤
    max(1, 25 % of the slots), at every level; one line per miss. The running figure is
    scored where one was made, and must have been made in `RUNNING_SHARE` of each level's
    samples unless `running_made` is False (below saturation on an engine whose step barely
    grows, where none is made but at a transient queue: `RARE_RUNNING_SHARE`)."""
    misses = []
    for s in scores:
        name = s.level.name
        if not holds(f"{name} waiting MAE", s.waiting_mae, at_most=max(1.0, 0.25 * s.true_waiting)):
            misses.append(f"{name}: waiting MAE {s.waiting_mae:.2f}")
        rare = not running_made and s.running_share < RARE_RUNNING_SHARE
        if rare:
            # Below saturation on an engine whose step barely grows, the only running figure
            # is the queue rule's (every probe in the window queued: every slot busy). In one
            # fresh run on vLLM's CPU build it came once in 58 samples at half the capacity,
            # saying 4 where the engine's trailing 5 s averaged 2.38 (four probes in a row had
            # waited past the free threshold; the engine's count at that instant was not read).
            # Such figures must be the slots and rare; scored against a mean they are a claim
            # the estimate does not make below saturation.
            odd = [p[3] for p in s.pairs if not math.isnan(p[3]) and p[3] != slots]
            if odd:
                misses.append(f"{name}: rare running figures {odd} not the slots {slots}")
        elif not holds(f"{name} running MAE", s.running_mae, at_most=max(1.0, 0.25 * slots)):
            misses.append(f"{name}: running MAE {s.running_mae:.2f}")
        made = s.running_share
        if running_made and not holds(f"{name} running made", made, at_least=RUNNING_SHARE):
            misses.append(f"{name}: a running figure in {s.running_share:.0%}")
    return misses


RUNNING_SHARE = 0.8
# Below saturation (`running_made` False) a running figure in fewer than this share of the
# samples is the queue rule's, made at a transient queue (`check`).
RARE_RUNNING_SHARE = 0.1


# A load process ends by itself this long after the longest its level was planned to last, and
# as soon as its parent is gone: a harness that is stuck or killed never leaves it loading the
# engine (in one CI run a load meant for a minute ran its former hour-long default).
LOAD_OVERTIME_SECONDS = 120.0


@asynccontextmanager
async def foreign_load(
    base: str, level: Level, *extra: str, seconds: float
) -> AsyncIterator[list[Any]]:
    """The load process for `level`, for at most `seconds` + `LOAD_OVERTIME_SECONDS`; yields a
    list that holds its report once it has stopped."""
    cmd = [
        sys.executable, "-m", "tests.support.foreign_load", "--url", f"{base}/v1",
        "--seconds", f"{seconds + LOAD_OVERTIME_SECONDS:.0f}", *level.args(), *extra,
    ]  # fmt: skip
    pipe = asyncio.subprocess.PIPE  # stdin: the load stops when it closes (our end)
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=_ROOT, stdin=pipe, stdout=pipe)
    report: list[Any] = []
    try:
        yield report
    finally:
        if proc.returncode is None:
            proc.terminate()
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout=30)
        except TimeoutError:
            proc.kill()
            raise
        if out.strip():
            report.append(json.loads(out.decode().strip().splitlines()[-1]))


async def measure_capacity(base: str, workers: int, seconds: float, *extra: str) -> float:
    """Completions per second of a closed loop of `workers` foreign clients (after a warm-up),
    driven by a load process of its own (`foreign_load`); the engine drained after it. (The
    own-load experiment's `queue_accuracy.measure_capacity_in_process` runs its clients in
    this process.)"""
    level = Level("capacity", "closed", workers=workers)
    warmup = ("--warmup", str(seconds / 4))
    async with foreign_load(base, level, *warmup, *extra, seconds=seconds) as report:
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
    learn: float = 0.0, learn_at: tuple[int, ...] = (0,), learn_grace: float = 0.0,
    until_word: bool = False,
) -> list[Score]:  # fmt: skip
    """One daemon probing `base` (no metrics_url, no load of its own) through every level of
    the foreign load in turn (`queue_accuracy.run_own_load_levels` steps the daemon's own load).

    `learn`: seconds the levels `learn_at` settle longer, for a fresh daemon to learn what a
    long-running one has long known: the decode slowdown from its first pairs of probes (a
    level below saturation, where a companion finds a free slot), and, without a slots hint,
    the slots from probes that decoded at full batch (the first queued level). How long that
    took is each level's `known_after`. `learn_grace`: up to this many seconds more, the
    levels `learn_at` wait until the estimate has a basis before they are scored: on a slower
    engine the pairs take longer (llama-server on an AVX2-only CPU at 1.9 requests/s: no basis
    for half the Poisson level after 35 s, a running MAE of 1.22). `until_word`: they wait
    instead until the daemon has said whether the decode slowdown can be read at all (its
    `decode_slowdown_*` line, `word_after`): before that word a figure comes and goes with
    the pairs' running judgement, and the first one that comes says little."""
    config = {
        "server": {"listen": "127.0.0.1:0", "grace_seconds": 0.5},
        "targets": [{"name": "engine", "url": f"{base}/v1", "model": "m", **target}],
    }
    scores = []
    words: list[float] = []  # when the daemon said its word on the slowdown
    async with (
        daemon(config) as (url, _),
        aiohttp.ClientSession() as session,
        _decode_lines(words),
    ):
        for i, level in enumerate(levels):
            level_settle = settle if level.settle is None else level.settle
            level_seconds = seconds if level.seconds is None else level.seconds
            wait_first = level_settle + (learn if i in learn_at else 0.0)
            grace = learn_grace if i in learn_at else 0.0
            planned = wait_first + grace + level_seconds
            score = Score(level)
            lag = LoopLag()
            async with (
                foreign_load(base, level, *load_args, seconds=planned) as report,
                lag,
                snapshot_at(planned / 2) as machine,
            ):
                truth: deque[tuple[float, float, float]] = deque()
                started = time.monotonic()
                scored_from: float | None = None
                elapsed = 0.0
                while scored_from is None or elapsed < scored_from + level_seconds:
                    elapsed = time.monotonic() - started
                    reading = await _answer(engine_reading(session, base), "engine")
                    waiting, running, departed = reading
                    now = time.monotonic()
                    truth.append((now, waiting, running))
                    while truth[0][0] < now - truth_seconds:
                        truth.popleft()
                    samples = await _answer(scrape(url), "daemon")
                    if score.known_after is None and _known(samples):
                        score.known_after = elapsed
                    if score.word_after is None and words:
                        score.word_after = max(0.0, words[0] - started)
                    ready = score.word_after if until_word else score.known_after
                    settled = ready is not None or elapsed >= wait_first + grace
                    if scored_from is None and elapsed >= wait_first and settled:
                        scored_from = elapsed
                    if scored_from is not None:
                        _sample(score, truth, samples)
                        if departed is not None:
                            score.departed.append((now, departed))
                    await asyncio.sleep(sample_every)
            score.completed_per_second = float(report[0]["rate"]) if report else 0.0
            score.failed = int(report[0]["failed"]) if report else 0
            score.reasons = dict(report[0].get("reasons", {})) if report else {}
            score.lag = lag.worst
            score.machine = "".join(machine)
            scores.append(score)
            await drain(base, timeout=300)
    return scores


@asynccontextmanager
async def _decode_lines(words: list[float]) -> AsyncIterator[None]:
    """The daemon's `decode_slowdown_*` lines (info) in the test's output: what the pairs read
    where the running figure below saturation is made, or not; when each came (monotonic
    seconds) appended to `words`."""
    capacity = logging.getLogger("prober.capacity")
    was = capacity.level
    capacity.setLevel(logging.INFO)
    handler = _WordHandler(words)
    capacity.addHandler(handler)
    try:
        yield
    finally:
        capacity.removeHandler(handler)
        capacity.setLevel(was)


class _WordHandler(logging.Handler):
    """Notes when a `decode_slowdown_readable` or `_unreadable` line is logged (structlog
    hands stdlib logging its event as a dict)."""

    def __init__(self, words: list[float]) -> None:
        super().__init__(logging.INFO)
        self.words = words

    def emit(self, record: logging.LogRecord) -> None:
        event = record.msg.get("event") if isinstance(record.msg, dict) else None
        if isinstance(event, str) and event.startswith("decode_slowdown_"):
            self.words.append(time.monotonic())


# How long one sample's `/metrics` read may take: an engine or daemon that does not answer
# fails the level here, named, instead of holding the test until its timeout.
ANSWER_SECONDS = 30.0


async def _answer(read: Awaitable[T], who: str) -> T:
    try:
        return await asyncio.wait_for(read, ANSWER_SECONDS)
    except TimeoutError:
        machine = await asyncio.to_thread(snapshot)
        raise AssertionError(
            f"the {who}'s /metrics did not answer in {ANSWER_SECONDS:.0f} s\n{machine}"
        ) from None


def probes_like_traffic(slots: int, answer_tokens: int) -> dict[str, Any]:
    """A target's probe settings for the real engines' tests: a probe a second, shaped like
    the foreign traffic (about 40 prompt tokens, answers of `answer_tokens` on average) and
    saying so (`traffic: probes`: unsaid, no waiting depth is made), so the service time needs
    no scaling; the `slots` hint; timeouts a deep queue on a slow engine cannot reach."""
    return {
        "interval_seconds": 1.0, "jitter_seconds": 0.2, "warmup": 1, "slots": slots,
        "prompt_tokens": 40, "max_tokens": answer_tokens, "extra_body": {"ignore_eos": True},
        "traffic": "probes", "timeouts": {"first_token_seconds": 120, "total_seconds": 300},
    }  # fmt: skip


def paced(
    level: Level, capacity: float, slots: int, settle: float, seconds: float, cycles: float = 2.0
) -> Level:
    """`level` with its settling and scoring times long enough for the same number of probe
    cycles on an engine of any speed (at least `settle` and `seconds`).

    A probe in a closed loop of `workers` clients waits for the requests ahead, about
    `workers / slots` service times (a service time `slots / capacity`), and is served. A
    pair's companion joins 40 % into the first probe's decode, waits as long, and the next
    probe goes once both are done: a cycle of about `2·workers/slots + 1.4` service times
    (pairs go with every probe while the decode slowdown is learned, and in a queue none
    teaches it). The estimate needs two cycles to follow a queue. Sized on an engine serving
    4.7 requests a second, the levels had a probe through in 4 s; on an AVX2-only CPU, vLLM
    served 0.82 a second, a probe took 20 s, and with 10 s to settle the estimate still read
    the probes of the unqueued moments (waiting 7.5 for 12.8). Paced by one probe's cycle
    (a third too short with pairs), vLLM's first quarter-minute scored at twice the slots
    read 0.5 to 0.9 requests high (2026-12-03).

    `cycles`: how many it settles for. The waits' window holds the last four probes at
    least, so after a step to a deep queue it holds the level before's until four probes of
    the new one are back: with a companion on half the probes, about 1.5 a cycle, after the
    cycle in flight at the step. On the simulator at five times the slots (a cycle of about
    8 s) a level settled 10 s was scored while the window still held the level before's
    waits: the figure read 14.0 to 16.7 for 16.8 to 17.1, low in every one of 23 such levels;
    settled three cycles, 18.0 and 18.3 for 17.0 (2026-12-07, docs/flakiness.md).

    At most `PACED_MAX_CYCLE_SECONDS` a cycle is allowed for: a capacity misread far low (a
    stalled moment of the machine) must not stretch a level past the test's timeout."""
    service = slots / capacity
    cycle = min((2 * level.workers / slots + 1.4) * service, PACED_MAX_CYCLE_SECONDS)
    return replace(level, settle=max(settle, cycles * cycle), seconds=max(seconds, 2 * cycle))


PACED_MAX_CYCLE_SECONDS = 30.0  # 60 s to settle and 60 s scored, a level at the most


def _known(samples: Any) -> bool:
    return any(
        name == "llmprober_queue_estimate_basis" and v == 1 and dict(labels)["basis"] != "none"
        for (name, labels), v in samples.items()
    )


def _exported(samples: Any, **labels: str) -> bool:
    """Whether the daemon exported an estimated queue depth with these labels."""
    return any(
        name == "llmprober_queue_depth" and ("source", "estimate") in sample_labels
        and all((k, v) in sample_labels for k, v in labels.items())
        for name, sample_labels in samples
    )  # fmt: skip


def _sample(score: Score, truth: deque[tuple[float, float, float]], samples: Any) -> None:
    n = len(truth)
    true_waiting = sum(t[1] for t in truth) / n
    true_running = sum(t[2] for t in truth) / n
    est = {
        state: value(samples, "llmprober_queue_depth", source="estimate", state=state)
        for state in ("waiting", "running")
    }
    if not _exported(samples, state="running"):
        est["running"] = math.nan  # no figure made: scored apart (`running_share`)
    score.pairs.append((true_waiting, est["waiting"], true_running, est["running"]))
    score.known.append(_known(samples))
    for (name, labels), v in samples.items():
        if name == "llmprober_queue_drain_rate":  # one target: one series, where exported
            score.drain_estimates.append(v)
        if name == "llmprober_queue_estimate_basis" and v == 1:
            score.bases[dict(labels)["basis"]] += 1
        if name == "llmprober_queue_drain_basis" and v == 1:
            score.drains[dict(labels)["basis"]] += 1
        if name == "llmprober_engine_slots":
            score.slots[int(v)] += 1
