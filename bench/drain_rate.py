"""Can a probe see the engine's drain rate, whatever the traffic's shape? Admissions in its gaps.

The probes-alone estimate turns a probe's queue wait into a depth with the drain rate
`μ = slots / T`, T the service time of a request of the traffic's shape, which it does not
know. While every slot is busy, each departure lets a waiting request in, and its prefill runs
inside the batch the probe decodes in: one of the probe's token gaps is longer. Counted over
the probe's decode, those long gaps are admissions per second, which while a queue lasts *is*
the drain rate, with no shape assumed.

This bench measures that against the truth on an engine serving closed loops of foreign
clients (`tests/support/foreign_load.py`, another process, its completions per second the
truth of the departures), with answers of 0.5×, 1× and 2× the probes':

    .venv/bin/python bench/drain_rate.py --engine sim          # the 4-slot simulator
    .venv/bin/python bench/drain_rate.py --engine llama        # llama-server -np 4
    .venv/bin/python bench/drain_rate.py --engine vllm         # vLLM --max-num-seqs 4
    .venv/bin/python bench/drain_rate.py --url http://127.0.0.1:8000 --slots 4

Per level it prints the true departures/s (the foreign load's completions plus the probes'),
the admission rate read from the probes' runs of long gaps (`admissions`: a gap past the
probe's median by `--spike` of it or six median absolute deviations of the gaps below the
median, and not followed by a gap under half the median, which is the client's stall; a run as
long as the runs' median is one admission, longer runs two or more), scaled by
`slots / (slots − 1)` (see `analyse`), and the shape-bound rate `slots / T_probe` the estimate
uses with no `traffic:`, each as a ratio to the truth; `runs`: how many runs of long gaps the
rate rests on (its noise is about one in √runs). With `--twins`, each probe has a one-token
twin sent 10 ms behind it, and `twins/s` is the departures read from the spacing of their
first tokens (`twin_rate`). Figures: `bench/README.md`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
TWIN_AFTER = 0.01  # seconds between a probe and its twin
sys.path.insert(0, str(ROOT))

from bench.perf_common import free_port, wait_http  # noqa: E402


@dataclass
class Probe:
    """One probe's token arrival instants (monotonic seconds) and its send instant."""

    sent: float
    tokens: list[float] = field(default_factory=list)

    def gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.tokens, self.tokens[1:], strict=False)]


@dataclass
class Reading:
    level: str
    true_rate: float
    runs_rate: float
    shape_rate: float
    probes: int
    events: int
    twins_rate: float = 0.0
    twins: int = 0


async def _probe(session: aiohttp.ClientSession, url: str, tokens: int) -> Probe:
    body = {
        "model": "m", "stream": True, "max_tokens": tokens, "ignore_eos": True,
        "messages": [{"role": "user", "content": f"{os.urandom(8).hex()} probe"}],
    }  # fmt: skip
    probe = Probe(sent=time.monotonic())
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            choices = event.get("choices") or []
            if choices and (choices[0].get("delta") or {}).get("content"):
                probe.tokens.append(time.monotonic())
    return probe


async def _twin(session: aiohttp.ClientSession, url: str, tokens: int) -> Probe:
    await asyncio.sleep(TWIN_AFTER)  # behind the probe in the engine's queue
    return await _probe(session, url, tokens)


def admissions(stamps: list[float], spike: float) -> list[int]:
    """The lengths (in gaps) of the runs of long gaps in one probe's decode."""
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    if len(gaps) < 4:
        return []
    base = statistics.median(gaps)
    # The deviations of the gaps up to the median: the long gaps would widen them.
    spread = statistics.median(base - g for g in gaps if g <= base)
    threshold = base + max(spike * base, 6 * spread)
    runs, length = [], 0
    for gap, after in itertools.zip_longest(gaps, gaps[1:], fillvalue=base):
        if gap > threshold and after >= base / 2:  # followed by a bunch: a client stall
            length += 1
        elif length:
            runs.append(length)
            length = 0
    return [*runs, length] if length else runs


