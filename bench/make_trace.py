"""Writes the shipped synthetic trace, `prober/load/traces/diurnal.jsonl`, deterministically.

    .venv/bin/python bench/make_trace.py            # rewrites prober/load/traces/diurnal.jsonl
    .venv/bin/python bench/make_trace.py --out x.jsonl

One "day" compressed into 300 s: the rate follows a daily cycle (0.3x the mean at night, 1.7x
at midday, 4 req/s on average) with four 8-second bursts of a batch job on top. Lengths are
heavy-tailed mixtures of four kinds of request (chat, retrieval-augmented, agent, batch),
each a lognormal; hash ids follow Mooncake's format (one id per 512-token block), with
shared system prompts, popular documents and the batch job's common prompt as shared leading
blocks, so a prefix cache has real sharing to find. Only `random.Random.random()` and the
standard library's NormalDist are used, so the file is the same on every Python version;
`tests/unit/test_load_workload.py` checks that the committed file is exactly this script's output.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from statistics import NormalDist

DAY = 300.0  # seconds of one compressed day
MEAN_RATE = 4.0  # requests/s over the day, bursts excluded
BURSTS = (60.0, 130.0, 175.0, 240.0)  # starts, seconds
BURST_SECONDS, BURST_RATE = 8.0, 12.0
BLOCK = 512
SEED = 20_260_101
OUT = Path(__file__).resolve().parents[1] / "prober" / "load" / "traces" / "diurnal.jsonl"
# kind: (share, prompt median, sigma, answer median, sigma)
KINDS = {
    "chat": (0.6, 700.0, 0.8, 120.0, 0.8),
    "rag": (0.3, 2500.0, 0.5, 200.0, 0.6),
    "agent": (0.1, 6000.0, 0.4, 40.0, 0.7),
}
BATCH = (1500.0, 0.2, 64.0, 0.3)
PROMPT_MAX, ANSWER_MAX = 16_000, 2048
SYSTEM_PROMPTS = [[1 + 3 * i + j for j in range(1 + i % 3)] for i in range(6)]  # 1-3 blocks
DOCUMENTS = [[100 + 2 * i, 101 + 2 * i] for i in range(20)]  # 2 blocks each
BATCH_PROMPT = [900, 901]
_UNIT = NormalDist()


def in_burst(t: float) -> bool:
    return any(start <= t < start + BURST_SECONDS for start in BURSTS)


def rate_at(t: float) -> float:
    daily = MEAN_RATE * (1 - 0.7 * math.cos(2 * math.pi * t / DAY))
    return daily + (BURST_RATE if in_burst(t) else 0.0)


def lognormal(rng: random.Random, median: float, sigma: float, top: int) -> int:
    u = min(max(rng.random(), 1e-12), 1 - 1e-12)
    return max(1, min(top, round(median * math.exp(sigma * _UNIT.inv_cdf(u)))))


def zipf(rng: random.Random, n: int) -> int:
    """An index in [0, n) with weight 1/(i + 1)."""
    weights = [1 / (i + 1) for i in range(n)]
    pick = rng.random() * sum(weights)
    for i, weight in enumerate(weights):
        pick -= weight
        if pick < 0:
            return i
    return n - 1


class Blocks:
    """Hash ids of one request: its shared leading blocks (whole blocks only), then its own."""

    def __init__(self) -> None:
        self._next = 10_000

    def ids(self, input_length: int, shared: list[int]) -> list[int]:
        whole = input_length // BLOCK
        ids = shared[:whole]
        for _ in range(math.ceil(input_length / BLOCK) - len(ids)):
            ids.append(self._next)
            self._next += 1
        return ids


def request(rng: random.Random, blocks: Blocks, t: float) -> dict[str, object]:
    if in_burst(t) and rng.random() < BURST_RATE / rate_at(t):  # the batch job's share
        p_median, p_sigma, a_median, a_sigma = BATCH
        shared = list(BATCH_PROMPT)
    else:
        pick, kind = rng.random(), "agent"
        for name, (share, *_rest) in KINDS.items():
            pick -= share
            if pick < 0:
                kind = name
                break
        _, p_median, p_sigma, a_median, a_sigma = KINDS[kind]
        shared = list(SYSTEM_PROMPTS[zipf(rng, len(SYSTEM_PROMPTS))]) if rng.random() < 0.8 else []
        if kind == "rag":
            shared += DOCUMENTS[zipf(rng, len(DOCUMENTS))]
    input_length = lognormal(rng, p_median, p_sigma, PROMPT_MAX)
    return {
        "timestamp": round(t * 1000),
        "input_length": input_length,
        "output_length": lognormal(rng, a_median, a_sigma, ANSWER_MAX),
        "hash_ids": blocks.ids(input_length, shared),
    }


def generate(seed: int = SEED) -> str:
    """The trace's text: a non-homogeneous Poisson process by thinning, one JSON line each."""
    rng = random.Random(seed)
    top = MEAN_RATE * 1.7 + BURST_RATE
    blocks = Blocks()
    lines = []
    t = 0.0
    while True:
        t += -math.log(1 - rng.random()) / top
        if t >= DAY:
            break
        if rng.random() * top < rate_at(t):
            lines.append(json.dumps(request(rng, blocks, t)) + "\n")
    return "".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    text = generate()
    args.out.write_text(text)
    print(f"{args.out}: {text.count(chr(10))} requests, {len(text.encode())} bytes")


if __name__ == "__main__":
    main()
