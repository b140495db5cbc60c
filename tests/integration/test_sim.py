"""The simulator as a client sees it: real server on 127.0.0.1, real aiohttp client, no mocks.

Timing checks hold on a loaded machine: load only ever delays a token, so each token is held
to a lower bound that holds strictly, and what must be close (a step, a prefill, a queue wait)
is a median over many tokens, which a few stalls do not move, under a stated upper bound. The
engine steps on an absolute clock, so a late step is followed by a short one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDict
from prometheus_client.parser import text_string_to_metric_families

from prober.sim import SimConfig, bound_port, serve

HOST = "127.0.0.1"
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Hello, world! How are you?"}]
PROMPT_TOKENS = 8 + 4 + 3  # 8 pieces, one message, reply priming
# Fast engine for tests that are not about timing.
FAST: dict[str, Any] = {
    "prefill_base_seconds": 0.001,
    "decode_step_seconds": 0.002,
    "decode_slowdown": 0.0,
}

Start = Callable[..., Awaitable[str]]
Json = Any  # parsed JSON bodies: shapes are what the tests assert


@pytest.fixture
async def sim() -> AsyncIterator[Start]:
    runners = []

    async def start(**overrides: Any) -> str:
        runner = await serve(SimConfig(**overrides), HOST, 0)
        runners.append(runner)
        return f"http://{HOST}:{bound_port(runner)}"

    yield start
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        yield session


@dataclass
class Stream:
    status: int
    headers: Mapping[str, str]
    events: list[tuple[float, str]]  # (perf_counter at arrival, data payload)
    t_send: float

    @property
    def chunks(self) -> list[Json]:
        return [json.loads(data) for _, data in self.events if data != "[DONE]"]

    def token_events(self) -> list[tuple[float, str, str]]:
        """(arrival, channel, text) of every event carrying a non-empty token."""
        out = []
        for t, data in self.events:
            if data == "[DONE]":
                continue
            for channel, text in _tokens(json.loads(data)):
                out.append((t, channel, text))
        return out


def _tokens(chunk: Json) -> list[tuple[str, str]]:
    found = []
    for choice in chunk.get("choices") or []:
        delta = choice.get("delta", {})
        for channel in ("content", "reasoning_content", "reasoning"):
            if delta.get(channel):
                found.append((channel, delta[channel]))
        if choice.get("text"):
            found.append(("text", choice["text"]))
    return found


def _body(max_tokens: int = 8, **extra: object) -> dict[str, object]:
    return {"model": "sim", "messages": MESSAGES, "stream": True, "max_tokens": max_tokens} | extra


async def stream(
    client: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    fault: str | None = None,
    client_timeout: aiohttp.ClientTimeout | None = None,
) -> Stream:
    headers = {"X-Sim-Fault": fault} if fault else {}
    t_send = time.perf_counter()
    async with client.post(url, json=body, headers=headers, timeout=client_timeout) as resp:
        events = []
        async for raw in resp.content:
            line = raw.rstrip(b"\r\n")
            if line.startswith(b"data: "):
                events.append((time.perf_counter(), line[6:].decode()))
        return Stream(resp.status, CIMultiDict(resp.headers), events, t_send)


async def scrape(client: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with client.get(base + "/metrics") as resp:
        text = await resp.text()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.labels == {"model_name": "sim"}
    }


async def raw_lines(resp: aiohttp.ClientResponse) -> list[bytes]:
    return (await resp.read()).split(b"\n")


# --- stream shapes -------------------------------------------------------------------------


async def test_chat_stream_shape_usage_and_timings(
    sim: Start, client: aiohttp.ClientSession
) -> None:
    base = await sim(**FAST)
    s = await stream(client, base + CHAT, _body(6, stream_options={"include_usage": True}))
    assert s.status == 200
    assert s.headers["Content-Type"].startswith("text/event-stream")
    assert s.events[-1][1] == "[DONE]"
    chunks = s.chunks
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    for chunk in chunks:
        assert chunk["object"] == "chat.completion.chunk"
        assert str(chunk["id"]).startswith("chatcmpl-")
        assert chunk["id"] == s.headers["X-Request-Id"]
        assert chunk["model"] == "sim"
    tokens = s.token_events()
    assert [ch for _, ch, _ in tokens] == ["content"] * 6
    last = chunks[-2]
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["timings"]["prompt_n"] == PROMPT_TOKENS
    assert last["timings"]["predicted_n"] == 6
    assert set(last["timings"]) >= {
        "prompt_ms",
        "predicted_ms",
        "predicted_per_token_ms",
        "cache_n",
    }
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {
        "prompt_tokens": PROMPT_TOKENS,
        "completion_tokens": 6,
        "total_tokens": PROMPT_TOKENS + 6,
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


async def test_completions_stream_without_usage(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(timings=False, **FAST)
    body = {"prompt": "Hello, world!", "stream": True, "max_completion_tokens": 5}
    s = await stream(client, base + "/v1/completions", body)
    chunks = s.chunks
    assert all(c["object"] == "text_completion" for c in chunks)
    assert [ch for _, ch, _ in s.token_events()] == ["text"] * 5
    assert "usage" not in chunks[-1]
    assert "timings" not in chunks[-1]
    assert s.events[-1][1] == "[DONE]"


async def test_non_streaming_answers(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(reasoning_tokens=2, **FAST)
    async with client.post(base + CHAT, json=_body(5, stream=False)) as resp:
        body = await resp.json()
    message = body["choices"][0]["message"]
    assert len(message["content"].split()) == 3
    assert len(message["reasoning_content"].split()) == 2
    assert body["usage"]["completion_tokens"] == 5
    assert body["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}
    async with client.post(
        base + "/v1/completions", json={"prompt": "a b.", "max_tokens": 4}
    ) as resp:
        body = await resp.json()
    assert len(body["choices"][0]["text"].split()) == 4
    assert body["usage"]["prompt_tokens"] == 3


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_channel_counts(
    sim: Start, client: aiohttp.ClientSession, field: str
) -> None:
    base = await sim(reasoning_tokens=3, reasoning_field=field, **FAST)
    s = await stream(client, base + CHAT, _body(8, stream_options={"include_usage": True}))
    assert [ch for _, ch, _ in s.token_events()] == [field] * 3 + ["content"] * 5
    usage = s.chunks[-1]["usage"]
    assert usage["completion_tokens"] == 8
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 3}


async def test_multi_token_chunks(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(tokens_per_chunk=4, reasoning_tokens=3, **FAST)
    s = await stream(client, base + CHAT, _body(10, stream_options={"include_usage": True}))
    sizes = [(ch, len(text.split())) for _, ch, text in s.token_events()]
    assert sizes == [("reasoning_content", 3), ("content", 4), ("content", 3)]
    assert s.chunks[-1]["usage"]["completion_tokens"] == 10


async def test_prompt_tokens_are_not_words(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    messages = [{"role": "system", "content": "Be brief."}, *MESSAGES]
    async with client.post(base + CHAT, json={"messages": messages, "max_tokens": 1}) as resp:
        usage = (await resp.json())["usage"]
    assert usage["prompt_tokens"] == (3 + 4) + (8 + 4) + 3  # 7 whitespace words


async def test_ollama_ndjson(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(reasoning_tokens=1, **FAST)
    body = {"model": "sim", "messages": MESSAGES, "options": {"num_predict": 4}}
    async with client.post(base + "/api/chat", json=body) as resp:
        assert resp.headers["Content-Type"].startswith("application/x-ndjson")
        objects = [json.loads(line) async for line in resp.content if line.strip()]
    assert [o["done"] for o in objects] == [False] * 4 + [True]
    assert objects[0]["message"]["thinking"].strip()
    assert all(o["message"]["content"].strip() for o in objects[1:4])
    final = objects[-1]
    assert final["prompt_eval_count"] == PROMPT_TOKENS
    assert final["eval_count"] == 4
    durations = ("load_duration", "prompt_eval_duration", "eval_duration", "total_duration")
    assert all(isinstance(final[k], int) for k in durations)
    assert final["total_duration"] >= final["prompt_eval_duration"] + final["eval_duration"]
    async with client.post(base + "/api/chat", json=body | {"stream": False}) as resp:
        whole = await resp.json()
    assert whole["done"] is True
    assert whole["eval_count"] == 4


async def test_models_health_and_bad_requests(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    async with client.get(base + "/v1/models") as resp:
        assert (await resp.json())["data"][0]["id"] == "sim"
    async with client.get(base + "/health") as resp:
        assert resp.status == 200
    bad: list[Json] = [{"messages": []}, {"messages": MESSAGES, "max_tokens": 0}]
    for body in bad:
        async with client.post(base + CHAT, json=body) as resp:
            assert resp.status == 400
    async with client.post(base + CHAT, data=b"{nope") as resp:
        assert resp.status == 400
    async with client.post(base + CHAT, json=_body(), headers={"X-Sim-Fault": "boom"}) as resp:
        assert resp.status == 400
        assert "unknown fault" in (await resp.text())


# --- engine behaviour ----------------------------------------------------------------------

TIMED: dict[str, Any] = {
    "prefill_base_seconds": 0.05,
    "prefill_tokens_per_second": 1e6,
    "decode_slowdown": 0.0,
}
PREFILL, STEP = 0.05, 0.02  # TIMED's prefill of a short prompt; the decode step these tests use


async def write_stamps(client: aiohttp.ClientSession, base: str, s: Stream) -> list[float]:
    """The server's first-byte stamp, then its token write stamps, in seconds (same clock as
    the client's `perf_counter`: the simulator runs in this process)."""
    async with client.get(f"{base}/sim/requests/{s.headers['X-Request-Id']}") as resp:
        stamps = await resp.json()
    writes = stamps["token_write_ns"]
    assert writes == sorted(writes)
    assert stamps["first_byte_ns"] <= writes[0]
    return [ns / 1e9 for ns in (stamps["first_byte_ns"], *writes)]


