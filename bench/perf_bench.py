"""`llm-prober bench` against the truth: its TTFT error and its CPU per token, beside floors.

    .venv/bin/python bench/perf_bench.py [--levels 50,200] [--repeats 3] [--per-worker 6]
        [--clients raw,rawparse,rawstate,aiohttp,bench[,aiperf --aiperf CMD]] [--bench-loop auto]
        [--no-pin] [--json FILE]

The server is `truth_server.py` (its own process, uvloop): it stamps each request's arrival
and each token's write, answers after a 50 ms "prefill" with `--tokens` tokens on a shared
10 ms step. Server and client are each pinned to a core with `taskset` (`--no-pin` to undo).
Per level C, closed loop, each client in a fresh process:

- `raw`: the floor. asyncio.Protocol on uvloop, one kept-alive connection per worker, opened
  and warmed by one request before the clock; each next request is written from
  `data_received` the moment the last one's final chunk arrives; a token is a read holding
  `"content"`, stamped on arrival; no JSON parsing, no result objects.
- `rawparse`: `raw`, but every event's JSON decoded with orjson and a token counted only
  where the first choice's delta has content: what reporting tokens costs at the least.
- `rawstate`: `raw`, but each read de-chunked (in Python) and fed to prober's own
  `SSEParser` and `StreamState`, and each request's `RequestResult` built, as bench does:
  prober's accounting with no HTTP client under it, the least a hand-written client could cost.
- `aiohttp`: the chosen stack's floor. aiohttp's client on uvloop as bench uses it (one
  session, no pool limit, every connection warmed first), each worker a task reading with
  `readany()` and counting `"content"` as `raw` does: no SSE, no JSON, no result objects.
- `bench`: the command itself, `python -m prober.cli bench --concurrency C --num-requests
  C×per-worker --no-progress --out FILE` (loop `--bench-loop`, default what the daemon picks).
- `aiperf` (with `--aiperf CMD`, aiperf installed in a venv of its own): `aiperf profile
  --streaming --concurrency C`, run twice (C × per-worker and three times as many requests)
  so its CPU is marginal, all its processes counted; TTFT matched to the truth by its
  `X-Request-ID`.

The floors separate what bench's CPU goes to: `rawparse ÷ raw` is decoding the events,
`rawstate ÷ raw` prober's accounting of them (channels, usage, bounds, stamps), `aiohttp ÷ raw`
the HTTP client, `bench ÷ aiohttp` everything bench adds to its client.

Per request, the truth TTFT is first token write − arrival at the server; the client's TTFT is
what it reports (bench: `ttft_seconds` of its JSON record, matched by request id). Printed:
TTFT p50 / p99 of the client minus the truth's over the same requests (what a user reads
off the report), the per-request error's p50 / p99 and where it is (`error_parts`: the
client's `t_sched` → write, and the server's first-token write → the client's stamp of it),
client CPU-seconds per 1,000 tokens over the measured level only (bench: its own
`client.cpu_seconds`) and its ratio to each floor's, the tokens per CPU-second (where one
core would saturate), and bench's own verdict on whether the client was the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import cast

import orjson
from perf_common import (
    PYTHON,
    ROOT,
    STEP_SECONDS,
    OtherLoad,
    fmt,
    free_port,
    median,
    pct,
    wait_http,
    wait_quiet,
    write_runs,
)

HERE = Path(__file__).resolve().parent
PROMPT_WORDS = 24
FLOORS = ("raw", "rawparse", "rawstate", "aiohttp")  # the clients this script runs itself
CLIENTS = (*FLOORS, "bench", "aiperf")


# -- the raw floor (runs in its own process) --------------------------------------------------


def raw_request(port: int, rid: str, tokens: int) -> bytes:
    body = json.dumps({
        "model": "truth", "stream": True, "max_tokens": tokens,
        "messages": [{"role": "user", "content": "word " * PROMPT_WORDS}],
        "stream_options": {"include_usage": True},
    }).encode()  # fmt: skip
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nX-Request-Id: {rid}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class RawLane(asyncio.Protocol):
    """One worker on one connection: `count` requests back to back, each sent on the spot."""

    def __init__(self, port: int, tokens: int) -> None:
        self.port, self.tokens = port, tokens
        self.transport: asyncio.Transport | None = None
        self.records: list[tuple[str, int, int, int]] = []  # id, t_sched, t_first, tokens
        self.left = 0
        self.done: asyncio.Future[None] | None = None
        self._rid, self._t_sched, self._t_first, self._n, self._tail = "", 0, 0, 0, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, only alike.
        self.transport = cast(asyncio.Transport, transport)

    def run(self, count: int) -> asyncio.Future[None]:
        self.records, self.left = [], count
        self.done = asyncio.get_running_loop().create_future()
        self._send()
        return self.done

    def _send(self) -> None:
        assert self.transport is not None
        self._rid, self._t_first, self._n, self._tail = uuid.uuid4().hex, 0, 0, b""
        self._t_sched = time.perf_counter_ns()
        self.transport.write(raw_request(self.port, self._rid, self.tokens))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        buf = self._tail + data
        found = self._count(buf)
        if found:
            self._n += found
            self._t_first = self._t_first or now
        if buf.endswith(b"\r\n0\r\n\r\n"):
            self._ended(self._t_first, self._n)

    def _ended(self, t_first: int, tokens: int) -> None:
        """The current request's body ended: record it, then send the next or be done."""
        self.records.append((self._rid, self._t_sched, t_first, tokens))
        self.left -= 1
        if self.left > 0:
            self._send()
        elif self.done is not None:
            self.done.set_result(None)

    def _count(self, buf: bytes) -> int:
        self._tail = buf[-9:]  # a marker split across reads is counted once
        return buf.count(b'"content"')


