"""Discovered targets: `target_groups:` sources, their refresh loops and the desired set.

- `source`: what every source answers (`Source`, `Fetched`, `Fault` of a closed `Reason`)
  and Prometheus's target-group list as file_sd and HTTP SD hold it;
- `files`, `http`, `dns`: the three sources (`FileSd`, `HttpSd`, `DnsSd`);
- `state`: a group's addresses across refreshes (`remove_after_seconds`) and `merge`, the
  one set `static ∪ discovered` keyed by target name, name clashes resolved;
- `runner`: `Discovery`, one refresh loop per group, handing the set to the fleet's `apply`
  when it changes, and the discovery series at scrape time.

The configuration of a group is `prober.config.group.TargetGroupConfig`; docs/design.md
("Discovery") says why each choice was made.
"""

from prober.discovery.runner import Discovery, make_source
from prober.discovery.source import Discovered, Fault, Fetched, Reason, Source

__all__ = ["Discovered", "Discovery", "Fault", "Fetched", "Reason", "Source", "make_source"]
