"""prober.capacity.server: engine /metrics normalised, against recorded expositions and a real
server."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from prober.capacity.server import (
    MAX_BODY_BYTES,
    Engine,
    ServerMetricsError,
    ServerSnapshot,
    TokenTotals,
    detect_engine,
    parse_metrics,
    scrape,
)
from prober.capacity.target import TargetCapacity
from prober.metrics import Metrics
from prober.record import ScrapeRecorder
from prober.settings import TargetConfig
from prober.targets import Target

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "metrics"


def fixture_text(name: str) -> str:
    return (FIXTURES / f"{name}.txt").read_text(encoding="utf-8")


# Each fixture's header comment states the same expectations, so a reader can check both.
EXPECTED = {
    "vllm": ServerSnapshot(
        Engine.vllm,
        5.0,
        3.0,
        0.006595822645657723,
        11.0,
        TokenTotals(11.0, 426.0, 132.0),
        progress_total=154.0,
    ),
    "llamacpp": ServerSnapshot(Engine.llamacpp, 7.0, 4.0, None, None, progress_total=349.0),
    "sglang": ServerSnapshot(
        Engine.sglang,
        5.0,
        12.0,
        0.63,
        3517.0,
        TokenTotals(3517.0, 7.41416e6, 1.837764e6),
        progress_total=1.837764e6,
    ),
    "tgi": ServerSnapshot(
        Engine.tgi,
        6.0,
        4.0,
        None,
        2178.0,
        TokenTotals(2178.0, 3239038.0, 1008696.0),
        progress_total=97633.0,
    ),
}


# --- recorded expositions ---------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_normalises_to_expected_snapshot(name: str) -> None:
    assert parse_metrics(fixture_text(name)) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_engine_is_detected(name: str) -> None:
    families = list(text_string_to_metric_families(fixture_text(name)))
    assert detect_engine(families) == EXPECTED[name].engine


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_explicit_engine_matching_the_text_gives_the_same_snapshot(name: str) -> None:
    expected = EXPECTED[name]
    assert parse_metrics(fixture_text(name), expected.engine) == expected


def test_explicit_engine_overrides_detection() -> None:
    both = fixture_text("vllm") + fixture_text("tgi")
    assert parse_metrics(both).engine is Engine.vllm  # detection order prefers vLLM
    assert parse_metrics(both, Engine.tgi) == EXPECTED["tgi"]


@pytest.mark.parametrize(
    ("name", "engine"),
    [("vllm", Engine.tgi), ("tgi", Engine.llamacpp), ("llamacpp", Engine.sglang)],
)
def test_configured_engine_whose_metrics_are_absent_is_an_error(name: str, engine: Engine) -> None:
    with pytest.raises(ServerMetricsError, match=rf"^{engine} metrics absent: none of "):
        parse_metrics(fixture_text(name), engine)


# --- parse errors and detection -----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "<html><body><h1>404 Not Found</h1></body></html>",
        "vllm:num_requests_waiting three",
        "# TYPE\n",
        "vllm:num_requests_waiting{model_name=x} 1\n",
        "vllm:num_requests_waiting 1_000\n",
    ],
)
def test_garbage_text_is_an_error(text: str) -> None:
    with pytest.raises(ServerMetricsError, match=r"^unparseable metrics text: "):
        parse_metrics(text)


@pytest.mark.parametrize(
    "text",
    ["", "\n", "up 1\n", "# HELP process_cpu_seconds_total CPU\nprocess_cpu_seconds_total 4.2\n"],
)
def test_text_of_no_known_engine_is_an_error(text: str) -> None:
    with pytest.raises(ServerMetricsError, match=r"^no known engine metrics found"):
        parse_metrics(text)


def test_engine_detected_by_prefix_alone_still_needs_its_queue_metrics() -> None:
    # A TGI router that has not served a request yet renders only what it has touched.
    text = "# TYPE tgi_request_count counter\ntgi_request_count 0\n"
    assert detect_engine(text_string_to_metric_families(text)) is Engine.tgi
    with pytest.raises(ServerMetricsError, match=r"^tgi metrics absent"):
        parse_metrics(text)


def test_queue_metrics_win_detection_over_a_bare_prefix() -> None:
    text = "vllm:some_router_metric 1\nsglang:num_queue_reqs 2\n"
    assert parse_metrics(text).engine is Engine.sglang


# --- the parser's counter rewriting --------------------------------------------------------


def test_parser_appends_total_to_a_counter_sample_named_without_it() -> None:
    """Pins the prometheus_client behaviour that the lookups compensate for."""
    text = "# TYPE tgi_request_success counter\ntgi_request_success 5\n"
    (family,) = text_string_to_metric_families(text)
    assert family.name == "tgi_request_success"
    assert [sample.name for sample in family.samples] == ["tgi_request_success_total"]


def test_parser_strips_total_from_a_counter_family_name() -> None:
    text = "# TYPE vllm:request_success_total counter\nvllm:request_success_total 5\n"
    (family,) = text_string_to_metric_families(text)
    assert family.name == "vllm:request_success"
    assert [sample.name for sample in family.samples] == ["vllm:request_success_total"]


@pytest.mark.parametrize(
    "counter_text",
    [
        "# TYPE tgi_request_success counter\ntgi_request_success 5\n",  # TGI as it is served
        "tgi_request_success 5\n",  # untyped: the sample keeps its name
        "# TYPE tgi_request_success_total counter\ntgi_request_success_total 5\n",
    ],
)
def test_counter_is_found_under_either_spelling(counter_text: str) -> None:
    snapshot = parse_metrics(counter_text + "tgi_queue_size 1\n")
    assert snapshot.completed_total == 5.0


def test_openmetrics_style_counter_family_is_found() -> None:
    text = (
        "# TYPE vllm:request_success counter\n"
        'vllm:request_success_total{finished_reason="stop"} 4.0\n'
        "vllm:num_requests_waiting 0.0\n"
    )
    assert parse_metrics(text).completed_total == 4.0


# --- aggregation and name fallbacks --------------------------------------------------------

TWO_ENGINES_TWO_MODELS = """\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a"} 2.0
vllm:num_requests_waiting{engine="1",model_name="a"} 5.0
vllm:num_requests_waiting{engine="0",model_name="b"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="a"} 4.0
vllm:num_requests_running{engine="1",model_name="a"} 4.0
vllm:num_requests_running{engine="0",model_name="b"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="a"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="a"} 0.75
vllm:kv_cache_usage_perc{engine="0",model_name="b"} 0.5
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="a"} 10.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="a"} 2.0
vllm:request_success_total{engine="1",finished_reason="abort",model_name="a"} 1.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="b"} 7.0
"""


def test_counts_are_summed_and_kv_ratio_is_the_maximum_across_label_sets() -> None:
    assert parse_metrics(TWO_ENGINES_TWO_MODELS) == ServerSnapshot(
        Engine.vllm, waiting=8.0, running=8.0, kv_usage_ratio=0.75, completed_total=20.0
    )


@dataclass(frozen=True)
class KvCase:
    text: str
    expected: float | None


@pytest.mark.parametrize(
    "case",
    [
        KvCase("vllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.3\n", 0.3),
        KvCase(
            "vllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.3\n"
            "vllm:kv_cache_usage_perc 0.4\n",
            0.4,
        ),
        KvCase(
            "# TYPE llamacpp:kv_cache_usage_ratio gauge\nllamacpp:kv_cache_usage_ratio 0.125\n"
            "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n",
            0.125,
        ),
        KvCase("llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n", None),
    ],
    ids=["vllm-old-name", "vllm-new-name-wins", "llamacpp-legacy-ratio", "llamacpp-current"],
)
def test_kv_usage_name_fallbacks(case: KvCase) -> None:
    assert parse_metrics(case.text).kv_usage_ratio == case.expected


def test_non_finite_samples_are_dropped_and_named() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0"} NaN\n'
        'vllm:num_requests_waiting{engine="1"} 3\n'
        "vllm:num_requests_running +Inf\n"
    )
    snapshot = parse_metrics(text)
    assert snapshot.waiting == 3.0
    assert snapshot.running is None
    assert snapshot.rejected == ("waiting", "running")


# What a hostile engine's /metrics sent (issue: exported as they came).
HOSTILE = [
    ("vllm:num_requests_waiting -5\nvllm:num_requests_running 1\n", "waiting"),
    ("vllm:num_requests_waiting 1e308\nvllm:num_requests_running 1\n", "waiting"),
    ("vllm:num_requests_waiting 0\nvllm:num_requests_running -1e308\n", "running"),
    ("vllm:num_requests_waiting 0\nvllm:num_requests_running 1.18e21\n", "running"),
    ("vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc -3\n", "kv_usage"),
    ("vllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 1e6\n", "kv_usage"),
    ("vllm:num_requests_waiting 0\nvllm:request_success_total -2\n", "completed"),
    ("vllm:num_requests_waiting 0\nvllm:generation_tokens_total -7\n", "progress"),
    ("llamacpp:requests_deferred 0\nllamacpp:n_decode_total 1e300\n", "progress"),
    ("tgi_queue_size 0\ntgi_batch_inference_count NaN\n", "progress"),
]


@pytest.mark.parametrize(("text", "quantity"), HOSTILE)
def test_out_of_range_figures_are_dropped_never_used(text: str, quantity: str) -> None:
    snapshot = parse_metrics(text)
    fields = {"kv_usage": "kv_usage_ratio", "completed": "completed_total"}
    field = {**fields, "progress": "progress_total"}.get(quantity, quantity)
    assert getattr(snapshot, field) is None
    assert snapshot.rejected == (quantity,)


def test_a_sum_past_the_ceiling_is_dropped() -> None:
    lines = "".join(f'vllm:num_requests_waiting{{engine="{i}"}} 600000\n' for i in range(2))
    snapshot = parse_metrics(lines)
    assert snapshot.waiting is None
    assert snapshot.rejected == ("waiting",)


def test_a_ratio_of_one_and_counts_at_zero_are_kept() -> None:
    text = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\nvllm:kv_cache_usage_perc 1\n"
    snapshot = parse_metrics(text)
    assert (snapshot.waiting, snapshot.running, snapshot.kv_usage_ratio) == (0.0, 0.0, 1.0)
    assert snapshot.rejected == ()


def test_token_totals_with_a_rejected_sample_are_dropped_whole() -> None:
    text = (
        "vllm:num_requests_waiting 0\n"
        'vllm:request_prompt_tokens_count{engine="0"} 10\n'
        'vllm:request_prompt_tokens_count{engine="1"} -4\n'
        "vllm:request_prompt_tokens_sum 100\n"
        "vllm:request_generation_tokens_sum 50\n"
    )
    snapshot = parse_metrics(text)
    assert snapshot.lengths is None
    assert snapshot.rejected == ("lengths",)


def test_progress_falls_back_to_the_counter_added_at_a_request_end() -> None:
    text = "llamacpp:requests_deferred 0\nllamacpp:tokens_predicted_total 960\n"
    assert parse_metrics(text).progress_total == 960.0


def test_missing_quantities_are_none_not_zero() -> None:
    snapshot = parse_metrics("sglang:num_running_reqs 3\n")
    assert snapshot == ServerSnapshot(Engine.sglang, None, 3.0, None, None)


def test_sum_is_exact_for_many_small_values() -> None:
    lines = "".join(f'vllm:num_requests_waiting{{engine="{i}"}} 0.1\n' for i in range(10))
    assert parse_metrics(lines).waiting == 1.0  # math.fsum; a plain sum gives 0.9999999999999999


# --- scrape against a real local server ----------------------------------------------------

LLAMA_SERVER_METRICS_DISABLED = (
    '{"error":{"code":501,"message":"This server does not support metrics endpoint.'
    ' Start it with `--metrics`","type":"not_supported_error"}}'
)


@dataclass
class MetricsServer:
    base: str
    accept_headers: list[str]


@pytest.fixture
async def server() -> AsyncIterator[MetricsServer]:
    accept_headers: list[str] = []
    release = asyncio.Event()

    async def metrics(request: web.Request) -> web.Response:
        accept_headers.append(request.headers.get("Accept", ""))
        name = request.match_info["name"]
        return web.Response(
            body=fixture_text(name).encode(),
            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
        )

    async def failing(_: web.Request) -> web.Response:
        return web.Response(status=500, text="Internal Server Error\n")

    async def metrics_disabled(_: web.Request) -> web.Response:
        # Captured from llama-server (build 11434) started without --metrics.
        return web.Response(
            status=501,
            body=LLAMA_SERVER_METRICS_DISABLED.encode(),
            content_type="application/json",
        )

    async def html(_: web.Request) -> web.Response:
        return web.Response(text="<html><body>hello</body></html>", content_type="text/html")

    async def huge(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        line = b"# " + b"x" * 65_000 + b"\n"
        for _ in range(MAX_BODY_BYTES // len(line) + 2):
            await response.write(line)
        return response

    async def hostile(_: web.Request) -> web.Response:
        text = "vllm:num_requests_waiting -5\nvllm:num_requests_running 1e308\n"
        return web.Response(text=text + "vllm:kv_cache_usage_perc 0.5\n")

    async def slow(_: web.Request) -> web.Response:
        await asyncio.wait_for(release.wait(), timeout=5)
        return web.Response(text=fixture_text("vllm"))

    app = web.Application()
    app.router.add_get("/fixture/{name}/metrics", metrics)
    app.router.add_get("/500", failing)
    app.router.add_get("/501", metrics_disabled)
    app.router.add_get("/html", html)
    app.router.add_get("/slow", slow)
    app.router.add_get("/huge", huge)
    app.router.add_get("/hostile", hostile)
    runner = web.AppRunner(app, shutdown_timeout=1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield MetricsServer(f"http://{host}:{port}", accept_headers)
    finally:
        release.set()
        await runner.cleanup()


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as client:
        yield client


@pytest.mark.parametrize("name", sorted(EXPECTED))
async def test_scrape_serves_each_fixture(
    server: MetricsServer, session: aiohttp.ClientSession, name: str
) -> None:
    url = f"{server.base}/fixture/{name}/metrics"
    assert await scrape(session, url, None, timeout_s=5) == EXPECTED[name]


async def test_scrape_asks_for_the_classic_text_format(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    await scrape(session, f"{server.base}/fixture/vllm/metrics", Engine.vllm, timeout_s=5)
    assert server.accept_headers == ["text/plain;version=0.0.4;q=1.0,*/*;q=0.1"]


async def test_scrape_http_500_names_url_and_status(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    url = f"{server.base}/500"
    with pytest.raises(ServerMetricsError) as info:
        await scrape(session, url, None, timeout_s=5)
    assert str(info.value) == f"{url}: HTTP 500: Internal Server Error"


async def test_scrape_http_error_carries_the_body_snippet(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    with pytest.raises(ServerMetricsError, match=r"HTTP 501: .*does not support metrics"):
        await scrape(session, f"{server.base}/501", Engine.llamacpp, timeout_s=5)


async def test_scrape_of_a_page_that_is_no_metrics_names_the_url(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    url = f"{server.base}/html"
    with pytest.raises(ServerMetricsError, match=rf"^{url}: unparseable metrics text"):
        await scrape(session, url, None, timeout_s=5)


async def test_scrape_with_engine_absent_names_the_url(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    url = f"{server.base}/fixture/vllm/metrics"
    with pytest.raises(ServerMetricsError, match=rf"^{url}: sglang metrics absent"):
        await scrape(session, url, Engine.sglang, timeout_s=5)


async def test_scrape_of_a_body_past_the_bound_is_an_error(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    with pytest.raises(ServerMetricsError, match=f"body over {MAX_BODY_BYTES} bytes"):
        await scrape(session, f"{server.base}/huge", Engine.vllm, timeout_s=30)


async def test_scrape_connection_refused(session: aiohttp.ClientSession) -> None:
    with socket.socket() as sock:  # a port that was free a moment ago, now closed
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/metrics"
    with pytest.raises(ServerMetricsError, match=rf"^{url}: connection failed: "):
        await scrape(session, url, None, timeout_s=5)


async def test_scrape_timeout(server: MetricsServer, session: aiohttp.ClientSession) -> None:
    url = f"{server.base}/slow"
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(ServerMetricsError, match=rf"^{url}: timed out after 0.05 s$"):
        await scrape(session, url, None, timeout_s=0.05)
    assert loop.time() - started < 2


async def test_scrape_invalid_url_is_an_error(session: aiohttp.ClientSession) -> None:
    with pytest.raises(ServerMetricsError, match="request failed"):
        await scrape(session, "not a url", None, timeout_s=1)


async def test_scrape_lets_cancellation_propagate(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    task = asyncio.create_task(scrape(session, f"{server.base}/slow", None, timeout_s=5))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_watched_scrape_that_fails_is_counted_and_drops_the_snapshot(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    metrics = Metrics(CollectorRegistry())
    cfg = TargetConfig(
        name="t", url="http://127.0.0.1:1/v1", model="m", metrics_url=f"{server.base}/500"
    )
    cap = TargetCapacity(Target.from_config(cfg), ScrapeRecorder(metrics))
    cap.snapshot = EXPECTED["vllm"]  # a good scrape's, before the engine's /metrics broke
    watch = asyncio.create_task(cap.watch(session))
    labels = {"target": "t", "model": "m"}

    def errors() -> float | None:
        return metrics.registry.get_sample_value("llmprober_server_scrape_errors_total", labels)

    for _ in range(500):  # the first scrape, at once; the next only after 5 s
        if errors() is not None:
            break
        await asyncio.sleep(0.01)
    watch.cancel()
    await asyncio.gather(watch, return_exceptions=True)
    assert errors() == 1.0
    assert cap.snapshot is None


async def test_a_watched_scrape_with_out_of_range_samples_counts_them_and_keeps_the_rest(
    server: MetricsServer, session: aiohttp.ClientSession
) -> None:
    metrics = Metrics(CollectorRegistry())
    cfg = TargetConfig(
        name="t", url="http://127.0.0.1:1/v1", model="m", metrics_url=f"{server.base}/hostile"
    )
    cap = TargetCapacity(Target.from_config(cfg), ScrapeRecorder(metrics))
    watch = asyncio.create_task(cap.watch(session))

    def rejected(quantity: str) -> float | None:
        labels = {"target": "t", "model": "m", "quantity": quantity}
        return metrics.registry.get_sample_value("llmprober_server_samples_rejected_total", labels)

    for _ in range(500):  # the first scrape, at once; the next only after 5 s
        if cap.snapshot is not None:
            break
        await asyncio.sleep(0.01)
    watch.cancel()
    await asyncio.gather(watch, return_exceptions=True)
    assert (rejected("waiting"), rejected("running"), rejected("kv_usage")) == (1.0, 1.0, None)
    assert cap.snapshot is not None
    assert (cap.snapshot.waiting, cap.snapshot.running) == (None, None)
    assert cap.snapshot.kv_usage_ratio == 0.5
