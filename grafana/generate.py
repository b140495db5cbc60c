"""Generate the provisioned Grafana dashboards in grafana/dashboards/ (run after any change):

    .venv/bin/python grafana/generate.py          # write the JSON files
    .venv/bin/python grafana/generate.py --check  # exit 1 if they are out of date

The dashboards are code so that every panel follows the same conventions (the `${datasource}`
variable, `$__rate_interval`, `sum by (target, model)` across prober replicas) and so that the
autoscaling thresholds drawn on the "Capacity" dashboard are read from the KEDA ScaledObject
instead of being copied by hand. Builders live in panels.py; tests/deploy checks the output.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from panels import (
    RI,
    SEL,
    SEL_MODE,
    Panel,
    dashboard,
    dashed,
    heatmap,
    layout,
    q,
    quantiles,
    row,
    slo_line,
    stat,
    timeseries,
)

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "grafana" / "dashboards"
KEDA = ROOT / "deploy" / "kubernetes" / "autoscale-keda" / "keda-scaledobject.yaml"
BY_TARGET = "sum by (target, model)"
GOODPUT = (
    f"{BY_TARGET} (rate(llmprober_requests_good_total{{{SEL_MODE}}}[{RI}])) / {BY_TARGET} "
    f'(rate(llmprober_requests_total{{{SEL_MODE}, outcome!="cancelled"}}[{RI}]))'
)


def keda_thresholds() -> dict[str, float]:
    """Trigger name -> threshold of the KEDA ScaledObject (the autoscaling contract)."""
    spec = yaml.safe_load(KEDA.read_text())["spec"]
    return {t["name"]: float(t["metadata"]["threshold"]) for t in spec["triggers"]}


def server_latencies() -> list[dict[str, Any]]:
    """Prefill and decode-per-token quantiles as the engine reports them."""
    prefill = quantiles("llmprober_server_prefill_seconds", SEL, ("0.5", "0.95"))
    decode = quantiles("llmprober_server_decode_per_token_seconds", SEL, ("0.5", "0.95"))
    return [
        *[{**t, "legendFormat": t["legendFormat"] + " prefill"} for t in prefill],
        *[{**t, "refId": t["refId"] * 2, "legendFormat": t["legendFormat"] + " decode/token"}
          for t in decode],
    ]  # fmt: skip


# fmt: off
def latency_panels() -> list[tuple[Panel, int, int]]:
    return [
        (row("Latency as a user sees it (probes and background load)"), 24, 1),
        (timeseries("Time to first token",
                    [*quantiles("llmprober_ttft_seconds"), slo_line("llmprober_slo_ttft_seconds")],
                    "s", "TTFT from the scheduled start (queue + prefill + network + dispatch "
                    "lag); dashed: the target's TTFT SLO.", overrides=[dashed("S")]), 12, 8),
        (heatmap("TTFT distribution", "llmprober_ttft_seconds",
                 "Requests per TTFT bucket: a second mode means a queue or a cold path."), 12, 8),
        (timeseries("Time to first answer token", quantiles("llmprober_ttfo_seconds"), "s",
                    "First content token, after any reasoning tokens: what a chat user waits "
                    "for."), 12, 8),
        (heatmap("TTFO distribution", "llmprober_ttfo_seconds",
                 "Requests per time-to-first-answer-token bucket."), 12, 8),
        (timeseries("Time per output token",
                    [*quantiles("llmprober_tpot_seconds"), slo_line("llmprober_slo_tpot_seconds")],
                    "s", "Decode time per token after the first; dashed: the TPOT SLO. Grows "
                    "with the engine's batch size.", overrides=[dashed("S")]), 12, 8),
        (heatmap("TPOT distribution", "llmprober_tpot_seconds",
                 "Requests per time-per-output-token bucket."), 12, 8),
        (timeseries("Inter-token latency", quantiles("llmprober_itl_seconds"), "s",
                    "Every gap between streamed tokens: stalls that TPOT averages away."), 12, 8),
        (heatmap("ITL distribution", "llmprober_itl_seconds",
                 "Token gaps per bucket: a band far above the rest is a stutter."), 12, 8),
        (timeseries("End to end",
                    [*quantiles("llmprober_e2e_seconds"), slo_line("llmprober_slo_e2e_seconds")],
                    "s", "Whole successful streams; dashed: the E2E SLO where one is configured.",
                    overrides=[dashed("S")]), 24, 8),
    ]


def outcome_and_traffic_panels() -> list[tuple[Panel, int, int]]:
    return [
        (row("Goodput and outcomes"), 24, 1),
        (stat("Goodput", [q(GOODPUT, "{{target}}", "A")], "percentunit",
              "Share of requests that were ok AND within every SLO of the target.",
              [("red", None), ("orange", 0.95), ("green", 0.99)]), 6, 8),
        (stat("Last probe",
              [q(f"min by (target, model) (llmprober_probe_success{{{SEL}}})", "{{target}}", "A")],
              "bool_yes_no", "Did the last probe succeed (worst prober replica)?",
              [("red", None), ("green", 1)]), 6, 8),
        (timeseries("Error-budget burn rate (goodput SLO)", [
            q(f"llmprober:goodput_slo:burn_rate1h{{{SEL}}}", "{{target}} 1h", "A"),
            q(f"llmprober:goodput_slo:burn_rate6h{{{SEL}}}", "{{target}} 6h", "B"),
        ], "none", "1 = spending the budget exactly over the SLO period. Pages at 14.4 (1h), "
           "tickets at 6 (6h).", threshold=14.4), 12, 8),
        (timeseries("Outcomes", [
            q(f"sum by (outcome) (rate(llmprober_requests_total{{{SEL_MODE}}}[{RI}]))",
              "{{outcome}}", "A"),
        ], "reqps", "Requests per second by outcome class: ok, timeouts, stalls, HTTP and "
           "protocol errors.", stack=True, bars=True), 12, 8),
        (timeseries("Goodput ratio", [
            q(GOODPUT, "{{target}}", "A"),
            q("max(llmprober:goodput_slo:objective)", "objective", "S"),
        ], "percentunit", "Good requests / all requests; dashed: the SLO objective.",
           overrides=[dashed("S")], max_=1), 12, 8),
        (row("Traffic"), 24, 1),
        (timeseries("Request rate", [
            q(f"sum by (target, mode) (rate(llmprober_requests_total{{{SEL_MODE}}}[{RI}]))",
              "{{target}} {{mode}}", "A"),
        ], "reqps", "Requests sent per second: periodic probes and background load."), 8, 8),
        (timeseries("Token rate", [
            q(f"sum by (target, kind) (rate(llmprober_tokens_total{{{SEL_MODE}}}[{RI}]))",
              "{{target}} {{kind}}", "A"),
        ], "short", "Prompt, output and reasoning tokens per second (server usage where "
           "reported)."), 8, 8),
        (timeseries("Background load", [
            q(f"sum by (target) (llmprober_load_target_rate{{{SEL}}})", "{{target}} configured",
              "A"),
            q(f'sum by (target) (rate(llmprober_requests_total{{{SEL}, mode="load"}}[{RI}]))',
              "{{target}} sent", "B"),
            q(f"sum by (target) (llmprober_load_in_flight{{{SEL}}})", "{{target}} in flight",
              "C"),
        ], "short", "Configured Poisson rate (req/s) against what was sent, and requests in "
           "flight."), 8, 8),
    ]


def stream_panels() -> list[tuple[Panel, int, int]]:
    unanswered = (
        f"{BY_TARGET} (rate(llmprober_requests_without_answer_total{{{SEL_MODE}}}[{RI}])) / "
        f'{BY_TARGET} (rate(llmprober_requests_total{{{SEL_MODE}, outcome!="cancelled"}}[{RI}]))'
    )
    return [
        (row("What the streams said"), 24, 1),
        (timeseries("Requests without an answer", [
            q(unanswered, "{{target}}", "A"),
        ], "percentunit", "Share of requests that got reasoning tokens but no answer token "
           "(the token budget went on thinking): never good. Alert: above 5 % for 10m.",
           max_=1), 8, 8),
        (timeseries("Finish reasons", [
            q(f"sum by (reason) (rate(llmprober_finish_reasons_total{{{SEL_MODE}}}[{RI}]))",
              "{{reason}}", "A"),
        ], "reqps", "Why generation stopped: stop, length (max_tokens reached), content_filter, "
           "tool_calls, other; none: the server never said.", stack=True, bars=True), 8, 8),
        (timeseries("Token count source", [
            q(f"sum by (target, source) (rate(llmprober_token_source_total{{{SEL_MODE}}}[{RI}]))",
              "{{target}} {{source}}", "A"),
        ], "reqps", "usage: the server's count; chunks: counted events (usage not sent); "
           "chunks_lower_bound: events carried several tokens, so token counts are lower "
           "bounds and TPOT an upper bound.", stack=True), 8, 8),
        (row("Probe phases: connection set-up and the request's course"), 24, 1),
        (timeseries("Probe phases (p50)", [
            q(f"histogram_quantile(0.5, sum by (phase, connection, le) "
              f"(rate(llmprober_probe_phase_seconds_bucket{{{SEL}}}[{RI}])))",
              "{{phase}} ({{connection}})", "A"),
        ], "s", "resolve, connect and tls (fresh connections only), request_written, "
           "first_byte, first_token: they add up to TTFT minus dispatch lag.", stack=True),
         16, 8),
        (timeseries("Connections", [
            q(f"sum by (target, connection) (rate(llmprober_connections_total{{{SEL_MODE}}}"
              f"[{RI}]))", "{{target}} {{connection}}", "A"),
        ], "reqps", "Requests on a fresh connection against a reused (pooled) one. Set "
           "`connection: fresh` on a target to measure what a new user meets.", stack=True),
         8, 8),
    ]


def queue_and_health_panels() -> list[tuple[Panel, int, int]]:
    depth = "max by (target, source) (llmprober_queue_depth{{{sel}, state=\"{state}\"}})"
    return [
        (row("Queue: client estimate against server truth"), 24, 1),
        (timeseries("Waiting requests", [
            q(depth.format(sel=SEL, state="waiting"), "{{target}} {{source}}", "A"),
        ], "short", "source=server: the engine's own count; source=estimate: the prober's "
           "estimate from queue wait and drain rate, absent where the drain rate would rest on "
           "a traffic shape nobody gave (drain basis probe_shape: set traffic:, or a "
           "metrics_url whose engine counts its requests' tokens)."), 8, 8),
        (timeseries("Running requests", [
            q(depth.format(sel=SEL, state="running"), "{{target}} {{source}}", "A"),
        ], "short", "Requests holding a slot, from the server and as estimated from decode "
           "slowdown."), 8, 8),
        (timeseries("Estimated queue wait",
                    quantiles("llmprober_queue_wait_seconds", SEL, ("0.5", "0.95")), "s",
                    "TTFT minus the learned prefill baseline: time spent waiting for a slot."),
         8, 8),
        (timeseries("KV cache usage", [
            q(f"max by (target) (llmprober_server_kv_cache_usage_ratio{{{SEL}}})", "{{target}}",
              "A"),
        ], "percentunit", "From the engine's metrics (vLLM, SGLang). Pre-allocated: not a load "
           "signal on its own.", max_=1), 8, 8),
        (timeseries("Server prefill and decode", server_latencies(), "s",
                    "Server-reported prefill time and decode time per token, where the engine "
                    "exports them."), 16, 8),
        (row("Prober health"), 24, 1),
        (timeseries("Dispatch lag",
                    quantiles("llmprober_dispatch_lag_seconds", SEL_MODE, ("0.5", "0.99")), "s",
                    "Scheduled start to the moment the prober began the request: its own "
                    "delay, included in TTFT (connection set-up is a phase of its own)."),
         6, 8),
        (timeseries("Dropped arrivals", [
            q(f"sum by (target, reason) (rate(llmprober_load_dropped_total{{{SEL}}}[{RI}]))",
              "{{target}} {{reason}}", "A"),
        ], "reqps", "Load arrivals not sent. in_flight: the in-flight cap was reached, the load "
           "is no longer open-loop. silent: the target answered no token for "
           "load.silent_seconds, and gets its probes only until it does."), 6, 8),
        (timeseries("Time since last probe", [
            q(f"time() - max by (target) (llmprober_last_probe_timestamp_seconds{{{SEL}}})",
              "{{target}}", "A"),
            q(f"3 * max by (target) (llmprober_probe_interval_seconds{{{SEL}}})",
              "{{target}} stale after", "S"),
        ], "s", "Stale when above three probe intervals (dashed).", overrides=[dashed("S")]),
         6, 8),
        (timeseries("Engine metrics scrape errors", [
            q(f"{BY_TARGET} (rate(llmprober_server_scrape_errors_total{{{SEL}}}[{RI}]))",
              "{{target}}", "A"),
        ], "short", "Failed scrapes of metrics_url per second: server truth is missing "
           "meanwhile."), 6, 8),
    ]


# The engine state as one number per target, for a stat panel's colours (docs/design.md §12).
ENGINE_STATES = {0: ("ok", "green"), 1: ("busy", "orange"), 2: ("stalled", "red"),
                 3: ("down", "dark-red")}
ENGINE_STATE = "max by (target) (" + " or ".join(
    f'(llmprober_engine_state{{{SEL}, state="{name}"}} == 1) * {value}'
    for value, (name, _) in ENGINE_STATES.items()
) + ")"


def answer_panels() -> list[tuple[Panel, int, int]]:
    return [
        (row("Answers: is it stalled or busy, is the answer right, is the cache working"), 24, 1),
        (stat("Engine state", [q(ENGINE_STATE, "{{target}}", "A")], "none",
              "ok; busy: tokens flow, but the queue wait or TTFT is over the SLO or every "
              "slot is taken (never restart it); stalled: requests wait and no token comes "
              "(on no stream, and the engine's token counter still where it is scraped); "
              "down: no connection, or only connection errors and 5xx. /-/engine?target= "
              "answers 503 for the last two (docs/design.md §12). Alert: "
              "LLMProberEngineStalled.", [("green", None)], ENGINE_STATES), 6, 8),
        (timeseries("Answer checks", [
            q(f"sum by (target, check, result) (rate(llmprober_answer_checks_total"
              f"{{{SEL_MODE}}}[{RI}]))", "{{target}} {{check}} {{result}}", "A"),
        ], "reqps", "The target's expect: checks on every ok probe (regex, json, json_schema, "
           "min_answer_tokens, model), passed and failed per second. A failed one makes the "
           "probe not good; its log line shows the answer's first 200 characters.",
           stack=True, bars=True), 6, 8),
        (timeseries("Prefix cache: TTFT of a hit against a miss", [
            q(f"histogram_quantile(0.5, sum by (target, result, le) "
              f"(rate(llmprober_cache_probe_ttft_seconds_bucket{{{SEL}}}[{RI}])))",
              "{{target}} {{result}} p50", "A"),
        ], "s", "The cache probe (cache_probe:): one prefix sent twice, a miss that warms the "
           "cache, then a hit. The hit below the miss: the prefix cache cuts TTFT on that "
           "replica or through that gateway."), 6, 8),
        (timeseries("Prefix cache: hits the engine confirmed", [
            q(f'sum by (target, confirmed) (rate(llmprober_cache_probe_total{{{SEL}, '
              f'result="hit"}}[{RI}]))', "{{target}} {{confirmed}}", "A"),
        ], "reqps", "The cache probe's hits by what the engine said: true, at least half the "
           "prefix reported cached; false, less (a hit that the engine did not serve from "
           "its cache: another replica, or the prefix evicted); unknown, the engine reports "
           "no cached tokens (vLLM needs --enable-prompt-tokens-details).", stack=True), 6, 8),
    ]


VLLM = '{model_name=~"$model"}'


def vllm_quantile(metric: str, quant: str) -> str:
    """A quantile of one of vLLM's own per-request histograms, per served model."""
    return (
        f"histogram_quantile({quant}, sum by (model_name, le) "
        f"(rate({metric}_bucket{VLLM}[{RI}])))"
    )


