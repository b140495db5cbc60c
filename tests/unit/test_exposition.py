"""prober.exposition: the same bytes as prometheus-client's encoders, for every registry shape.

The fast renderer is only worth having if no scrape can tell it apart from the library's, so
each test renders both and compares them byte for byte.
"""

from __future__ import annotations

import gzip
import itertools
import math
import threading
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest
from aiohttp import web
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    Summary,
    disable_created_metrics,
    enable_created_metrics,
    exposition,
)
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.aiohttp import make_aiohttp_handler
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.openmetrics import exposition as openmetrics
from prometheus_client.registry import Collector

from prober.exposition import OPENMETRICS, TEXT, FastExposition, fmt
from prober.metrics import Labels, Metrics
from prober.result import Outcome, TokenSource
from prober.scrapes import metrics_handler
from prober.timings import Slo
from tests.support.results import result
from tests.support.servers import serve_app

PROMETHEUS_2 = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
PROMETHEUS_3 = (
    "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
    "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;q=0.4,"
    "text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
# Every Accept header the fast path serves itself, and some it hands to the library.
ACCEPTS = [
    PROMETHEUS_2,
    PROMETHEUS_3,
    "",
    "text/plain;version=0.0.4",
    "text/plain;version=1.0.0;escaping=allow-utf-8",
    "text/plain;version=1.0.0;escaping=underscores",
    "application/openmetrics-text",
    "application/openmetrics-text;version=1.0.0;escaping=underscores",
    "text/plain;version=1.0.0;escaping=dots",  # library
    "application/openmetrics-text;version=1.0.0;escaping=values",  # library
    "application/openmetrics-text;version=2.0.0",  # library
]
ODD_VALUES = ['say "hi"', "back\\slash", "new\nline", "é ünïcode ✓", "", "le"]
FLOATS = [0.0, -0.0, 1.0, -3.5, 1e-7, 999_999.0, 1_000_000.0, 12_345_678.9, 1e300,
          math.inf, -math.inf, math.nan]  # fmt: skip


class Families:
    """A collector that yields fixed families, like the daemon's capacity collector."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("custom_depth", 'Custom "help"\nwith \\ escapes.', labels=["s"])
        family.add_metric(["waiting"], 3.0)
        family.add_metric(["new\nline"], math.nan)
        yield family


def library(registry: Collector, accept: str) -> tuple[bytes, str]:
    encoder, content_type = exposition.choose_encoder(accept)
    return encoder(registry), content_type


def assert_same(registry: CollectorRegistry, fast: FastExposition | None = None) -> None:
    fast = fast or FastExposition(registry)
    encoders = {TEXT: exposition.generate_latest, OPENMETRICS: openmetrics.generate_latest}
    for form, encoder in encoders.items():
        for escaping in (openmetrics.UNDERSCORES, openmetrics.ALLOWUTF8):
            expected = encoder(registry, escaping=escaping)
            got = fast.render(form, escaping)
            assert got is not None, (form, escaping)
            assert got.decode() == expected.decode(), (form, escaping)


def everything() -> CollectorRegistry:
    """Every shape the renderer meets or must hand over, in one registry."""
    registry = CollectorRegistry()
    plain = Counter("plain_events", "An unlabelled counter.", registry=registry)
    plain.inc(3)
    plain.inc(0.5, exemplar={"request_id": 'id-"1"'})
    doc = 'Labelled.\nSecond line \\ with "quotes".'
    labelled = Counter("requests", doc, ["target", "outcome"], registry=registry)
    for i, value in enumerate(ODD_VALUES):
        labelled.labels(value, "ok").inc(i * 1_000_000.5)
    gauge = Gauge("level", "A gauge.", ["target"], registry=registry)
    for i, value in enumerate(FLOATS):
        gauge.labels(f"t{i}").set(value)
    registry.register(Families())
    seconds = Histogram("latency_seconds", "Latency.", ["target", "mode"], unit="seconds",
                        buckets=(0.001, 0.01, 0.1, 1.0, 10.0), registry=registry)  # fmt: skip
    for i, value in enumerate(ODD_VALUES):
        child = seconds.labels(value, "probe")
        for amount in (0.0005, 0.05, 0.05, 5.0, 50.0, 1e7):
            child.observe(amount * (i + 1), {"request_id": f"req-{i}"} if i % 2 else None)
    seconds.labels("untouched", "load")
    bounds = (-1.0, 0.0, 1.0)
    negative = Histogram("offsets", "First bound < 0: no _sum.", buckets=bounds, registry=registry)
    negative.observe(-0.5)
    unlabelled = Histogram("unlabelled_seconds", "No labels.", registry=registry)
    for _ in range(2_000_000 // 100_000):
        unlabelled.observe(0.2)
    Gauge("empty_family", "No children yet.", ["target"], registry=registry)
    callback = Gauge("callback", "Set by a function: library path.", registry=registry)
    callback.set_function(lambda: 42.0)
    Summary("rpc_seconds", "A summary: library path.", registry=registry).observe(0.3)
    Info("build", "Info: library path.", registry=registry).info({"version": "1"})
    return registry


@pytest.mark.parametrize("created", [True, False], ids=["with-created", "without-created"])
def test_every_shape_renders_as_the_library_does(created: bool) -> None:
    # The switch is process-wide (the daemon's app turns it off): set it, whatever ran before.
    was = prometheus_metrics._use_created
    (enable_created_metrics if created else disable_created_metrics)()
    try:
        assert_same(everything())
    finally:
        (enable_created_metrics if was else disable_created_metrics)()


def test_the_daemons_own_metrics() -> None:
    metrics = Metrics(CollectorRegistry())
    slo = Slo(ttft_seconds=2.0, tpot_seconds=0.2, e2e_seconds=None)
    labels = Labels(target='gemma "small"', model="gemma-3-270m")
    metrics.describe_target(labels, slo, 15.0)
    for mode in ("probe", "load"):
        metrics.record(
            result(request_id="chatcmpl-1", token_source=TokenSource.USAGE), labels, mode, slo
        )
        metrics.record(result(Outcome.HTTP_5XX, http_status=503), labels, mode, slo)
    assert_same(metrics.registry)


class TwoSteps(Families):
    """A collector read on the loop, its families made from the reading, like the capacity
    collector; notes the thread of each step."""

    def __init__(self) -> None:
        self.threads: dict[str, str] = {}

    def read_on_loop(self) -> float:
        self.threads["read"] = threading.current_thread().name
        return 3.0

    def families_from(self, waiting: float) -> list[GaugeMetricFamily]:
        self.threads["families"] = threading.current_thread().name
        family = GaugeMetricFamily("custom_depth", "Depth.", labels=["s"])
        family.add_metric(["waiting"], waiting)
        return [family]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield from self.families_from(self.read_on_loop())


def test_a_two_step_collector_makes_its_families_off_the_loop() -> None:
    """Only its reading is taken where `plan` runs (the loop); its families are made where
    `assemble` runs (the worker), and the output is the library's."""
    registry = CollectorRegistry()
    collector = TwoSteps()
    registry.register(collector)
    fast = FastExposition(registry)
    plan = fast.plan(TEXT)
    assert plan is not None
    assert collector.threads == {"read": threading.current_thread().name}
    with ThreadPoolExecutor(1, thread_name_prefix="worker") as pool:
        got = pool.submit(fast.assemble, plan, TEXT).result()
    assert collector.threads["families"].startswith("worker")
    assert got == exposition.generate_latest(registry)


def test_series_appear_and_vanish_between_renders() -> None:
    registry = CollectorRegistry()
    counter = Counter("events", "Events.", ["target"], registry=registry)
    hist = Histogram("sizes", "Sizes.", ["target"], buckets=(1.0, 2.0), registry=registry)
    fast = FastExposition(registry)
    counter.labels("a").inc()
    hist.labels("a").observe(1.5)
    assert_same(registry, fast)
    counter.labels("b").inc(2)
    hist.remove("a")
    hist.labels("b").observe(0.5)
    assert_same(registry, fast)
    counter.clear()
    counter.labels("a").inc(5)  # a new child under an old label set: new _created
    assert_same(registry, fast)
    registry.unregister(hist)
    late = Gauge("late", "Registered after the first render.", registry=registry)
    late.set(1)
    assert_same(registry, fast)


def test_each_exemplar_change_is_rendered() -> None:
    registry = CollectorRegistry()
    hist = Histogram("h", "H.", ["t"], buckets=(1.0,), registry=registry)
    fast = FastExposition(registry)
    for i in range(3):
        hist.labels("x").observe(0.5, {"trace_id": f"t{i}"})
        assert_same(registry, fast)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["c", "g", "h"]),
            st.text(max_size=8),
            st.floats(allow_nan=False, min_value=-1e12, max_value=1e12),
        ),
        max_size=40,
    ),
    st.floats(allow_nan=True, allow_infinity=True),
)
def test_any_sequence_of_updates(updates: list[tuple[str, str, float]], gauge_value: float) -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "C.", ["label"], registry=registry)
    gauge = Gauge("g", "G.", ["label"], registry=registry)
    hist = Histogram("h_seconds", "H.", ["label"], registry=registry)
    fast = FastExposition(registry)
    for kind, label, value in updates:
        if kind == "c":
            counter.labels(label).inc(abs(value), {"id": label[:8]} if value > 0 else None)
        elif kind == "g":
            gauge.labels(label).set(value)
        else:
            hist.labels(label).observe(value, {"id": label} if value > 1 else None)
        assert_same(registry, fast)
    gauge.labels("last").set(gauge_value)
    assert_same(registry, fast)


