"""The simulator's `/metrics`: the engine's true state under vLLM's metric names.

Values are read from the engine when Prometheus scrapes (a custom collector), so they are
exact at that instant and nothing has to keep gauges up to date. Names and the `model_name`
label follow vLLM, so the prober's server scraper reads the simulator like a vLLM server.

`DCGM_FI_DEV_GPU_UTIL` is the GPU utilisation as NVIDIA's DCGM exporter names it (percent,
0..100, labels `gpu` and `modelName`): the share of the last second the engine was stepping,
which reads near 100 % with a single stream (`Engine.utilization`).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from prober.sim.engine import Engine


class EngineCollector(Collector):
    """Reads `Engine.stats()` at scrape time."""

    def __init__(self, engine: Engine, model: str) -> None:
        self._engine = engine
        self._model = model

    def collect(self) -> Iterator[Metric]:
        stats = self._engine.stats()
        labels = ["model_name"]
        values = [self._model]
        gauges = (
            ("vllm:num_requests_waiting", "Requests waiting in the queue.", stats.waiting),
            ("vllm:num_requests_running", "Requests in a slot (prefill or decode).", stats.running),
            ("vllm:kv_cache_usage_perc", "Reserved share of the KV budget (0..1).", stats.kv_usage),
        )
        for name, doc, value in gauges:
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(values, value)
            yield gauge
        util = GaugeMetricFamily(
            "DCGM_FI_DEV_GPU_UTIL",
            "GPU utilisation (%): share of the last second any sequence was stepping.",
            labels=["gpu", "modelName"],
        )
        util.add_metric(["0", self._model], 100.0 * self._engine.utilization())
        yield util
        counters = (
            ("vllm:request_success", "Requests that finished.", stats.request_success_total),
            ("vllm:prompt_tokens", "Prompt tokens prefilled.", stats.prompt_tokens_total),
            ("vllm:generation_tokens", "Tokens generated.", stats.generation_tokens_total),
        )
        for name, doc, value in counters:
            counter = CounterMetricFamily(name, doc, labels=labels)
            counter.add_metric(values, value)
            yield counter


def build_registry(engine: Engine, model: str) -> CollectorRegistry:
    """A private registry holding only the engine collector."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(engine, model))
    return registry