def vllm_panels() -> list[tuple[Panel, int, int]]:
    """vLLM's own figures beside the probes', where Prometheus scrapes vLLM too (its series
    carry `model_name`, the served model: the `model` of a target that names it)."""
    probe_ttft = (
        f"histogram_quantile(0.95, sum by (target, le) "
        f'(rate(llmprober_ttft_seconds_bucket{{{SEL}, mode="probe"}}[{RI}])))'
    )
    return [
        (row("The engine's own view (vLLM, where Prometheus scrapes it)"), 24, 1),
        (timeseries("TTFT p95: vLLM's own and the probes'", [
            q(vllm_quantile("vllm:time_to_first_token_seconds", "0.95"),
              "{{model_name}} vLLM", "A"),
            q(probe_ttft, "{{target}} probes", "B"),
        ], "s", "vLLM's TTFT starts when its API server has the request; the probes' at the "
           "scheduled send: the gap is the network, the HTTP exchange and tokenisation."), 8, 8),
        (timeseries("vLLM queue time and inter-token latency", [
            q(vllm_quantile("vllm:request_queue_time_seconds", "0.95"),
              "{{model_name}} queue time p95", "A"),
            q(vllm_quantile("vllm:inter_token_latency_seconds", "0.5"),
              "{{model_name}} ITL p50", "B"),
        ], "s", "Time requests waited in vLLM's scheduler, and its median token gap: compare "
           "with the estimated queue wait and the probes' TPOT."), 8, 8),
        (timeseries("vLLM requests waiting and running", [
            q(f"sum by (model_name) (vllm:num_requests_waiting{VLLM})",
              "{{model_name}} waiting", "A"),
            q(f"sum by (model_name) (vllm:num_requests_running{VLLM})",
              "{{model_name}} running", "B"),
        ], "short", "vLLM's gauges as Prometheus scrapes them; the Queue row shows the same "
           "through llm-prober (source=server) beside its estimate."), 8, 8),
    ]


