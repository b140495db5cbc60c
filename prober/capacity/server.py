"""Scrape an inference engine's own /metrics and normalise it: the server-side truth.

This module owns the mapping from each engine's metric names to one snapshot:
requests waiting, requests running, KV-cache usage as a 0..1 ratio, a completed-requests
counter (whose rate is a drain rate) and the finished requests' prompt and output tokens
(`TokenTotals`: their rates give the traffic's mean shape). It has no side effects: no
metrics, no logging; the caller counts and logs failures.

Engine -> waiting / running / KV usage ratio / completed-requests counter (the first name
present wins where several are listed):

- vLLM: `vllm:num_requests_waiting` / `vllm:num_requests_running` /
  `vllm:kv_cache_usage_perc`, else `vllm:gpu_cache_usage_perc` /
  `vllm:request_success_total` (summed over `finished_reason`).
- llama.cpp: `llamacpp:requests_deferred` / `llamacpp:requests_processing` /
  `llamacpp:kv_cache_usage_ratio` (older builds only, else None) / none exported.
- SGLang: `sglang:num_queue_reqs` / `sglang:num_running_reqs` / `sglang:token_usage` /
  `sglang:num_requests_total`.
- TGI: `tgi_queue_size` / `tgi_batch_current_size` / none exported / `tgi_request_success`.

A counter that moves while the engine generates (`progress_total`: the engine state reads its
movement, `capacity/state.py`), the first name present:

- vLLM: `vllm:generation_tokens_total` (added at every engine step).
- llama.cpp: `llamacpp:n_decode_total` (decode calls, one per engine step), else
  `llamacpp:tokens_predicted_total` (added only when a request ends).
- SGLang: `sglang:generation_tokens_total`.
- TGI: `tgi_batch_inference_count` (prefill and decode calls), else
  `tgi_request_generated_tokens_sum` (added when a request ends).

Finished requests / their prompt tokens / their output tokens (`TokenTotals`; the first
source whose three names are all present wins, so a count and its tokens always come from one
source):

- vLLM: the histograms' `vllm:request_prompt_tokens_count` / `vllm:request_prompt_tokens_sum`
  / `vllm:request_generation_tokens_sum` (observed once per finished request), else the
  counters `vllm:request_success_total` / `vllm:prompt_tokens_total` /
  `vllm:generation_tokens_total` (which count the tokens of requests still running too).
- SGLang: `sglang:num_requests_total` / `sglang:prompt_tokens_total` /
  `sglang:generation_tokens_total`.
- TGI: `tgi_request_input_length_count` / `tgi_request_input_length_sum` /
  `tgi_request_generated_tokens_sum`.
- llama.cpp: none (`prompt_tokens_total` and `tokens_predicted_total` without a request count).

Notes on the sources:

- vLLM's "perc" is a fraction: its HELP text says "KV-cache usage. 1 means 100 percent usage."
  and the scheduler sets it from a 0..1 usage; vLLM 0.9 renamed `gpu_cache_usage_perc` to
  `kv_cache_usage_perc` and exports both for a while. `request_success_total` carries one
  series per `finished_reason` (stop, length, abort); they are summed, since every finished
  request leaves the engine whatever the reason.
- llama.cpp exports no per-request counter; `tokens_predicted_total` and `n_decode_total`
  count tokens and decode calls, not requests.
- SGLang's `token_usage` is used tokens / KV pool capacity; `num_requests_total` is
  incremented once per finished request (`observe_one_finished_request`).
- TGI's router counts only successes in `tgi_request_success`.

Aggregation across label sets (several `model_name`s, vLLM data-parallel `engine`s, SGLang
`dp_rank`s): counts (waiting, running, completed) are **summed**, because the endpoint's queue is
the sum of its parts; the KV ratio takes the **maximum**, because a sum of ratios is no ratio and
the fullest pool is the one that preempts or queues first. Caveat:
SGLang with `--enable-metrics-for-all-schedulers` reports the same queue once per TP rank, which
a sum over-counts.

Every figure is checked before it is used, as a stream's are (an engine's /metrics is input
from outside like its answers): a sample that is not finite, is negative, or passes what its
quantity can be (`_CEILINGS`: a KV ratio above 1, more than `MAX_REQUESTS` requests waiting or
running, a counter past `MAX_TOTAL`) is dropped, and the snapshot names the quantities that lost
a sample (`rejected`) for the caller to count; a sum that passes the ceiling is dropped the same
way. The body is read up to `MAX_BODY_BYTES` and parsed off the event loop.

`prometheus_client`'s parser rewrites counters: a family typed `counter` loses `_total` from its
*family* name, and a counter sample whose name lacks `_total` (TGI, `llamacpp:n_tokens_max`) gets
`_total` appended. Lookups go by sample name and try both spellings.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import aiohttp
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from prober.kinds import Engine

__all__ = [
    "Engine",
    "ServerMetricsError",
    "ServerSnapshot",
    "TokenTotals",
    "detect_engine",
    "parse_metrics",
    "scrape",
]

# Ask for the classic text format: prometheus_client servers (vLLM, SGLang) would otherwise be
# free to answer in OpenMetrics, whose counter and EOF conventions differ.
_ACCEPT = {"Accept": "text/plain;version=0.0.4;q=1.0,*/*;q=0.1"}
_SNIPPET_CHARS = 200
# vLLM's exposition is about 100 KB with a few models; sixteen times the largest seen is still
# an engine's, and more is refused before it is held or parsed.
MAX_BODY_BYTES = 8 << 20
MAX_REQUESTS = 1e6  # requests waiting or running in one endpoint: no engine holds a million
MAX_TOTAL = 1e15  # a counter of requests or tokens: 30 years at a million tokens a second

SampleIndex = Mapping[str, list[float]]


class ServerMetricsError(ValueError):
    """The engine's /metrics could not be fetched, parsed or recognised."""