class ParsingLane(RawLane):
    """`raw`, but each event's JSON is decoded (orjson) and a token is an event whose first
    choice's delta has content: the least a client must do to report what bench reports.
    An event cut by the end of a read is finished by the next one."""

    def _count(self, buf: bytes) -> int:
        found, start = 0, buf.find(b"data: {")
        self._tail = b""
        while start >= 0:
            end = buf.find(b"\n\n", start)
            if end < 0:
                self._tail = buf[start:]
                break
            choices = orjson.loads(buf[start + 6 : end]).get("choices")
            if choices and choices[0].get("delta", {}).get("content"):
                found += 1
            start = buf.find(b"data: {", end)
        return found


class StateLane(RawLane):
    """`raw`, but each read de-chunked (in Python) and fed to prober's own `SSEParser` and
    `StreamState`, and each request's `RequestResult` built, as bench does with every read:
    what bench's accounting costs with no HTTP client under it. A hand-written client could
    cost no less than this."""

    def __init__(self, port: int, tokens: int) -> None:
        from prober.request.sse import SSEParser
        from prober.request.stream import StreamState, max_events

        super().__init__(port, tokens)
        self._parser = SSEParser
        self._new_state = functools.partial(
            StreamState, ndjson=False, event_limit=max_events(tokens)
        )

    def _send(self) -> None:
        self._state = self._new_state("")
        self._sse = self._parser()
        self._head, self._last, self._left, self._skip, self._pending = True, False, 0, 0, b""
        super()._send()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        body, ended = self._dechunk(data)
        state = self._state
        state.first_byte(now)
        if body:
            state.feed(self._sse, body, now)
        if not ended:
            return
        state.close(self._sse, now)
        result = state.result(
            state.conclude().outcome, t_sched_ns=self._t_sched, t_send_ns=self._t_sched,
            t_end_ns=now, wall_start=0.0,
        )  # fmt: skip
        self._ended(result.t_first_content_ns or 0, result.output_tokens)

    def _dechunk(self, data: bytes) -> tuple[bytes, bool]:
        """The body bytes `data` carries (headers and chunk framing gone), and whether the
        last chunk came. Reads may split the framing anywhere."""
        if self._head:
            data = self._pending + data  # the header block so far
            end = data.find(b"\r\n\r\n")
            if end < 0:
                self._pending = data
                return b"", False
            self._head, self._pending, data = False, b"", data[end + 4 :]
        elif self._pending:  # a chunk-size line cut by the last read
            data, self._pending = self._pending + data, b""
        out: list[bytes] = []
        i, size = 0, len(data)
        while i < size:
            if self._skip:  # the CRLF after a chunk's data, or after the last chunk
                step = min(self._skip, size - i)
                self._skip -= step
                i += step
                if self._last and not self._skip:
                    return b"".join(out), True
            elif self._left:
                step = min(self._left, size - i)
                out.append(data[i : i + step])
                self._left -= step
                i += step
                if not self._left:
                    self._skip = 2
            else:
                eol = data.find(b"\r\n", i)
                if eol < 0:
                    self._pending = data[i:]
                    break
                self._left = int(data[i:eol].split(b";", 1)[0], 16)
                i = eol + 2
                if not self._left:  # the last chunk: the CRLF after it (no trailers) ends
                    self._last, self._skip = True, 2
        return b"".join(out), False