def offsets(times: list[float], origin: float) -> list[float]:
    """Token k's time past `origin` less k decode steps: the prefill plus whatever was late."""
    return [t - origin - k * STEP for k, t in enumerate(times)]


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(times)]


async def test_ttft_is_prefill_and_gaps_are_decode_steps(
    sim: Start, client: aiohttp.ClientSession
) -> None:
    """Load only ever delays: every token is checked against a lower bound that holds
    strictly, and the figures that must be close (the step, the prefill) are medians over
    many tokens and the best of three requests, which a few stalls do not move.

    The engine steps on an absolute clock, so a late step is followed by a short one and the
    median gap stays at the step; a relative sleep, a wrong step or a missing prefill fails.
    """
    base = await sim(decode_step_seconds=STEP, **TIMED)
    client_gaps, server_gaps, client_prefill, server_prefill = [], [], [], []
    for _ in range(3):
        s = await stream(client, base + CHAT, _body(30))
        times = [t for t, _, _ in s.token_events()]
        assert len(times) == 30
        first_byte, *writes = await write_stamps(client, base, s)
        assert len(writes) == 30
        # Token k cannot come before the prefill and k steps, counted from the request's
        # first byte (the engine sees the request only after that) or from the client's send.
        assert min(offsets(writes, first_byte)) >= PREFILL
        assert min(offsets(times, s.t_send)) >= PREFILL
        server_prefill.append(statistics.median(offsets(writes, first_byte)))
        client_prefill.append(statistics.median(offsets(times, s.t_send)))
        server_gaps += gaps(writes)
        client_gaps += gaps(times)
    # Median gap over 87 steps, written and received: within 2 ms of the 20 ms step.
    assert statistics.median(server_gaps) == pytest.approx(STEP, abs=0.002)
    assert statistics.median(client_gaps) == pytest.approx(STEP, abs=0.002)
    # The prefill, as the best of three medians: at most 25 ms over its 50 ms (a second
    # prefill or an extra step would add 50 or 20 ms to every token of every request).
    assert min(server_prefill) <= PREFILL + 0.025
    assert min(client_prefill) <= PREFILL + 0.025


