"""The discovery series, made at scrape time from what the runner keeps.

`llmprober_target_info` (one per target this replica probes: `target`, `group` — empty for a
static target, but a group's `gateway` has that group and `gateway="true"` —, `address`, and
the labels its group declares), `llmprober_discovery_targets`
(a group's targets on this shard), `llmprober_discovery_errors_total{group, reason}` (every
reason from 0) and `llmprober_discovery_last_refresh_timestamp_seconds` (the last good answer).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType

import yarl
from prometheus_client.core import GaugeMetricFamily, Metric

from prober import metric_specs as specs
from prober.config.target import TargetConfig
from prober.discovery.source import Reason
from prober.discovery.state import Member

# A group's name, its targets on this shard, its faults by reason, its last good answer.
GroupCounts = tuple[str, int, Mapping[Reason, int], float | None]


def families(
    targets: Mapping[str, TargetConfig],
    members: Mapping[str, Member],
    groups: Sequence[GroupCounts],
    gateways: Mapping[str, str] = MappingProxyType({}),
) -> Iterator[Metric]:
    """The four families: `targets` are those this replica reports an info series for,
    `members` the discovered ones among them (by name), `gateways` the group each static
    gateway routes to (by its name)."""
    # Its labels beyond the spec's are each group's declared ones: a family without a fixed
    # label set, its samples added whole.
    info = GaugeMetricFamily(specs.TARGET_INFO.name, specs.TARGET_INFO.help)
    for name, config in targets.items():
        labels = _info(name, config, members.get(name), gateways.get(name))
        info.add_sample(specs.TARGET_INFO.name, labels, 1.0)
    yield info
    count = specs.gauge_family(specs.DISCOVERY_TARGETS)
    errors = specs.counter_family(specs.DISCOVERY_ERRORS)
    refreshed = specs.gauge_family(specs.DISCOVERY_LAST_REFRESH)
    for group, targets_now, faults, last in groups:
        count.add_metric([group], targets_now)
        for reason in Reason:
            errors.add_metric([group, reason.value], faults.get(reason, 0))
        if last is not None:
            refreshed.add_metric([group], last)
    yield from (count, errors, refreshed)


def _info(
    name: str, config: TargetConfig, member: Member | None, gateway_of: str | None
) -> dict[str, str]:
    if member is None and gateway_of is not None:  # the router in front of a group
        return {"target": name, "group": gateway_of, "address": address_of(config.url),
                "gateway": "true"}  # fmt: skip
    if member is None:
        return {"target": name, "group": "", "address": address_of(config.url)}
    return {"target": name, "group": member.group, "address": member.address,
            **dict(member.labels)}  # fmt: skip


def address_of(url: str) -> str:
    """A static target's `host:port` (`[host]:port` for IPv6), as a source would give it."""
    parsed = yarl.URL(url)
    if not parsed.raw_host:
        return ""
    if parsed.host and ":" in parsed.host:
        return f"[{parsed.host}]:{parsed.port}"
    return f"{parsed.raw_host}:{parsed.port}"