# A target's group, joined from its info series (docs/design.md §10): one per target, `max`
# keeping one where several prober replicas export it. `group!=""` leaves static targets out;
# a group's gateway has its group too, so it is drawn beside its replicas.
IN_GROUP = (
    "* on (target) group_left (group) max by (target, group) "
    '(llmprober_target_info{target=~"$target", group=~"$group", group!=""})'
)


def by_replica(metric: str, quant: str, sel: str = SEL_MODE) -> dict[str, Any]:
    """One target's quantile of `metric`, labelled with its group."""
    expr = (
        f"histogram_quantile({quant}, sum by (target, le) (rate({metric}_bucket{{{sel}}}[{RI}])))"
        f" {IN_GROUP}"
    )
    return q(expr, "{{group}} {{target}}", "A")


def replica_panels() -> list[tuple[Panel, int, int]]:
    """The targets of a group (`target_groups:`) side by side, one line each."""
    errors = (
        f"(sum by (target) (rate(llmprober_requests_total{{{SEL_MODE}, "
        f'outcome!~"ok|cancelled"}}[{RI}])) / sum by (target) (rate(llmprober_requests_total'
        f'{{{SEL_MODE}, outcome!="cancelled"}}[{RI}]))) {IN_GROUP}'
    )
    waiting = (
        f'max by (target) (llmprober_queue_depth{{{SEL}, source="server", state="waiting"}}) '
        f"{IN_GROUP}"
    )
    group = 'group=~"$group"'
    return [
        (row("Replicas: the targets of a group side by side"), 24, 1),
        (timeseries("TTFT p95 by replica", [by_replica("llmprober_ttft_seconds", "0.95")], "s",
                    "One line per target of the group (and its gateway, where the group names "
                    "one): a replica far above the rest is sick or holds a longer queue."),
         8, 8),
        (timeseries("TPOT p95 by replica", [by_replica("llmprober_tpot_seconds", "0.95")], "s",
                    "Decode time per token by replica: a slower GPU, or a fuller batch."), 8, 8),
        (timeseries("Queue wait p95 by replica",
                    [by_replica("llmprober_queue_wait_seconds", "0.95", SEL)], "s",
                    "Estimated queue wait by replica: a router that spreads badly shows here "
                    "first."), 8, 8),
        (timeseries("Error ratio by replica", [q(errors, "{{group}} {{target}}", "A")],
                    "percentunit", "Failed requests / all (cancelled left out) by replica.",
                    max_=1), 8, 8),
        (timeseries("Engine's waiting requests by replica",
                    [q(waiting, "{{group}} {{target}}", "A")], "short",
                    "The engine's own count of waiting requests, where its metrics_url is "
                    "scraped (metrics_url: on the group)."), 8, 8),
        (timeseries("Group spread and the router's share", [
            q(f"llmprober:group_ttft_p95_seconds:max{{{group}}}", "{{group}} slowest p95", "A"),
            q(f"llmprober:group_ttft_p95_seconds:min{{{group}}}", "{{group}} fastest p95", "B"),
            q(f"llmprober:group_router_ttft_p50_seconds:diff{{{group}}}", "{{group}} router",
              "C"),
        ], "s", "The slowest and fastest replica's TTFT p95 over 5m; router: the gateway's "
           "TTFT p50 minus the replicas' median p50, the time the gateway adds (groups with "
           "gateway: only)."), 8, 8),
    ]