def floor_output(cpu: float, records: list[tuple[str, int, int, int]]) -> dict[str, object]:
    """A floor's measured level: its CPU-seconds and, per request, (id, t_sched, first token,
    tokens) as stamped on its own clock."""
    return {
        "cpu": cpu,
        "event_loop": "uvloop",
        "requests": [
            {"id": i, "ttft": (f - s) / 1e9, "tokens": n, "sent_ns": s, "first_ns": f}
            for i, s, f, n in records
        ],
    }


async def raw_measure(
    port: int, concurrency: int, per_worker: int, tokens: int, kind: str = "raw"
) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    lanes = []
    lane_class = {"raw": RawLane, "rawparse": ParsingLane, "rawstate": StateLane}[kind]
    for _ in range(concurrency):
        _, lane = await loop.create_connection(lambda: lane_class(port, tokens), "127.0.0.1", port)
        lanes.append(lane)
    await asyncio.gather(*(lane.run(1) for lane in lanes))  # warm every connection
    ramp = statistics.fmean((f - s) / 1e9 for _, s, f, _ in (ln.records[0] for ln in lanes))
    ramp += tokens * STEP_SECONDS  # about one request's E2E: the ramp bench uses too

    async def lane_run(i: int, lane: RawLane) -> None:
        # As bench's workers: lane i starts i/C of a request late, its first request not
        # recorded, so the sends are spread and all C are in flight when recording starts.
        await asyncio.sleep(i * ramp / concurrency)
        await lane.run(1)
        await lane.run(per_worker)

    cpu0 = time.process_time()
    await asyncio.gather(*(lane_run(i, lane) for i, lane in enumerate(lanes)))
    cpu = time.process_time() - cpu0
    records = [r for lane in lanes for r in lane.records]
    return floor_output(cpu, records)


async def aiohttp_measure(
    port: int, concurrency: int, per_worker: int, tokens: int
) -> dict[str, object]:
    """The floor of the chosen stack: aiohttp's client as bench uses it (one pooled session,
    connections opened and warmed first), each read counted for `"content"` as `raw` does,
    no SSE, no JSON, no result objects."""
    import aiohttp

    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    records: list[tuple[str, int, int, int]] = []

    async def one(session: aiohttp.ClientSession, keep: bool) -> float:
        rid = uuid.uuid4().hex
        body = raw_request(port, rid, tokens).split(b"\r\n\r\n", 1)[1]
        t_sched = time.perf_counter_ns()
        t_first, n, tail = 0, 0, b""
        async with session.post(url, data=body, headers={
            "Content-Type": "application/json", "X-Request-Id": rid,
        }) as resp:  # fmt: skip
            while chunk := await resp.content.readany():
                now = time.perf_counter_ns()
                buf = tail + chunk
                if found := buf.count(b'"content"'):
                    n += found
                    t_first = t_first or now
                tail = buf[-9:]
        if keep:
            records.append((rid, t_sched, t_first, n))
        return (t_first - t_sched) / 1e9

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        first = await asyncio.gather(*(one(session, False) for _ in range(concurrency)))
        ramp = statistics.fmean(first) + tokens * STEP_SECONDS

        async def lane_run(i: int) -> None:
            await asyncio.sleep(i * ramp / concurrency)
            await one(session, False)
            for _ in range(per_worker):
                await one(session, True)

        cpu0 = time.process_time()
        await asyncio.gather(*(lane_run(i) for i in range(concurrency)))
        cpu = time.process_time() - cpu0
    return floor_output(cpu, records)