def admission_count(runs: list[int]) -> int:
    """One admission a run as long as the runs' median (one gap on the simulator and vLLM,
    two or three on llama-server, whose prefill spans several of a probe's steps)."""
    if not runs:
        return 0
    unit = statistics.median(runs)
    return sum(max(1, round(length / unit)) for length in runs)


def twin_rate(pairs: list[tuple[Probe, Probe]]) -> tuple[float, int]:
    """Departures per second from twins: a one-token twin sent right behind a probe into a
    queue is admitted at the next departure after it, so the time between their first tokens
    (the prefills, alike, cancel) is one interval between departures of the slots the probe
    does not hold. A twin that overtook the probe left after one step and let it in: no
    reading. Where the probe left before its twin was admitted, its own departure let the twin
    in and the interval is known only to be longer: the rate is the departures seen over the
    time watched. Only twins of a probe that waited count."""
    seen, watched, n = 0, 0.0, 0
    for a, b in pairs:
        if len(a.tokens) < 3 or not b.tokens:
            continue
        step = statistics.median(a.gaps())
        interval = b.tokens[0] - a.tokens[0]
        if a.tokens[0] - a.sent <= 0.02 + 3 * step or interval < 0:
            continue  # a slot was free (no queue to read), or the twin went first
        left = a.tokens[-1] - a.tokens[0]
        seen += interval < left
        watched += min(interval, left)
        n += 1
    return (seen / watched if watched else 0.0), n


def analyse(level: str, probes: list[Probe], true_rate: float, slots: int, spike: float) -> Reading:
    """The rates from the probes' runs of long gaps. While a probe decodes, its own slot does
    not free: the admissions it sees are the departures of the other `slots − 1`, so each
    count is scaled by `slots / (slots − 1)` to the engine's."""
    span = 0.0
    runs: list[int] = []
    services: list[float] = []
    for probe in probes:
        gaps = probe.gaps()
        if len(gaps) < 4:
            continue
        runs.extend(admissions(probe.tokens, spike))
        span += sum(gaps)
        # Its service time as the estimate reads it: the decode and one more step for the
        # prefill (TTFT includes the wait, which is what is being measured).
        services.append(sum(gaps) + statistics.median(gaps))
    scale = slots / (slots - 1) / span if span and slots > 1 else 0.0
    return Reading(
        level=level,
        true_rate=true_rate,
        runs_rate=admission_count(runs) * scale,
        shape_rate=slots / statistics.mean(services) if services else 0.0,
        probes=len(probes),
        events=len(runs),
    )


async def run_level(
    url: str, level: str, workers: int, answer: int, probe_tokens: int, seconds: float,
    warmup: float, slots: int, sigma: float, spike: float, twins: bool, twin_tokens: int,
) -> Reading:  # fmt: skip
    load = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.foreign_load", "--url", f"{url}/v1",
        "--mode", "closed", "--workers", str(workers), "--max-tokens", str(answer),
        "--seconds", str(warmup + seconds), "--warmup", str(warmup), "--sigma", str(sigma),
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    probes: list[Probe] = []
    pairs: list[tuple[Probe, Probe]] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            await asyncio.sleep(warmup)
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                if twins:
                    a, b = await asyncio.gather(
                        _probe(session, url, probe_tokens), _twin(session, url, twin_tokens)
                    )
                    probes.append(a)
                    pairs.append((a, b))
                else:
                    probes.append(await _probe(session, url, probe_tokens))
                await asyncio.sleep(0.2 + random.random())
        out, _ = await asyncio.wait_for(load.communicate(), warmup + seconds + 120)
    finally:
        if load.returncode is None:
            load.kill()
            await load.wait()
    report = json.loads(out.decode().strip().splitlines()[-1])
    span = time.monotonic() - probes[0].sent if probes else seconds
    true_rate = report["rate"] + len(probes) * (2 if twins else 1) / span
    reading = analyse(level, probes, true_rate, slots, spike)
    reading.twins_rate, reading.twins = twin_rate(pairs)
    return reading