def capacity_panels() -> list[tuple[Panel, int, int]]:
    th = keda_thresholds()
    q_th, in_th, ttft_th = th["queue-waiting"], th["in-system"], th["ttft-p95"]
    return [
        (row("Autoscaling signals (KEDA triggers / HPA External metrics)"), 24, 1),
        (timeseries("Queue waiting (trigger queue-waiting)", [
            q(f"llmprober:queue_waiting:sum{{{SEL}}}", "{{target}} fleet backlog", "A"),
            q(f"llmprober:queue_waiting:max{{{SEL}}}", "{{target}} worst prober view", "B"),
        ], "short", f"llmprober:queue_waiting:sum, AverageValue {q_th:g}: the HPA wants "
           f"backlog / {q_th:g} replicas. Red line: the per-replica target. Empty where no "
           "depth is made: no metrics_url and no traffic: shape (drain basis probe_shape).",
           threshold=q_th), 12, 8),
        (timeseries("TTFT p95 (trigger ttft-p95)", [
            q(f"llmprober:ttft_seconds:p95_5m{{{SEL}}}", "{{target}} p95", "A"),
            slo_line("llmprober_slo_ttft_seconds"),
        ], "s", f"llmprober:ttft_seconds:p95_5m, Value {ttft_th:g} s: replicas grow in "
           "proportion to p95 / threshold. Dashed: the prober's TTFT SLO.",
           overrides=[dashed("S", "orange")], threshold=ttft_th), 12, 8),
        (timeseries("Requests in the system (trigger in-system)", [
            q(f"llmprober:requests_in_system:sum{{{SEL}}}", "{{target}} waiting + running", "A"),
            q(f"llmprober:queue_running:sum{{{SEL}}}", "{{target}} running", "B"),
        ], "short", f"llmprober:requests_in_system:sum, AverageValue {in_th:g} (75 % of the "
           "slots of one replica): keeps the capacity that a drained queue still needs. Needs "
           "the waiting depth: empty where it is withheld (drain basis probe_shape).",
           threshold=in_th), 12, 8),
        (timeseries("Replicas each trigger asks for", [
            q(f"ceil(llmprober:queue_waiting:sum{{{SEL}}} / {q_th:g})",
              "{{target}} queue-waiting", "A"),
            q(f"ceil(llmprober:requests_in_system:sum{{{SEL}}} / {in_th:g})",
              "{{target}} in-system", "B"),
        ], "short", "Desired replicas from the AverageValue triggers (the HPA takes the "
           "largest, then applies minReplicas, maxReplicas and its scale-down policy). "
           "ttft-p95 scales the current count and is not shown."), 12, 8),
        (row("Saturation and what the estimate rests on"), 24, 1),
        (timeseries("Saturation", [
            q(f"llmprober:saturation:max{{{SEL}}}", "{{target}} most saturated engine", "A"),
            q(f"llmprober:saturation:avg{{{SEL}}}", "{{target}} fleet mean", "B"),
        ], "none", "Busy slots / slots below 1, 1 + waiting / slots above: continuous across "
           "the knee, so it rises before the queue and TTFT do. Red line: 1, every slot busy. "
           "Where the estimate's depth is withheld (drain basis probe_shape) it is shown "
           "below the knee only.",
           threshold=1.0), 12, 8),
        (timeseries("Queue estimate basis", [
            q(f"max by (target, basis) (llmprober_queue_estimate_basis{{{SEL}}} == 1)",
              "{{target}} {{basis}}", "A"),
            q(f"max by (target, basis) (llmprober_queue_drain_basis{{{SEL}}} == 1)",
              "{{target}} drain rate: {{basis}}", "B"),
        ], "none", "What the estimate rests on: server (engine counters), own_load (the "
           "prober's load is the traffic), probes_hint / probes_learned (probes alone, slots "
           "hinted or learned), none (not enough data yet, or no traffic shape). Prefer "
           "server, then the estimate. Its drain rate: server, engine_shape (the traffic's "
           "shape from the engine's token counters), traffic (the traffic: shape given), "
           "traffic_probes (traffic: probes), probe_shape (no shape given: no waiting depth "
           "is exported), none."),
         6, 8),
        (timeseries("Engine slots", [
            q(f"max by (target, source) (llmprober_engine_slots{{{SEL}}})",
              "{{target}} {{source}}", "A"),
        ], "short", "Parallel slots behind the estimate and saturation: the target's slots: "
           "hint, or learned from the probes (decode slowdown at full batch) or own load."),
         6, 8),
        (row("Saturation context"), 24, 1),
        (timeseries("Estimated queue wait p95", [
            q(f"llmprober:queue_wait_seconds:p95_5m{{{SEL}}}", "{{target}}", "A"),
        ], "s", "Queue wait needs no drain-rate assumption: the cleanest latency-side scaling "
           "signal."), 6, 8),
        (timeseries("KV cache usage", [
            q(f"llmprober:kv_cache_usage:max{{{SEL}}}", "{{target}}", "A"),
        ], "percentunit", "Context only: KV memory is pre-allocated, so GPU memory always "
           "looks full; the share of the KV cache in use tells how close preemption is.",
           max_=1), 6, 8),
        (timeseries("Output tokens per second", [
            q(f'llmprober:tokens:rate5m{{{SEL}, kind="output"}}', "{{target}}", "A"),
        ], "short", "Decode throughput the prober observed (its own traffic only)."), 6, 8),
        (timeseries("Request rate", [
            q(f"llmprober:requests:rate5m{{{SEL}}}", "{{target}}", "A"),
        ], "reqps", "Requests per second sent by the prober."), 6, 8),
        (row("Goodput SLO"), 24, 1),
        (timeseries("Goodput and errors", [
            q(f"llmprober:goodput:ratio_rate5m{{{SEL}}}", "{{target}} goodput", "A"),
            q(f"llmprober:errors:ratio_rate5m{{{SEL}}}", "{{target}} errors", "B"),
            q("max(llmprober:goodput_slo:objective)", "objective", "S"),
        ], "percentunit", "Good / all and failed / all over 5m; dashed: the objective.",
           overrides=[dashed("S")], max_=1), 12, 8),
        (timeseries("Burn rate by window", [
            q(f"llmprober:goodput_slo:burn_rate5m{{{SEL}}}", "{{target}} 5m", "A"),
            q(f"llmprober:goodput_slo:burn_rate30m{{{SEL}}}", "{{target}} 30m", "B"),
            q(f"llmprober:goodput_slo:burn_rate1h{{{SEL}}}", "{{target}} 1h", "C"),
            q(f"llmprober:goodput_slo:burn_rate6h{{{SEL}}}", "{{target}} 6h", "D"),
        ], "none", "Page: 1h and 5m above 14.4. Ticket: 6h and 30m above 6 (red area: page).",
           threshold=14.4), 12, 8),
    ]
