"""Someone else's traffic: a plain aiohttp client, run as its own process, that shares no code
with the daemon, so nothing the daemon computes can leak into the load it is judged under.

    python -m tests.support.foreign_load --url http://127.0.0.1:8080/v1 \\
        --mode poisson --rate 2 --seconds 60
    python -m tests.support.foreign_load --url ... --mode closed --workers 8 --seconds 60

Every request streams a chat completion with a fresh random prefix (no prefix-cache hits) and
`max_tokens` drawn uniformly within ±spread of the mean, or, with `--sigma`, prompt and answer
lengths heavy-tailed (lognormal; prompts of at least a third of their mean); `ignore_eos`
makes llama-server generate all of them, and closed-loop clients do not march in lockstep.
It runs until `--seconds` pass, SIGTERM, or its standard input, a pipe, closes (its parent's
end), never waits for requests in flight at the end, and prints one JSON line: requests
completed, failed (and why), and completions per second after `--warmup` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import stat
import sys
import time
from collections import Counter

import aiohttp

# A closed-loop client whose request failed waits this long before its next: a refusing or
# failing engine would otherwise turn the load into a busy loop that starves the machine.
FAILURE_PAUSE_SECONDS = 0.5


def _body(rng: random.Random, args: argparse.Namespace) -> dict[str, object]:
    if args.sigma:
        tokens = _heavy(rng, args.max_tokens, args.sigma)
        # At least a third of the mean: a prompt of a few words has a prefill too short to
        # tell from a decode step's jitter on the tests' engines (docs/design.md §6, "Where
        # it fails").
        words = max(args.prompt_words // 3, _heavy(rng, args.prompt_words, args.sigma))
    else:
        spread = args.spread * args.max_tokens
        tokens = max(1, round(rng.uniform(args.max_tokens - spread, args.max_tokens + spread)))
        words = args.prompt_words
    prompt = f"{rng.getrandbits(64):x} " + "hello " * words
    return {
        "model": "m", "stream": True, "max_tokens": tokens, "ignore_eos": True,
        "messages": [{"role": "user", "content": prompt}],
    }  # fmt: skip


def _heavy(rng: random.Random, mean: int, sigma: float) -> int:
    """A lognormal draw of mean `mean` (its median `mean·e^(−σ²/2)`), within 1 and 6× the mean:
    mostly short, now and then long, as production lengths are."""
    draw = rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma)
    return max(1, min(6 * mean, round(draw)))


class Counts:
    def __init__(self, warmup_until: float) -> None:
        self.warmup_until = warmup_until
        self.ok = self.failed = self.ok_after_warmup = 0
        self.reasons: Counter[str] = Counter()  # why requests failed: status or error class

    def done(self, failure: str | None) -> None:
        if failure is not None:
            self.failed += 1
            self.reasons[failure] += 1
            return
        self.ok += 1
        if time.monotonic() >= self.warmup_until:
            self.ok_after_warmup += 1


async def _one(session: aiohttp.ClientSession, url: str, body: dict[str, object]) -> str | None:
    """Streams one request to its end; None, or why it failed."""
    try:
        async with session.post(url, json=body) as resp:
            async for _ in resp.content.iter_any():
                pass
            return None if resp.status == 200 else f"HTTP {resp.status}"
    except aiohttp.ClientError as exc:
        return type(exc).__name__


async def _closed(session: aiohttp.ClientSession, args: argparse.Namespace, counts: Counts) -> None:
    rng = random.Random(args.seed)

    async def worker() -> None:
        while True:
            failure = await _one(session, args.url, _body(rng, args))
            counts.done(failure)
            if failure is not None:  # a failing engine answers at once: no busy loop
                await asyncio.sleep(FAILURE_PAUSE_SECONDS)

    await asyncio.gather(*(worker() for _ in range(args.workers)))


async def _poisson(
    session: aiohttp.ClientSession, args: argparse.Namespace, counts: Counts
) -> None:
    rng = random.Random(args.seed)
    start, offset = time.monotonic(), 0.0
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        counts.done(await _one(session, args.url, _body(rng, args)))

    while True:
        offset += rng.expovariate(args.rate)  # an absolute schedule: open loop
        await asyncio.sleep(max(0.0, start + offset - time.monotonic()))
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)


class _UntilStdinCloses(asyncio.Protocol):
    """Sets `stop` when standard input closes: the parent holds its other end, so that is
    when the parent is gone (killed, say) or has let this process go."""

    def __init__(self, stop: asyncio.Event) -> None:
        self.stop = stop

    def connection_lost(self, exc: Exception | None) -> None:
        self.stop.set()


async def main(args: argparse.Namespace) -> None:
    counts = Counts(time.monotonic() + args.warmup)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    if stat.S_ISFIFO(os.fstat(sys.stdin.fileno()).st_mode):  # run by hand: no such watch
        await loop.connect_read_pipe(lambda: _UntilStdinCloses(stop), sys.stdin)
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        drive = _closed if args.mode == "closed" else _poisson
        runner = asyncio.create_task(drive(session, args, counts))
        await asyncio.wait(
            [runner, asyncio.create_task(stop.wait())], timeout=args.seconds,
            return_when=asyncio.FIRST_COMPLETED,
        )  # fmt: skip
        measured = max(time.monotonic() - counts.warmup_until, 1e-9)
        print(json.dumps({
            "ok": counts.ok, "failed": counts.failed, "reasons": dict(counts.reasons),
            "rate": counts.ok_after_warmup / measured,
        }), flush=True)  # fmt: skip
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="the OpenAI base URL (…/v1)")
    p.add_argument("--mode", choices=("poisson", "closed"), required=True)
    p.add_argument("--rate", type=float, default=1.0, help="poisson: arrivals per second")
    p.add_argument("--workers", type=int, default=8, help="closed: clients, each one in flight")
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--warmup", type=float, default=0.0, help="not counted in the rate")
    p.add_argument("--prompt-words", type=int, default=30)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--spread", type=float, default=0.5, help="±fraction of max-tokens")
    p.add_argument(
        "--sigma", type=float, default=0.0,
        help="lognormal prompt and answer lengths of this σ around their means (not --spread)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    args.url = args.url.rstrip("/") + "/chat/completions"
    return args


if __name__ == "__main__":
    asyncio.run(main(parse()))