@contextlib.contextmanager
def engine(kind: str, slots: int) -> Iterator[str]:
    if kind == "llama":
        from tests.support.engine import llama_server

        with llama_server(slots) as base:
            yield base
        return
    if kind == "vllm":  # `--max-num-seqs 4`, as the tests start it (VLLM_PYTHON, VLLM_MODEL)
        from tests.support.vllm import SLOTS, vllm_server

        if slots != SLOTS:
            raise SystemExit(f"--engine vllm serves {SLOTS} sequences: --slots {SLOTS}")
        with vllm_server() as base:
            yield base
        return
    port = free_port()
    sim = subprocess.Popen(
        [str(ROOT / ".venv" / "bin" / "llm-prober"), "sim", "--port", str(port),
         "--slots", str(slots)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/health")
        yield base
    finally:
        sim.terminate()
        sim.wait(10)


def _table(readings: list[Reading]) -> str:
    head = (
        f"{'level':>12} {'true/s':>7} {'runs/s':>8} {'÷true':>6} {'shape/s':>8} {'÷true':>6}"
        f" {'probes':>6} {'runs':>5} {'twins/s':>8} {'÷true':>6} {'twins':>5}"
    )
    rows = [head]
    for r in readings:
        t = r.true_rate or float("nan")
        rows.append(
            f"{r.level:>12} {r.true_rate:7.2f} {r.runs_rate:8.2f} {r.runs_rate / t:6.2f}"
            f" {r.shape_rate:8.2f} {r.shape_rate / t:6.2f} {r.probes:6d} {r.events:5d}"
            f" {r.twins_rate:8.2f} {r.twins_rate / t:6.2f} {r.twins:5d}"
        )
    return "\n".join(rows)


async def main_async(args: argparse.Namespace) -> None:
    readings = []
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(engine(args.engine, args.slots))
        for factor in args.answers:
            answer = max(1, round(factor * args.probe_tokens))
            for k in args.loads:
                level = f"{factor:g}x c{k * args.slots}"
                reading = await run_level(
                    url, level, k * args.slots, answer, args.probe_tokens, args.seconds,
                    args.warmup, args.slots, args.sigma, args.spike, args.twins,
                    args.twin_tokens,
                )  # fmt: skip
                readings.append(reading)
                print(_table(readings[-1:]).splitlines()[1], flush=True)
    print(f"\n{args.engine if not args.url else args.url}, {args.slots} slots, probes of "
          f"{args.probe_tokens} tokens, long gaps past {args.spike:g} of the median")  # fmt: skip
    print(_table(readings))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--engine", choices=("sim", "llama", "vllm"), default="sim")
    p.add_argument("--url", help="an engine already running (no /v1); --engine is ignored")
    p.add_argument("--slots", type=int, default=4)
    p.add_argument("--probe-tokens", type=int, default=32)
    p.add_argument("--answers", type=float, nargs="+", default=[0.5, 1.0, 2.0],
                   help="the foreign answers, as multiples of the probes'")  # fmt: skip
    p.add_argument("--loads", type=int, nargs="+", default=[2],
                   help="closed-loop clients, as multiples of the slots")  # fmt: skip
    p.add_argument("--sigma", type=float, default=0.0,
                   help="heavy-tailed foreign lengths: lognormal σ (foreign_load)")  # fmt: skip
    p.add_argument("--spike", type=float, default=0.2,
                   help="a long gap: past the probe's median by this share of it")  # fmt: skip
    p.add_argument("--twins", action="store_true",
                   help="a twin behind each probe; departures from their spacing")  # fmt: skip
    p.add_argument("--twin-tokens", type=int, default=1,
                   help="the twin's answer: it is read for its first token only")  # fmt: skip
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=8.0)
    asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    main()
