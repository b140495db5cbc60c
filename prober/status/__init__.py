"""The status page: what every target is doing now, for a person with a browser or a phone.

- `view`: the view model, read from the fleet's live state (members, their capacity, load and
  recent probes), the last reload, discovery and the engine states, every string made safe
  and bounded;
- `pages`: the routes `/` and `/targets/NAME`, Jinja2 templates (`templates/`) with
  autoescaping, no script, a meta refresh;
- `debug`: the text of `/probe?target=NAME&debug=true`, the probe's own account.

docs/status-page.md says what each part of the page means and how it is bounded.
"""

from prober.status.debug import probe_account
from prober.status.pages import add_status_routes
from prober.status.view import Sources

__all__ = ["Sources", "add_status_routes", "probe_account"]