def raw_worker(ns: argparse.Namespace) -> None:
    import uvloop

    uvloop.install()
    args = (ns.port, ns.concurrency, ns.per_worker, ns.tokens)
    if ns.worker == "aiohttp":
        out = asyncio.run(aiohttp_measure(*args))
    else:
        out = asyncio.run(raw_measure(*args, kind=ns.worker))
    Path(ns.out).write_text(json.dumps(out))


# -- the benchmark ----------------------------------------------------------------------------


def pinned(cmd: list[str], cpu: int | None) -> list[str]:
    return cmd if cpu is None else ["taskset", "-c", str(cpu), *cmd]


def fetch_truth(port: int) -> dict[str, list[object]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/truth", timeout=30) as resp:
        return dict(json.load(resp))


def client_command(
    client: str, ns: argparse.Namespace, port: int, level: int, out: str
) -> list[str]:
    if client in FLOORS:
        return [PYTHON, __file__, "--worker", client, "--port", str(port), "--concurrency",
                str(level), "--per-worker", str(ns.per_worker), "--tokens", str(ns.tokens),
                "--out", out]  # fmt: skip
    return [PYTHON, "-m", "prober.cli", "bench", "--url", f"http://127.0.0.1:{port}/v1",
            "--model", "truth", "--concurrency", str(level), "--num-requests",
            str(level * ns.per_worker), "--input-len", str(PROMPT_WORDS),
            "--output-len", str(ns.tokens), "--warmup", "2", "--no-progress", "--seed", "1",
            "--event-loop", ns.bench_loop, "--out", out]  # fmt: skip


def client_figures(
    client: str, doc: dict[str, object]
) -> tuple[list[dict[str, object]], dict[str, object]]:
    """(requests as {id, ttft, tokens}, the client's own figures) from a worker's output."""
    if client in FLOORS:
        return list(doc["requests"]), {"cpu": doc["cpu"]}  # type: ignore[call-overload]
    level = doc["levels"][0]  # type: ignore[index]
    requests = [{"id": r["request_id"], "ttft": r["ttft_seconds"], "tokens": r["output_tokens"],
                 "offsets": (r["t_sched_offset_seconds"], r["t_send_offset_seconds"],
                             r["t_first_token_offset_seconds"])}
                for r in level["requests"] if r["outcome"] == "ok"]  # fmt: skip
    watch = level["client"]
    own = {
        "cpu": watch["cpu_seconds"], "client_bound": float(watch["client_bound"]),
        "cpu_share": watch["cpu_share"], "loop_lag_p99": watch["loop_lag_seconds"]["p99"] * 1e3,
        "lag_p99": level["dispatch_lag_seconds"]["p99"] * 1e3,
    }  # fmt: skip
    return requests, own


def one_run(
    ns: argparse.Namespace, port: int, level: int, client: str, cpu: int | None
) -> dict[str, float]:
    fetch_truth(port)  # forget what earlier runs left
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "out.json")
        other = OtherLoad([])
        usage0 = os.times()
        proc = subprocess.run(pinned(client_command(client, ns, port, level, out), cpu), cwd=ROOT,
                              capture_output=True, text=True, timeout=600, check=False)  # fmt: skip
        usage1 = os.times()
        if proc.returncode != 0:
            raise RuntimeError(f"{client} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        doc = json.loads(Path(out).read_text())
    child_cpu = (usage1.children_user - usage0.children_user) + (
        usage1.children_system - usage0.children_system
    )
    truth = fetch_truth(port)
    requests, own = client_figures(client, doc)
    return analyse(requests, truth, own) | {"other_load": other.share(child_cpu)}


# -- aiperf (NVIDIA's benchmark client), when its command is given ---------------------------

AIPERF_TOKENIZER = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = ["[UNK]", "tok", "word"] + [f"w{i}" for i in range(500)]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(sys.argv[1])
"""


def aiperf_tokenizer(aiperf: str, where: Path) -> Path:
    """A word-level tokenizer on disk: aiperf needs one, and its `builtin` one downloads its
    encoding, which this machine cannot. The truth server's tokens are words (" tok").
    ValueError, one line naming `--aiperf`, where that venv cannot write one."""
    python = Path(aiperf).parent / "python"
    if not (Path(aiperf).is_file() and python.is_file()):
        raise ValueError(f"--aiperf {aiperf}: not an aiperf command with a python beside it")
    proc = subprocess.run([str(python), "-c", AIPERF_TOKENIZER, str(where)],
                          capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise ValueError(f"--aiperf {aiperf}: its python could not write a tokenizer: {last}")
    return where


def aiperf_run(
    ns: argparse.Namespace, port: int, level: int, cpu: int | None, tokenizer: Path
) -> dict[str, float]:
    """aiperf at concurrency `level`, twice: C×per-worker and 3× as many measured requests.
    Its CPU is marginal (the difference of the two runs' CPU over the difference of their
    tokens, all its processes counted), so its start-up (a few seconds of imports and worker
    processes) does not count; its TTFT errors come from the larger run, matched to the truth
    by aiperf's `X-Request-ID`."""
    cpu_tokens = []
    for count in (level * ns.per_worker, 3 * level * ns.per_worker):
        fetch_truth(port)
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [ns.aiperf, "profile", "--model", "truth", "--url", f"http://127.0.0.1:{port}",
                   "--endpoint-type", "chat", "--streaming", "--tokenizer", str(tokenizer),
                   "--concurrency", str(level), "--request-count", str(count),
                   "--warmup-request-count", str(level), "--prompt-input-tokens-mean",
                   str(PROMPT_WORDS), "--prompt-output-tokens-mean", str(ns.tokens),
                   "--extra-inputs", f"max_tokens:{ns.tokens}", "--ui-type", "none",
                   "--no-server-metrics", "--no-gpu-telemetry", "--no-auto-plot",
                   "--artifact-dir", tmp]  # fmt: skip
            other = OtherLoad([])
            usage0 = os.times()
            proc = subprocess.run(pinned(cmd, cpu), cwd=ROOT, capture_output=True, text=True,
                                  timeout=900, check=False)  # fmt: skip
            usage1 = os.times()
            if proc.returncode != 0:
                raise RuntimeError(f"aiperf failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
            used = (usage1.children_user - usage0.children_user) + (
                usage1.children_system - usage0.children_system
            )
            lines = (Path(tmp) / "profile_export.jsonl").read_text().splitlines()
        truth = fetch_truth(port)
        cpu_tokens.append((used, sum(len(writes) for _, writes in truth.values())))  # type: ignore[arg-type]
    requests = []
    for line in lines:
        record = json.loads(line)
        meta, metrics = record["metadata"], record.get("metrics", {})
        if meta.get("benchmark_phase") != "profiling" or "time_to_first_token" not in metrics:
            continue
        requests.append({"id": meta["x_request_id"], "tokens": ns.tokens,
                         "ttft": metrics["time_to_first_token"]["value"] / 1e3})  # fmt: skip
    (cpu1, tokens1), (cpu2, tokens2) = cpu_tokens
    figures = analyse(requests, truth, {"cpu": cpu2 - cpu1}, cpu_tokens=tokens2 - tokens1)
    return figures | {"other_load": other.share(used)}


def analyse(requests: list[dict[str, object]], truth: dict[str, list[object]],
            own: dict[str, object], cpu_tokens: int | None = None) -> dict[str, float]:  # fmt: skip
    """A run's figures: `requests` matched to the `truth` by id, and the client's own figures
    (`own["cpu"]`: its CPU-seconds, spent on `cpu_tokens` tokens, by default the matched
    requests' tokens)."""
    client_ms, truth_ms, errors = [], [], []
    tokens = 0
    for r in requests:
        record = truth.get(str(r["id"]))
        if record is None or r["ttft"] is None:
            continue
        receive_ns, writes = record
        true_ms = (writes[0] - receive_ns) / 1e6  # type: ignore[index, operator]
        seen_ms = float(r["ttft"]) * 1e3  # type: ignore[arg-type]
        client_ms.append(seen_ms)
        truth_ms.append(true_ms)
        errors.append(seen_ms - true_ms)
        tokens += int(r["tokens"])  # type: ignore[call-overload]
    cpu = float(own["cpu"])  # type: ignore[arg-type]
    tokens = tokens if cpu_tokens is None else cpu_tokens
    figures = {
        "matched": float(len(errors)),
        "ttft_p50_err": pct(client_ms, 50) - pct(truth_ms, 50),
        "ttft_p99_err": pct(client_ms, 99) - pct(truth_ms, 99),
        "err_p50": pct(errors, 50),
        "err_p99": pct(errors, 99),
        "truth_p50": pct(truth_ms, 50),
        "cpu_per_1k": 1000 * cpu / tokens if tokens else float("nan"),
        "tokens_per_cpu_s": tokens / cpu if cpu > 0 else float("nan"),
    }
    figures |= error_parts(requests, truth)
    return figures | {k: float(v) for k, v in own.items() if k != "cpu" and v is not None}  # type: ignore[arg-type]


def error_parts(
    requests: list[dict[str, object]], truth: dict[str, list[object]]
) -> dict[str, float]:
    """Where a request's TTFT error is, p50 in ms: `to_send`, the client's own time from
    `t_sched` to the write, and `to_stamp`, from the server's first-token write to the
    client's stamp of it (the network between is microseconds on loopback).

    bench's stamps are offsets from its level's start: they are put on the server's clock by
    the request whose write reached the server soonest (its write → arrival taken as 0).
    """
    rows = []
    relative = False
    for r in requests:
        record = truth.get(str(r["id"]))
        if record is None or not ("offsets" in r or "sent_ns" in r):  # aiperf: no stamps
            continue
        arrival, writes = int(record[0]), record[1]  # type: ignore[call-overload]
        first_write = int(writes[0])  # type: ignore[index]
        if "offsets" in r:  # bench
            relative = True
            sched, send, first = (float(x) * 1e9 for x in r["offsets"])  # type: ignore[attr-defined]
            rows.append((sched, send, first, arrival, first_write))
        else:  # a floor: absolute stamps, its write is its t_sched
            sent, seen = float(r["sent_ns"]), float(r["first_ns"])  # type: ignore[arg-type]
            rows.append((sent, sent, seen, arrival, first_write))
    if not rows:
        return {}
    origin = min(arrival - send for _, send, _, arrival, _ in rows) if relative else 0.0
    to_send = [(send - sched) / 1e6 for sched, send, _, _, _ in rows]
    to_stamp = [(origin + first - first_write) / 1e6 for _, _, first, _, first_write in rows]
    return {"to_send_p50": pct(to_send, 50), "to_stamp_p50": pct(to_stamp, 50)}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="50,200")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--per-worker", type=int, default=6, help="measured requests a worker")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--clients", default="raw,rawparse,rawstate,aiohttp,bench")
    parser.add_argument("--bench-loop", default="auto", choices=["auto", "uvloop", "asyncio"])
    parser.add_argument("--quiet", type=float, default=0.25, metavar="SHARE")
    parser.add_argument("--no-pin", action="store_true")
    parser.add_argument("--json", help="write every run's figures to this file")
    parser.add_argument("--aiperf", metavar="CMD",
                        help="aiperf's command (pip install aiperf in a venv of its own), for "
                             "the `aiperf` client")  # fmt: skip
    parser.add_argument("--worker", choices=FLOORS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.worker:
        raw_worker(ns)
        return
    cpus = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = (None, None) if ns.no_pin or len(cpus) < 2 else (cpus[0], cpus[1])
    levels = [int(x) for x in ns.levels.split(",")]
    clients = ns.clients.split(",")
    if unknown := [c for c in clients if c not in CLIENTS]:
        parser.error(f"--clients: unknown {', '.join(unknown)} (known: {', '.join(CLIENTS)})")
    if "aiperf" in clients and not ns.aiperf:
        parser.error("--clients aiperf needs --aiperf: the aiperf command, in a venv of its own")
    scratch = tempfile.TemporaryDirectory()
    try:
        tokenizer = (
            aiperf_tokenizer(ns.aiperf, Path(scratch.name)) if "aiperf" in clients else Path()
        )
    except ValueError as exc:
        parser.error(str(exc))
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    port = free_port()
    server = subprocess.Popen(
        pinned([PYTHON, str(HERE / "truth_server.py"), "--port", str(port)], server_cpu),
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_http(f"http://127.0.0.1:{port}/health")
        for level in levels:
            for repeat in range(ns.repeats):
                for client in clients:
                    wait_quiet(ns.quiet)
                    if client == "aiperf":
                        figures = aiperf_run(ns, port, level, client_cpu, tokenizer)
                    else:
                        figures = one_run(ns, port, level, client, client_cpu)
                    runs.setdefault((level, client), []).append(figures)
                    print(
                        f"  c={level:<4} {client:<8} run {repeat + 1}: TTFT err p50/p99 "
                        f"{figures['ttft_p50_err']:+.2f}/{figures['ttft_p99_err']:+.2f} ms, "
                        f"cpu {figures['cpu_per_1k']:.4f} s/1k tok, "
                        f"other {figures['other_load']:.2f}",
                        file=sys.stderr,
                    )
    finally:
        server.terminate()
        server.wait(10)
    report(levels, clients, runs, pinned=server_cpu is not None)
    write_runs(ns.json, runs)


def report(
    levels: list[int], clients: list[str], runs: dict[tuple[int, str], list[dict[str, float]]],
    *, pinned: bool,
) -> None:  # fmt: skip
    def med(level: int, client: str, key: str) -> float:
        return median(r.get(key, float("nan")) for r in runs[(level, client)])

    n = len(next(iter(runs.values())))
    pins = "server and client on a core each (taskset)" if pinned else "not pinned"
    print(f"\nmedians of {n} runs; {pins}; truth = the server's first-token write − arrival")
    floors = [f for f in FLOORS if f in clients]
    print(f"{'C':>4} {'client':<8} " + " ".join(f"{h:>{w}}" for _, h, _, w in COLUMNS)
          + "".join(f" {'CPU÷' + f:>12}" for f in floors))  # fmt: skip
    for level in levels:
        for client in clients:
            cells = (fmt(med(level, client, k), d).rjust(w) for k, _, d, w in COLUMNS)
            cpu = med(level, client, "cpu_per_1k")
            ratios = (fmt(cpu / med(level, f, "cpu_per_1k")).rjust(12) for f in floors)
            print(f"{level:>4} {client:<8} " + " ".join(cells) + " " + " ".join(ratios))
    print(
        "ms; TTFT err = client's percentile − truth's; per-req = each request's own error; "
        "send = t_sched → its write; stamp = the server's first-token write → the client's "
        "stamp of it; lag = bench's dispatch lag; loop = its "
        "event-loop lag; bound = share of runs bench judged client-bound; tok/CPU-s = tokens "
        "one core would carry"
    )


COLUMNS = (  # key, heading, digits, width
    ("ttft_p50_err", "TTFT err p50", 2, 12), ("ttft_p99_err", "p99", 2, 6),
    ("err_p50", "per-req p50", 2, 11), ("err_p99", "p99", 2, 6),
    ("to_send_p50", "send p50", 2, 8), ("to_stamp_p50", "stamp p50", 2, 9),
    ("truth_p50", "truth p50", 1, 9), ("cpu_per_1k", "CPU s/1k tok", 4, 12),
    ("tokens_per_cpu_s", "tok/CPU-s", 0, 9), ("lag_p99", "lag p99", 2, 7),
    ("loop_lag_p99", "loop p99", 2, 8), ("client_bound", "bound", 1, 5),
    ("other_load", "other", 2, 5),
)  # fmt: skip


if __name__ == "__main__":
    main()