@dataclass(frozen=True)
class ServerSnapshot:
    """One scrape, normalised; None where the engine does not export the quantity."""

    engine: Engine
    waiting: float | None
    running: float | None
    kv_usage_ratio: float | None
    completed_total: float | None
    lengths: TokenTotals | None = None
    progress_total: float | None = None  # moves while the engine generates (module docstring)
    rejected: tuple[str, ...] = ()  # quantities that lost a sample to the range check


@dataclass(frozen=True)
class TokenTotals:
    """Cumulative finished requests and their prompt and output tokens, from one source."""

    requests: float
    prompt_tokens: float
    output_tokens: float


@dataclass(frozen=True)
class _Spec:
    """Where one engine keeps each quantity; within a tuple the first name present wins."""

    prefix: str
    waiting: tuple[str, ...]
    running: tuple[str, ...]
    kv_usage: tuple[str, ...]
    completed: tuple[str, ...]
    # (finished requests, their prompt tokens, their output tokens), sources best first
    lengths: tuple[tuple[str, str, str], ...] = ()
    progress: tuple[str, ...] = ()  # a counter that moves while it generates


_SPECS: Mapping[Engine, _Spec] = MappingProxyType(
    {
        Engine.vllm: _Spec(
            prefix="vllm:",
            waiting=("vllm:num_requests_waiting",),
            running=("vllm:num_requests_running",),
            kv_usage=("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
            completed=("vllm:request_success_total",),
            progress=("vllm:generation_tokens_total",),
            lengths=(
                (
                    "vllm:request_prompt_tokens_count",
                    "vllm:request_prompt_tokens_sum",
                    "vllm:request_generation_tokens_sum",
                ),
                (
                    "vllm:request_success_total",
                    "vllm:prompt_tokens_total",
                    "vllm:generation_tokens_total",
                ),
            ),
        ),
        Engine.sglang: _Spec(
            prefix="sglang:",
            waiting=("sglang:num_queue_reqs",),
            running=("sglang:num_running_reqs",),
            kv_usage=("sglang:token_usage",),
            completed=("sglang:num_requests_total",),
            progress=("sglang:generation_tokens_total",),
            lengths=(
                (
                    "sglang:num_requests_total",
                    "sglang:prompt_tokens_total",
                    "sglang:generation_tokens_total",
                ),
            ),
        ),
        Engine.llamacpp: _Spec(
            prefix="llamacpp:",
            waiting=("llamacpp:requests_deferred",),
            running=("llamacpp:requests_processing",),
            kv_usage=("llamacpp:kv_cache_usage_ratio",),
            completed=(),
            progress=("llamacpp:n_decode_total", "llamacpp:tokens_predicted_total"),
        ),
        Engine.tgi: _Spec(
            prefix="tgi_",
            waiting=("tgi_queue_size",),
            running=("tgi_batch_current_size",),
            kv_usage=(),
            completed=("tgi_request_success",),
            progress=("tgi_batch_inference_count", "tgi_request_generated_tokens_sum"),
            lengths=(
                (
                    "tgi_request_input_length_count",
                    "tgi_request_input_length_sum",
                    "tgi_request_generated_tokens_sum",
                ),
            ),
        ),
    }
)


def _index(families: Iterable[Metric]) -> dict[str, list[float]]:
    """Sample name -> values, one per label set, as the engine sent them."""
    index: dict[str, list[float]] = {}
    for family in families:
        for sample in family.samples:
            index.setdefault(sample.name, []).append(float(sample.value))
    return index


class _Checked:
    """Values of one scrape within what their quantity can be; the quantities that lost one."""

    def __init__(self, index: SampleIndex) -> None:
        self._index = index
        self.rejected: list[str] = []

    def present(self, name: str) -> bool:
        return _lookup(self._index, (name,)) is not None

    def values(self, quantity: str, names: tuple[str, ...], ceiling: float) -> list[float] | None:
        found = _lookup(self._index, names)
        if found is None:
            return None
        kept = [v for v in found if math.isfinite(v) and 0 <= v <= ceiling]
        if len(kept) < len(found):
            self.rejected.append(quantity)
        return kept

    def summed(self, quantity: str, names: tuple[str, ...], ceiling: float) -> float | None:
        values = self.values(quantity, names, ceiling)
        if not values:
            return None
        total = math.fsum(values)
        if total > ceiling:
            self.rejected.append(quantity)
            return None
        return total

    def maximum(self, quantity: str, names: tuple[str, ...], ceiling: float) -> float | None:
        values = self.values(quantity, names, ceiling)
        return max(values) if values else None


def _lookup(index: SampleIndex, names: tuple[str, ...]) -> list[float] | None:
    """Values of the first name present, under its own or its parser-added `_total` spelling."""
    for name in names:
        for spelling in (name, f"{name}_total"):
            if spelling in index:
                return index[spelling]
    return None


def _lengths(check: _Checked, sources: tuple[tuple[str, str, str], ...]) -> TokenTotals | None:
    """The first source whose three totals are all present and within range."""
    for names in sources:
        if not all(check.present(name) for name in names):
            continue
        before = len(check.rejected)
        requests, prompt, output = (check.summed("lengths", (n,), MAX_TOTAL) for n in names)
        if requests is None or prompt is None or output is None or len(check.rejected) > before:
            return None  # a count and its tokens from one source, whole, or nothing
        return TokenTotals(requests, prompt, output)
    return None


def _has_queue_metrics(index: SampleIndex, spec: _Spec) -> bool:
    return _lookup(index, spec.waiting + spec.running) is not None


def detect_engine(families: Iterable[Metric]) -> Engine | None:
    """The engine whose queue metrics are present, else the one whose name prefix is.

    Engines are tried in a fixed order (vLLM, SGLang, llama.cpp, TGI), so an exposition that
    carries two engines' names resolves the same way every time.
    """
    index = _index(families)
    for engine, spec in _SPECS.items():
        if _has_queue_metrics(index, spec):
            return engine
    for engine, spec in _SPECS.items():
        if any(name.startswith(spec.prefix) for name in index):
            return engine
    return None


def _parse_families(text: str) -> list[Metric]:
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, IndexError) as err:  # the two the parser raises on malformed text
        cause = str(err) or type(err).__name__
        raise ServerMetricsError(f"unparseable metrics text: {cause}") from err


