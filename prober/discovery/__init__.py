"""Discovered targets: `target_groups:` sources, their refresh loops and the desired set.

- `source`: what every source answers (`Source`, `Fetched`, `Fault` of a closed `Reason`)
  and Prometheus's target-group list as file_sd and HTTP SD hold it;
- `files`, `http`, `dns`: the three sources (`FileSd`, `HttpSd`, `DnsSd`);
- `state`: a group's addresses across refreshes (`remove_after_seconds`) and `merge`, the
  one set `static ∪ discovered` keyed by target name, name clashes resolved;
- `series`: the discovery series, made at scrape time.

`Discovery`, the one composer of the set the fleet runs (at start, when a group's answer
changes it, and at a reload, handed the new configuration), one refresh loop per group, the
targets of a group filtered to this replica's shard before they are built, sits above this
package and the fleet's: `prober.fleet.compose`.

The configuration of a group is `prober.config.group.TargetGroupConfig`; docs/design.md
("Discovery") says why each choice was made.
"""

from prober.discovery.source import Discovered, Fault, Fetched, Reason, Source

__all__ = ["Discovered", "Fault", "Fetched", "Reason", "Source"]
