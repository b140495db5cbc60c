"""Scaling policies: the triggers and behaviour of a KEDA ScaledObject, and the time factor.

A policy is what a platform team would deploy: a set of Prometheus triggers (name, query,
`Value` or `AverageValue`, threshold) and the HPA behaviour. `from_scaled_object` reads them
from a ScaledObject document (the shipped manifest, or the one `llm-prober bench` emits), so
the experiment runs the manifest itself rather than a copy of its numbers. Every duration of
the behaviour is divided by the time-compression factor.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, cast

from .hpa import Behavior, MetricType, ScalingPolicy, ScalingRules


@dataclass(frozen=True, slots=True)
class Trigger:
    name: str
    kind: MetricType
    query: str
    threshold: float


@dataclass(frozen=True, slots=True)
class Policy:
    name: str
    triggers: tuple[Trigger, ...]
    behavior: Behavior
    min_replicas: int
    max_replicas: int

    def only(self, name: str, *triggers: str) -> Policy:
        """The same behaviour with a subset of the triggers, renamed."""
        kept = tuple(t for t in self.triggers if t.name in triggers)
        missing = set(triggers) - {t.name for t in kept}
        if missing:
            raise ValueError(f"no trigger named {sorted(missing)}")
        return replace(self, name=name, triggers=kept)

    def plus(self, name: str, *triggers: Trigger) -> Policy:
        """The same behaviour with these triggers instead."""
        return replace(self, name=name, triggers=tuple(triggers))


def _rules(node: Mapping[str, Any], factor: float) -> ScalingRules:
    policies = tuple(
        ScalingPolicy(p["type"], int(p["value"]), float(p["periodSeconds"]) / factor)
        for p in node.get("policies", ())
    )
    return ScalingRules(
        stabilization_seconds=float(node.get("stabilizationWindowSeconds", 0)) / factor,
        policies=policies,
        select=node.get("selectPolicy", "Max"),
    )


def from_scaled_object(doc: Mapping[str, Any], factor: float, name: str = "shipped") -> Policy:
    """The policy a ScaledObject describes, its durations divided by `factor`."""
    spec = doc["spec"]
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    triggers = [
        Trigger(
            name=t["name"],
            kind=cast(MetricType, t.get("metricType", "AverageValue")),
            query=t["metadata"]["query"],
            threshold=float(t["metadata"]["threshold"]),
        )
        for t in spec["triggers"]
        if t["type"] == "prometheus"
    ]
    up, down = _rules(behavior["scaleUp"], factor), _rules(behavior["scaleDown"], factor)
    return Policy(
        name=name,
        triggers=tuple(triggers),
        behavior=Behavior(up, down),
        min_replicas=max(1, int(spec.get("minReplicaCount", 1))),
        max_replicas=int(spec.get("maxReplicaCount", 100)),
    )


# What KEDA-on-GPU recipes deploy: mean DCGM utilisation over the fleet, `Value` 80 %.
GPU_UTILIZATION = Trigger(
    name="gpu-utilization",
    kind="Value",
    query="avg(DCGM_FI_DEV_GPU_UTIL) or vector(0)",
    threshold=80.0,
)


def saturation_trigger(threshold: float = 0.8, target: str = "vllm") -> Trigger:
    """The ScaledObject's commented `saturation` option."""
    return Trigger(
        name="saturation",
        kind="Value",
        query=f'avg(llmprober:saturation:avg{{target="{target}"}}) or vector(0)',
        threshold=threshold,
    )


def standard_policies(shipped: Policy, saturation: Trigger | None = None) -> list[Policy]:
    """GPU utilisation, queue, TTFT p95, saturation, and the shipped combination."""
    return [
        shipped.plus("gpu-util", GPU_UTILIZATION),
        shipped.only("queue", "queue-waiting"),
        shipped.only("ttft-p95", "ttft-p95"),
        shipped.plus("saturation", saturation or saturation_trigger()),
        shipped,
    ]


def by_name(policies: Iterable[Policy], names: Iterable[str]) -> list[Policy]:
    index = {p.name: p for p in policies}
    out = []
    for n in names:
        if n not in index:
            raise ValueError(f"unknown policy {n!r}; one of {sorted(index)}")
        out.append(index[n])
    return out