async def test_one_slot_queues_the_second_request(
    sim: Start, client: aiohttp.ClientSession
) -> None:
    base = await sim(slots=1, decode_step_seconds=STEP, **TIMED)
    # One request = 50 ms prefill (first token) + 19 steps of 20 ms = 430 ms.
    tasks = [asyncio.create_task(stream(client, base + CHAT, _body(20))) for _ in range(2)]
    during = await scrape(client, base)
    deadline = time.perf_counter() + 5
    while during["vllm:num_requests_running"] + during["vllm:num_requests_waiting"] < 2:
        assert time.perf_counter() < deadline, "the two requests never reached the engine"
        await asyncio.sleep(0.01)
        during = await scrape(client, base)
    # Seen as soon as both are in: one decoding, one queued behind it.
    assert during["vllm:num_requests_running"] == 1
    assert during["vllm:num_requests_waiting"] == 1
    first, second = sorted(await asyncio.gather(*tasks), key=lambda s: s.token_events()[0][0])
    first_byte = (await write_stamps(client, base, first))[0]
    writes = (await write_stamps(client, base, second))[1:]
    # The second waits for the whole first request (430 ms from the first's first byte at
    # the earliest), then pays its own prefill: each of its tokens comes at least 480 ms plus
    # its steps after the first request's first byte, whatever the load ...
    assert min(offsets(writes, first_byte)) >= 0.43 + PREFILL
    # ... and, on the median over its 20 tokens, within 100 ms of that (not queued: 430 ms
    # less; queued behind two requests: 430 ms more).
    assert statistics.median(offsets(writes, first_byte)) <= 0.43 + PREFILL + 0.1
    after = await scrape(client, base)
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    assert after["vllm:request_success_total"] == 2
    assert after["vllm:generation_tokens_total"] == 40
    assert after["vllm:prompt_tokens_total"] == 2 * PROMPT_TOKENS


