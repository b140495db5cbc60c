"""prober.metric_specs: the one table of exported metrics, and the histogram fast path.

The daemon's registry carries exactly the table's families (so a metric declared elsewhere
fails here), the README documents every one, and `observe_many` leaves a histogram in the
state repeated `observe` calls would, sample for sample, for any list of values.
"""

from __future__ import annotations

import asyncio
import math
import re
from pathlib import Path
from typing import cast

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from prober import metric_specs as specs
from prober.metric_specs import SPECS, Kind, MetricSpec, histogram
from prober.metrics import observe_many
from prober.settings import Settings
from prober.web import build_app

README = Path(__file__).resolve().parents[2] / "README.md"
HISTOGRAM_SPECS = [spec for spec in SPECS if spec.kind is Kind.HISTOGRAM]


async def test_the_daemon_exports_the_tables_families_and_no_other() -> None:
    """The app started (some metrics are declared at start-up, beside the session)."""
    registry = CollectorRegistry()
    target = {"name": "t", "url": "http://127.0.0.1:1/v1", "model": "m", "interval_seconds": 3600}
    runner = web.AppRunner(build_app(Settings.model_validate({"targets": [target]}), registry))
    await runner.setup()
    try:
        exported = {f.name: (f.type, f.documentation) for f in registry.collect()}
    finally:
        await runner.cleanup()
    table = {spec.family: (spec.kind.value, spec.help) for spec in SPECS}
    assert exported == table


@pytest.mark.parametrize("accept", ["text/plain", "application/openmetrics-text; version=1.0.0"])
async def test_the_daemon_serves_no_created_series(accept: str) -> None:
    """Counters and histograms carry no `_created` sample in either format (docs/design.md)."""
    target = {"name": "t", "url": "http://127.0.0.1:1/v1", "model": "m", "interval_seconds": 3600}
    app = build_app(Settings.model_validate({"targets": [target]}), CollectorRegistry())
    async with TestClient(TestServer(app)) as client:
        for _ in range(200):  # the first probe (refused at once) is counted within a second
            text = await (await client.get("/metrics", headers={"Accept": accept})).text()
            if 'outcome="connect_error",target="t"} 1.0' in text:
                break
            await asyncio.sleep(0.01)
    assert 'outcome="connect_error",target="t"} 1.0' in text, text
    assert "llmprober_requests_total{" in text
    assert "llmprober_dispatch_lag_seconds_count{" in text  # a histogram
    assert [line for line in text.splitlines() if "_created" in line] == []


def test_the_readme_documents_every_metric() -> None:
    text = README.read_text()
    missing = [s.name for s in SPECS if not re.search(rf"`{re.escape(s.name)}[`{{]", text)]
    assert missing == []


def test_series_and_family_names() -> None:
    assert specs.REQUESTS.family == "llmprober_requests"
    assert specs.REQUESTS.series == ("llmprober_requests_total",)
    assert specs.SATURATION.family == specs.SATURATION.series[0] == "llmprober_saturation"
    assert specs.TTFT.series == (
        "llmprober_ttft_seconds_bucket",
        "llmprober_ttft_seconds_sum",
        "llmprober_ttft_seconds_count",
    )


@pytest.mark.parametrize(
    ("name", "kind", "buckets"),
    [
        ("llmprober_requests", Kind.COUNTER, ()),  # a counter without _total
        ("llmprober_depth_total", Kind.GAUGE, ()),  # _total on a gauge
        ("llmprober_wait_seconds", Kind.HISTOGRAM, ()),  # a histogram without buckets
        ("llmprober_depth", Kind.GAUGE, (1.0,)),  # buckets on a gauge
        ("queue_depth", Kind.GAUGE, ()),  # no prefix
    ],
)
def test_a_malformed_entry_is_refused(name: str, kind: Kind, buckets: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match=name):
        MetricSpec(name, kind, "help", ("target",), buckets)


def test_a_builder_refuses_an_entry_of_another_kind() -> None:
    with pytest.raises(ValueError, match="llmprober_saturation is a gauge, not a histogram"):
        histogram(specs.SATURATION, CollectorRegistry())


# --- observe_many == observe, repeated ---------------------------------------------------------
EDGES = sorted(
    {0.0, -0.0, -1.0, -1e-300, 1e-300, 1e308, -1e308, math.inf, -math.inf, math.nan}
    | {b for spec in HISTOGRAM_SPECS for b in spec.buckets}
    | {math.nextafter(b, d) for spec in HISTOGRAM_SPECS for b in spec.buckets for d in (0, 9e9)},
    key=repr,
)
VALUES = st.one_of(st.sampled_from(EDGES), st.floats(allow_nan=True, allow_infinity=True))


def samples(registry: CollectorRegistry) -> list[tuple[str, tuple[tuple[str, str], ...], str]]:
    """Every sample but `_created`, its value as `repr` (so -0.0, NaN and bits all count)."""
    return [
        (s.name, tuple(sorted(s.labels.items())), repr(s.value))
        for family in registry.collect()
        for s in family.samples
        if not s.name.endswith("_created")
    ]


def exposition(registry: CollectorRegistry) -> bytes:
    lines = generate_latest(registry).splitlines(keepends=True)
    return b"".join(line for line in lines if b"_created" not in line)


@settings(max_examples=300, deadline=None)
@given(
    spec=st.sampled_from(HISTOGRAM_SPECS),
    batches=st.lists(st.lists(VALUES, max_size=70), max_size=4),
)
def test_observe_many_equals_repeated_observe(spec: MetricSpec, batches: list[list[float]]) -> None:
    one_by_one, at_once = CollectorRegistry(), CollectorRegistry()
    values = ("t", "m", "probe", "fresh")[: len(spec.labels)]
    slow = histogram(spec, one_by_one).labels(*values)
    fast = histogram(spec, at_once).labels(*values)
    for batch in batches:  # later batches start from the state the earlier ones left
        for amount in batch:
            slow.observe(amount)
        observe_many(fast, batch)
    assert samples(at_once) == samples(one_by_one)
    assert exposition(at_once) == exposition(one_by_one)


def test_observe_many_falls_back_to_observe_without_the_internals() -> None:
    seen: list[float] = []

    class Bare:
        def observe(self, amount: float) -> None:
            seen.append(amount)

    observe_many(cast(Histogram, Bare()), [0.5, math.nan, 2.0])
    assert seen[0] == 0.5
    assert math.isnan(seen[1])
    assert seen[2] == 2.0
