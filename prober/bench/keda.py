"""Autoscaling targets from a bench report: per-replica budgets, a KEDA ScaledObject, an HPA.

Derivation (docs/autoscaling.md, "Thresholds from a measurement"), for one replica with
`slots` parallel sequences and a TTFT SLO:

- capacity at the SLO: bench's capacity level (the highest level, from the lowest up, whose
  goodput ratio meets `--capacity-goodput`); X its request throughput, W its mean E2E from
  send, S its mean service time (E2E minus the measured queue wait);
- drain rate at full batch: `mu = slots / S` (requests/s one saturated replica completes);
  without `slots`, X;
- in-system budget (waiting + running, `AverageValue`): `headroom × min(slots, X × W)`, the
  requests one replica holds at capacity by Little's law, less a headroom for bursts;
- queue budget (`AverageValue`): every waiting request adds `1 / mu` to the wait of those
  behind it, so a queue of `mu × (SLO − floor)` uses up the SLO; half of it is the budget,
  `floor` being the TTFT p95 at the lowest level (prefill and a step, no queue);
- TTFT p95 target (`Value`): the SLO itself; it must lie above the floor, since a target
  under the floor would add replicas forever;
- saturation target (`Value`): the in-system budget over the slots.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

from prober.validation import bound, within

DEFAULT_HEADROOM = 0.75
DEFAULT_PROMETHEUS = "http://prometheus-operated.monitoring.svc.cluster.local:9090"


@dataclass(frozen=True, slots=True)
class Budgets:
    """Per-replica targets and the figures they come from."""

    slots: int | None
    slo_ttft_seconds: float
    capacity_level: dict[str, Any]
    capacity_rps: float
    capacity_in_system: float
    service_seconds: float
    drain_rps: float
    ttft_floor_p95_seconds: float
    queue_waiting: int
    in_system: int
    ttft_p95_seconds: float
    saturation: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def _num(node: Any, *path: str) -> float | None:
    for key in path:
        if not isinstance(node, dict) or node.get(key) is None:
            return None
        node = node[key]
    return float(node)


def derive(
    report: dict[str, Any], slots: int | None, headroom: float = DEFAULT_HEADROOM
) -> Budgets:
    """The budgets of the module docstring; ValueError when the report cannot give them."""
    if not 0 < headroom <= 1:
        raise ValueError(f"headroom {within(0, 1, headroom, open_low=True)}")
    if slots is not None and slots < 1:
        raise ValueError(f"--slots: {bound('at least', 1, slots)}")
    cap = report["capacity"]
    if cap.get("level") is None:
        raise ValueError(f"no level meets the SLO ({cap['rule']}): nothing to size on")
    slo = float(report["config"]["slo_ttft_seconds"])
    level = next(lvl for lvl in report["levels"] if lvl["level"] == cap["level"])
    x = _num(cap, "request_throughput")
    w = _num(cap, "mean_e2e_from_send_seconds")
    s = _num(cap, "mean_service_seconds") or w
    floor = _num(report["levels"][0], "ttft_seconds", "p95")
    if x is None or w is None or s is None or floor is None or s <= 0:
        raise ValueError("the capacity level has no throughput, E2E or TTFT figures")
    if floor >= slo:
        raise ValueError(
            f"TTFT p95 at the lowest level ({floor:.3f}s) is not below the SLO "
            f"({slo:g}s): no replica count can meet it"
        )
    in_flight = x * w
    mu = slots / s if slots else x
    held = min(float(slots), in_flight) if slots else in_flight
    in_system = max(1, math.floor(headroom * held + 1e-9))
    return Budgets(
        slots=slots,
        slo_ttft_seconds=slo,
        capacity_level=dict(level["level"]),
        capacity_rps=x,
        capacity_in_system=in_flight,
        service_seconds=s,
        drain_rps=mu,
        ttft_floor_p95_seconds=floor,
        queue_waiting=max(1, math.floor(mu * (slo - floor) / 2 + 1e-9)),
        in_system=in_system,
        ttft_p95_seconds=slo,
        saturation=round(in_system / slots, 3) if slots else headroom,
    )


# A Kubernetes object name (RFC 1123 label: what a Deployment's name may be, and a valid
# label value for the HPA's selector): nothing in it needs escaping anywhere it is written.
_KUBE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_PROMQL_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def kube_name(value: str) -> str:
    """`value` where it is a Kubernetes name, else ValueError in one line (the value shown
    escaped)."""
    if not _KUBE_NAME.fullmatch(value):
        raise ValueError(
            "must be a Kubernetes name (lower-case letters, digits and '-', at most 63, "
            f"starting and ending with a letter or digit), got {value[:80]!r}"
        )
    return value


def promql_string(value: str) -> str:
    """`value` as a PromQL string literal: quoted, with backslash, quote and control
    characters escaped, so no value can end the literal and add to the query."""
    return '"' + "".join(_PROMQL_ESCAPES.get(ch) or _control(ch) for ch in value) + '"'


def _control(ch: str) -> str:
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch


def _trigger(name: str, kind: str, query: str, threshold: float, server: str) -> dict[str, Any]:
    return {
        "type": "prometheus",
        "name": name,
        "metricType": kind,
        "metadata": {"serverAddress": server, "query": query, "threshold": f"{threshold:g}"},
    }


def behavior() -> dict[str, Any]:
    """The shipped behaviour: up at once by 2 pods or 100 %, whichever is more, per 2 min (a
    start-up: more can't be judged before the new pods serve); down 1 pod / 5 min after 10."""
    return {
        "scaleUp": {
            "stabilizationWindowSeconds": 0,
            "selectPolicy": "Max",
            "policies": [
                {"type": "Pods", "value": 2, "periodSeconds": 120},
                {"type": "Percent", "value": 100, "periodSeconds": 120},
            ],
        },
        "scaleDown": {
            "stabilizationWindowSeconds": 600,
            "policies": [{"type": "Pods", "value": 1, "periodSeconds": 300}],
        },
    }


def triggers(b: Budgets, target: str, server: str = DEFAULT_PROMETHEUS) -> list[dict[str, Any]]:
    """The shipped three triggers (queue-waiting, ttft-p95, in-system) with `b`'s targets."""
    sel = f"{{target={promql_string(target)}}}"
    return [
        _trigger(
            "queue-waiting",
            "AverageValue",
            f"sum(llmprober:queue_waiting:sum{sel}) or vector(0)",
            b.queue_waiting,
            server,
        ),
        _trigger(
            "ttft-p95",
            "Value",
            f"max(llmprober:ttft_seconds:p95_5m{sel} >= 0) or vector(0)",
            b.ttft_p95_seconds,
            server,
        ),
        _trigger(
            "in-system",
            "AverageValue",
            f"sum(llmprober:requests_in_system:sum{sel}) or vector(0)",
            b.in_system,
            server,
        ),
    ]


def scaled_object(
    b: Budgets,
    *,
    name: str,
    target: str,
    min_replicas: int = 1,
    max_replicas: int = 8,
    server: str = DEFAULT_PROMETHEUS,
) -> dict[str, Any]:
    """A KEDA ScaledObject scaling Deployment `name` on target `target`'s rules."""
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicaCount": min_replicas,
            "maxReplicaCount": max_replicas,
            "pollingInterval": 15,
            "cooldownPeriod": 300,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": behavior()}},
            "triggers": triggers(b, target, server),
        },
    }