async def test_kv_capacity_limits_admission(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(slots=4, kv_capacity_tokens=100, decode_step_seconds=0.02, **TIMED)
    body = _body(40) | {"messages": [{"role": "user", "content": "hi"}]}  # 8 + 40 = 48 each
    tasks = [asyncio.create_task(stream(client, base + CHAT, body)) for _ in range(3)]
    await asyncio.sleep(0.15)
    during = await scrape(client, base)
    assert (during["vllm:num_requests_running"], during["vllm:num_requests_waiting"]) == (2, 1)
    assert during["vllm:kv_cache_usage_perc"] == pytest.approx(0.96)
    async with client.post(base + CHAT, json=body | {"max_tokens": 100}) as resp:
        assert resp.status == 400
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_disconnect_frees_slot_and_queue(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(slots=1, **FAST)
    endless = await client.post(base + CHAT, json=_body(2), headers={"X-Sim-Fault": "endless"})
    await endless.content.readline()
    queued = asyncio.create_task(stream(client, base + CHAT, _body(3)))
    await asyncio.sleep(0.1)
    assert (await scrape(client, base))["vllm:num_requests_waiting"] == 1
    endless.close()  # the client leaves: its slot must go to the queued request
    s = await asyncio.wait_for(queued, 5)
    assert len(s.token_events()) == 3
    # A client that leaves while queued leaves the queue too.
    blocker = await client.post(base + CHAT, json=_body(2), headers={"X-Sim-Fault": "endless"})
    waiter = asyncio.create_task(stream(client, base + CHAT, _body(3)))
    await asyncio.sleep(0.1)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    await asyncio.sleep(0.2)
    metrics = await scrape(client, base)
    assert (metrics["vllm:num_requests_running"], metrics["vllm:num_requests_waiting"]) == (1, 0)
    blocker.close()


async def test_200_concurrent_streams(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(slots=256, **(FAST | {"decode_step_seconds": 0.01}))
    body = _body(32, stream_options={"include_usage": True})
    t0 = time.perf_counter()
    results = await asyncio.wait_for(
        asyncio.gather(*(stream(client, base + CHAT, body) for _ in range(200))), 45
    )
    elapsed = time.perf_counter() - t0
    for s in results:
        assert len(s.token_events()) == 32
        assert s.chunks[-1]["usage"]["completion_tokens"] == 32
    metrics = await scrape(client, base)
    assert metrics["vllm:request_success_total"] == 200
    assert metrics["vllm:generation_tokens_total"] == 200 * 32
    assert elapsed < 45


# --- faults --------------------------------------------------------------------------------


@dataclass
class Raw:
    status: int
    lines: list[bytes]
    error: BaseException | None

    def data(self) -> list[bytes]:
        return [line.rstrip(b"\r\n")[6:] for line in self.lines if line.startswith(b"data: ")]

    def tokens(self) -> int:
        n = 0
        for data in self.data():
            try:
                chunk = json.loads(data)
            except ValueError:
                continue
            if isinstance(chunk, dict):
                n += sum(len(text.split()) for _, text in _tokens(chunk))
        return n

    @property
    def done(self) -> bool:
        return b"[DONE]" in self.data()


async def collect(
    client: aiohttp.ClientSession,
    url: str,
    body: Mapping[str, object],
    fault: str,
    *,
    read_timeout: float = 2.0,
    whole: bool = False,
) -> Raw:
    """Read a faulty answer to its end, keeping what arrived and the error that ended it."""
    timeout = aiohttp.ClientTimeout(total=10, sock_read=read_timeout)
    raw = Raw(0, [], None)
    try:
        async with client.post(
            url, json=body, headers={"X-Sim-Fault": fault}, timeout=timeout
        ) as resp:
            raw.status = resp.status
            if whole:  # readline() refuses lines past 128 KiB; split the body ourselves
                raw.lines = [line + b"\n" for line in (await resp.read()).split(b"\n")]
            else:
                async for line in resp.content:
                    raw.lines.append(line)
    except (aiohttp.ClientError, TimeoutError) as exc:
        raw.error = exc
    return raw


@pytest.mark.parametrize(("code", "retry_after"), [(503, None), (429, "1"), (404, None)])
async def test_fault_status(
    sim: Start, client: aiohttp.ClientSession, code: int, retry_after: str | None
) -> None:
    base = await sim(**FAST)
    async with client.post(
        base + CHAT, json=_body(), headers={"X-Sim-Fault": f"status:{code}"}
    ) as resp:
        assert resp.status == code
        assert (await resp.json())["error"]["code"] == code
        assert resp.headers.get("Retry-After") == retry_after
    assert (await scrape(client, base))["vllm:generation_tokens_total"] == 0


async def test_fault_no_first_byte(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    t0 = time.perf_counter()
    raw = await collect(client, base + CHAT, _body(), "no_first_byte", read_timeout=0.3)
    assert isinstance(raw.error, TimeoutError)
    assert raw.status == 0
    assert time.perf_counter() - t0 >= 0.3


async def test_fault_no_first_token(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(keepalive_seconds=0.05, **FAST)
    lines: list[bytes] = []

    async def read_all(resp: aiohttp.ClientResponse) -> None:
        async for line in resp.content:
            lines.append(line)

    async with client.post(
        base + CHAT, json=_body(), headers={"X-Sim-Fault": "no_first_token"}
    ) as resp:
        assert resp.status == 200
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(read_all(resp), 0.4)
    raw = Raw(200, lines, None)
    assert sum(line.startswith(b": ping") for line in lines) >= 4
    assert raw.tokens() == 0
    assert len(raw.data()) == 1


async def test_fault_stall_after(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    raw = await collect(client, base + CHAT, _body(), "stall_after:3", read_timeout=0.3)
    assert raw.status == 200
    assert isinstance(raw.error, TimeoutError)
    assert raw.tokens() == 3
    assert not raw.done


async def test_fault_truncate_after(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    raw = await collect(
        client, base + CHAT, _body(stream_options={"include_usage": True}), "truncate_after:3"
    )
    assert raw.error is None  # a clean end of body ...
    assert raw.tokens() == 3
    assert not raw.done
    assert not any(b'"usage"' in line for line in raw.lines)


async def test_fault_close_mid_body(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    raw = await collect(client, base + CHAT, _body(), "close_mid_body")
    assert isinstance(raw.error, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError)
    assert raw.tokens() == 2
    assert not raw.done


async def test_fault_malformed(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    raw = await collect(client, base + CHAT, _body(), "malformed")
    assert raw.error is None
    assert raw.done
    assert raw.tokens() == 8
    framed = [line for line in raw.lines if line.strip() and not line.startswith((b"data: ", b":"))]
    assert framed  # lines outside SSE's data: framing
    undecodable = 0
    for line in framed:
        try:
            line.decode()
        except UnicodeDecodeError:
            undecodable += 1
    assert undecodable == 1


async def test_fault_bad_json(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    raw = await collect(client, base + CHAT, _body(), "bad_json")
    assert raw.error is None
    assert raw.done
    assert raw.tokens() == 8
    assert raw.data().count(b"{not json") == 1


async def test_fault_oversized(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    raw = await collect(client, base + CHAT, _body(), "oversized:4000000", whole=True)
    assert raw.error is None
    assert raw.done
    assert raw.tokens() == 8
    big = [line for line in raw.lines if len(line) > 100_000]
    assert len(big) == 1
    assert len(big[0]) == 4_000_000 + 1
    assert json.loads(big[0][6:])["choices"][0]["delta"] == {"content": ""}


async def test_fault_endless(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    async with client.post(base + CHAT, json=_body(2), headers={"X-Sim-Fault": "endless"}) as resp:
        tokens = 0
        async for line in resp.content:
            if line.startswith(b"data: ") and b'"content":" ' in line:
                tokens += 1
                if tokens == 40:
                    break
    assert tokens == 40  # far past max_tokens=2
    for _ in range(50):  # the engine sees the client leave at its next step
        if (await scrape(client, base))["vllm:num_requests_running"] == 0:
            break
        await asyncio.sleep(0.02)
    assert (await scrape(client, base))["vllm:num_requests_running"] == 0


async def test_fault_no_tokens(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    raw = await collect(client, base + CHAT, _body(), "no_tokens")
    assert raw.error is None
    assert raw.tokens() == 0
    usage, done = raw.data()
    assert done == b"[DONE]"
    assert json.loads(usage)["usage"]["completion_tokens"] == 0


async def test_random_faults_follow_the_seed(sim: Start, client: aiohttp.ClientSession) -> None:
    async def statuses() -> list[int]:
        base = await sim(fault_rates={"status:503": 0.5}, seed=3, **FAST)
        out = []
        for _ in range(20):
            async with client.post(base + CHAT, json=_body(1, stream=False)) as resp:
                out.append(resp.status)
        return out

    first = await statuses()
    assert set(first) == {200, 503}
    assert first == await statuses()


async def test_faults_on_ollama_and_non_streaming(
    sim: Start, client: aiohttp.ClientSession
) -> None:
    base = await sim(**FAST)
    ollama = {"messages": MESSAGES, "options": {"num_predict": 6}}
    raw = await collect(client, base + "/api/chat", ollama, "truncate_after:2")
    objects = [json.loads(line) for line in raw.lines if line.strip()]
    assert raw.error is None
    assert len(objects) == 2
    assert not any(o["done"] for o in objects)
    raw = await collect(client, base + "/api/chat", ollama, "bad_json")
    assert b"{not json\n" in raw.lines
    assert json.loads(raw.lines[-1])["done"] is True
    raw = await collect(client, base + "/api/chat", ollama, "no_first_token", read_timeout=0.3)
    assert raw.status == 200
    assert isinstance(raw.error, TimeoutError)
    assert raw.lines == []
    raw = await collect(client, base + CHAT, _body(stream=False), "bad_json")
    assert raw.status == 200
    assert b"".join(raw.lines) == b"{not json"
    raw = await collect(client, base + CHAT, _body(stream=False), "close_mid_body")
    assert isinstance(raw.error, aiohttp.ClientPayloadError | aiohttp.ServerDisconnectedError)
    raw = await collect(client, base + CHAT, _body(stream=False), "stall_after:1", read_timeout=0.3)
    assert isinstance(raw.error, TimeoutError)
    assert raw.status == 0


async def test_unknown_stamp_id(sim: Start, client: aiohttp.ClientSession) -> None:
    base = await sim(**FAST)
    async with client.get(base + "/sim/requests/chatcmpl-nope") as resp:
        assert resp.status == 404


# --- lifecycle -----------------------------------------------------------------------------


async def test_shutdown_ends_open_streams_without_leaks() -> None:
    runner = await serve(SimConfig(slots=2, keepalive_seconds=0.05, **FAST), HOST, 0)
    base = f"http://{HOST}:{bound_port(runner)}"
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))

    async def hold(fault: str | None, body: dict[str, object]) -> None:
        headers = {"X-Sim-Fault": fault} if fault else {}
        async with session.post(base + CHAT, json=body, headers=headers) as resp:
            async for _ in resp.content:
                pass

    opened = [
        ("endless", _body(2)),  # takes a slot
        ("stall_after:1", _body(100_000)),  # takes the other slot, silent
        ("no_first_byte", _body()),
        ("no_first_token", _body()),
        (None, _body(5)),  # queued behind the two slots
    ]
    tasks = [asyncio.create_task(hold(fault, body)) for fault, body in opened]
    await asyncio.sleep(0.3)
    metrics = await scrape(session, base)
    assert (metrics["vllm:num_requests_running"], metrics["vllm:num_requests_waiting"]) == (2, 1)
    t0 = time.perf_counter()
    await runner.cleanup()
    assert time.perf_counter() - t0 < 3
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert all(isinstance(r, aiohttp.ClientError) for r in results)
    await session.close()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == {asyncio.current_task()}