# fmt: on


def overview() -> dict[str, Any]:
    """How the endpoints feel to users: latency, goodput, outcomes, traffic, queue."""
    panels = (
        latency_panels() + outcome_and_traffic_panels() + stream_panels()
        + answer_panels() + queue_and_health_panels() + vllm_panels() + replica_panels()
    )  # fmt: skip
    return dashboard(
        "llm-prober-overview",
        "llm-prober / Overview",
        "How OpenAI-compatible LLM endpoints feel to users, measured by llm-prober.",
        layout(panels),
        with_mode=True,
        with_group=True,
    )


def capacity() -> dict[str, Any]:
    """What the autoscaler sees: the recording rules KEDA / the HPA read, with thresholds."""
    return dashboard(
        "llm-prober-capacity",
        "llm-prober / Capacity",
        "What the autoscaler sees: llm-prober's recording rules with the KEDA / HPA thresholds.",
        layout(capacity_panels()),
        with_mode=False,
    )


DASHBOARDS: dict[str, Callable[[], dict[str, Any]]] = {
    "llm-prober-overview.json": overview,
    "llm-prober-capacity.json": capacity,
}


def render(build: Callable[[], dict[str, Any]]) -> str:
    return json.dumps(build(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    check = "--check" in sys.argv[1:]
    stale = []
    for name, build in DASHBOARDS.items():
        path, text = OUT / name, render(build)
        if not check:
            path.write_text(text)
        elif not path.exists() or path.read_text() != text:
            stale.append(name)
    if stale:
        print(f"out of date: {', '.join(stale)}; run grafana/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
