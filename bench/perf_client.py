"""Client overhead and accuracy: llm-prober's streaming client against the thinnest possible one.

    .venv/bin/python bench/perf_client.py [--levels 1,50,200] [--repeats 3]
        [--clients raw,prober,prober@uvloop] [--before DIR] [--sim-loop asyncio|uvloop]
        [--no-pin] [--default-malloc] [--json FILE]

The simulator runs in a process of its own (10 ms decode step, no batch slowdown, more slots
than streams, 1 ms prefill) and records `perf_counter_ns()` right after each token event was
written to the socket. Each client runs in a fresh process: one warm-up wave of N streams,
then N lanes streaming `--tokens`-token answers back to back, lane i starting i/N of a stream
late, so N streams are always in flight with their starts and ends spread over the engine's
steps while every step sends a token to all N at once. It reports its per-token arrival stamps
and its CPU time over the lanes. Per token, error = client arrival stamp − server write stamp
(both CLOCK_MONOTONIC). TTFT error is that of the first token; ITL error is |client gap −
server gap|. With two cores or more the simulator and the client get one each (`--no-pin`).

`raw` is the floor: asyncio streams on kept-alive connections, a hand-built HTTP/1.1 POST,
`data: ` found in the raw bytes, a stamp per read, the response id extracted once, no JSON
parsing. `prober` is `prober.request.stream_request` on the daemon's own session, with
`Metrics.record` of every result, the daemon's per-request work. Client specs are
`MODE[@LOOP][+gc]`: `@uvloop` runs it on uvloop, `+gc` applies the proposed GC tuning after
the warm-up. With `--before DIR`, client `before` is `prober` imported from DIR (e.g. an
unpacked `git archive` of an older commit), for before/after ratios in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from perf_common import (
    FAST_SIM_ARGS,
    STEP_SECONDS,
    Sim,
    add_client_args,
    add_run_args,
    add_worker_args,
    client_spec,
    client_worker,
    emit,
    exit_on_sigterm,
    fmt,
    median,
    pinning,
    set_loop,
    summary,
    tune_gc,
    wait_quiet,
    write_runs,
)

PROMPT = "Say something long. " * 8


# -- workers (run in their own process) ------------------------------------------------------


def request_bytes(port: int, tokens: int, *, keep_alive: bool = False) -> bytes:
    body = json.dumps(
        {
            "model": "sim",
            "stream": True,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    close = "" if keep_alive else "Connection: close\r\n"
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n{close}\r\n"
    ).encode()
    return head + body


async def raw_stream(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
) -> dict[str, object]:
    """One stream on a kept-alive connection: stamp each read, count `data: ` in it."""
    t_send = time.perf_counter_ns()
    writer.write(request)
    stamps: list[int] = []
    rid = ""
    tail = b""
    while True:
        chunk = await reader.read(65536)
        t_ns = time.perf_counter_ns()
        if not chunk:
            break
        buf = tail + chunk
        stamps.extend([t_ns] * buf.count(b"data: "))
        if not rid and (at := buf.find(b'"id":"')) >= 0:
            rid = buf[at + 6 : buf.index(b'"', at + 6)].decode()
        if buf.endswith(b"\r\n0\r\n\r\n"):  # the last chunk of the chunked body
            break
        tail = buf[-6:]  # a `data: ` split across reads is counted once, never twice
    # Events: the role-only opening chunk, the token chunks, the usage chunk, [DONE].
    return {"id": rid, "send": t_send, "tokens": stamps[1:-2], "ok": bool(rid)}


One = Callable[[int], Awaitable[dict[str, object]]]
"""One stream on lane i."""


@contextlib.asynccontextmanager
async def _raw(port: int, tokens: int) -> AsyncIterator[One]:
    """Lane i always streams on connection i, kept alive (as a pool would)."""
    request = request_bytes(port, tokens, keep_alive=True)
    lanes: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}

    async def one(lane: int) -> dict[str, object]:
        if lane not in lanes:
            lanes[lane] = await asyncio.open_connection("127.0.0.1", port)
        return await raw_stream(*lanes[lane], request)

    try:
        yield one
    finally:
        for _, writer in lanes.values():
            writer.close()


@contextlib.asynccontextmanager
async def _prober(port: int, tokens: int) -> AsyncIterator[One]:
    """`stream_request` on the daemon's session, each result recorded as the daemon does."""
    from prometheus_client import CollectorRegistry

    from prober.metrics import Labels, Metrics
    from prober.request import Api, RequestSpec, stream_request
    from prober.timings import Slo
    from prober.web import client_session

    spec = RequestSpec(f"http://127.0.0.1:{port}/v1", Api.CHAT, "sim", PROMPT, tokens)
    metrics = Metrics(CollectorRegistry())
    labels, slo = Labels("bench", "sim"), Slo(2.0, 0.2)

    async def one(lane: int) -> dict[str, object]:
        r = await stream_request(session, spec, time.perf_counter_ns())
        metrics.record(r, labels, "load", slo)
        return {"id": r.request_id, "send": r.t_send_ns, "tokens": r.token_event_ns, "ok": r.ok}

    async with client_session() as session:
        yield one