def hpa(
    b: Budgets, *, name: str, target: str, min_replicas: int = 1, max_replicas: int = 8
) -> dict[str, Any]:
    """The same targets as an autoscaling/v2 HPA on prometheus-adapter's External metrics."""

    def external(metric: str, kind: str, value: float) -> dict[str, Any]:
        key = "averageValue" if kind == "AverageValue" else "value"
        return {
            "type": "External",
            "external": {
                "metric": {"name": metric, "selector": {"matchLabels": {"target": target}}},
                "target": {"type": kind, key: f"{value:g}"},
            },
        }

    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": name}},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                external("llmprober_queue_waiting_sum", "AverageValue", b.queue_waiting),
                external("llmprober_ttft_seconds_p95_5m", "Value", b.ttft_p95_seconds),
                external("llmprober_requests_in_system_sum", "AverageValue", b.in_system),
            ],
            "behavior": behavior(),
        },
    }


def header(b: Budgets) -> str:
    """A YAML comment block saying where every number came from."""
    lines = [
        "Generated by `llm-prober bench --emit-keda/--emit-hpa` (docs/autoscaling.md).",
        f"capacity at the SLO: {b.capacity_level} -> {b.capacity_rps:.3g} req/s, "
        f"{b.capacity_in_system:.3g} in system (X x W), service {b.service_seconds:.3g} s",
        f"drain rate at full batch: {b.drain_rps:.3g} req/s"
        + (f" ({b.slots} slots / service time)" if b.slots else " (throughput at capacity)"),
        f"TTFT p95 floor {b.ttft_floor_p95_seconds:.3g} s, SLO {b.slo_ttft_seconds:g} s",
        f"queue-waiting {b.queue_waiting} = floor(drain x (SLO - floor) / 2)",
        f"in-system {b.in_system} = floor(headroom x min(slots, X x W))",
        f"ttft-p95 {b.ttft_p95_seconds:g} s = SLO; saturation option {b.saturation:g}",
    ]
    return "".join(f"# {line}\n" for line in lines)
