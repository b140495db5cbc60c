"""The HorizontalPodAutoscaler's replica arithmetic, as Kubernetes documents and implements it.

Pure functions and one small stateful class (`Hpa`) fed with the time, so tests drive it with
plain numbers. Sources: the HPA documentation ("Algorithm details", "Configurable scaling
behavior") and `pkg/controller/podautoscaler` (replica_calculator.go, horizontal.go):

- External metric, `AverageValue` target: `usage_ratio = metric / (target × status_replicas)`;
  within the tolerance the count stays, else `desired = ceil(metric / target)`.
- External metric, `Value` target: `usage_ratio = metric / target`; within the tolerance the
  count stays, else `desired = ceil(usage_ratio × ready_pods)`.
- The tolerance is 0.1; the largest desired count over all metrics wins.
- Stabilisation: every recommendation is recorded; a scale-up goes no higher than the lowest
  recommendation within the scale-up window, a scale-down no lower than the highest within
  the scale-down window.
- Policies (`Pods` n per period, `Percent` p per period, `selectPolicy` Max by default)
  bound the change against the count at the start of each period, from the recorded scale
  events; finally `minReplicas` / `maxReplicas`.
- KEDA passes a float as a milli-quantity (truncated), which is what the HPA compares.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

TOLERANCE = 0.1
MetricType = Literal["AverageValue", "Value"]


@dataclass(frozen=True, slots=True)
class ScalingPolicy:
    kind: Literal["Pods", "Percent"]
    value: int
    period_seconds: float


@dataclass(frozen=True, slots=True)
class ScalingRules:
    stabilization_seconds: float
    policies: tuple[ScalingPolicy, ...]
    select: Literal["Max", "Min", "Disabled"] = "Max"


@dataclass(frozen=True, slots=True)
class Behavior:
    up: ScalingRules
    down: ScalingRules


def milli(value: float) -> float:
    """The value as the HPA sees it: KEDA's `NewMilliQuantity(int64(v * 1000))`."""
    if not math.isfinite(value):
        return 0.0
    return math.trunc(value * 1000) / 1000


def desired_for_metric(
    kind: MetricType, metric: float, target: float, status_replicas: int, ready_pods: int
) -> int:
    """One metric's desired count (replica_calculator.go, external metrics)."""
    metric = milli(metric)
    if kind == "AverageValue":
        if status_replicas == 0:
            return math.ceil(metric / target)
        ratio = metric / (target * status_replicas)
        if abs(1.0 - ratio) <= TOLERANCE:
            return status_replicas
        return math.ceil(metric / target)
    ratio = metric / target
    if status_replicas == 0:
        return math.ceil(ratio)
    if abs(1.0 - ratio) <= TOLERANCE:
        return status_replicas
    return math.ceil(ratio * ready_pods)


@dataclass(frozen=True, slots=True)
class _Event:
    at: float
    change: int


@dataclass
class Hpa:
    """One HPA's memory: recommendations and scale events, both timestamped."""

    behavior: Behavior
    min_replicas: int
    max_replicas: int
    _recommendations: list[tuple[float, int]] = field(default_factory=list)
    _up_events: list[_Event] = field(default_factory=list)
    _down_events: list[_Event] = field(default_factory=list)

    def seed(self, now: float, replicas: int) -> None:
        """Remember a recommendation, as an HPA that has been running at `replicas` would."""
        self._recommendations.append((now, replicas))

    def decide(self, now: float, current: int, desired: int) -> int:
        """The new spec replica count from the metrics' largest `desired` (horizontal.go)."""
        stabilised = self._stabilise(now, current, desired)
        limited = self._rate_limit(now, current, stabilised)
        final = max(self.min_replicas, min(self.max_replicas, limited))
        if final > current:
            self._up_events.append(_Event(now, final - current))
        elif final < current:
            self._down_events.append(_Event(now, current - final))
        return final

    def _stabilise(self, now: float, current: int, desired: int) -> int:
        up_cut = now - self.behavior.up.stabilization_seconds
        down_cut = now - self.behavior.down.stabilization_seconds
        up, down = desired, desired
        for at, rec in self._recommendations:
            if at > up_cut:
                up = min(up, rec)
            if at > down_cut:
                down = max(down, rec)
        keep = max(self.behavior.up.stabilization_seconds, self.behavior.down.stabilization_seconds)
        self._recommendations = [(t, r) for t, r in self._recommendations if t > now - keep]
        self._recommendations.append((now, desired))
        return min(max(current, up), down)

    def _rate_limit(self, now: float, current: int, desired: int) -> int:
        if desired > current:
            limit = max(current, self._limit(now, current, self.behavior.up, up=True))
            return min(desired, limit)
        if desired < current:
            limit = min(current, self._limit(now, current, self.behavior.down, up=False))
            return max(desired, limit)
        return desired

    def _limit(self, now: float, current: int, rules: ScalingRules, *, up: bool) -> int:
        if rules.select == "Disabled" or not rules.policies:
            return current
        proposals = []
        for p in rules.policies:
            added = sum(e.change for e in self._up_events if e.at > now - p.period_seconds)
            removed = sum(e.change for e in self._down_events if e.at > now - p.period_seconds)
            start = current - added + removed if up else current + removed - added
            if p.kind == "Pods":
                proposals.append(start + p.value if up else start - p.value)
            elif up:
                proposals.append(math.ceil(start * (1 + p.value / 100)))
            else:
                proposals.append(math.floor(start * (1 - p.value / 100)))
        # Max: the policy allowing the largest change; for a scale-down that is the lowest.
        most = max if up else min
        least = min if up else max
        return (most if rules.select == "Max" else least)(proposals)