def _snapshot(index: SampleIndex, engine: Engine) -> ServerSnapshot:
    spec = _SPECS[engine]
    if not _has_queue_metrics(index, spec):
        wanted = ", ".join(spec.waiting + spec.running)
        raise ServerMetricsError(f"{engine} metrics absent: none of {wanted} found")
    check = _Checked(index)
    return ServerSnapshot(
        engine=engine,
        waiting=check.summed("waiting", spec.waiting, MAX_REQUESTS),
        running=check.summed("running", spec.running, MAX_REQUESTS),
        kv_usage_ratio=check.maximum("kv_usage", spec.kv_usage, 1.0),
        completed_total=check.summed("completed", spec.completed, MAX_TOTAL),
        lengths=_lengths(check, spec.lengths),
        progress_total=check.summed("progress", spec.progress, MAX_TOTAL),
        rejected=tuple(dict.fromkeys(check.rejected)),
    )


def parse_metrics(text: str, engine: Engine | None = None) -> ServerSnapshot:
    """Normalise one /metrics exposition; `engine` overrides detection when given."""
    families = _parse_families(text)
    if engine is None:
        engine = detect_engine(families)
    if engine is None:
        prefixes = ", ".join(spec.prefix for spec in _SPECS.values())
        raise ServerMetricsError(
            f"no known engine metrics found (looked for {prefixes}); llama-server needs"
            " --metrics, SGLang --enable-metrics, and Ollama has no /metrics"
        )
    return _snapshot(_index(families), engine)


def _snippet(body: bytes | bytearray) -> str:
    text = " ".join(body.decode("utf-8", errors="replace").split())
    return text[:_SNIPPET_CHARS]


async def _fetch(session: aiohttp.ClientSession, url: str, timeout_s: float) -> str:
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with session.get(url, timeout=timeout, headers=_ACCEPT) as response:
            body = bytearray()
            async for chunk in response.content.iter_chunked(1 << 16):
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise ServerMetricsError(f"{url}: body over {MAX_BODY_BYTES} bytes")
            if not 200 <= response.status < 300:
                detail = _snippet(body)
                raise ServerMetricsError(
                    f"{url}: HTTP {response.status}" + (f": {detail}" if detail else "")
                )
    except TimeoutError as err:
        raise ServerMetricsError(f"{url}: timed out after {timeout_s:g} s") from err
    except aiohttp.ClientConnectionError as err:
        raise ServerMetricsError(f"{url}: connection failed: {err}") from err
    except aiohttp.ClientError as err:
        raise ServerMetricsError(f"{url}: request failed: {err!r}") from err
    return body.decode("utf-8", errors="replace")


async def scrape(
    session: aiohttp.ClientSession, url: str, engine: Engine | None, timeout_s: float
) -> ServerSnapshot:
    """GET `url` within `timeout_s` and normalise it; any failure is a ServerMetricsError."""
    text = await _fetch(session, url, timeout_s)
    try:
        # A parse of a large exposition takes milliseconds of CPU: off the loop the probes
        # stamp on.
        return await asyncio.to_thread(parse_metrics, text, engine)
    except ServerMetricsError as err:
        raise ServerMetricsError(f"{url}: {err}") from err