@pytest.mark.parametrize("value", [*FLOATS, 5e-324, 123456.789, 1234567.0, 0.1 + 0.2, -1e7])
def test_fmt_is_floatToGoString(value: float) -> None:
    from prometheus_client.utils import floatToGoString

    assert fmt(value) == floatToGoString(value)


# aiohttp takes the first of its codings (deflate, gzip, identity) that Accept-Encoding names.
ENCODINGS = ("gzip", "identity", "deflate", "gzip, deflate, br", "br", "")


async def test_handler_answers_as_make_aiohttp_handler_does() -> None:
    registry = everything()
    app = web.Application()
    app.router.add_get("/daemon", metrics_handler(registry))
    app.router.add_get("/library", make_aiohttp_handler(registry))
    queries = ("", "?name[]=requests_total&name[]=level")
    async with serve_app(app) as root, aiohttp.ClientSession(auto_decompress=False) as session:
        for accept, query, encoding in itertools.product(ACCEPTS, queries, ENCODINGS):
            answers = []
            for path in ("/daemon", "/library"):
                headers = {"Accept": accept, "Accept-Encoding": encoding}
                async with session.get(root + path + query, headers=headers) as resp:
                    body = await resp.read()
                    encoded = resp.headers.get("Content-Encoding")
                    if encoded == "gzip":
                        body = gzip.decompress(body)
                    elif encoded == "deflate":
                        body = zlib.decompress(body)
                    answers.append((resp.status, resp.headers["Content-Type"], encoded, body))
            assert answers[0] == answers[1], (accept, query, encoding)
            assert answers[0][0] == 200
            chosen = [coding for coding in ("deflate", "gzip") if coding in encoding]
            assert answers[0][2] == (chosen[0] if chosen else None), encoding


@pytest.mark.parametrize("accept", ACCEPTS)
def test_negotiation_matches_the_library(accept: str) -> None:
    from prober.exposition import negotiate

    form, _, content_type = negotiate(accept)
    _, expected_type = library(CollectorRegistry(), accept)
    assert content_type == expected_type
    fallback = "dots" in accept or "values" in accept or "version=2.0.0" in accept
    assert (form is None) == fallback
