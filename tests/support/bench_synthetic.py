"""Bench levels from a tiny queueing model, for tests of the intervals and the verdicts.

A server of `slots` slots serves requests first come, first served; each request's service
time is `service` seconds times a seeded log-normal noise of spread `noise` (times `slow`,
a machine running slower for the whole level), its first token `prefill` seconds (with the
same noise, times `slow`) after its service starts. `closed_level` drives it with C workers,
each sending when its last request ends; `open_level` with Poisson arrivals. Both return the
level as the report carries it (`stats.summarize` plus its identity), so the verdicts see
exactly what a sweep would give them.
"""

from __future__ import annotations

import heapq
import math
import random
from typing import Any

from prober.bench.stats import arrival_rate, summarize
from prober.result import Outcome, RequestResult, TokenSource
from prober.timings import Slo
from tests.support.results import S

SLO = Slo(ttft_seconds=30.0, tpot_seconds=10.0)
TOKENS = 8


def _request(send: float, start: float, service: float, prefill: float) -> RequestResult:
    first, end = start + prefill, start + service
    events = tuple(int((first + i * (end - first) / (TOKENS - 1)) * S) for i in range(TOKENS))
    return RequestResult(
        outcome=Outcome.OK, t_sched_ns=int(send * S), t_send_ns=int(send * S),
        t_end_ns=events[-1], t_first_token_ns=events[0], t_first_content_ns=events[0],
        t_last_token_ns=events[-1], token_event_ns=events, output_tokens=TOKENS,
        prompt_tokens=100, token_source=TokenSource.USAGE,
    )  # fmt: skip


class Server:
    """FIFO over `slots`; `serve(send)` returns the request sent at `send` (sends in order)."""

    def __init__(self, slots: int, rng: random.Random, *, service: float, prefill: float,
                 noise: float, slow: float) -> None:  # fmt: skip
        self.free = [0.0] * slots
        self.rng, self.service, self.prefill = rng, service * slow, prefill * slow
        self.noise = noise

    def serve(self, send: float) -> RequestResult:
        start = max(send, heapq.heappop(self.free))
        prefill = self.prefill * math.exp(self.rng.gauss(0, self.noise))
        service = max(self.service * math.exp(self.rng.gauss(0, self.noise)), 2 * prefill)
        heapq.heappush(self.free, start + service)
        return _request(send, start, service, prefill)


def closed_level(
    concurrency: int, requests: int, *, slots: int, seed: int, service: float = 1.0,
    prefill: float = 0.1, noise: float = 0.1, slow: float = 1.0,
) -> dict[str, Any]:  # fmt: skip
    """One closed-loop level: `requests` measured requests from `concurrency` workers."""
    rng = random.Random(f"closed:{seed}:{concurrency}")
    server = Server(slots, rng, service=service, prefill=prefill, noise=noise, slow=slow)
    sends = [(0.0, worker) for worker in range(concurrency)]
    results: list[RequestResult] = []
    while len(results) < requests:
        send, worker = heapq.heappop(sends)
        r = server.serve(send)
        results.append(r)
        heapq.heappush(sends, (r.t_end_ns / S, worker))
    key = {"concurrency": concurrency}
    return {**key, "level": key, **summarize(results, SLO, concurrency=concurrency)}


def open_results(
    rate: float, requests: int, *, slots: int, seed: int, service: float = 1.0,
    prefill: float = 0.1, noise: float = 0.1,
) -> list[RequestResult]:  # fmt: skip
    """`requests` Poisson arrivals at `rate` per second, served."""
    rng = random.Random(f"open:{seed}:{rate}")
    server = Server(slots, rng, service=service, prefill=prefill, noise=noise, slow=1.0)
    send, results = 0.0, []
    for _ in range(requests):
        results.append(server.serve(send))
        send += rng.expovariate(rate)
    return results


def open_level(rate: float, requests: int, **model: Any) -> dict[str, Any]:
    """One open-loop level (`open_results`), with its achieved arrival rate."""
    results = open_results(rate, requests, **model)
    key = {"rate": rate}
    return {**key, "level": key, **summarize(results, SLO),
            "arrival_rate": arrival_rate(results, rate)}  # fmt: skip