async def _measure(ns: argparse.Namespace) -> dict[str, object]:
    """A warm-up wave, then N lanes of back-to-back streams, lane i starting i/N of a stream
    late: N streams always in flight, their starts and ends spread over every engine step
    (as under real load) while every step still sends a token to all N at once."""
    client = _raw if ns.worker == "raw" else _prober
    async with client(ns.port, ns.tokens) as one:
        await asyncio.gather(*(one(i) for i in range(ns.concurrency)))  # warm-up, not measured
        if ns.tune_gc:
            tune_gc()

        async def lane(i: int) -> list[dict[str, object]]:
            await asyncio.sleep(i * ns.stagger / ns.concurrency)
            return [await one(i) for _ in range(ns.per_lane)]

        cpu0, wall0 = time.process_time(), time.perf_counter()
        lanes = await asyncio.gather(*(lane(i) for i in range(ns.concurrency)))
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    return {"cpu": cpu, "wall": wall, "streams": [s for ss in lanes for s in ss]}


def worker(ns: argparse.Namespace) -> None:
    set_loop(ns.loop)
    emit(asyncio.run(_measure(ns)), ns.out)


# -- the benchmark ---------------------------------------------------------------------------


def per_lane(concurrency: int) -> int:
    """Streams per lane: several thousand tokens at every level, without long runs."""
    return max(4, min(12, 600 // concurrency))


def analyse(sim: Sim, run: dict[str, object]) -> dict[str, float]:
    offsets: list[float] = []
    ttft: list[float] = []
    itl: list[float] = []
    n_tokens = 0
    bad = 0
    for stream in run["streams"]:  # type: ignore[attr-defined]
        client = stream["tokens"]
        server = sim.stamps(stream["id"])["token_write_ns"] if stream["ok"] else []
        if not client or len(client) != len(server):  # type: ignore[arg-type]
            bad += 1
            continue
        n_tokens += len(client)
        errs = [(c - s) / 1e6 for c, s in zip(client, server, strict=True)]  # type: ignore[arg-type]
        offsets += errs
        ttft.append(errs[0])
        itl += [abs(b - a) for a, b in itertools.pairwise(errs)]
    out = {
        "tokens": n_tokens,
        "bad_streams": bad,
        "cpu_per_1k": 1000 * run["cpu"] / n_tokens,  # type: ignore[operator]
        "other_load": run["other_load"],
    }
    for name, values in (("offset", offsets), ("ttft", ttft), ("itl", itl)):
        for key, value in summary(values).items():
            out[f"{name}_{key}"] = value
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,50,200")
    add_run_args(parser)
    add_client_args(parser, "raw,prober,prober@uvloop")
    parser.add_argument("--sim-loop", default="asyncio", choices=["asyncio", "uvloop"])
    parser.add_argument(
        "--default-malloc", action="store_true",
        help="leave glibc's mmap threshold alone in the clients (see bench/README.md)",
    )  # fmt: skip
    parser.add_argument("--worker", choices=["raw", "prober"], help=argparse.SUPPRESS)
    add_worker_args(parser)
    parser.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--per-lane", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stagger", type=float, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.worker:
        worker(ns)
        return
    exit_on_sigterm()
    levels = [int(x) for x in ns.levels.split(",")]
    clients = ns.clients.split(",")
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    sim_cpus, client_cpus = pinning(not ns.no_pin)
    with Sim(FAST_SIM_ARGS, ns.sim_loop, sim_cpus) as sim:
        for level in levels:
            for repeat in range(ns.repeats):
                for client in clients:
                    args, env = worker_run(ns, sim, level, client)
                    wait_quiet(ns.quiet)
                    figures = analyse(sim, sim.run_worker(args, env, client_cpus))
                    runs.setdefault((level, client), []).append(figures)
                    print(
                        f"  c={level:<4} {client:<16} run {repeat + 1}: "
                        f"p99 {figures['offset_p99']:.2f} ms, "
                        f"cpu {figures['cpu_per_1k']:.3f} s/1k tok, "
                        f"other load {figures['other_load']:.2f}",
                        file=sys.stderr,
                    )
    report(levels, clients, runs, ns.sim_loop, pinned=sim_cpus is not None)
    write_runs(ns.json, runs)


def worker_run(
    ns: argparse.Namespace, sim: Sim, level: int, client: str
) -> tuple[list[str], dict[str, str] | None]:
    """The worker's arguments and environment for one run of `client` at `level` streams."""
    base = dict(os.environ)
    if not ns.default_malloc:
        base["MALLOC_MMAP_THRESHOLD_"] = str(1 << 20)
    mode, flags, env = client_worker(client, ns.before, base)
    args = [
        __file__, "--worker", mode, *flags,
        "--port", str(sim.port), "--concurrency", str(level),
        "--per-lane", str(per_lane(level)), "--tokens", str(ns.tokens),
        "--stagger", str(ns.tokens * STEP_SECONDS),
    ]  # fmt: skip
    return args, env


def report(
    levels: list[int], clients: list[str], runs: dict[tuple[int, str], list[dict[str, float]]],
    sim_loop: str, *, pinned: bool,
) -> None:  # fmt: skip
    def med(level: int, client: str, key: str) -> float:
        return median(r[key] for r in runs[(level, client)])

    n = len(next(iter(runs.values())))
    pins = "simulator and client on a core each" if pinned else "not pinned"
    print(f"\nmedians of {n} runs; simulator on {sim_loop}; {pins}; errors in ms;")
    print("'other': share of the machine other people's processes used during the runs (0..1)")
    head = (
        f"{'streams':>7} {'client':<16} {'token err p50/p99/max':>22} {'TTFT err p50/p99':>17} "
        f"{'ITL err p50/p99':>16} {'CPU s/1k tok':>13} {'p99÷raw':>8} {'CPU÷raw':>8} "
        f"{'other':>6}"
    )
    print(head)
    for level in levels:
        for client in clients:
            uv = client_spec(client)[1] == "uvloop" and "raw@uvloop" in clients
            floor = "raw@uvloop" if uv else "raw"
            p99, cpu = med(level, client, "offset_p99"), med(level, client, "cpu_per_1k")
            ratio_p99 = p99 / med(level, floor, "offset_p99") if floor in clients else float("nan")
            ratio_cpu = cpu / med(level, floor, "cpu_per_1k") if floor in clients else float("nan")
            print(
                f"{level:>7} {client:<16} "
                f"{fmt(med(level, client, 'offset_p50')):>6}/{fmt(p99):>6}/"
                f"{fmt(med(level, client, 'offset_max')):>7}  "
                f"{fmt(med(level, client, 'ttft_p50')):>7}/"
                f"{fmt(med(level, client, 'ttft_p99')):>7}  "
                f"{fmt(med(level, client, 'itl_p50')):>7}/{fmt(med(level, client, 'itl_p99')):>7} "
                f"{fmt(cpu, 3):>13} {fmt(ratio_p99):>8} {fmt(ratio_cpu):>8} "
                f"{fmt(med(level, client, 'other_load')):>6}"
            )


if __name__ == "__main__":
    main()
